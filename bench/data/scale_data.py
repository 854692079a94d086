"""The pre-training data path at the real size, simulated here: 160 GB of text (≈ 38 B bert-base-uncased tokens),
64 ranks on 8 nodes. Every figure is measured on this machine on a synthetic corpus in the real format, at a
fraction of the real size, then projected.

    python bench/data/scale_data.py run --fractions 0.001,0.01,0.05 --workdir /tmp/scale --output docs/scale

1. `simulate`: a prepared directory (manifest.json + .bin/.idx shards, data_prep's format) whose sentence and
   document lengths are drawn from those data_prep measures on ../shared/data — Project Gutenberg books with
   `--doc-boundary file` (one book = one document) and WikiText (one paragraph = one document) — mixed in the
   paper's proportion of books (BookCorpus 4 GB of 164 GB); token ids are random valid ids (they only have to be
   readable). Written shard by shard, so the simulator's memory is one shard.
2. `measure`: in fresh processes (so RSS is the step's own): opening the corpus; building the sample index (the
   shipped builder, and the previous per-sample Python loop for comparison); how long the *other* ranks take to
   get the index (7 waiters beside the builder on an empty cache, and a cold start on a published one); RSS, PSS
   and private memory of 8 rank processes that open the same corpus and index and read samples; the dataloader's
   samples/s per rank against what one rank consumes at the paper's rate.
3. `run`: both for each fraction, then the dataloader speed of every size interleaved in one process; a JSON +
   markdown table + log-log plot in --output; the corpora deleted at the end (disk).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

from bench.harness import CORPUS as SHARED  # noqa: E402
from bench.harness import REPO, write_result  # noqa: E402

REAL_TOKENS = 38e9  # 160 GB at the 4.2 bytes per bert-base-uncased token measured on Gutenberg
BOOK_SHARE = 4 / 164  # BookCorpus 4 GB of Wikipedia 12 + BookCorpus 4 + OpenWebText 38 + C4 110 GB
SHARD_TOKENS = 1 << 24  # data_prep's default shard size
SEQ, SHORT_SEQ_PROB, SEED = 512, 0.1, 1234
RANKS, RANKS_PER_NODE, REAL_RANKS = 8, 8, 64
GLOBAL_BATCH, V100_TFLOPS, ASSUMED_MFU = 4096, 125.0, 0.40


# ------------------------------------------------------------------------------------------------ distributions


def measured_distributions(cache: Path) -> dict[str, dict[str, np.ndarray]]:
    """Per source, every document's sentence lengths as data_prep produces them (tokenised once, then cached)."""
    out = {}
    for name, inputs, boundary in (
        ("books", [SHARED / "gutenberg"], "file"),
        ("wiki", [SHARED / "wikitext-2-raw"], "auto"),
    ):
        npz = cache / f"{name}_lengths.npz"
        if not npz.is_file():
            from data_prep import minilm_vocab, tokenize_corpus
            from data_prep.reader import PreparedCorpus

            prepared = cache / f"{name}_prepared"
            shutil.rmtree(prepared, ignore_errors=True)
            tokenize_corpus(
                [str(p) for p in inputs],
                prepared,
                tokenizer=minilm_vocab(),
                workers=2,
                valid_fraction=0.0,
                doc_boundary=boundary,
                progress=False,
            )
            corpus = PreparedCorpus(prepared, "train")
            np.savez(npz, lengths=np.asarray(corpus.sentence_lengths), bounds=np.asarray(corpus.doc_boundaries))
            shutil.rmtree(prepared, ignore_errors=True)
        data = np.load(npz)
        out[name] = {"lengths": data["lengths"].astype(np.int32), "bounds": data["bounds"].astype(np.int64)}
    return out


