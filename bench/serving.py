"""Serving on CPU: ours (early exit × int8) against what a user would deploy instead, side by side in one run.

For a fine-tuned multi-exit model and a real dev set (texts in, labels out; tokenisation included everywhere), the
inputs/s and accuracy of:

- `pipeline` fp32      — `transformers.pipeline("text-classification")` on the model, full depth: the anchor a user has
- ORT fp32 / ORT int8  — the full model exported to ONNX (opset 17) and run by ONNX Runtime (graph optimisation
                          ORT_ENABLE_ALL; int8: `onnxruntime.quantization.quantize_dynamic`, QInt8 per-channel
                          weights — the optimum route), batches padded to their longest row as a user would
- ours full fp32 / int8 — `EarlyExitClassifier` with the static rule (the full model; int8: `elasticbert.precision`)
- ours EE fp32 / EE int8 — entropy early exit at the fastest threshold within `--within` points (default 1.0) of the
                          full fp32 model's dev accuracy, each chosen on logits of its own precision
- ours-ORT EE fp32 / int8 — the same engine and rule on ONNX Runtime: the model exported as pieces
                          (`finetune export --format onnx`, `finetune.onnx_runtime`), each threshold chosen on the
                          logits of its own runtime and precision the same way

at batch 1 and 32 and 1 and 2 threads (torch, ONNX Runtime and the Rust tokenizer alike; every configuration is
handed the inputs `batch` at a time, in dev-set order, and tokenises them per batch), plus the latency of each input
served alone (batch 1: p50 and p99 per configuration; one pass, the configurations interleaved input by input).
Timing is interleaved: every round runs each configuration once over the whole dev set, and the best of `--rounds` is
kept per configuration (the machine is shared; best-of-N is the least noisy). The thresholds are chosen on the same
dev rows they are scored on (ELUE's protocol; optimistic by the choice itself, equally for fp32 and int8), as the
lowest accuracy of batch 1 and of batches of 32 in arrival order (eager int8 quantizes activations per tensor, so its
logits move with the batch; the ORT int8 pieces quantize per token and answer the same in both). Needs
onnxruntime and onnx (`pip install '.[bench]'`).

    .venv/bin/python bench/serving.py --model SST-2=runs/sst2/best --model MRPC=runs/mrpc/best
    .venv/bin/python bench/serving.py --model SST-2=runs/sst2/best --max-examples 64 --rounds 1   # a quick look

Writes OUTPUT/results.json and OUTPUT/section.md (default docs/results/serving).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from elasticbert.exit_setting import EarlyExitSetting  # noqa: E402
from elasticbert.precision import for_inference  # noqa: E402
from experiments.common import GLUE_DIR, RESULTS_DIR, write_json  # noqa: E402
from finetune.data import EncodedSplit, load_tokenizer, subsample  # noqa: E402
from finetune.early_exit import make_rule, per_sample_flops, run_dataset, static_flops  # noqa: E402
from finetune.model import load_finetuned  # noqa: E402
from finetune.predict import EarlyExitClassifier, trained_max_length  # noqa: E402
from finetune.tasks import get_task, load_split  # noqa: E402

CONFIGS = (
    "pipeline fp32",
    "ORT fp32",
    "ORT int8",
    "ours full fp32",
    "ours full int8",
    "ours EE fp32",
    "ours EE int8",
    "ours-ORT EE fp32",
    "ours-ORT EE int8",
)
GOAL = "ours-ORT EE int8"
ENTROPY_GRID = np.round(np.linspace(0.01, 0.66, 40), 4)  # fractions of ln 2 from 1.5 % to 95 %


class FullModel(nn.Module):
    """The model's full-depth path (embeddings, every layer, the last exit) as one traceable forward for ONNX."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.last = model, model.exit_layers[-1]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor):
        hidden = self.model.elasticbert.embeddings(input_ids, token_type_ids, None)
        mask = attention_mask[:, None, None, :].bool()
        for index in range(self.last):
            hidden = self.model.elasticbert.encoder.run_layer(index, hidden, mask)
        return self.model.classify(self.last, hidden, attention_mask)[1]


