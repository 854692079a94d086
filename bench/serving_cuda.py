"""The one-file early-exit model (`finetune.serve.onnx_single`) on ONNX Runtime's CUDA provider: bench/gpu_check.sh's
`onnx-cuda` part (issue 60).

The early-exit benches' classifier (bench/queued_gpu.py: base size, six MHA exits whose heads spread the entropy
rule's rows over the exits; toy size with `--quick`), traced once and written as two fp32 files: the full model (the
`static` rule: every layer, the last exit) and early exit (the entropy rule, its threshold fed per run). Then:

1. answers: on the provider (CUDA; `--device cpu`: the CPU provider, CI's smoke run) the labels and exit layers equal
   the CPU provider's at batch 1 and 32 (logits within 1e-3: GPU kernels round differently);
2. speed: wall time of the early-exit file against the full file on the same provider, batch 1 and 32, at entropy
   thresholds of about 1.5-3x fewer FLOPs: wall speed-up, FLOPs speed-up, their ratio; inputs in length order.

Needs onnxruntime-gpu on a GPU (`CUDAExecutionProvider`); where the provider is missing the report says so and exits
0 with `"skipped"` (the lent image has no network, and onnxruntime-gpu's wheel is far over what a run can carry).

    python bench/serving_cuda.py --device cuda --output OUT        # a lent GPU
    .venv/bin/python bench/serving_cuda.py --device cpu --quick --output OUT   # CI (gpu_check.sh --cpu --fast)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import queued_gpu  # noqa: E402
from elasticbert.exit_setting import EarlyExitSetting  # noqa: E402
from elasticbert.flops import sample_flops  # noqa: E402

THRESHOLDS = (0.01, 0.05, 0.2)


def sessions(model, providers: list[str]) -> dict:
    """{"full": session, "ee": session} of the model's two one-file forms on `providers`."""
    import onnxruntime as ort

    from finetune.serve.onnx_export import trace_pieces
    from finetune.serve.onnx_single import rule_plan, single_file, single_metadata

    traced = trace_pieces(model)
    out = {}
    for name, setting in (("full", EarlyExitSetting("static")), ("ee", EarlyExitSetting("entropy", 0.05))):
        plan = rule_plan(setting, model.config.num_labels)
        metadata = single_metadata(model.config, setting, plan, list(model.exit_layers), 128)
        proto = single_file(traced, "fp32", plan, model.config, metadata)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        out[name] = ort.InferenceSession(proto.SerializeToString(), options, providers=providers)
    return out


def batches(ids, mask, lengths, batch: int) -> list[dict]:
    """Feeds of `batch` rows in length order (longest first), each cut to its longest row."""
    order = torch.argsort(lengths, descending=True)
    out = []
    for start in range(0, len(order), batch):
        rows = order[start : start + batch]
        m = int(lengths[rows].max())
        feed = {"input_ids": ids[rows, :m], "attention_mask": mask[rows, :m], "token_type_ids": ids[rows, :m] * 0}
        out.append({key: value.numpy() for key, value in feed.items()})
    return out


def timed(session, feeds: list[dict], extra: dict, repeats: int) -> tuple[float, list]:
    """Best of `repeats` seconds of one pass over `feeds`, and that pass's outputs."""
    best, outputs = np.inf, []
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = [session.run(["logits", "exit_layer"], {**feed, **extra}) for feed in feeds]
        best = min(best, time.perf_counter() - start)
    return best, outputs


def measure(device: str, quick: bool) -> dict:
    import onnxruntime as ort

    provider = "CUDAExecutionProvider" if device == "cuda" else "CPUExecutionProvider"
    if provider not in ort.get_available_providers():
        return {"skipped": f"{provider} is not available (onnxruntime {ort.__version__}: pip install onnxruntime-gpu)"}
    model, ids, mask, lengths = queued_gpu.bench_classifier("cpu", quick, 24 if quick else 256)
    on_providers = [provider, "CPUExecutionProvider"] if provider != "CPUExecutionProvider" else [provider]
    cpu, on = sessions(model, ["CPUExecutionProvider"]), sessions(model, on_providers)
    cfg, layers = model.config, model.config.num_hidden_layers
    full_flops = sum(sample_flops(cfg, int(n), layers).total for n in lengths)
    rows, repeats = [], 1 if quick else 5
    for batch in (1, 32):
        feeds = batches(ids, mask, lengths, batch)
        full_seconds, _ = timed(on["full"], feeds, {}, repeats)
        for tau in THRESHOLDS:
            extra = {"threshold": np.array(tau, dtype=np.float32)}
            seconds, got = timed(on["ee"], feeds, extra, repeats)
            reference = [cpu["ee"].run(["logits", "exit_layer"], {**feed, **extra}) for feed in feeds]
            same = all(
                np.array_equal(a[1], b[1]) and np.array_equal(a[0].argmax(-1), b[0].argmax(-1))
                for a, b in zip(got, reference)
            )
            drift = max(float(np.abs(a[0] - b[0]).max()) for a, b in zip(got, reference))
            exits = np.concatenate([g[1] for g in got])
            flops = sum(
                sample_flops(cfg, int(n), int(e), list(range(1, int(e) + 1))).total
                for n, e in zip(torch.sort(lengths, descending=True).values.tolist(), exits.tolist())
            )
            rows.append(
                {
                    "batch": batch,
                    "threshold": tau,
                    "answers_equal_cpu": same,
                    "max_logit_drift": drift,
                    "wall_speedup": full_seconds / seconds,
                    "flops_speedup": full_flops / flops,
                    "ratio": (full_seconds / seconds) / (full_flops / flops),
                }
            )
    return {"provider": provider, "onnxruntime": ort.__version__, "quick": quick, "rows": rows}


def report(results: dict) -> str:
    if "skipped" in results:
        return f"one-file ONNX on the GPU: skipped: {results['skipped']}"
    lines = [f"one-file ONNX early exit on {results['provider']} (onnxruntime {results['onnxruntime']}), fp32:"]
    lines += ["| batch | τ | answers = CPU | FLOPs speed-up | wall speed-up vs the full file | wall ÷ FLOPs |"]
    lines += ["|---|---|---|---|---|---|"]
    for r in results["rows"]:
        lines.append(
            f"| {r['batch']} | {r['threshold']} | {'yes' if r['answers_equal_cpu'] else 'NO'} "
            f"(max Δlogit {r['max_logit_drift']:.1e}) | {r['flops_speedup']:.2f} | {r['wall_speedup']:.2f} | "
            f"{r['ratio']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="toy size (CI's smoke run)")
    parser.add_argument("--output", type=Path, required=True, help="writes OUTPUT/onnx_cuda.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with torch.no_grad():
        results = measure(args.device, args.quick)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "onnx_cuda.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    print(report(results))
    return 0 if "skipped" in results or all(r["answers_equal_cpu"] for r in results["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
