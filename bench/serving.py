"""Serving early exit, measured: each runtime's full model against the early-exit engine on it, side by side.

For fine-tuned multi-exit models and their real dev sets (texts in, labels out; tokenisation included everywhere), at
each batch size (inputs handed to every configuration `B` at a time, in dev-set order) and thread count:

- full models, the reference of their runtime: `torch fp32 full` / `torch int8 full` (the model's own forward, int8:
  `elasticbert.precision`), `ORT fp32 full` / `ORT int8 full` (the whole model exported as one ONNX graph, int8 by
  `onnxruntime.quantization.quantize_dynamic` with per-channel weights — the optimum route; ORT_ENABLE_ALL); each
  tokenises with the tokenizer's Rust batch call (no `transformers` call around it) and pads a batch to its longest
  row, as a user serving the full model would;
- early exit (`EarlyExitClassifier.stream`: the per-layer queues, every layer call a full batch of B rows of
  whatever inputs reached it, answers in input order): `torch fp32 EE`, `torch int8 EE`, `ORT fp32 EE`,
  `ORT int8 EE` (the export's fused steps, per-token int8), and `ORT int8 EE per batch` — the same engine flushed
  after every batch (each batch runs until its deepest row leaves: what the engine did before the queues);
- `pipeline fp32`: `transformers.pipeline("text-classification")` on the full model, the anchor a user starts from;
- the one-file model (`finetune.serve.onnx_single`, docs/onnx_single_file.md): `ORT int8 EE one file` /
  `ORT fp32 EE one file` served as a user serves it (the Rust tokenizer's call, one plain session run per batch with
  the calibrated threshold fed to its `threshold` input, argmax: the full-model rows' code with the other file), and
  `ORT int8 EE ours` (`EarlyExitClassifier.stream`: the one file at batch 1, the queues above). `ORT int8 EE` keeps
  the per-layer queues at every batch size.

Per configuration and cell: inputs/s (best of `--rounds` interleaved rounds: every round runs each configuration once
over the whole dev set, the machine is shared), p50 / p99 latency per input (from the moment its batch is handed in
to the moment its answer is handed out, in input order; of the best round), mean FLOPs per input (ELUE conventions),
accuracy, the ratio to the full model on the same runtime and precision, and wall ÷ FLOPs (that ratio over the
FLOPs speed-up: 1.0 when the wall time follows the FLOPs). Each early-exit threshold is chosen on its own runtime's
logits, as the fewest mean FLOPs whose dev accuracy stays within `--within` points of the full fp32 model (ELUE's
protocol: chosen on the rows it is scored on, equally for every runtime); eager int8 quantizes activations per
tensor, so its logits move with the batch: its threshold must hold one input at a time and 32 at a time in arrival
order (the other runtimes answer an input the same in any batch). `--device cuda` runs the torch rows on a GPU (CUDA
graphs for the early-exit engine; int8 rows are CPU-only). Needs onnxruntime and onnx (`pip install '.[bench]'`).

    .venv/bin/python bench/serving.py --model SST-2=runs/sst2/best --model MRPC=runs/mrpc/best --rounds 2
    .venv/bin/python bench/serving.py --model SST-2=runs/sst2/best --max-examples 64 --rounds 1   # a quick look
    .venv/bin/python bench/serving.py --model SST-2=A --model MRPC=B --configs "ORT int8 full" "ORT int8 EE" \
        "ORT int8 EE one file" "ORT int8 EE ours" --rounds 5 --no-pipeline     # issue 60's rows

Writes OUTPUT/results.json and OUTPUT/section.md (default docs/results/serving).
"""

from __future__ import annotations

import argparse
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

from bench.serving_report import section  # noqa: E402
from elasticbert.exit_queues import EarlyExitResult, ExitQueues  # noqa: E402
from elasticbert.exit_setting import EarlyExitSetting  # noqa: E402
from elasticbert.precision import for_inference  # noqa: E402
from experiments.common import GLUE_DIR, RESULTS_DIR, write_json  # noqa: E402
from finetune.data import EncodedSplit, load_tokenizer, subsample  # noqa: E402
from finetune.model import load_finetuned  # noqa: E402
from finetune.serve.early_exit import make_rule, per_sample_flops, static_flops  # noqa: E402
from finetune.serve.inputs import TextInput  # noqa: E402
from finetune.serve.predict import EarlyExitClassifier, trained_max_length  # noqa: E402
from finetune.tasks import get_task, load_split  # noqa: E402

