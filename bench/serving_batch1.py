"""Where a request's time goes at batch 1: early exit on the ONNX Runtime int8 steps against the full model on ONNX
Runtime int8 (`bench/serving.py`'s two rows of issue 48's batch-1 goal), taken apart.

One thread, the task's dev set handed in one input at a time, best of `--rounds` interleaved rounds:

- `full`: tokenise (the Rust backend) + one session run of the whole model + argmax, per input;
- `EE`: the serving stream (`EarlyExitClassifier.stream(1)`: verdicts, tokenising, checks, the queue engine, the exit
  rule, the record), with the runner's steps timed inside it: steps per input and their time in the stream;
- `EE, steps free`: the same stream with every step replaced by its cached output: the stream's own Python alone;
- hot, at the dev set's median length: one step (layer 2 with its exit) run back to back, and the full model's run
  divided by its layers;
- the one-file model (issue 60): the Rust tokenizer alone, the full model's and the one int8 file's session runs
  alone (inputs tokenised beforehand), each tokenize + run + argmax as a user's loop does it, and our stream on the
  one file (`EarlyExitClassifier.stream(1)`).

From these: what the stream spends outside the steps, what a step costs in the stream against hot and against a
layer of the full model, and the wall ÷ FLOPs the early-exit row would reach if its steps cost what the full model's
layers do and its Python what the full row's does — the ceiling of the one-session-per-layer design here.

    .venv/bin/python bench/serving_batch1.py --model SST-2=RUN/best --work-dir WORK --threshold 0.5767

WORK is `bench/serving.py`'s `--work-dir` (WORK/TASK/ee_onnx and WORK/TASK/model_int8.onnx, made there).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import serving  # noqa: E402
from bench.serving import full_runner, onnx_sessions, rust_encoder  # noqa: E402
from elasticbert.exit_setting import EarlyExitSetting  # noqa: E402
from experiments.common import GLUE_DIR, write_json  # noqa: E402
from finetune.data import EncodedSplit, load_tokenizer  # noqa: E402
from finetune.model import load_finetuned  # noqa: E402
from finetune.serve.early_exit import static_flops  # noqa: E402
from finetune.serve.inputs import TextInput  # noqa: E402
from finetune.serve.onnx_runtime import OnnxLayers  # noqa: E402
from finetune.serve.predict import EarlyExitClassifier, trained_max_length  # noqa: E402
from finetune.tasks import get_task, load_split  # noqa: E402


class TimedSteps:
    """The runner's `step`, timed (`free`: each (layer, shape) run once, then its output handed back at no cost)."""

    def __init__(self, runner: OnnxLayers) -> None:
        self.runner, self.step, self.free = runner, runner.step, False
        self.seconds, self.calls, self.cache = 0.0, 0, {}
        runner.step = self

    def __call__(self, index, inputs, mask, padded, with_exit):
        key = (index, tuple(mask.shape), with_exit)
        if self.free and key in self.cache:
            self.calls += 1
            return self.cache[key]
        start = clock()
        out = self.step(index, inputs, mask, padded, with_exit)
        self.seconds += clock() - start
        self.calls += 1
        self.cache[key] = out
        return out


# The bench's clock: wall time (`--clock wall`, the figures to report from a quiet machine), or the calling thread's
# CPU time (`--clock cpu`: one thread computes everything on the calling thread, so on a loaded machine this is the
# work itself, without the waits for a core; it cannot see time spent waiting on memory or other threads).
clock = time.perf_counter


def stream_pass(
    classifier: EarlyExitClassifier, inputs: list[TextInput], one_file: bool = False
) -> tuple[float, list[dict]]:
    """Seconds to serve `inputs` one at a time, and the records (`one_file`: the export's one file serves, else the
    per-layer queues)."""
    stream, records = classifier.stream(1, one_file=one_file), []
    start = clock()
    for item in inputs:
        stream.submit([item])
        stream.flush()
        records += [record for _, record in stream.ready()]
    return clock() - start, records


