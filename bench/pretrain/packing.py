"""Packing (`data.packing`) vs one sample per padded row: real (non-pad) tokens per second, side by side in one run.

For WikiText-2 (one paragraph per line: data_prep's `auto` boundary, short documents) and Project Gutenberg books
(`--doc-boundary file`), at seq 128 and 512, the trainer's own samples (`PretrainingDataset`, short_seq_prob 0.1,
the first micro-batches of the training order) are collated both ways (`pretrain.collation`: `collate` pads each
sample to the micro-batch's longest, `pack` packs them into rows of max_length) and reported:

- padding before / after (the trainer's `padding_fraction`: 1 − real tokens / tokens computed), rows per micro-batch,
  and the lower bound on rows for those micro-batches (no packing of the same micro-batches can use fewer rows);
  "as the trainer collates": micro-batches that packing shrinks by less than 10 % stay padded
  (`pretrain.collation.PACKING_MIN_SAVING`); the steps below are timed on those batches;
- the cost of collation per micro-batch (pack vs collate) and of building its samples, against a training step;
- training steps (forward + backward + AdamW, fp32, dropout 0.1, exit groups G=2 alternating, gradient equilibrium)
  of a tiny model (configs/tiny_cpu.yaml's) and of a base-width model (hidden 768, 12 heads, FFN 3072; 4 layers so
  that it fits this 2-core box), on the same micro-batches packed and padded, interleaved, the fastest of the
  rounds: real tokens per second of each, their ratio, and the issue's goal 0.9 / (1 − padding before);
- the cost of the block-diagonal mask alone (Gutenberg, seq 512, base-width: a padded batch stepped as it is and as
  packed rows of one sample each, same shapes), which sets `pretrain.collation.PACKING_MIN_SAVING`;
- the data loader's headroom: samples one worker builds and packs per second (the trainer's path: `BlendedDataset`
  + `Collator(packing=True)`) against what a packed step consumes, here and projected to ElasticBERT-base on a V100
  and an A100 (seq 512, G=2, the FLOP model of `elasticbert.flops` at an assumed MFU of 40 %);
- fine-tuning (`data.group_by_length`): MiniLM-L6 (all 6 exits, AdamW), CoLA and SST-2 at max_length 128, batch 32:
  the first pool of 50 batches as random batches (the default) and grouped by length (the same 1,600 examples),
  real tokens per second of each.

Usage: python bench/pretrain/packing.py [--quick] [--micro 32] [--threads 1] [--json OUT]
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

from bench.harness import CORPUS as SHARED  # noqa: E402
from bench.harness import best_of_rounds, load_average, write_result  # noqa: E402
from elasticbert import ElasticBertConfig, ElasticBertForPreTraining, exit_groups, minilm_dir  # noqa: E402
from pretrain.collation import collate, pack, pack_rows, row_plan  # noqa: E402

VOCAB = 30522
SIZES = {  # name: (hidden, layers, heads, ffn)
    "tiny": (64, 4, 2, 256),
    "base-width": (768, 4, 12, 3072),
}


def prepare(workdir: Path, books: int) -> dict[str, Path]:
    """WikiText-2 and `books` Gutenberg books through data_prep (bert-base-uncased vocabulary, as the tests)."""
    from data_prep.pipeline import tokenize_corpus

    vocab = minilm_dir() / "vocab.txt"
    wiki, gut = workdir / "wikitext", workdir / "gutenberg"
    tokenize_corpus([str(SHARED / "wikitext-2-raw" / "wiki.test.raw")], wiki, tokenizer=vocab, valid_fraction=0.0)
    paths = sorted(glob.glob(str(SHARED / "gutenberg" / "*.txt")))[:books]
    tokenize_corpus(paths, gut, tokenizer=vocab, valid_fraction=0.0, doc_boundary="file")
    return {"WikiText-2": wiki, "Gutenberg": gut}


def micro_batches(path: Path, seq: int, micro: int, count: int) -> tuple[list[list[dict]], float]:
    """The first `count` micro-batches of the training order (one corpus, seed 1234), and the seconds it took to
    build one sample (SOP pair + n-gram masking, one process)."""
    from data_prep.reader import PreparedCorpus
    from pretrain.data import MaskingConfig, PretrainingDataset, SampleOrder, build_sample_index

    corpus = PreparedCorpus(path, "train")
    index = build_sample_index(corpus, seq, 0.1, 1234)
    dataset = PretrainingDataset(corpus, index, MaskingConfig(seq, 0.15, 3, 1234))
    order = SampleOrder([len(dataset)], [1.0], 1234)
    _, ids = order(np.arange(micro * count))
    t0 = time.perf_counter()
    items = [dataset[int(i)] for i in ids]
    build_s = (time.perf_counter() - t0) / len(items)
    return [items[i : i + micro] for i in range(0, len(items), micro)], build_s


def row_lower_bound(lengths: list[int], capacity: int) -> int:
    """Martello & Toth's L2 bound on the bins of a bin-packing instance: no packing uses fewer rows."""
    best = -(-sum(lengths) // capacity)
    for k in range(capacity // 2 + 1):
        big = sum(1 for n in lengths if n > capacity - k)
        mid = [n for n in lengths if capacity - k >= n > capacity / 2]
        small = sum(n for n in lengths if capacity / 2 >= n >= k)
        rest = small - (len(mid) * capacity - sum(mid))
        best = max(best, big + len(mid) + max(0, -(-rest // capacity)))
    return best


def padding_figures(batches: list[list[dict]], seq: int) -> dict:
    """Padding before/after, rows, the rows' lower bound, and collation times per micro-batch (fastest of 3)."""
    real = before = after = rows = bound = trainer = full_width = 0
    collate_s, pack_s = [], []
    for items in batches:
        lengths = [len(it["input_ids"]) for it in items]
        times = {}
        for name, fn in (("collate", collate), ("pack", lambda batch: pack(batch, capacity=seq, min_saving=0))):
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                out = fn(items)
                best = min(best, time.perf_counter() - t0)
            times[name] = (best, out)
        padded, packed = times["collate"][1], times["pack"][1]
        real += sum(lengths)
        before += padded["input_ids"].numel()
        after += packed["input_ids"].numel()
        trainer += pack(items, capacity=seq)["input_ids"].numel()
        rows += packed["input_ids"].shape[0]
        bound += row_lower_bound(lengths, seq)
        full_rows = pack_rows(lengths, seq)  # rows of max_length, as before the width search (`row_plan`)
        full_fill = max(sum(lengths[i] for i in row) for row in full_rows)
        full_width += len(full_rows) * min(-(-full_fill // 8) * 8, seq)
        collate_s.append(times["collate"][0])
        pack_s.append(times["pack"][0])
    t0 = time.perf_counter()
    for items in batches:
        row_plan([len(it["input_ids"]) for it in items], seq)
    plan_s = (time.perf_counter() - t0) / len(batches)
    return {
        "padding_before": 1 - real / before,
        "padding_after": 1 - real / after,
        "padding_trainer": 1 - real / trainer,
        "padding_full_width": 1 - real / full_width,
        "rows_per_micro": rows / len(batches),
        "rows_lower_bound_per_micro": bound / len(batches),
        "padding_at_bound": 1 - real / (bound * seq),
        "mean_sample_tokens": real / sum(len(b) for b in batches),
        "collate_ms": 1e3 * float(np.mean(collate_s)),
        "pack_ms": 1e3 * float(np.mean(pack_s)),
        "plan_ms": 1e3 * plan_s,
    }


def make_model(size: str, seq: int) -> tuple[ElasticBertForPreTraining, torch.optim.Optimizer]:
    hidden, layers, heads, ffn = SIZES[size]
    torch.manual_seed(0)
    config = ElasticBertConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=ffn,
        max_position_embeddings=max(seq, 128),
    )
    model = ElasticBertForPreTraining(config).train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def train_step(model, opt, batch: dict[str, torch.Tensor], exits: tuple[int, ...]) -> float:
    inputs = {k: v for k, v in batch.items() if k != "keys"}
    t0 = time.perf_counter()
    out = model(**inputs, active_exits=exits, gradient_equilibrium=True)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def throughput(size: str, batches: list[list[dict]], seq: int, rounds: int) -> dict:
    """Real tokens per second, padded vs packed, on the same micro-batches: variants interleaved batch by batch,
    the fastest round of each (one warm-up step per variant first)."""
    model, opt = make_model(size, seq)
    groups = exit_groups(model.config.num_hidden_layers, 2)
    both = {"padded": [collate(items) for items in batches], "packed": [pack(items, capacity=seq) for items in batches]}
    real = sum(int(b["attention_mask"].sum()) for b in both["padded"])
    for name in both:
        train_step(model, opt, both[name][0], groups[0])
    best = {name: float("inf") for name in both}
    for _ in range(rounds):
        spent = dict.fromkeys(both, 0.0)
        for i in range(len(batches)):
            for name in both:
                spent[name] += train_step(model, opt, both[name][i], groups[i % 2])
        best = {name: min(best[name], spent[name]) for name in both}
    return {
        "padded_tokens_per_s": real / best["padded"],
        "packed_tokens_per_s": real / best["packed"],
        "speedup": best["padded"] / best["packed"],
        "step_s_padded": best["padded"] / len(batches),
        "step_s_packed": best["packed"] / len(batches),
    }


def step_flops(config: ElasticBertConfig, batch: dict[str, torch.Tensor], exits: tuple[int, ...]) -> float:
    """Matmul FLOPs of one training step (forward + backward = 3 x forward) on the rows as computed: the encoder up
    to the deepest exit over every position of every row (padding and other samples' blocks included: dense
    attention computes them), and per active exit the MLM transform + decoder at the masked tokens and the pooler +
    SOP classifier per sample (`elasticbert.flops`' conventions)."""
    from elasticbert.flops import layer_flops

    rows, width = batch["input_ids"].shape
    h, vocab = config.hidden_size, config.vocab_size
    encoder = rows * layer_flops(config, width).matmul * max(exits)
    masked = int((batch["mlm_labels"] != -100).sum())
    heads = len(exits) * (masked * 2 * (h * h + h * vocab) + batch["sop_labels"].numel() * 2 * (h * h + 2 * h))
    return 3 * (encoder + heads)


def flops_bound(size: str, batches: list[list[dict]], seq: int) -> float:
    """The packed ÷ padded speed-up if a step's time followed its matmul FLOPs (`step_flops`), on the timed
    micro-batches with the groups alternating as timed: the ceiling the measured ratio is read against. The heads
    at the masked tokens cost the same both ways, so the ceiling sits below 1 ÷ (1 − padding before)."""
    config = make_model(size, seq)[0].config
    groups = exit_groups(config.num_hidden_layers, 2)
    padded = sum(step_flops(config, collate(items), groups[i % 2]) for i, items in enumerate(batches))
    packed = sum(step_flops(config, pack(items, capacity=seq), groups[i % 2]) for i, items in enumerate(batches))
    return padded / packed


def mask_overhead(items: list[dict], size: str, seq: int, rounds: int) -> float:
    """What the block-diagonal mask alone costs: the padded batch stepped as it is, and as packed rows of one sample
    each (the same shapes and tokens, plus `sample_ids` / `cls_positions`: a [rows, 1, T, T] mask instead of
    [rows, 1, 1, T]); time with the mask ÷ time without, the fastest of the rounds, interleaved."""
    model, opt = make_model(size, seq)
    exits = exit_groups(model.config.num_hidden_layers, 2)[0]
    padded = collate(items)
    rows, width = padded["input_ids"].shape
    masked = dict(padded)
    masked["sample_ids"] = padded["attention_mask"] * torch.arange(1, rows + 1)[:, None]
    masked["cls_positions"] = torch.arange(rows) * width
    best = {"padded": float("inf"), "masked": float("inf")}
    for r in range(rounds + 1):  # the first round warms up
        for name in ("padded", "masked") if r % 2 else ("masked", "padded"):
            spent = train_step(model, opt, padded if name == "padded" else masked, exits)
            best[name] = min(best[name], spent) if r else best[name]
    return best["masked"] / best["padded"]


def loader_headroom(path: Path, seq: int, micro: int, batches: int) -> float:
    """Samples per second one DataLoader worker builds and packs (the trainer's collation, in this process)."""
    from data_prep.reader import PreparedCorpus
    from pretrain.collation import Collator
    from pretrain.data import BlendedDataset, MaskingConfig, PretrainingDataset, build_sample_index

    corpus = PreparedCorpus(path, "train")
    dataset = BlendedDataset(
        [PretrainingDataset(corpus, build_sample_index(corpus, seq, 0.1, 1234), MaskingConfig(seq, 0.15, 3, 1234))]
    )
    collator = Collator(0, 8, packing=True, max_length=seq)
    n = len(dataset.datasets[0])
    t0 = time.perf_counter()
    for b in range(batches):
        collator([dataset[(0, (b * micro + i) * 7919 % n)] for i in range(micro)])
    return batches * micro / (time.perf_counter() - t0)


def projected_samples_per_s(mean_tokens: float, seq: int, peak_tflops: float, mfu: float = 0.4) -> float:
    """Samples per second one GPU consumes training ElasticBERT-base at `seq`, G=2 (its larger group, 7 exits),
    packed: real tokens only, attention over rows of `seq` (`elasticbert.flops.training_flops_per_token`)."""
    from elasticbert.flops import training_flops_per_token

    config = ElasticBertConfig()  # bert-base shape
    per_token = training_flops_per_token(config, exit_groups(12, 2)[0], seq)
    return peak_tflops * 1e12 * mfu / per_token / mean_tokens


def finetune_throughput(glue: Path, task: str, rounds: int) -> dict:
    """Real tokens per second of fine-tuning steps on random vs length-grouped batches of the same examples."""
    from elasticbert import ElasticBertForSequenceClassification
    from finetune.data import LENGTH_POOL, iterate_batches, load_tokenizer
    from finetune.tasks import load_split

    tokenizer = load_tokenizer(minilm_dir())
    examples = load_split(task, glue, "train")[: LENGTH_POOL * 32]
    both = {
        name: list(iterate_batches(tokenizer, examples, 32, 128, shuffle=True, seed=42, group_by_length=grouped))
        for name, grouped in (("random", False), ("grouped", True))
    }
    torch.manual_seed(0)
    model = ElasticBertForSequenceClassification.from_pretrained(
        minilm_dir(), num_labels=2, exit_layers=list(range(1, 7))
    )
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    real = sum(int(b["attention_mask"].sum()) for b in both["random"])

    def epoch(batches: list[dict]) -> None:
        for b in batches:
            labels = b["labels"].clamp(0, 1).long()
            out = model(
                input_ids=b["input_ids"],
                attention_mask=b["attention_mask"],
                token_type_ids=b["token_type_ids"],
                labels=labels,
            )
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    best = best_of_rounds({name: lambda batches=batches: epoch(batches) for name, batches in both.items()}, rounds)
    padding = {n: 1 - real / sum(b["input_ids"].numel() for b in bs) for n, bs in both.items()}
    return {
        "task": task,
        "padding_random": padding["random"],
        "padding_grouped": padding["grouped"],
        "random_tokens_per_s": real / best["random"],
        "grouped_tokens_per_s": real / best["grouped"],
        "speedup": best["random"] / best["grouped"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer micro-batches and rounds (a smoke run)")
    ap.add_argument("--micro", type=int, default=32, help="samples per micro-batch (the base config's: 32)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the box is shared)")
    ap.add_argument("--books", type=int, default=12, help="Gutenberg books to tokenize")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--base-batches", type=int, default=2, help="base-width micro-batches timed (each way)")
    ap.add_argument("--base-rounds", type=int, default=2, help="rounds over them (the fastest counts)")
    ap.add_argument("--only", metavar="CORPUS:SEQ", help="one case, e.g. WikiText-2:512 (no fine-tuning table)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_start = load_average()
    stats_batches = 8 if args.quick else 64  # padding figures: cheap, so many micro-batches
    timed = {"tiny": 2 if args.quick else 6, "base-width": 1 if args.quick else args.base_batches}
    rounds = {"tiny": 2 if args.quick else 3, "base-width": 1 if args.quick else args.base_rounds}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        corpora = prepare(Path(tmp), 3 if args.quick else args.books)
        for corpus, path in corpora.items():
            for seq in (128, 512):
                if args.only and args.only != f"{corpus}:{seq}":
                    continue
                batches, build_s = micro_batches(path, seq, args.micro, stats_batches)
                row = {"corpus": corpus, "seq": seq, "micro": args.micro, "build_ms_per_sample": 1e3 * build_s}
                row.update(padding_figures(batches, seq))
                row["loader_samples_per_s"] = loader_headroom(path, seq, args.micro, 4 if args.quick else 16)
                for size in SIZES:
                    row[size] = throughput(size, batches[: timed[size]], seq, rounds[size])
                    row[size]["flops_bound"] = flops_bound(size, batches[: timed[size]], seq)
                    print(f"  {corpus} seq {seq} {size}: {row[size]['speedup']:.2f}x", flush=True)
                results.append(row)
                if corpus == "Gutenberg" and seq == 512:  # full-length samples: the padded batch is 32 x 512
                    row["mask_overhead_base_width"] = mask_overhead(
                        batches[0], "base-width", seq, 1 if args.quick else 3
                    )
    tasks = (
        []
        if args.only
        else [finetune_throughput(SHARED.parent / "glue", t, 1 if args.quick else 2) for t in ("CoLA", "SST-2")]
    )
    report(results, tasks, args, load_start, load_average())
    if args.json:
        write_result(args.json, {"pretrain": results, "finetune": tasks})


def report(
    results: list[dict], tasks: list[dict], args: argparse.Namespace, load_start: float, load_end: float
) -> None:
    print(
        f"\nmicro-batch {args.micro} samples, {args.threads} thread(s), load average {load_start:.1f} at the "
        f"start, {load_end:.1f} at the end ({os.cpu_count()} cores, shared)\n"
    )
    print(
        "| corpus | seq | mean sample | padding before → packed | rows of max_length: padding (at the rows' bound) "
        "| rows / micro (bound at max_length) | padding as the trainer collates |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['corpus']} | {r['seq']} | {r['mean_sample_tokens']:.0f} | {r['padding_before']:.1%} → "
            f"{r['padding_after']:.1%} | {r['padding_full_width']:.1%} ({r['padding_at_bound']:.1%}) | "
            f"{r['rows_per_micro']:.1f} "
            f"({r['rows_lower_bound_per_micro']:.1f}) | {r['padding_trainer']:.1%} |"
        )
    print(
        "\n| corpus | seq | model | padded tok/s | packed tok/s | packed ÷ padded | if time followed FLOPs | goal "
        "| step padded / packed |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        goal = 0.9 / (1 - r["padding_before"])
        for size in SIZES:
            t = r[size]
            print(
                f"| {r['corpus']} | {r['seq']} | {size} | {t['padded_tokens_per_s']:,.0f} | "
                f"{t['packed_tokens_per_s']:,.0f} | **{t['speedup']:.2f}×** | {t['flops_bound']:.2f}× | {goal:.2f}× | "
                f"{t['step_s_padded']:.2f} / {t['step_s_packed']:.2f} s |"
            )
    print("\n| corpus | seq | build / sample | collate / micro | pack / micro (plan) | extra ÷ packed step |")
    print("|---|---|---|---|---|---|")
    for r in results:
        extra = (r["pack_ms"] - r["collate_ms"]) / 1e3
        shares = ", ".join(f"{extra / r[s]['step_s_packed']:.3%}" for s in SIZES)
        print(
            f"| {r['corpus']} | {r['seq']} | {r['build_ms_per_sample']:.2f} ms | {r['collate_ms']:.2f} ms | "
            f"{r['pack_ms']:.2f} ms ({r['plan_ms']:.3f} ms) | {shares} |"
        )
    for r in results:
        if "mask_overhead_base_width" in r:
            print(
                f"\nthe block-diagonal mask alone ({r['corpus']}, seq {r['seq']}, base-width, padded batch as one "
                f"sample per packed row): {r['mask_overhead_base_width']:.3f}x the padded step"
            )
    print(
        "\n| corpus | seq | 1 worker builds + packs | ÷ packed step here (tiny) | ÷ base's need per GPU, V100 / A100 "
        "(1 worker; 4 = the base configs') |"
    )
    print("|---|---|---|---|---|")
    for r in results:
        here = r["loader_samples_per_s"] * r["tiny"]["step_s_packed"] / args.micro
        gpus = [
            r["loader_samples_per_s"] / projected_samples_per_s(r["mean_sample_tokens"], r["seq"], tf)
            for tf in (125, 312)
        ]
        print(
            f"| {r['corpus']} | {r['seq']} | {r['loader_samples_per_s']:,.0f} samples/s | {here:,.0f}× | "
            f"{gpus[0]:.1f}× / {gpus[1]:.1f}× ({4 * gpus[0]:.0f}× / {4 * gpus[1]:.0f}×) |"
        )
    print(
        "\n| fine-tuning (MiniLM-L6, 6 exits, batch 32) | padding random → grouped | random tok/s | grouped tok/s "
        "| ratio |"
    )
    print("|---|---|---|---|---|")
    for t in tasks:
        print(
            f"| {t['task']} | {t['padding_random']:.1%} → {t['padding_grouped']:.1%} | {t['random_tokens_per_s']:,.0f} "
            f"| {t['grouped_tokens_per_s']:,.0f} | **{t['speedup']:.2f}×** |"
        )


if __name__ == "__main__":
    main()