# The bench's clock: wall time (`--clock wall`, the figures to report from a quiet machine), or the calling thread's
# CPU time (`--clock cpu`: one thread computes everything on the calling thread, so on a loaded machine this is the
# work itself, without the waits for a core; it cannot see time spent waiting on memory or other threads).
clock = time.perf_counter

# configuration -> (runtime and precision: the full model it is compared with, early exit or not)
CONFIGS = {
    "pipeline fp32": ("pipeline", False),
    "torch fp32 full": ("torch fp32", False),
    "torch int8 full": ("torch int8", False),
    "ORT fp32 full": ("ORT fp32", False),
    "ORT int8 full": ("ORT int8", False),
    "torch fp32 EE": ("torch fp32", True),
    "torch int8 EE": ("torch int8", True),
    "ORT fp32 EE": ("ORT fp32", True),
    "ORT int8 EE": ("ORT int8", True),
    "ORT int8 EE per batch": ("ORT int8", True),
    "ORT int8 EE one file": ("ORT int8", True),
    "ORT int8 EE ours": ("ORT int8", True),
    "ORT fp32 EE one file": ("ORT fp32", True),
}
GOAL = "ORT int8 EE one file"  # issue 60: the one-file model as a user serves it
ENTROPY_GRID = np.round(np.linspace(0.01, 0.66, 40), 4)  # fractions of ln 2 from 1.5 % to 95 %
Run = Callable[[int], tuple[list[int], list[float]]]  # batch size -> (label ids, seconds per input), input order


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


