"""What the benches share, in one place: where the repository and the shared data are, the clock and the load
average a figure is reported with, a command timed with its peak memory, the best of interleaved rounds, the matmul
peak that MFU is a fraction of, model sizes, ONNX Runtime sessions, and results written atomically.

bench/ is not an installed package. Every bench, in its stage's folder, starts the same way, which puts the repository
first on the path (the project's packages and `bench.*`) whether it is run as `python bench/STAGE/NAME.py` or
imported by a test:

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness, the packages
    from bench.harness import REPO, ...  # noqa: E402
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from common.io import atomic_write_json, make_dirs
from experiments.common import GLUE_DIR, REPO, RESULTS_DIR, SHARED_DATA

CORPUS = SHARED_DATA / "corpus"  # ../shared/data/corpus: Gutenberg books and WikiText, read in place
GUTENBERG = CORPUS / "gutenberg"
VOCAB = 30522  # bert-base-uncased's vocabulary size, the benches' default
__all__ = ["CORPUS", "GLUE_DIR", "GUTENBERG", "REPO", "RESULTS_DIR", "SHARED_DATA", "VOCAB"]


class Clock:
    """The benches' clock: wall time (`--clock wall`, the figures to report from a quiet machine), or the calling
    thread's CPU time (`--clock cpu`: when one thread computes everything on the calling thread, on a loaded machine
    this is the work itself without the waits for a core; it cannot see time spent waiting on memory or other
    threads). One object, so every module of a bench reads the clock its command line chose."""

    KINDS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}

    def __init__(self) -> None:
        self.kind, self._now = "wall", time.perf_counter

    def __call__(self) -> float:
        return self._now()

    def use(self, kind: str) -> None:
        self.kind, self._now = kind, self.KINDS[kind]

    @staticmethod
    def add_option(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--clock", choices=tuple(Clock.KINDS), default="wall", help="wall time, or the thread's CPU time"
        )


clock = Clock()


def load_average() -> float:
    """The 1-minute load average, printed and recorded beside every figure (the machine is shared)."""
    return os.getloadavg()[0]


def machine_line() -> str:
    return f"{os.cpu_count()} CPUs, load average {load_average():.2f}"


def run_timed(cmd: list[str], env: dict | None = None, cwd: Path = REPO) -> dict:
    """Wall and CPU time (children included) and peak RSS (the largest process; `/usr/bin/time -v`) of one command;
    exits with the command's output when it fails."""
    start = time.perf_counter()
    run = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env, cwd=cwd)
    wall = time.perf_counter() - start
    if run.returncode:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}")
    return {"wall_s": wall, **time_v_fields(run.stderr)}


def time_v_fields(stderr: str) -> dict:
    """CPU seconds and peak RSS (MB) from `/usr/bin/time -v`'s report."""
    fields = dict(re.findall(r"^\s*(.+?):\s+(.+)$", stderr, re.M))
    cpu = float(fields["User time (seconds)"]) + float(fields["System time (seconds)"])
    return {"cpu_s": cpu, "max_rss_mb": int(fields["Maximum resident set size (kbytes)"]) / 1024}


def best_of_rounds(variants: dict[str, Callable[[], Any]], rounds: int, warmup: bool = False) -> dict[str, float]:
    """The fastest of `rounds` runs of each variant, the variants interleaved within every round (A B A B …, so
    that a noisy neighbour slows both sides alike; other processes only ever add time). `warmup`: one untimed round
    first."""
    best = dict.fromkeys(variants, float("inf"))
    for r in range(rounds + int(warmup)):
        for name, run in variants.items():
            start = clock()
            run()
            if r or not warmup:
                best[name] = min(best[name], clock() - start)
    return best


def matmul_peak(dtype: Any = None, sizes: Iterable[int] = (1024, 2048), reps: int = 3) -> float:
    """FLOP/s of the fastest square matmul on this CPU: the peak that an MFU figure divides by."""
    import torch

    dtype = dtype or torch.float32
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        a @ b
        for _ in range(reps):
            start = time.perf_counter()
            a @ b
            best = max(best, 2 * n**3 / (time.perf_counter() - start))
    return best


def bert_size(hidden: int, layers: int, heads: int | None = None, vocab: int = VOCAB) -> dict:
    """The fields of a BERT of this width and depth, for `BertConfig` and `ElasticBertConfig` alike: heads of 64
    dimensions unless given, a feed-forward 4× the width."""
    return {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads or hidden // 64,
        "intermediate_size": 4 * hidden,
    }


def ort_session(
    model: str | Path | bytes,
    threads: int = 1,
    providers: Iterable[str] = ("CPUExecutionProvider",),
    spin: bool = False,
) -> Any:
    """An ONNX Runtime session as the benches time it: `threads` intra-op threads, one inter-op, every graph
    optimisation, warnings off; without spinning threads unless `spin` (a spinning pool burns the core a
    neighbouring measurement needs)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, options, providers=list(providers))


def write_result(path: Path, obj: Any, indent: int = 1) -> None:
    """A results file, written atomically (a killed bench never leaves one that looks complete)."""
    make_dirs(Path(path).parent)
    atomic_write_json(path, obj, indent=indent)