def hot_ms(run, repeats: int = 300) -> float:
    """Best-of-3 milliseconds of `run()` called back to back."""
    run()
    best = np.inf
    for _ in range(3):
        start = clock()
        for _ in range(repeats):
            run()
        best = min(best, (clock() - start) / repeats)
    return 1e3 * best


def measure(task_name: str, model_dir: Path, work: Path, threshold: float, rounds: int) -> dict:
    task = get_task(task_name)
    examples = load_split(task, GLUE_DIR, "dev")
    tokenizer, max_length = load_tokenizer(model_dir), trained_max_length(model_dir)
    model = load_finetuned(model_dir, require_trained=True).eval()
    texts = [e.text_a if e.text_b is None else (e.text_a, e.text_b) for e in examples]
    inputs = [TextInput(e.text_a, e.text_b, f"dev row {i}") for i, e in enumerate(examples)]
    session = onnx_sessions(model, work, 1)["ORT int8"]
    full = full_runner(texts, rust_encoder(tokenizer, max_length), lambda feed: session.run(None, feed)[0])
    runner = OnnxLayers(work / "ee_onnx", "int8", 1)
    steps = TimedSteps(runner)
    setting = EarlyExitSetting("entropy", threshold)
    classifier = EarlyExitClassifier(runner, tokenizer, setting, max_length=max_length, task=task, precision="int8")
    n, best = len(inputs), {"full": np.inf, "EE": np.inf, "EE, steps free": np.inf}
    step_ms = calls = flops = np.inf
    for _ in range(rounds):
        start = clock()
        full(1)
        best["full"] = min(best["full"], clock() - start)
        for free in (False, True):
            steps.free, steps.seconds, steps.calls = free, 0.0, 0
            seconds, records = stream_pass(classifier, inputs)
            name = "EE, steps free" if free else "EE"
            if seconds < best[name]:
                best[name] = seconds
                if not free:
                    step_ms, calls = 1e3 * steps.seconds / steps.calls, steps.calls / n
                    flops = float(np.mean([r["flops"] for r in records]))
    split = EncodedSplit.from_examples(tokenizer, examples, max_length)
    parts = one_file_parts(texts, rust_encoder(tokenizer, max_length), session, work / "ee_onnx", threshold, rounds)
    parts["ours, one file"] = min(stream_pass(classifier, inputs, one_file=True)[0] for _ in range(rounds)) * 1e3 / n
    length = int(np.median(split.lengths.numpy()))
    hidden, mask = torch.randn(1, length, model.config.hidden_size), torch.ones(1, length, dtype=torch.long)
    steps.free = False
    step_hot = hot_ms(lambda: steps(1, hidden, mask, False, True))
    ids = np.full((1, length), 1000, dtype=np.int64)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    layer_hot = hot_ms(lambda: session.run(None, feed)) / model.exit_layers[-1]
    full_flops = float(static_flops(model.config, split.lengths, model.exit_layers[-1]).mean())
    ms = {name: 1e3 * seconds / n for name, seconds in best.items()}
    full_other = ms["full"] - layer_hot * model.exit_layers[-1]  # tokenising, feeds, argmax (the run taken hot)
    speedup, flops_speedup = ms["full"] / ms["EE"], full_flops / flops
    ceiling = ms["full"] / (calls * layer_hot + full_other) / flops_speedup
    return {
        "examples": n,
        "median_length": length,
        "ms_per_input": ms,
        "steps_per_input": calls,
        "step_ms_in_stream": step_ms,
        "step_ms_hot": step_hot,
        "full_layer_ms_hot": layer_hot,
        "stream_python_ms": ms["EE"] - calls * step_ms,
        "full_outside_run_ms": full_other,
        "speedup": speedup,
        "flops_speedup": flops_speedup,
        "wall_over_flops": speedup / flops_speedup,
        "wall_over_flops_ceiling": ceiling,
        "one_file_ms_per_input": parts,
        "one_file_wall_over_flops": parts["full: tokenize + run + argmax"]
        / parts["one file: tokenize + run + argmax"]
        / flops_speedup,
    }