def rust_encoder(tokenizer, max_length: int) -> Callable[[list], dict[str, np.ndarray]]:
    """The tokenizer's Rust backend, truncating to `max_length` and padding a batch to its longest row."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.enable_truncation(max_length, strategy="longest_first")
    backend.enable_padding(pad_id=tokenizer.pad_token_id, pad_token=tokenizer.pad_token)

    def encode(texts: list) -> dict[str, np.ndarray]:
        encodings = backend.encode_batch(texts) if len(texts) > 1 else [backend.encode(*_parts(texts[0]))]
        ids, mask, types = zip(*((e.ids, e.attention_mask, e.type_ids) for e in encodings))
        return {
            "input_ids": np.array(ids, dtype=np.int64),
            "attention_mask": np.array(mask, dtype=np.int64),
            "token_type_ids": np.array(types, dtype=np.int64),
        }

    return encode


def _parts(text: str | tuple[str, str]) -> tuple:
    return (text,) if isinstance(text, str) else text


def full_runner(texts: list, encode: Callable, forward: Callable[[dict], np.ndarray]) -> Run:
    """The full model on `texts`, `batch` at a time in order: (label ids, each input's latency)."""

    def run(batch: int) -> tuple[list[int], list[float]]:
        labels, latency = [], []
        for start in range(0, len(texts), batch):
            began = clock()
            chunk = texts[start : start + batch]
            labels += forward(encode(chunk)).argmax(-1).tolist()
            latency += [clock() - began] * len(chunk)
        return labels, latency

    return run


def torch_forward(model: nn.Module) -> Callable[[dict], np.ndarray]:
    device = model.device

    def forward(feed: dict) -> np.ndarray:
        with torch.inference_mode():
            tensors = {key: torch.from_numpy(value).to(device) for key, value in feed.items()}
            out = model(**tensors, exit_layers=[model.exit_layers[-1]], early_exit=False)
            return out.logits.float().cpu().numpy()

    return forward


def early_exit_runner(
    classifier: EarlyExitClassifier, inputs: list[TextInput], label_of: dict, queued: bool, one_file: bool = False
) -> Run:
    """The classifier's stream fed `batch` inputs at a time; `queued`: rows wait at their layer for rows of later
    batches (flushed at the end), else each batch is flushed before the next is handed in; `one_file`: the stream may
    run the export's one file (at batch 1), else the per-layer queues always."""

    def run(batch: int) -> tuple[list[int], list[float]]:
        stream = classifier.stream(batch, one_file=one_file)
        handed: list[float] = []
        labels, latency = [], []

        def collect() -> None:
            now = clock()
            for _, record in stream.ready():
                labels.append(label_of[record["label"]])
                latency.append(now - handed[len(latency)])

        for start in range(0, len(inputs), batch):
            chunk = inputs[start : start + batch]
            handed += [clock()] * len(chunk)
            stream.submit(chunk)
            if not queued or batch == 1:
                stream.flush()
            collect()
        stream.flush()
        collect()
        run.fill = stream.engine.fill()  # rows per layer call / B, for the report
        run.steps = sum(stream.engine.steps) / max(sum(stream.engine.calls), 1)  # runner steps per layer call
        return labels, latency

    return run


def pipeline_runner(model: nn.Module, tokenizer, texts: list, max_length: int, label_of: dict) -> Run:
    from transformers import pipeline

    model.config.early_exit = {"strategy": "static"}  # the full model at any batch size
    classify = pipeline("text-classification", model=model, tokenizer=tokenizer, device=model.device)
    items = [t if isinstance(t, str) else {"text": t[0], "text_pair": t[1]} for t in texts]

    def run(batch: int) -> tuple[list[int], list[float]]:
        labels, latency = [], []
        for start in range(0, len(items), batch):
            began = clock()
            chunk = items[start : start + batch]
            outputs = classify(chunk, batch_size=batch, truncation=True, max_length=max_length)
            labels += [label_of[o["label"]] for o in outputs]
            latency += [clock() - began] * len(chunk)
        return labels, latency

    return run


def engine_pass(runner, rule, split: EncodedSplit, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """(predictions, FLOPs) per row of `split` through the queue engine, `batch` rows handed in at a time in order."""
    engine = ExitQueues(runner, rule, batch_size=batch)
    for start in range(0, len(split), batch):
        rows = slice(start, start + batch)
        longest = int(split.lengths[rows].max())
        engine.submit(*(t[rows, :longest] for t in (split.input_ids, split.attention_mask, split.token_type_ids)))
        engine.pump()
    engine.flush()
    done = engine.take()
    order = torch.argsort(done.slots)
    result = EarlyExitResult(
        done.logits[order], done.exit_layers[order], done.lengths[order], done.exits_evaluated[order], engine.exits
    )
    return result.predictions.numpy(), per_sample_flops(runner.config, result)[0]


def calibrate(runner, split: EncodedSplit, labels: np.ndarray, floor: float, points: int, both: bool) -> dict:
    """The entropy threshold with the fewest mean FLOPs whose dev accuracy is ≥ `floor` on this runner's logits,
    among `points` of `ENTROPY_GRID`; `both`: it must hold one input at a time too (eager int8: per-tensor scales)."""
    best = None
    picks = ENTROPY_GRID[np.linspace(0, len(ENTROPY_GRID) - 1, min(points, len(ENTROPY_GRID))).round().astype(int)]
    for tau in picks:
        accuracy, flops = np.inf, 0.0
        for batch in (32, 1) if both else (32,):
            predictions, per_row = engine_pass(runner, make_rule("entropy", float(tau), 2), split, batch)
            accuracy = min(accuracy, 100 * float((predictions == labels).mean()))
            flops = max(flops, float(per_row.mean()))
        if accuracy >= floor and (best is None or flops < best["mean_flops"]):
            best = {"threshold": float(tau), "accuracy": accuracy, "mean_flops": flops}
    return best or {"threshold": None}


def setting_of(calibrated: dict) -> EarlyExitSetting:
    """The entropy rule at the calibrated threshold, or the full model when no threshold kept the accuracy."""
    if calibrated["threshold"] is None:
        return EarlyExitSetting("static")
    return EarlyExitSetting("entropy", calibrated["threshold"])


def runners(context: dict, threads: int, args: argparse.Namespace) -> dict[str, Run]:
    """Configuration name -> its `Run`, at `threads` threads."""
    from finetune.serve.onnx_runtime import OnnxLayers

    model, tokenizer, texts = context["model"], context["tokenizer"], context["texts"]
    inputs, label_of, thresholds = context["inputs"], context["label_of"], context["thresholds"]
    sessions = onnx_sessions(model, context["work"], threads)
    encode = rust_encoder(tokenizer, context["max_length"])
    wanted = {CONFIGS[name][0] for name in args.configs or CONFIGS}
    eager = {"fp32": model.to(args.device)} if "torch fp32" in wanted else {}
    if args.device == "cpu" and "torch int8" in wanted:
        eager["int8"] = for_inference(model, "int8")
    out: dict[str, Run] = {}
    if args.pipeline:
        out["pipeline fp32"] = pipeline_runner(model, tokenizer, texts, context["max_length"], label_of)
    for precision, m in eager.items():
        out[f"torch {precision} full"] = full_runner(texts, encode, torch_forward(m))
    for name, session in sessions.items():
        out[f"{name} full"] = full_runner(texts, encode, lambda feed, s=session: s.run(None, feed)[0])

    def classifier(runner, precision: str, key: str) -> EarlyExitClassifier:
        setting = setting_of(thresholds[key])
        task, length = context["task"], context["max_length"]
        return EarlyExitClassifier(runner, tokenizer, setting, max_length=length, task=task, precision=precision)

    for precision, m in eager.items():
        out[f"torch {precision} EE"] = early_exit_runner(
            classifier(m, precision, f"torch {precision}"), inputs, label_of, True
        )
    for precision in ("fp32", "int8"):
        if f"ORT {precision}" not in thresholds:
            continue
        pieces = classifier(OnnxLayers(context["export"], precision, threads), precision, f"ORT {precision}")
        out[f"ORT {precision} EE"] = early_exit_runner(pieces, inputs, label_of, True)
        if precision == "int8":
            out["ORT int8 EE per batch"] = early_exit_runner(pieces, inputs, label_of, False)
            out["ORT int8 EE ours"] = early_exit_runner(pieces, inputs, label_of, True, one_file=True)
        out[f"ORT {precision} EE one file"] = full_runner(texts, encode, one_file_forward(context, precision, threads))
    return {name: serve for name, serve in out.items() if not args.configs or name in args.configs}


def one_file_forward(context: dict, precision: str, threads: int) -> Callable[[dict], np.ndarray]:
    """The export's one file as a user runs it: a plain session (ORT_ENABLE_ALL, `threads` intra-op threads), the
    calibrated threshold fed to its `threshold` input; returns the logits of each row's exit."""
    import onnxruntime as ort

    from finetune.serve.onnx_single import SINGLE_FILES

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads, options.log_severity_level = threads, 1, 3
    path = str(context["export"] / SINGLE_FILES[precision])
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    tau = context["thresholds"].get(f"ORT {precision}", {}).get("threshold")
    rule = {"threshold": np.array(0.0 if tau is None else tau, dtype=np.float32)}  # None: none kept the accuracy

    def forward(feed: dict) -> np.ndarray:
        return session.run(["logits"], {**feed, **rule})[0]

    return forward


def time_cell(run: dict[str, Run], batch: int, rounds: int, labels: np.ndarray) -> dict:
    """Per configuration: best-of-`rounds` seconds over the whole dev set (interleaved), that round's latencies,
    the accuracy, and the load average around the rounds."""
    best: dict = {name: {"seconds": np.inf} for name in run}
    loads = [os.getloadavg()[0]]
    for _ in range(rounds):
        for name, serve in run.items():
            start = clock()
            predictions, latency = serve(batch)
            seconds = clock() - start
            if seconds < best[name]["seconds"]:
                best[name] = {
                    "seconds": seconds,
                    "p50_ms": 1e3 * float(np.percentile(latency, 50)),
                    "p99_ms": 1e3 * float(np.percentile(latency, 99)),
                    "accuracy": 100 * float((np.array(predictions) == labels).mean()),
                }
                if hasattr(serve, "fill"):
                    best[name]["fill"], best[name]["steps_per_call"] = serve.fill, serve.steps
        loads.append(os.getloadavg()[0])
    return {"configs": best, "load_average": loads}


def onnx_export(model_dir: Path, work: Path, max_length: int) -> Path:
    """The model as ONNX steps (`finetune export --format onnx`), once per model."""
    from finetune.serve.onnx_export import FORMAT, MANIFEST, export_onnx

    out = work / "ee_onnx"
    manifest = out / MANIFEST
    text = manifest.read_text(encoding="utf-8") if manifest.is_file() else ""
    if not (out / "checksums.json").is_file() or FORMAT not in text or '"strategy": "entropy"' not in text:
        setting = EarlyExitSetting("entropy", 0.3)  # the one file's rule; the bench feeds its calibrated threshold
        export_onnx(model_dir, out, max_length=max_length, overwrite=True, setting=setting)
    return out


def prepare(task_name: str, model_dir: Path, args: argparse.Namespace) -> dict:
    """What every cell of a task shares: data, model, export, thresholds per runtime."""
    from finetune.serve.onnx_runtime import OnnxLayers

    task = get_task(task_name)
    examples = subsample(load_split(task, GLUE_DIR, "dev"), args.max_examples)
    tokenizer, max_length = load_tokenizer(model_dir), trained_max_length(model_dir)
    split = EncodedSplit.from_examples(tokenizer, examples, max_length)
    labels = np.array([int(e.label) for e in examples])
    model = load_finetuned(model_dir, require_trained=True).eval()
    model.config.early_exit = None
    torch.set_num_threads(1)
    work = args.work_dir / task.name
    export = onnx_export(model_dir, work, max_length)
    full, _ = engine_pass(model, make_rule("static", None, model.config.num_labels), split, 32)
    full_accuracy = 100 * float((full == labels).mean())
    floor = full_accuracy - args.within
    candidates = {"torch fp32": model, **{f"ORT {p}": OnnxLayers(export, p, 1) for p in ("fp32", "int8")}}
    if args.device == "cpu":
        candidates["torch int8"] = for_inference(model, "int8")
    wanted = {CONFIGS[name][0] for name in args.configs or CONFIGS if CONFIGS[name][1]}
    candidates = {key: runner for key, runner in candidates.items() if key in wanted}
    thresholds = {
        key: calibrate(runner, split, labels, floor, args.grid_points, both=key == "torch int8")
        for key, runner in candidates.items()
    }
    print(f"{task.name}: full fp32 accuracy {full_accuracy:.2f}; thresholds {thresholds}", flush=True)
    texts = [e.text_a if e.text_b is None else (e.text_a, e.text_b) for e in examples]
    return {
        "task": task,
        "model": model.to(args.device),
        "tokenizer": tokenizer,
        "max_length": max_length,
        "texts": texts,
        "inputs": [TextInput(e.text_a, e.text_b, f"dev row {i}") for i, e in enumerate(examples)],
        "labels": labels,
        "label_of": {name: i for i, name in model.config.id2label.items()},
        "export": export,
        "work": work,
        "thresholds": thresholds,
        "full_accuracy": full_accuracy,
        "full_flops": float(static_flops(model.config, split.lengths, model.exit_layers[-1]).mean()),
    }


def bench_task(task_name: str, model_dir: Path, args: argparse.Namespace) -> dict:
    context = prepare(task_name, model_dir, args)
    mean_flops = {key: value.get("mean_flops", context["full_flops"]) for key, value in context["thresholds"].items()}
    cells = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        # the Rust tokenizer's batch call uses every core unless told not to: one thread means one thread here too
        os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
        run = runners(context, threads, args)
        for batch in args.batch_sizes:
            key = f"b{batch}_t{threads}"
            cell = time_cell(run, batch, args.rounds, context["labels"])
            n = len(context["labels"])
            for name, row in cell["configs"].items():
                runtime, early = CONFIGS[name]
                row["inputs_per_s"] = n / row.pop("seconds")
                row["mean_flops"] = mean_flops.get(runtime, context["full_flops"]) if early else context["full_flops"]
            for name, row in cell["configs"].items():
                runtime, early = CONFIGS[name]
                full = cell["configs"].get(f"{runtime} full")
                if early and full:
                    row["vs_full"] = row["inputs_per_s"] / full["inputs_per_s"]
                    row["wall_over_flops"] = row["vs_full"] / (context["full_flops"] / row["mean_flops"])
            cells[key] = cell
            line = "  ".join(f"{name} {row['inputs_per_s']:.0f}/s" for name, row in cell["configs"].items())
            print(f"{task_name} {key} (load {cell['load_average']}): {line}", flush=True)
    return {
        "examples": len(context["labels"]),
        "max_length": context["max_length"],
        "model": str(model_dir),
        "full_fp32_accuracy": context["full_accuracy"],
        "full_mean_flops": context["full_flops"],
        "thresholds": context["thresholds"],
        "cells": cells,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, metavar="TASK=DIR", help="a fine-tuned model")
    parser.add_argument("--within", type=float, default=1.0, help="accuracy points below full fp32 allowed (EE)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-examples", type=int, default=None)
    parser.add_argument("--grid-points", type=int, default=40, help="entropy thresholds tried per calibration (of 40)")
    parser.add_argument("--pipeline", action=argparse.BooleanOptionalAction, default=True, help="the pipeline row")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=None, help="only these rows")
    parser.add_argument("--device", default="cpu", help="where the torch rows run (cuda: a GPU)")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/serving_bench"))
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "serving")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="wall time, or the thread's CPU time")
    args = parser.parse_args(argv)
    global clock
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    try:
        import onnxruntime
    except ImportError:
        sys.exit("bench/serving.py: needs the bench extra: pip install onnxruntime onnx")
    models = dict(spec.split("=", 1) for spec in args.model)
    results = {
        "cpu": platform.processor() or platform.machine(),
        "device": args.device,
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "ort_graph_optimization": "ORT_ENABLE_ALL",
        "int8_engine": torch.backends.quantized.engine,
        "rounds": args.rounds,
        "clock": args.clock,
        "command": " ".join(sys.argv),
        "tasks": {task: bench_task(task, Path(path), args) for task, path in models.items()},
    }
    args.output.mkdir(parents=True, exist_ok=True)
    write_json(args.output / "results.json", results)
    (args.output / "section.md").write_text(section(results, GOAL), encoding="utf-8")
    print(section(results, GOAL))
    return 0


if __name__ == "__main__":
    sys.exit(main())
