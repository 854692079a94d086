"""Does HashEE turn saved FLOPs into saved time?  wall-time speed-up ÷ FLOPs speed-up at batch 1 and 32, on the CPU.

For each fine-tuned HashEE model (`finetune train --method hashee`) and its task's dev set, the model's forward (what
`evaluate`, `pipeline` and `hashee-score` run: the gathered token-level layers) is timed against the full model - the
same weights in `ElasticBertForSequenceClassification`, every token at every layer - on the same length-sorted
batches. Timing is paired per batch: each batch runs both back to back, `--rounds` times, alternating which goes
first, and the minimum per (batch, model) is summed (a shared machine's load changes over seconds). FLOPs are the
ELUE counter's (`elasticbert.flops`: per token and per layer for HashEE). Goal: wall ÷ FLOPs >= 0.8 at batch 32.

    .venv/bin/python bench/serving/hashee.py --model SST-2=RUN1/best --model MRPC=RUN2/best --rounds 3

The full model's and HashEE's predictions are checked against each other's FLOPs bookkeeping, and HashEE's logits
against a batch-1 pass (a row's answer must not depend on its batch).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

from bench.harness import load_average, write_result  # noqa: E402
from common.cli import add_data_dir  # noqa: E402
from elasticbert import ElasticBertConfig, ElasticBertForSequenceClassification  # noqa: E402
from elasticbert.flops import sample_flops, token_exit_flops  # noqa: E402
from elasticbert.hashee import running_per_layer  # noqa: E402
from finetune.config import load_run_config  # noqa: E402
from finetune.data import EncodedSplit, load_tokenizer, subsample  # noqa: E402
from finetune.model import load_finetuned  # noqa: E402
from finetune.tasks import get_task, load_split  # noqa: E402


def full_model_of(hashee: torch.nn.Module) -> ElasticBertForSequenceClassification:
    """The same weights as a plain ElasticBERT classifier: every token at every layer."""
    fields = {k: v for k, v in hashee.config.to_dict().items() if k not in ("token_exit", "model_type", "auto_map")}
    full = ElasticBertForSequenceClassification(ElasticBertConfig(**fields)).eval()
    missing, unexpected = full.load_state_dict(hashee.state_dict(), strict=False)
    assert not missing and unexpected == ["elasticbert.token_layers"], (missing, unexpected)
    return full


def paired_times(models: dict, batches: list, rounds: int) -> dict:
    """Per model, the sum over batches of the fastest of `rounds` runs (order alternating per round)."""
    best = {name: [float("inf")] * len(batches) for name in models}
    names = list(models)
    with torch.inference_mode():
        for r in range(rounds):
            for i, batch in enumerate(batches):
                for name in names if (r + i) % 2 == 0 else names[::-1]:
                    start = time.perf_counter()
                    models[name](batch.input_ids, batch.attention_mask, batch.token_type_ids)
                    best[name][i] = min(best[name][i], time.perf_counter() - start)
    return {name: sum(times) for name, times in best.items()}


def measure(task_name: str, model_dir: str, data_dir: str, rounds: int, batch1_rows: int) -> dict:
    hashee = load_finetuned(model_dir).eval()
    full = full_model_of(hashee)
    task = get_task(task_name)
    run_config = Path(model_dir).parent / "run_config.json"
    max_length = load_run_config(run_config).data.max_length if run_config.is_file() else 128
    split = EncodedSplit.from_examples(load_tokenizer(model_dir), load_split(task, data_dir, "dev"), max_length)
    depth = hashee.elasticbert.token_depths(split.input_ids, split.attention_mask)
    running = running_per_layer(depth, hashee.config.num_hidden_layers)
    lengths = split.lengths.tolist()
    ours = [token_exit_flops(hashee.config, n, r).total for n, r in zip(lengths, running.tolist())]
    every = [sample_flops(full.config, n, full.config.num_hidden_layers).total for n in lengths]
    out = {"task": task.name, "model": model_dir, "max_length": max_length, "rows": len(lengths)}
    out["flops_speedup"] = sum(every) / sum(ours)
    models = {"full": full, "hashee": hashee}
    for batch_size in (1, 32):
        rows = len(lengths) if batch_size > 1 else min(batch1_rows, len(lengths))
        chosen = subsample(range(len(lengths)), rows, 0)  # every row, or a seeded subset at batch 1
        batches = split.select(torch.as_tensor(chosen)).batches(batch_size)
        times = paired_times(models, batches, rounds)
        flops_speedup = sum(every[i] for i in chosen) / sum(ours[i] for i in chosen)
        wall_speedup = times["full"] / times["hashee"]
        out[f"batch_{batch_size}"] = {
            "rows": rows,
            "full_s": times["full"],
            "hashee_s": times["hashee"],
            "wall_speedup": wall_speedup,
            "flops_speedup": flops_speedup,
            "wall_over_flops": wall_speedup / flops_speedup,
        }
    with torch.inference_mode():  # a row's answer does not depend on its batch
        batched = torch.cat([hashee(b.input_ids, b.attention_mask, b.token_type_ids).logits for b in split.batches(32)])
        order = torch.cat([b.rows for b in split.batches(32)])
        first = split.select(torch.arange(min(50, len(split)))).batches(1, sort_by_length=False)  # dataset order
        alone = torch.cat([hashee(b.input_ids, b.attention_mask, b.token_type_ids).logits for b in first])
    out["batch_invariance_max_abs_diff"] = float((batched[torch.argsort(order)][: len(alone)] - alone).abs().max())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, metavar="TASK=DIR")
    add_data_dir(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch1-rows", type=int, default=300, help="rows timed at batch 1 (a seeded subset)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", help="write the results as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "threads": args.threads,
        "load_average_before": load_average(),
        "models": [],
    }
    for item in args.model:
        task, _, directory = item.partition("=")
        result = measure(task, directory, args.data_dir, args.rounds, args.batch1_rows)
        results["models"].append(result)
        for b in ("batch_1", "batch_32"):
            r = result[b]
            print(
                f"{task} {b}: full {r['full_s']:.2f} s, HashEE {r['hashee_s']:.2f} s over {r['rows']} rows: wall "
                f"{r['wall_speedup']:.2f}x, FLOPs {r['flops_speedup']:.2f}x, wall/FLOPs {r['wall_over_flops']:.3f}",
                flush=True,
            )
    results["load_average_after"] = load_average()
    if args.output:
        write_result(Path(args.output), results)


if __name__ == "__main__":
    main()