def onnx_sessions(model: nn.Module, work: Path, threads: int) -> dict:
    """ORT sessions of the full model, fp32 and int8 (exported and quantized once per model, into `work`)."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    work.mkdir(parents=True, exist_ok=True)
    fp32, int8 = work / "model.onnx", work / "model_int8.onnx"
    if not int8.is_file():
        example = (torch.ones(2, 8, dtype=torch.long),) * 3
        axes = {name: {0: "batch", 1: "length"} for name in ("input_ids", "attention_mask", "token_type_ids")}
        torch.onnx.export(
            FullModel(model).eval(),
            example,
            str(fp32),
            input_names=list(axes),
            output_names=["logits"],
            dynamic_axes={**axes, "logits": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
        quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8, per_channel=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return {
        name: ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        for name, path in (("ORT fp32", fp32), ("ORT int8", int8))
    }


def calibrate(model: nn.Module, split: EncodedSplit, labels: np.ndarray, floor: float, points: int = 40) -> dict:
    """The entropy threshold with the fewest mean FLOPs whose dev accuracy is ≥ `floor` (on this model's logits)
    however the inputs are served — one at a time, and 32 at a time in arrival order, as the timed cells take them
    (eager int8 quantizes activations per tensor, so its logits move with the batch: the lower accuracy counts) —, among
    `points` of `ENTROPY_GRID` (evenly spaced)."""
    servings = (split.batches(1), split.batches(32, sort_by_length=False))
    best = None
    for tau in ENTROPY_GRID[np.linspace(0, len(ENTROPY_GRID) - 1, min(points, len(ENTROPY_GRID))).round().astype(int)]:
        accuracy, flops = math.inf, 0.0
        for batches in servings:
            result, _ = run_dataset(model, batches, make_rule("entropy", float(tau), model.config.num_labels))
            accuracy = min(accuracy, 100 * float((result.predictions.numpy() == labels).mean()))
            flops = max(flops, float(per_sample_flops(model.config, result)[0].mean()))
        if accuracy >= floor and (best is None or flops < best["mean_flops"]):
            best = {"threshold": float(tau), "accuracy": accuracy, "mean_flops": flops}
    return best or {"threshold": None}


def early_exit_rule(calibrated: dict) -> EarlyExitSetting:
    """The entropy rule at the calibrated threshold, or the full model when no threshold kept the accuracy."""
    if calibrated["threshold"] is None:
        return EarlyExitSetting("static")
    return EarlyExitSetting("entropy", calibrated["threshold"])


def runners(
    task, model_dir: Path, examples, tokenizer, max_length: int, thresholds: dict, sessions: dict, onnx: dict
) -> dict:
    """Configuration name -> run(batch_size, rows) returning label ids of `rows` (default: all) in input order, texts
    in, tokenisation included. `onnx`: precision -> the export's `OnnxLayers` at this thread count."""
    from transformers import pipeline

    model = load_finetuned(model_dir, require_trained=True).eval()
    # the anchor: the full model (the static rule: every layer, the last exit), whatever setting the directory saved.
    # (Without a setting the forward returns every exit's logits, which a pipeline cannot split into samples once a
    # batch holds more rows than the model has exits.)
    model.config.early_exit = {"strategy": "static"}
    texts = [e.text_a if e.text_b is None else (e.text_a, e.text_b) for e in examples]
    label_of = {name: i for i, name in model.config.id2label.items()}
    classify = pipeline("text-classification", model=model, tokenizer=tokenizer, device="cpu")
    pipeline_inputs = [t if isinstance(t, str) else {"text": t[0], "text_pair": t[1]} for t in texts]

    def pick(items: list, rows: list[int] | None) -> list:
        return items if rows is None else [items[i] for i in rows]

    def run_pipeline(batch_size: int, rows: list[int] | None = None) -> list[int]:
        inputs = pick(pipeline_inputs, rows)
        outputs = classify(inputs, batch_size=batch_size, truncation=True, max_length=max_length)
        return [label_of[o["label"]] for o in outputs]

    def ort_runner(session) -> Callable[..., list[int]]:
        def run(batch_size: int, rows: list[int] | None = None) -> list[int]:
            out, chosen = [], pick(texts, rows)
            for start in range(0, len(chosen), batch_size):
                pairs = [c if isinstance(c, tuple) else (c, None) for c in chosen[start : start + batch_size]]
                firsts, seconds = [p[0] for p in pairs], [p[1] for p in pairs]
                enc = tokenizer(
                    firsts,
                    seconds if task.is_pair else None,
                    padding=True,
                    truncation=True,
                    max_length=max_length,
                    return_tensors="np",
                )
                feed = {k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
                out += session.run(None, feed)[0].argmax(-1).tolist()
            return out

        return run

    def ours(runner, setting: EarlyExitSetting, precision: str) -> Callable[..., list[int]]:
        classifier = EarlyExitClassifier(
            runner, tokenizer, setting, max_length=max_length, task=task, precision=precision
        )

        def run(batch_size: int, rows: list[int] | None = None) -> list[int]:
            # inputs arrive `batch_size` at a time, as the other configurations take them (tokenised per batch too)
            chosen, out = pick(texts, rows), []
            for start in range(0, len(chosen), batch_size):
                records = classifier.predict(chosen[start : start + batch_size], batch_size=batch_size)
                out += [label_of[r["label"]] for r in records]
            return out

        return run

    return {
        "pipeline fp32": run_pipeline,
        "ORT fp32": ort_runner(sessions["ORT fp32"]),
        "ORT int8": ort_runner(sessions["ORT int8"]),
        "ours full fp32": ours(model, EarlyExitSetting("static"), "fp32"),
        "ours full int8": ours(model, EarlyExitSetting("static"), "int8"),
        "ours EE fp32": ours(model, early_exit_rule(thresholds["fp32"]), "fp32"),
        "ours EE int8": ours(model, early_exit_rule(thresholds["int8"]), "int8"),
        "ours-ORT EE fp32": ours(onnx["fp32"], early_exit_rule(thresholds["ORT fp32"]), "fp32"),
        "ours-ORT EE int8": ours(onnx["int8"], early_exit_rule(thresholds["ORT int8"]), "int8"),
    }


def latencies(run: dict, n: int) -> dict:
    """Each input served alone (batch 1), the configurations interleaved input by input: ms per input, p50 / p99."""
    times: dict[str, list[float]] = {name: [] for name in run}
    for i in range(n):
        for name in run:
            start = time.perf_counter()
            run[name](1, [i])
            times[name].append(time.perf_counter() - start)
    return {
        name: {"p50_ms": 1e3 * float(np.percentile(t, 50)), "p99_ms": 1e3 * float(np.percentile(t, 99))}
        for name, t in times.items()
    }


def time_cell(run: dict, batch_size: int, rounds: int, labels: np.ndarray) -> tuple[dict, dict]:
    """Best-of-`rounds` seconds per configuration over the whole dev set (interleaved), and accuracy."""
    best, accuracy = dict.fromkeys(run, float("inf")), {}
    for _ in range(rounds):
        for name in run:
            start = time.perf_counter()
            predictions = run[name](batch_size)
            best[name] = min(best[name], time.perf_counter() - start)
            accuracy[name] = 100 * float((np.array(predictions) == labels).mean())
    return best, accuracy


def onnx_export(model_dir: Path, work: Path, max_length: int) -> Path:
    """The model as ONNX pieces (`finetune export --format onnx`), once per model."""
    from finetune.onnx_export import export_onnx

    out = work / "ee_onnx"
    if not (out / "checksums.json").is_file():
        export_onnx(model_dir, out, max_length=max_length, overwrite=True)
    return out


def bench_task(task_name: str, model_dir: Path, args: argparse.Namespace) -> dict:
    from finetune.onnx_runtime import OnnxLayers

    task = get_task(task_name)
    examples = subsample(load_split(task, GLUE_DIR, "dev"), args.max_examples)
    labels = np.array([int(e.label) for e in examples])
    tokenizer = load_tokenizer(model_dir)
    max_length = trained_max_length(model_dir)
    split = EncodedSplit.from_examples(tokenizer, examples, max_length)
    model = load_finetuned(model_dir, require_trained=True).eval()
    torch.set_num_threads(1)
    full = run_dataset(model, split.batches(32), make_rule("static", None, model.config.num_labels))[0]
    full_accuracy = 100 * float((full.predictions.numpy() == labels).mean())
    floor = full_accuracy - args.within
    export = onnx_export(model_dir, args.work_dir / task.name, max_length)
    points = args.grid_points
    thresholds = {p: calibrate(for_inference(model, p), split, labels, floor, points) for p in ("fp32", "int8")}
    for p in ("fp32", "int8"):
        thresholds[f"ORT {p}"] = calibrate(OnnxLayers(export, p, threads=1), split, labels, floor, points)
    full_flops = float(static_flops(model.config, split.lengths, model.exit_layers[-1]).mean())
    print(f"{task.name}: full fp32 accuracy {full_accuracy:.2f}; thresholds {thresholds}", flush=True)
    table: dict = {name: {} for name in CONFIGS}
    for threads in args.threads:
        torch.set_num_threads(threads)
        # the Rust tokenizer's batch encoding uses every core unless told not to: one thread means one thread here too
        os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
        sessions = onnx_sessions(model, args.work_dir / task.name, threads)
        onnx = {p: OnnxLayers(export, p, threads=threads) for p in ("fp32", "int8")}
        run = runners(task, model_dir, examples, tokenizer, max_length, thresholds, sessions, onnx)
        for batch_size in args.batch_sizes:
            key = f"b{batch_size}_t{threads}"
            best, accuracy = time_cell(run, batch_size, args.rounds, labels)
            for name in CONFIGS:
                table[name].setdefault("inputs_per_s", {})[key] = len(examples) / best[name]
                table[name].setdefault("accuracy", {})[key] = accuracy[name]
            line = "  ".join(f"{n} {len(examples) / best[n]:.0f}/s" for n in CONFIGS)
            print(f"{task.name} {key}: {line}", flush=True)
        if 1 in args.batch_sizes and args.latency:
            for name, row in latencies(run, len(examples)).items():
                table[name].setdefault("latency_b1", {})[f"t{threads}"] = row
                print(
                    f"{task.name} latency b1 t{threads} {name}: p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms"
                )
    return {
        "examples": len(examples),
        "max_length": max_length,
        "model": str(model_dir),
        "full_fp32_accuracy": full_accuracy,
        "full_mean_flops": full_flops,
        "thresholds": thresholds,
        "configs": table,
    }


def _goal_lines(r: dict, keys: list[str]) -> list[str]:
    anchor = r["configs"]["pipeline fp32"]["inputs_per_s"]
    goal = r["configs"][GOAL]["inputs_per_s"]
    ort8 = r["configs"]["ORT int8"]["inputs_per_s"]
    eager = r["configs"]["ours EE int8"]["inputs_per_s"]
    return [
        "",
        f"Goals ({GOAL}): ≥ 1.5× ORT int8 (full model) in every cell — "
        + ", ".join(f"{k} {goal[k] / ort8[k]:.2f}×" for k in keys)
        + "; ≥ 6× the pipeline at batch 32 — "
        + ", ".join(f"{k} {goal[k] / anchor[k]:.2f}×" for k in keys if k.startswith("b32"))
        + "; against eager EE int8 — "
        + ", ".join(f"{k} {goal[k] / eager[k]:.2f}×" for k in keys),
        "",
    ]


def _latency_lines(r: dict) -> list[str]:
    rows = {name: row["latency_b1"] for name, row in r["configs"].items() if "latency_b1" in row}
    if not rows:
        return []
    threads = list(next(iter(rows.values())))
    lines = [
        "Latency per input at batch 1 (each input served alone), ms:",
        "",
        "| config | " + " | ".join(f"p50 {t} | p99 {t}" for t in threads) + " |",
        "|---|" + "---|---|" * len(threads),
    ]
    for name, row in rows.items():
        cells = " | ".join(f"{row[t]['p50_ms']:.2f} | {row[t]['p99_ms']:.2f}" for t in threads)
        lines.append(f"| {name} | {cells} |")
    return [*lines, ""]


def section(results: dict) -> str:
    """The README table: inputs/s per setting, × the pipeline, and accuracy, per task; the latencies; the goals."""
    lines = []
    for task, r in results["tasks"].items():
        keys = list(next(iter(r["configs"].values()))["inputs_per_s"])
        taus = ", ".join(f"{name} τ={value.get('threshold')}" for name, value in r["thresholds"].items())
        lines += [
            f"**{task}** dev ({r['examples']} rows, max length {r['max_length']}; full fp32 accuracy "
            f"{r['full_fp32_accuracy']:.1f}; EE thresholds: {taus})",
            "",
            "| config | " + " | ".join(f"inputs/s {k.replace('_', ' ')}" for k in keys) + " | accuracy |",
            "|---|" + "---|" * (len(keys) + 1),
        ]
        anchor = r["configs"]["pipeline fp32"]["inputs_per_s"]
        for name, row in r["configs"].items():
            speeds = " | ".join(
                f"{row['inputs_per_s'][k]:.0f} (×{row['inputs_per_s'][k] / anchor[k]:.2f})" for k in keys
            )
            accuracies = sorted(set(round(a, 1) for a in row["accuracy"].values()))
            lines.append(f"| {name} | {speeds} | {' / '.join(f'{a:.1f}' for a in accuracies)} |")
        lines += _goal_lines(r, keys) + _latency_lines(r)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, metavar="TASK=DIR", help="a fine-tuned model")
    parser.add_argument("--within", type=float, default=1.0, help="accuracy points below full fp32 allowed (EE)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--latency", action=argparse.BooleanOptionalAction, default=True, help="p50/p99 per input at batch 1"
    )
    parser.add_argument("--max-examples", type=int, default=None)
    parser.add_argument("--grid-points", type=int, default=40, help="entropy thresholds tried per calibration")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/serving_bench"))
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "serving")
    args = parser.parse_args(argv)
    try:
        import onnxruntime
    except ImportError:
        sys.exit("bench/serving.py: needs the bench extra: pip install onnxruntime onnx")
    models = dict(spec.split("=", 1) for spec in args.model)
    results = {
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "ort_graph_optimization": "ORT_ENABLE_ALL",
        "int8_engine": torch.backends.quantized.engine,
        "rounds": args.rounds,
        "tasks": {task: bench_task(task, Path(path), args) for task, path in models.items()},
    }
    args.output.mkdir(parents=True, exist_ok=True)
    write_json(args.output / "results.json", results)
    (args.output / "section.md").write_text(section(results), encoding="utf-8")
    print(section(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