def draw_documents(
    source: dict[str, np.ndarray], tokens: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Whole real documents drawn with replacement until `tokens` is reached: (sentence lengths, sentences/doc)."""
    bounds, lengths = source["bounds"], source["lengths"]
    counts = np.diff(bounds)
    cum = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    doc_tokens = cum[bounds[1:]] - cum[bounds[:-1]]
    picked = []
    total = 0
    while total < tokens:
        batch = rng.integers(0, len(counts), size=max(16, int((tokens - total) / max(doc_tokens.mean(), 1)) + 1))
        take = np.cumsum(doc_tokens[batch]) + total
        stop = int(np.searchsorted(take, tokens, side="left")) + 1
        picked.append(batch[:stop])
        total = int(take[min(stop, len(take)) - 1])
    docs = np.concatenate(picked)
    n = counts[docs]
    starts = bounds[:-1][docs]
    offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(n)[:-1]]), n) + np.arange(int(n.sum()))
    return lengths[offsets], n


# ------------------------------------------------------------------------------------------------------ simulate


def simulate(fraction: float, output: Path, cache: Path, seed: int = 0) -> dict:
    """Write a prepared directory of `fraction` × 38 B tokens in data_prep's format; returns its totals."""
    from data_prep.shard_format import FORMAT, PartWriter
    from elasticbert import minilm_dir

    dist = measured_distributions(cache)
    rng = np.random.default_rng(seed)
    target = int(fraction * REAL_TOKENS)
    shutil.rmtree(output, ignore_errors=True)
    (output / "train").mkdir(parents=True)
    (output / "valid").mkdir(parents=True)
    tok_dir = output / "tokenizer"
    tok_dir.mkdir()
    shutil.copy(minilm_dir() / "vocab.txt", tok_dir / "vocab.txt")
    splits = {}
    for split, tokens in (("train", target), ("valid", max(target // 1000, 100_000))):
        shards, written = [], 0
        while written < tokens:
            budget = min(SHARD_TOKENS, tokens - written)
            book_tokens = int(round(budget * BOOK_SHARE))
            parts = [draw_documents(dist["books"], book_tokens, rng)] if book_tokens else []
            parts.append(draw_documents(dist["wiki"], budget - book_tokens, rng))
            sent_lens = np.concatenate([p[0] for p in parts])
            per_doc = np.concatenate([p[1] for p in parts])
            order = rng.permutation(len(per_doc))  # interleave book and wiki documents within the shard
            doc_start = np.concatenate([[0], np.cumsum(per_doc)[:-1]])
            sent_idx = _gather_docs(doc_start, per_doc, order)
            sent_lens, per_doc = sent_lens[sent_idx], per_doc[order]
            n_tok = int(sent_lens.sum(dtype=np.int64))
            name = f"shard_{len(shards):05d}"
            writer = PartWriter(output / split / name, np.dtype("<u2"))
            ids = rng.integers(999, 30522, size=n_tok, dtype=np.uint16)  # valid ids, no special tokens
            writer.add(ids, sent_lens, per_doc)
            shards.append({**writer.close(), "name": name, "units": []})
            written += n_tok
        splits[split] = {"shards": shards, **{k: sum(s[k] for s in shards) for k in ("docs", "sentences", "tokens")}}
    manifest = {
        "format": FORMAT,
        "format_version": 1,
        "dtype": "uint16",
        "simulated": {"fraction": fraction, "book_share": BOOK_SHARE, "seed": seed},
        "tokenizer": {
            "dir": "tokenizer",
            "kind": "wordpiece",
            "vocab_size": 30522,
            "dtype": "uint16",
            "special_ids": {"pad": 0, "unk": 100, "cls": 101, "sep": 102, "mask": 103},
        },
        "splits": splits,
        "totals": {k: sum(splits[s][k] for s in splits) for k in ("docs", "sentences", "tokens")},
    }
    (output / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest["totals"]


def _gather_docs(doc_start: np.ndarray, per_doc: np.ndarray, order: np.ndarray) -> np.ndarray:
    n = per_doc[order]
    return np.repeat(doc_start[order] - np.concatenate([[0], np.cumsum(n)[:-1]]), n) + np.arange(int(n.sum()))


# ------------------------------------------------------------------------------------------------------- measure


def memory() -> dict[str, float]:
    """This process's RSS, PSS, private and anonymous memory (MB) from /proc/self/smaps_rollup, and its peak RSS since
    the last `reset_peak` (VmHWM). Private includes file-backed pages only this process has touched (memmapped
    shard pages: page cache the kernel can drop); anonymous is heap, what a rank really costs."""
    fields = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        fields[key] = int(value.split()[0]) / 1024
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    private = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
    return {
        "rss": fields["Rss"],
        "pss": fields["Pss"],
        "private": private,
        "anon": fields.get("Anonymous", 0),
        "peak_rss": int(status["VmHWM"].split()[0]) / 1024,
    }


def reset_peak() -> None:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux: write 5 to /proc/self/clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def _open_corpus(path: str, out: mp.Queue) -> None:
    from data_prep.reader import PreparedCorpus

    before = memory()
    start = time.perf_counter()
    corpus = PreparedCorpus(path, "train")
    seconds = time.perf_counter() - start
    after = memory()
    out.put({"seconds": seconds, "rss_mb": after["rss"] - before["rss"], "shards": corpus.num_shards})


def old_build_sample_index(corpus: object, max_length: int, short_seq_prob: float, seed: int) -> np.ndarray:
    """The builder before this change (INDEX_VERSION 1): one Python iteration per sample over the concatenated
    sentence lengths of every shard, rows in a Python list. Kept here only to measure it side by side."""
    max_tokens = max_length - 3
    lengths = np.asarray(corpus.sentence_lengths, dtype=np.int64)
    cum = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cum[1:])
    bounds = np.asarray(corpus.doc_boundaries, dtype=np.int64)
    rng = np.random.default_rng([seed, 1, max_length])
    rows = []
    for doc in range(len(bounds) - 1):
        start, end = int(bounds[doc]), int(bounds[doc + 1])
        while end - start >= 2:
            target = max_tokens
            if short_seq_prob > 0 and rng.random() < short_seq_prob:
                target = int(rng.integers(2, max_tokens + 1))
            j = int(np.searchsorted(cum, cum[start] + target, side="left"))
            stop = min(max(j, start + 2), end)
            if end - stop == 1:
                stop = end
            rows.append((doc, start, stop, target))
            start = stop
    return np.asarray(rows, dtype=np.int64)


def _build_index(path: str, cache: str, old: bool, out: mp.Queue) -> None:
    from data_prep.reader import PreparedCorpus
    from pretrain.data import load_or_build_index

    corpus = PreparedCorpus(path, "train")
    reset_peak()
    before = memory()
    start = time.perf_counter()
    if old:
        rows = len(old_build_sample_index(corpus, SEQ, SHORT_SEQ_PROB, SEED))
    else:
        index, _, built = load_or_build_index(corpus, "train", SEQ, SHORT_SEQ_PROB, SEED, [Path(cache)], builder=True)
        rows = len(index)
        assert built
    seconds = time.perf_counter() - start
    out.put({"seconds": seconds, "peak_rss_mb": memory()["peak_rss"] - before["rss"], "samples": rows})


def _get_index(path: str, cache: str, builder: bool, barrier: object, out: mp.Queue) -> None:
    """One rank of a job start, timed from a barrier that every rank passes after its imports: the builder builds,
    the others wait; reports when this rank held a verified index."""
    from data_prep.reader import PreparedCorpus
    from pretrain.data import load_or_build_index

    corpus = PreparedCorpus(path, "train")
    barrier.wait()
    start = time.perf_counter()
    index, _, built = load_or_build_index(
        corpus, "train", SEQ, SHORT_SEQ_PROB, SEED, [Path(cache)], builder=builder, log=lambda _: None
    )
    out.put({"builder": builder, "built": built, "seconds": time.perf_counter() - start, "rows": len(index)})


def _rank_reader(path: str, cache: str, rank: int, samples: int, barrier: object, out: mp.Queue) -> None:
    """One of 8 rank processes on one node: open the corpus and index, read this rank's samples; memory measured
    while every rank is alive (a barrier before and after), so pages the ranks share count as shared."""
    from data_prep.reader import PreparedCorpus
    from pretrain.data import MaskingConfig, PretrainingDataset, RankBatches, SampleOrder, collate, load_or_build_index

    barrier.wait()
    base = memory()
    corpus = PreparedCorpus(path, "train")
    index, _, _ = load_or_build_index(corpus, "train", SEQ, SHORT_SEQ_PROB, SEED, [Path(cache)], builder=False)
    dataset = PretrainingDataset(corpus, index, MaskingConfig(SEQ, 0.15, 3, SEED))
    order = SampleOrder([len(dataset)], [1.0], SEED)
    batches = iter(RankBatches(order, 0, GLOBAL_BATCH, 32, rank, RANKS))
    read = 0
    while read < samples:
        keys = next(batches)
        collate([dataset[i] for _, i in keys])
        read += len(keys)
    barrier.wait()
    after = memory()
    barrier.wait()
    out.put(
        {
            "rank": rank,
            "rss_mb": after["rss"],
            "pss_mb": after["pss"],
            "private_mb": after["private"],
            "extra_private_mb": after["private"] - base["private"],
            "extra_anon_mb": after["anon"] - base["anon"],
            "extra_rss_mb": after["rss"] - base["rss"],
        }
    )


def _loader_speed(paths: list[str], caches: list[str], seconds: float, rounds: int, out: mp.Queue) -> None:
    """Samples/s of one process (one core) building samples the way a DataLoader worker does — index lookup, SOP
    pair, n-gram masking, collate into micro-batches of 32 — for every corpus size in turn, `rounds` times
    interleaved (the best round kept), so load changes on a shared machine hit every size alike."""
    from data_prep.reader import PreparedCorpus
    from pretrain.data import MaskingConfig, PretrainingDataset, RankBatches, SampleOrder, collate, load_or_build_index

    loaders = []
    for path, cache in zip(paths, caches):
        corpus = PreparedCorpus(path, "train")
        index, _, _ = load_or_build_index(corpus, "train", SEQ, SHORT_SEQ_PROB, SEED, [Path(cache)], builder=False)
        dataset = PretrainingDataset(corpus, index, MaskingConfig(SEQ, 0.15, 3, SEED))
        loaders.append(
            (dataset, iter(RankBatches(SampleOrder([len(dataset)], [1.0], SEED), 0, GLOBAL_BATCH, 32, 0, REAL_RANKS)))
        )
    best = [0.0] * len(loaders)
    for _ in range(rounds):
        for k, (dataset, batches) in enumerate(loaders):
            read, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                collate([dataset[i] for _, i in next(batches)])
                read += 32
            best[k] = max(best[k], read / (time.perf_counter() - start))
    out.put({"samples_per_s": best})


def run_processes(target: object, arg_list: list[tuple], barrier: bool = False, timeout: float = 3600) -> list[dict]:
    """Each argument tuple in a fresh interpreter (spawn: each measures only its own step), started together;
    with `barrier`, the processes also get a shared barrier to start their timed step at the same moment."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    extra = (ctx.Barrier(len(arg_list)),) if barrier else ()
    procs = [ctx.Process(target=target, args=(*args, *extra, queue)) for args in arg_list]
    for p in procs:
        p.start()
    results = [queue.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(60)
    return results


def per_rank_consumption() -> dict:
    """Samples/s one rank consumes at the paper's rate: batch 4,096 × 512 tokens per step on 64 V100s, with the
    step time taken from our FLOP model at an assumed MFU (an assumption, printed with the figure)."""
    from elasticbert import ElasticBertConfig, exit_groups
    from elasticbert.flops import training_flops_per_token

    cfg = ElasticBertConfig(
        vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072
    )
    groups = exit_groups(12, 2)
    fpt = sum(training_flops_per_token(cfg, g, SEQ) for g in groups) / len(groups)
    step_s = fpt * GLOBAL_BATCH * SEQ / (REAL_RANKS * V100_TFLOPS * 1e12 * ASSUMED_MFU)
    return {
        "step_s": step_s,
        "samples_per_s": GLOBAL_BATCH / REAL_RANKS / step_s,
        "assumption": f"step time = FLOPs of a G=2 ElasticBERT-base step at seq 512 / (64 V100 × "
        f"{V100_TFLOPS:.0f} TFLOP/s fp16 × {ASSUMED_MFU:.0%} MFU) = {step_s:.2f} s",
    }


def measure(corpus: Path, work: Path, samples: int = 2000, old_builder: bool = True) -> dict:
    results: dict = {}
    results["open"] = run_processes(_open_corpus, [(str(corpus),)])[0]
    cache = work / "index_cache"
    shutil.rmtree(cache, ignore_errors=True)
    results["build"] = run_processes(_build_index, [(str(corpus), str(cache), False)])[0]
    if old_builder:
        results["build_old"] = run_processes(_build_index, [(str(corpus), str(work / "unused"), True)])[0]
    shutil.rmtree(cache, ignore_errors=True)
    ranks = run_processes(_get_index, [(str(corpus), str(cache), r == 0) for r in range(RANKS)], barrier=True)
    waiters = [r for r in ranks if not r["builder"]]
    assert not any(r["built"] for r in waiters), "a waiting rank built the index"
    results["first_start"] = {
        "builder_s": next(r["seconds"] for r in ranks if r["builder"]),
        "waiters_max_s": max(r["seconds"] for r in waiters),
    }
    warm = run_processes(_get_index, [(str(corpus), str(cache), r == 0) for r in range(RANKS)], barrier=True)
    results["restart_max_s"] = max(r["seconds"] for r in warm)
    results["ranks"] = run_processes(
        _rank_reader, [(str(corpus), str(cache), r, samples) for r in range(RANKS)], barrier=True
    )
    results["consumption"] = per_rank_consumption()
    return results


# ---------------------------------------------------------------------------------------------------------- run


def summarise(fraction: float, totals: dict, m: dict) -> dict:
    ranks = m["ranks"]
    return {
        "fraction": fraction,
        "tokens": totals["tokens"],
        "sentences": totals["sentences"],
        "docs": totals["docs"],
        "open_s": m["open"]["seconds"],
        "open_rss_mb": m["open"]["rss_mb"],
        "index_build_s": m["build"]["seconds"],
        "index_build_peak_mb": m["build"]["peak_rss_mb"],
        "old_build_s": m.get("build_old", {}).get("seconds"),
        "old_build_peak_mb": m.get("build_old", {}).get("peak_rss_mb"),
        "samples": m["build"]["samples"],
        "waiters_first_start_s": m["first_start"]["waiters_max_s"],
        "restart_s": m["restart_max_s"],
        "rank_rss_mb": float(np.mean([r["rss_mb"] for r in ranks])),
        "rank_pss_mb": float(np.mean([r["pss_mb"] for r in ranks])),
        "rank_extra_private_mb": float(np.mean([r["extra_private_mb"] for r in ranks])),
        "rank_extra_anon_mb": float(np.mean([r["extra_anon_mb"] for r in ranks])),
        "samples_per_s_per_worker": None,  # measured for every size together at the end (interleaved)
        "consumed_per_rank": m["consumption"]["samples_per_s"],
        "consumption_assumption": m["consumption"]["assumption"],
    }


def projection(rows: list[dict]) -> dict:
    """Each figure at 160 GB: extrapolated from the largest measured corpus along the power law fitted to the two
    largest (log-log slope clamped to [0, 1], reported as `exponent_*`: 1 = linear in corpus size, 0 = flat)."""
    rows = sorted(rows, key=lambda r: r["tokens"])
    out: dict = {}
    keys = (
        "samples",
        "open_s",
        "open_rss_mb",
        "index_build_s",
        "index_build_peak_mb",
        "old_build_s",
        "old_build_peak_mb",
        "waiters_first_start_s",
        "restart_s",
        "rank_extra_private_mb",
        "rank_extra_anon_mb",
        "rank_pss_mb",
    )
    for key in keys:
        pts = [(r["tokens"], r[key]) for r in rows if r.get(key) is not None and r[key] > 0]
        if not pts:
            out[key] = None
            continue
        (x1, y1), (x2, y2) = (pts[-2], pts[-1]) if len(pts) > 1 else ((pts[-1][0] / 10, pts[-1][1] / 10), pts[-1])
        slope = float(np.log(y2 / y1) / np.log(x2 / x1)) if x2 != x1 and y1 > 0 else 1.0
        slope = min(max(slope, 0.0), 1.0)  # nothing here is super-linear; a noisy small point must not make it so
        out[f"exponent_{key}"] = slope
        out[key] = float(y2 * (REAL_TOKENS / x2) ** slope)
    out["tokens"] = REAL_TOKENS
    anon = [r["rank_extra_anon_mb"] for r in rows]
    out["rank_extra_anon_spread"] = (max(anon) - min(anon)) / max(min(anon), 1e-9)
    speeds = [r["samples_per_s_per_worker"] / r["consumed_per_rank"] for r in rows if r["samples_per_s_per_worker"]]
    out["dataloader_headroom"] = min(speeds) if speeds else None
    return out


def write_report(rows: list[dict], proj: dict, output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    write_result(output / "scale_data.json", {"rows": rows, "projection_160gb": proj})
    head = (
        "| corpus | tokens | open | open RSS | index build | build peak RSS | old build | old peak | other ranks "
        "wait (first start) | restart | rank RSS / PSS | rank extra heap / file-backed private | samples/s per worker "
        "(× need) |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        old = f"{r['old_build_s']:.1f} s" if r["old_build_s"] is not None else "–"
        old_mb = f"{r['old_build_peak_mb']:.0f} MB" if r["old_build_peak_mb"] is not None else "–"
        lines.append(
            f"| 1/{1 / r['fraction']:.0f} of 160 GB | {r['tokens'] / 1e9:.3f} B | {r['open_s'] * 1e3:.0f} ms | "
            f"{r['open_rss_mb']:.1f} MB | {r['index_build_s']:.1f} s | {r['index_build_peak_mb']:.0f} MB | {old} | "
            f"{old_mb} | {r['waiters_first_start_s']:.1f} s | {r['restart_s']:.1f} s | "
            f"{r['rank_rss_mb']:.0f} / {r['rank_pss_mb']:.0f} MB | {r['rank_extra_anon_mb']:.1f} / "
            f"{r['rank_extra_private_mb'] - r['rank_extra_anon_mb']:.1f} MB | "
            + (
                f"{r['samples_per_s_per_worker']:.0f} ({r['samples_per_s_per_worker'] / r['consumed_per_rank']:.0f}×) |"
                if r["samples_per_s_per_worker"]
                else "– |"
            )
        )
    p = proj
    lines.append(
        f"| **160 GB (projected)** | {p['tokens'] / 1e9:.0f} B | {p['open_s'] * 1e3:.0f} ms | "
        f"{p['open_rss_mb']:.0f} MB | {p['index_build_s']:.0f} s | {p['index_build_peak_mb']:.0f} MB | "
        f"{(p['old_build_s'] or 0):.0f} s | {(p['old_build_peak_mb'] or 0):.0f} MB | "
        f"{p['waiters_first_start_s']:.0f} s | {p['restart_s']:.0f} s | – | {p['rank_extra_anon_mb']:.1f} MB heap | "
        + (f"≥ {p['dataloader_headroom']:.0f}× |" if p["dataloader_headroom"] else "– |")
    )
    (output / "scale_data.md").write_text("\n".join(lines) + "\n\n" + rows[0]["consumption_assumption"] + "\n")
    plot(rows, output / "scale_data.png")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tokens = [r["tokens"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 5.4))
    for key, label in (
        ("index_build_s", "index build (s)"),
        ("old_build_s", "old per-sample builder (s)"),
        ("waiters_first_start_s", "other ranks get the index, first start (s)"),
        ("restart_s", "every rank gets the index, restart (s)"),
        ("open_s", "corpus open (s)"),
    ):
        if all(r.get(key) for r in rows):
            left.loglog(tokens, [r[key] for r in rows], "o-", label=label)
    left.set(xlabel="corpus tokens", ylabel="seconds", title="Time vs corpus size")
    for key, label in (
        ("index_build_peak_mb", "index build peak RSS"),
        ("old_build_peak_mb", "old builder peak RSS"),
        ("rank_extra_anon_mb", "extra heap per rank (8 ranks)"),
        ("rank_pss_mb", "PSS per rank"),
        ("open_rss_mb", "corpus open RSS"),
    ):
        if all(r.get(key) for r in rows):
            right.loglog(tokens, [max(r[key], 1e-2) for r in rows], "o-", label=label)
    right.set(xlabel="corpus tokens", ylabel="MB", title="Memory vs corpus size")
    for ax in (left, right):
        ax.axvline(REAL_TOKENS, color="grey", ls=":", lw=1)
        ax.text(REAL_TOKENS, ax.get_ylim()[0], " 160 GB", fontsize=8, color="grey", va="bottom")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("simulate", help="write one synthetic prepared corpus")
    s.add_argument("--fraction", type=float, required=True, help="of 160 GB, e.g. 0.001")
    s.add_argument("--output", type=Path, required=True)
    s.add_argument("--cache", type=Path, default=Path("/tmp/elasticbert-scale-cache"))
    r = sub.add_parser("run", help="simulate + measure each fraction, write the report")
    r.add_argument("--fractions", default="0.001,0.01,0.05")
    r.add_argument("--workdir", type=Path, default=Path("/tmp/elasticbert-scale"))
    r.add_argument("--cache", type=Path, default=Path("/tmp/elasticbert-scale-cache"))
    r.add_argument("--output", type=Path, default=REPO / "docs" / "scale")
    r.add_argument("--samples", type=int, default=2000, help="samples each of the 8 rank processes reads")
    r.add_argument("--keep", action="store_true", help="keep the synthetic corpora (default: delete each)")
    p = sub.add_parser("report", help="rewrite the table and plot from a measured scale_data.json")
    p.add_argument("--output", type=Path, default=REPO / "docs" / "scale")
    args = ap.parse_args()
    if args.command == "report":
        rows = json.loads((args.output / "scale_data.json").read_text())["rows"]
        write_report(rows, projection(rows), args.output)
        print((args.output / "scale_data.md").read_text())
        return 0
    args.cache.mkdir(parents=True, exist_ok=True)
    if args.command == "simulate":
        print(json.dumps(simulate(args.fraction, args.output, args.cache)))
        return 0
    rows, corpora, caches = [], [], []
    for fraction in [float(f) for f in args.fractions.split(",")]:
        corpus = args.workdir / f"corpus_{fraction:g}"
        start = time.perf_counter()
        totals = simulate(fraction, corpus, args.cache)
        print(
            f"simulated 1/{1 / fraction:.0f}: {totals['tokens'] / 1e9:.3f} B tokens in "
            f"{time.perf_counter() - start:.0f} s",
            flush=True,
        )
        m = measure(corpus, args.workdir / f"work_{fraction:g}", args.samples)
        rows.append(summarise(fraction, totals, m))
        corpora.append(str(corpus))
        caches.append(str(args.workdir / f"work_{fraction:g}" / "index_cache"))
        print(json.dumps(rows[-1], indent=1), flush=True)
    speeds = run_processes(_loader_speed, [(corpora, caches, 5.0, 3)])[0]["samples_per_s"]
    for row, speed in zip(rows, speeds):
        row["samples_per_s_per_worker"] = speed
    write_report(rows, projection(rows), args.output)
    if not args.keep:
        shutil.rmtree(args.workdir, ignore_errors=True)
    print((args.output / "scale_data.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
