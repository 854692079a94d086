"""What every experiment script shares: run a project command, time it, keep results atomically, summarise seeds.

Experiments drive the project's own command-line tools (`python -m data_prep|pretrain|finetune ...`) in
subprocesses, exactly as a user would, so the numbers in docs/results.md come from the shipped code paths.
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
GLUE_DIR = SHARED_DATA / "glue"
RESULTS_DIR = REPO / "docs" / "results"
SEEDS = (1, 2, 3)


def run_cli(module: str, args: list[str], log: Path, threads: int = 1, env: dict | None = None) -> float:
    """Run `python -m module args`, appending its output to `log`; return wall seconds. Fails with the log's tail."""
    cmd = [sys.executable, "-m", module, *map(str, args)]
    log.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), **(env or {})}
    start = time.perf_counter()
    with open(log, "a", encoding="utf-8") as f:
        f.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        f.flush()
        code = subprocess.run(cmd, cwd=REPO, env=full_env, stdout=f, stderr=subprocess.STDOUT).returncode
    if code:
        lines = log.read_text(errors="replace").splitlines()[-30:]
        raise RuntimeError(f"{module} {' '.join(map(str, args))} failed (exit {code}); {log}:\n" + "\n".join(lines))
    return time.perf_counter() - start


def cpu_seconds() -> float:
    """User + system CPU time of this process and of its finished children (the budget is stated in CPU time: on
    a shared machine wall time depends on everyone else's load)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def write_json(path: Path, data: object) -> None:
    """Write to a temporary name, then rename: a killed experiment never leaves a results file looking complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def fmt_mean_std(values: list[float], digits: int = 1) -> str:
    mean, std = mean_std(values)
    return f"{mean:.{digits}f} ± {std:.{digits}f}"
