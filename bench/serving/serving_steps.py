"""What a layer step costs on a CPU, and how the engine should split a layer call into steps: the measurements
behind the runners' `StepCost` constants (`elasticbert.layer_runner.EAGER_CPU_STEP`,
`finetune.serve.onnx_runtime.ONNX_STEP_COST`).

1. Step time over rows x length (one thread, best of 3, layer 2 with its exit): a least-squares fit of
   `seconds = a + b * rows * length` over the steps of at most 512 tokens gives the call's fixed cost in tokens'
   worth (a / b), and the time per token of the larger steps against that fit says where steps slow down.
2. The real stream (dev set, entropy rule at `--threshold`, B inputs handed in at a time) with each layer call run
   as one step (no split) and as the cheapest steps for several `call_tokens`, interleaved rounds: inputs/s and the
   share of padded tokens, side by side.

    .venv/bin/python bench/serving/serving_steps.py --model SST-2=RUN/best --export DIR/ee_onnx --threshold 0.56
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

from bench.harness import GLUE_DIR  # noqa: E402
from elasticbert.exit_setting import EarlyExitSetting  # noqa: E402
from elasticbert.precision import for_inference  # noqa: E402
from finetune.data import load_tokenizer  # noqa: E402
from finetune.model import load_finetuned  # noqa: E402
from finetune.serve.inputs import TextInput  # noqa: E402
from finetune.serve.onnx_runtime import OnnxLayers  # noqa: E402
from finetune.serve.predict import EarlyExitClassifier, trained_max_length  # noqa: E402
from finetune.tasks import get_task, load_split  # noqa: E402

ROWS, LENGTHS = (1, 2, 4, 8, 16, 32), (8, 16, 32, 64)


def step_seconds(runner, rows: int, length: int) -> float:
    """Best-of-3 seconds of one step of layer 2 (index 1) with its exit on `rows` x `length` tokens."""
    hidden = torch.randn(rows, length, runner.config.hidden_size)
    mask = torch.ones(rows, length, dtype=torch.long)
    repeats = max(2, int(300 / (rows * length) ** 0.8))
    with torch.inference_mode():
        runner.step(1, hidden, mask, False, True)
        best = np.inf
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(repeats):
                runner.step(1, hidden, mask, False, True)
            best = min(best, (time.perf_counter() - start) / repeats)
    return best


def fit(runner, name: str) -> None:
    grid = {(b, n): step_seconds(runner, b, n) for b in ROWS for n in LENGTHS}
    small = [(b * n, s) for (b, n), s in grid.items() if b * n <= 512]
    tokens, seconds = np.array(small, dtype=np.float64).T
    per_token, fixed = np.polyfit(tokens, seconds, 1)
    print(f"{name}: fixed {1e3 * fixed:.3f} ms + {1e6 * per_token:.1f} us/token -> call_tokens {fixed / per_token:.1f}")
    for (b, n), s in sorted(grid.items(), key=lambda kv: kv[0][0] * kv[0][1]):
        if b * n > 512:
            slower = s / (fixed + per_token * b * n)
            print(f"  {b:>2} x {n:>2} ({b * n:>4} tokens): {1e3 * s:7.2f} ms, {slower:.2f}x the fit")


def stream_rate(classifier, inputs: list, batch: int) -> float:
    stream = classifier.stream(batch)
    start = time.perf_counter()
    for first in range(0, len(inputs), batch):
        stream.submit(inputs[first : first + batch])
        stream.ready()
    stream.flush()
    stream.ready()
    return len(inputs) / (time.perf_counter() - start)


def splits(classifier, inputs: list, batch: int, rounds: int, name: str) -> None:
    runner = classifier.runner
    measured = runner.step_cost
    settings = {
        "one step per call": None,
        **{f"call_tokens {c}": replace(measured, call_tokens=c) for c in (4, 8, 14, 28, 56)},
    }
    best = dict.fromkeys(settings, 0.0)
    for _ in range(rounds):
        for label, cost in settings.items():
            runner.step_cost = cost
            best[label] = max(best[label], stream_rate(classifier, inputs, batch))
    runner.step_cost = measured
    base = best["one step per call"]
    line = "  ".join(f"{label}: {rate:.0f}/s ({rate / base:.2f}x)" for label, rate in best.items())
    print(f"{name} stream at batch {batch} (constant in use: {measured.call_tokens}): {line}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, metavar="TASK=DIR")
    parser.add_argument("--export", type=Path, required=True, help="its `finetune export --layout onnx` directory")
    parser.add_argument("--threshold", type=float, required=True, help="entropy threshold of the stream runs")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runtimes", nargs="+", default=["ORT int8", "ORT fp32", "torch fp32", "torch int8"])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    task_name, model_dir = args.model.split("=", 1)
    task = get_task(task_name)
    model = load_finetuned(model_dir, require_trained=True).eval()
    tokenizer = load_tokenizer(model_dir)
    examples = load_split(task, GLUE_DIR, "dev")
    inputs = [TextInput(e.text_a, e.text_b, f"dev row {i}") for i, e in enumerate(examples)]
    served = {  # what the classifier serves (a model or ONNX steps), precision, the runner it gets
        "ORT int8": (OnnxLayers(args.export, "int8", 1), "int8"),
        "ORT fp32": (OnnxLayers(args.export, "fp32", 1), "fp32"),
        "torch fp32": (model, "fp32"),
        "torch int8": (for_inference(model, "int8"), "int8"),
    }
    for name in args.runtimes:
        what, precision = served[name]
        setting = EarlyExitSetting("entropy", args.threshold)
        classifier = EarlyExitClassifier(
            what, tokenizer, setting, max_length=trained_max_length(Path(model_dir)), task=task, precision=precision
        )
        fit(classifier.runner, name)
        splits(classifier, inputs, args.batch, args.rounds, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