def one_file_parts(texts: list, encode, full_session, export: Path, threshold: float, rounds: int) -> dict:
    """Milliseconds per input, one at a time, best of `rounds` interleaved: the Rust tokenizer alone, each model's
    session run alone (inputs tokenised beforehand), and tokenize + run + argmax (what a user's loop does), for the
    full model and the export's one int8 file (`threshold` fed)."""
    import onnxruntime as ort

    from finetune.serve.onnx_single import SINGLE_FILES

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads, options.log_severity_level = 1, 1, 3
    one = ort.InferenceSession(str(export / SINGLE_FILES["int8"]), options, providers=["CPUExecutionProvider"])
    rule = {"threshold": np.array(threshold, dtype=np.float32)}
    feeds = [encode([text]) for text in texts]
    runs = {
        "tokenize": lambda: [encode([text]) for text in texts],
        "full: run": lambda: [full_session.run(None, feed) for feed in feeds],
        "one file: run": lambda: [one.run(["logits"], {**feed, **rule}) for feed in feeds],
        "full: tokenize + run + argmax": lambda: [
            full_session.run(None, encode([text]))[0].argmax(-1) for text in texts
        ],
        "one file: tokenize + run + argmax": lambda: [
            one.run(["logits"], {**encode([text]), **rule})[0].argmax(-1) for text in texts
        ],
    }
    best = dict.fromkeys(runs, np.inf)
    for _ in range(rounds):
        for name, run in runs.items():
            start = clock()
            run()
            best[name] = min(best[name], clock() - start)
    return {name: 1e3 * seconds / len(texts) for name, seconds in best.items()}


def report(task: str, r: dict) -> str:
    ms = r["ms_per_input"]
    return "\n".join(
        [
            f"{task} dev ({r['examples']} inputs, median {r['median_length']} tokens), batch 1, one thread:",
            f"  full model, ORT int8: {ms['full']:.3f} ms per input ({r['full_layer_ms_hot']:.3f} ms per layer hot, "
            f"{r['full_outside_run_ms']:.3f} ms outside the run)",
            f"  early exit, ORT int8 steps: {ms['EE']:.3f} ms per input = {r['steps_per_input']:.2f} steps x "
            f"{r['step_ms_in_stream']:.3f} ms + {r['stream_python_ms']:.3f} ms of the stream's own "
            f"({ms['EE, steps free']:.3f} ms with the steps free, hot)",
            f"  a step: {r['step_ms_in_stream']:.3f} ms in the stream, {r['step_ms_hot']:.3f} ms hot, against "
            f"{r['full_layer_ms_hot']:.3f} ms per layer of the full model",
            f"  speed-up {r['speedup']:.2f}x for {r['flops_speedup']:.2f}x fewer FLOPs: wall / FLOPs "
            f"{r['wall_over_flops']:.2f}; with steps at a full-model layer's cost and the full row's Python: "
            f"{r['wall_over_flops_ceiling']:.2f}",
            "  one file (ms per input): "
            + ", ".join(f"{name} {ms:.3f}" for name, ms in r["one_file_ms_per_input"].items())
            + f"; wall / FLOPs of the one file served plainly: {r['one_file_wall_over_flops']:.2f}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, metavar="TASK=DIR")
    parser.add_argument("--work-dir", type=Path, required=True, help="bench/serving.py's --work-dir")
    parser.add_argument("--threshold", type=float, action="append", required=True, help="entropy τ, per --model")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=None, help="write results.json here")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="wall time, or the thread's CPU time")
    args = parser.parse_args(argv)
    global clock
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    serving.clock = clock  # full_runner's
    if len(args.threshold) != len(args.model):
        parser.error("give one --threshold per --model")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    torch.set_num_threads(1)
    results = {}
    with torch.inference_mode():
        for spec, threshold in zip(args.model, args.threshold):
            task, _, directory = spec.partition("=")
            results[task] = measure(task, Path(directory), args.work_dir / get_task(task).name, threshold, args.rounds)
            print(report(task, results[task]), flush=True)
    if args.output is not None:
        write_json(
            args.output / "results.json", {"load_average": os.getloadavg(), "clock": args.clock, "tasks": results}
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
