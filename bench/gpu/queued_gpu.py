"""Early exit on an accelerator, measured: the per-layer queues and CUDA graphs against the full model.

bench/gpu/gpu_bench.py (the GPU half of bench/gpu/gpu_check.sh) calls `queued_early_exit_ratios` and prints
`report_lines`; `--device cpu --quick` runs the same code at toy sizes (the CUDA graphs' capture is then skipped and
their fixed-shape path runs eagerly). A base-size classifier (hidden 768, 6 layers, an MHA exit on each; random
weights with the exit heads scaled up so that the entropy rule spreads rows over the exits: the speed-up needs exits,
not accuracy) serves 512 inputs of 16-127 tokens handed in `batch` at a time in arrival order (not length-sorted), at
entropy thresholds from ≈ 1.3× to ≈ 4× fewer FLOPs. Per threshold and batch size, the wall-time speed-up over the
full model (its own forward, eager, on the same batches) of:

- `per batch`: `run_batch` on each batch (rows leave; the batch shrinks to its deepest row) - the engine before the
  queues;
- `queued`: `ExitQueues` over the eager `TorchLayers` (every layer call a full batch of rows of any batch);
- `queued + graphs`: `ExitQueues` over `GraphedLayers` (fixed shapes; CUDA graphs on a CUDA device);

and wall ÷ FLOPs (the speed-up over the FLOPs speed-up; 1.0: the wall time follows the FLOPs). The full model is
also timed through `GraphedLayers` (`full, graphs`), the stricter reference once graphs are in play. Timed with the
device synchronised around each whole pass (one warm-up pass per configuration first: graph captures happen there).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from bench.harness import bert_size

THRESHOLDS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4)


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench_classifier(device: str, quick: bool, n: int | None = None) -> tuple:
    """(model, ids, mask, lengths): the early-exit benches' classifier — base size (toy when `quick`), six MHA exits
    whose heads are scaled up so that the entropy rule spreads rows over the exits — and `n` inputs of 16-127 tokens."""
    from elasticbert import ElasticBertConfig, ElasticBertForSequenceClassification

    hidden, layers, heads, default_n = (64, 6, 2, 48) if quick else (768, 6, 12, 512)
    n = n or default_n
    config = ElasticBertConfig(
        **bert_size(hidden, layers, heads),
        num_labels=2,
        exit_layers=list(range(1, layers + 1)),
        exit_type="mha",
    )
    torch.manual_seed(0)
    model = ElasticBertForSequenceClassification(config).eval().to(device)
    with torch.no_grad():
        for param in model.exits.parameters():
            param.normal_(0.0, 0.6)
    lengths = torch.randint(16, 128, (n,))
    ids = torch.randint(1000, 30522, (n, 128)) * (torch.arange(128)[None] < lengths[:, None])
    return model, ids, (ids != 0).long(), lengths


def _passes(model, ids, mask, lengths, batch: int, device: str) -> dict[str, Callable]:
    """Configuration name -> rule -> (seconds, total FLOPs) of one pass over the inputs, `batch` at a time."""
    from elasticbert.early_exit import GraphedLayers, TorchLayers, make_rule, per_sample_flops, run_batch
    from elasticbert.exit_queues import EarlyExitResult, ExitQueues

    n, last = len(lengths), model.exit_layers[-1]
    batches = []
    for start in range(0, n, batch):
        rows = slice(start, start + batch)
        m = int(lengths[rows].max())
        batches.append([t[rows, :m].to(device) for t in (ids, mask, torch.zeros_like(ids))])
    graphed = GraphedLayers(model)

    def full(rule) -> float:
        for b in batches:
            model(b[0], attention_mask=b[1], token_type_ids=b[2], exit_layers=[last], early_exit=False)
        return 0.0

    def per_batch(rule) -> float:
        return sum(float(per_sample_flops(model.config, run_batch(model, *b, rule))[0].sum()) for b in batches)

    def queued(runner) -> Callable:
        def run(rule) -> float:
            engine = ExitQueues(runner, rule, batch_size=batch)
            for b in batches:
                engine.submit(*b)
                engine.pump()
            engine.flush()
            done = engine.take()
            result = EarlyExitResult(done.logits, done.exit_layers, done.lengths, done.exits_evaluated, engine.exits)
            return float(per_sample_flops(model.config, result)[0].sum())

        return run

    return {
        "full": full,
        "full, graphs": lambda rule: queued(graphed)(make_rule("static", None, 2)),
        "per batch": per_batch,
        "queued": queued(TorchLayers(model)),
        "queued + graphs": queued(graphed),
    }


def _timed(run: Callable, rule, device: str) -> tuple[float, float]:
    _synchronize(device)
    start = time.perf_counter()
    with torch.inference_mode():
        flops = run(rule)
    _synchronize(device)
    return time.perf_counter() - start, flops


def queued_early_exit_ratios(device: str, quick: bool) -> list[dict]:
    """Per batch size and threshold: each configuration's wall speed-up over the eager full model, the FLOPs
    speed-up, wall ÷ FLOPs; plus the full model through `GraphedLayers`."""
    from elasticbert.early_exit import make_rule
    from elasticbert.flops import sample_flops

    model, ids, mask, lengths = bench_classifier(device, quick)
    full_flops = sum(sample_flops(model.config, int(m), model.exit_layers[-1]).total for m in lengths)
    rows = []
    for batch in (1, 32):
        passes = _passes(model, ids, mask, lengths, batch, device)
        for run in passes.values():  # warm-up: kernels chosen, graphs captured
            _timed(run, make_rule("entropy", 0.02, 2), device)
        reference, _ = _timed(passes["full"], None, device)
        graphs_full, _ = _timed(passes["full, graphs"], None, device)
        for tau in THRESHOLDS[:3] if quick else THRESHOLDS:
            rule = make_rule("entropy", tau, 2)
            row = {"batch": batch, "threshold": tau, "full_graphs_speedup": reference / graphs_full}
            for name in ("per batch", "queued", "queued + graphs"):
                seconds, flops = _timed(passes[name], rule, device)
                row[name] = {"wall_speedup": reference / seconds, "flops_speedup": full_flops / flops}
                row[name]["ratio"] = row[name]["wall_speedup"] / row[name]["flops_speedup"]
            rows.append(row)
    return rows


def report_lines(rows: list[dict]) -> list[str]:
    """The markdown table of `queued_early_exit_ratios`' rows (none: nothing)."""
    if not rows:
        return []
    names = ("per batch", "queued", "queued + graphs")
    lines = [
        "",
        "Early exit, per-layer queues (× the full model's eager forward; wall speed-up / wall ÷ FLOPs):",
        "",
        "| batch | entropy τ | FLOPs speed-up | " + " | ".join(names) + " | full, graphs |",
        "|---|---|---|" + "---|" * (len(names) + 1),
    ]
    for r in rows:
        cells = " | ".join(f"{r[n]['wall_speedup']:.2f}× / {r[n]['ratio']:.2f}" for n in names)
        flops = r["queued"]["flops_speedup"]
        lines.append(f"| {r['batch']} | {r['threshold']} | {flops:.2f}× | {cells} | {r['full_graphs_speedup']:.2f}× |")
    slowest = {n: min(r[n]["wall_speedup"] for r in rows) for n in names}
    lines.append("")
    lines.append(
        "Slowest against the full model, any threshold: " + ", ".join(f"{n} {v:.2f}×" for n, v in slowest.items())
    )
    return lines
