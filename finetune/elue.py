"""The ELUE score: operating points against a baseline's per-exit curve, and the `elue-score` command.

ELUE score of a system on one task (Liu et al., 2022): given the baseline's points (FLOPs_j, score_j) - ElasticBERT-base
at each exit layer - linearly interpolated into p_EB(f), and the system's operating points (f_i, p_i),

    score = mean_i ( p_i − p_EB(f_i) ),

and the benchmark score is the mean of the per-task scores. Scores are in the units of the inputs (percent here, as
ELUE prints them); FLOPs are per sample, interpolated linearly (not in log space).

Outside the baseline's FLOPs range p_EB is not defined by the curve; `out_of_range` says what to do:
- ``clamp`` (default): hold the nearest end point, i.e. p_EB(f) = p_EB(f_min) below the range and p_EB(f_max) above.
  Below the range this credits the baseline with accuracy it may not reach at those FLOPs (conservative for the
  system); above it, it says the baseline gains nothing from more compute than its full model.
- ``extrapolate``: extend the first / last segment linearly (can leave [0, 100] far from the range).
- ``drop``: leave such points out of the mean (reported as dropped).
- ``error``: refuse.
Each point's status (in range / below / above) is reported with its value, so any choice can be audited.

Input files (baseline and points alike):
- JSON ``{"tasks": {"SST-2": [{"flops": 1.2e9, "score": 90.1}, ...], ...}}`` (a ``"name"`` key names the system), or
  ``{"SST-2": [[flops, score], ...]}``;
- CSV with a header ``task,flops,score`` (optional ``system`` column);
- a result JSON of ``python -m finetune early-exit``: as a baseline its static per-layer curve is used, as points
  each strategy is one system.

Submission files (one directory per operating point, for the ELUE site) are written by `finetune.submission`.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.cli import add_output
from common.errors import ConfigError
from common.io import atomic_write_json

from .early_exit.sweep import is_early_exit_result
from .tasks import DataError, get_task

OUT_OF_RANGE = ("clamp", "extrapolate", "drop", "error")

Points = list[tuple[float, float]]


# ------------------------------------------------------------------------------------------------------------ score


def task_key(name: str) -> str:
    """One key per task whatever the spelling: GLUE and ELUE versions of SST-2 / MRPC / STS-B compare as one."""
    try:
        return get_task(name).name.removeprefix("elue/")
    except DataError:
        return name


@dataclass(frozen=True)
class BaselineCurve:
    """A baseline's points sorted by FLOPs (scores at equal FLOPs averaged)."""

    flops: np.ndarray
    scores: np.ndarray

    @classmethod
    def from_points(cls, points: Sequence[tuple[float, float]]) -> BaselineCurve:
        if not points:
            raise DataError("a baseline curve needs at least one point")
        by_flops: dict[float, list[float]] = {}
        for f, s in points:
            if not (math.isfinite(f) and math.isfinite(s)):
                raise DataError(f"baseline point ({f}, {s}) is not finite")
            by_flops.setdefault(float(f), []).append(float(s))
        flops = np.array(sorted(by_flops))
        return cls(flops, np.array([np.mean(by_flops[f]) for f in flops]))

    def value(self, f: float, out_of_range: str = "clamp") -> tuple[float | None, str]:
        """p_EB(f) and where f lies ('in', 'below', 'above'); None when the policy drops the point."""
        if out_of_range not in OUT_OF_RANGE:
            raise ConfigError(f"out_of_range must be one of {OUT_OF_RANGE}, not {out_of_range!r}")
        lo, hi = self.flops[0], self.flops[-1]
        status = "below" if f < lo else "above" if f > hi else "in"
        if status == "in":
            return float(np.interp(f, self.flops, self.scores)), status
        if out_of_range == "error":
            raise DataError(f"FLOPs {f:.6g} outside the baseline's range [{lo:.6g}, {hi:.6g}]")
        if out_of_range == "drop":
            return None, status
        if out_of_range == "extrapolate" and len(self.flops) > 1:
            i = 0 if status == "below" else len(self.flops) - 2
            slope = (self.scores[i + 1] - self.scores[i]) / (self.flops[i + 1] - self.flops[i])
            return float(self.scores[i] + slope * (f - self.flops[i])), status
        return float(self.scores[0] if status == "below" else self.scores[-1]), status


def task_score(baseline: Points, points: Points, out_of_range: str = "clamp") -> dict:
    """ELUE score of one system on one task, with every point's baseline value and status."""
    curve = BaselineCurve.from_points(baseline)
    detail, diffs = [], []
    for f, p in points:
        base, status = curve.value(float(f), out_of_range)
        entry = {"flops": float(f), "score": float(p), "baseline": base, "status": status}
        if base is not None:
            entry["difference"] = float(p) - base
            diffs.append(entry["difference"])
        detail.append(entry)
    return {
        "score": float(np.mean(diffs)) if diffs else None,
        "points": detail,
        "used": len(diffs),
        "dropped": len(detail) - len(diffs),
    }


def elue_score(baseline: Mapping[str, Points], system: Mapping[str, Points], out_of_range: str = "clamp") -> dict:
    """Per-task ELUE scores and their mean over the tasks the system has points for."""
    base = {task_key(k): v for k, v in baseline.items()}
    tasks = {}
    for name, points in system.items():
        key = task_key(name)
        if key not in base:
            raise DataError(f"no baseline curve for task {name!r} (baseline has: {', '.join(sorted(base))})")
        tasks[key] = task_score(base[key], points, out_of_range)
    scored = [t["score"] for t in tasks.values() if t["score"] is not None]
    return {
        "score": float(np.mean(scored)) if scored else None,
        "tasks": tasks,
        "tasks_without_points": sorted(set(base) - set(tasks)),
        "out_of_range": out_of_range,
    }


# ------------------------------------------------------------------------------------------------------------ files


def _points_from_list(rows: Sequence, where: str) -> Points:
    out = []
    for row in rows:
        if isinstance(row, Mapping):
            f, s = row.get("flops", row.get("mean_flops")), row.get("score")
        else:
            f, s = row
        if f is None or s is None:
            raise DataError(f"{where}: point {row!r} lacks flops or score")
        out.append((float(f), float(s)))
    return out


def load_curves(path: str | Path, role: str = "points") -> dict[str, dict[str, Points]]:
    """{system: {task: [(flops, score), ...]}} from a JSON/CSV file. `role`="baseline" reads an early-exit result's
    static curve; "points" reads its strategies (one system each)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if path.suffix.lower() == ".csv":
        systems: dict[str, dict[str, Points]] = {}
        with path.open(encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = {"task", "flops", "score"} - set(reader.fieldnames or [])
            if missing:
                raise DataError(f"{path}: CSV header lacks {sorted(missing)} (needs task,flops,score)")
            for row in reader:
                name = row.get("system") or path.stem
                systems.setdefault(name, {}).setdefault(row["task"], []).append(
                    (float(row["flops"]), float(row["score"]))
                )
        return systems
    data = json.loads(path.read_text(encoding="utf-8"))
    if is_early_exit_result(data):
        task = data["task"]
        if role == "baseline":
            return {"static": {task: _points_from_list(data["static"], f"{path} static")}}
        return {
            name: {task: _points_from_list(entry["points"], f"{path} {name}")}
            for name, entry in data["strategies"].items()
        }
    if isinstance(data, Mapping) and "tasks" in data:
        tasks = data["tasks"]
        name = data.get("name", path.stem)
    elif isinstance(data, Mapping):
        tasks, name = data, path.stem
    else:
        raise DataError(f"{path}: expected a JSON object")
    return {name: {task: _points_from_list(rows, f"{path} {task}") for task, rows in tasks.items()}}


def merge_systems(parts: Sequence[dict[str, dict[str, Points]]]) -> dict[str, dict[str, Points]]:
    """Several --points files (e.g. one per task) -> one {system: {task: points}}."""
    out: dict[str, dict[str, Points]] = {}
    for part in parts:
        for name, tasks in part.items():
            for task, points in tasks.items():
                out.setdefault(name, {}).setdefault(task, []).extend(points)
    return out


def load_baseline(paths: Sequence[str | Path]) -> dict[str, Points]:
    """Baseline curves by task from one or more files (all systems in them are pooled per task)."""
    merged: dict[str, Points] = {}
    for path in paths:
        for tasks in load_curves(path, role="baseline").values():
            for task, points in tasks.items():
                merged.setdefault(task, []).extend(points)
    return merged


# -------------------------------------------------------------------------------------------------------------- CLI


def format_table(name: str, report: Mapping) -> str:
    lines = [f"system {name}: ELUE score {_fmt(report['score'])} (out-of-range: {report['out_of_range']})"]
    for task, entry in report["tasks"].items():
        lines.append(f"  {task:10s} {_fmt(entry['score'])}  ({entry['used']} points, {entry['dropped']} dropped)")
        for pt in entry["points"]:
            lines.append(
                f"      FLOPs {pt['flops']:.4g}  score {pt['score']:.2f}  baseline {_fmt(pt['baseline'])}"
                f"  [{pt['status']}]"
            )
    if report["tasks_without_points"]:
        lines.append(f"  (no points for: {', '.join(report['tasks_without_points'])})")
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f}" if abs(x) < 50 else f"{x:.2f}"


def add_subparser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `elue-score` on the `python -m finetune` command line."""
    p = subparsers.add_parser(
        "elue-score",
        help="ELUE score of operating points against a baseline per-exit curve",
        description="score = mean_i (p_i - p_EB(f_i)) per task with p_EB linearly interpolated from the baseline's "
        "points; the benchmark score is the mean over tasks. See finetune/elue.py for the file formats.",
    )
    p.add_argument("--baseline", required=True, nargs="+", help="baseline curve file(s): JSON, CSV or early-exit JSON")
    p.add_argument("--points", required=True, nargs="+", help="system points file(s): JSON, CSV or early-exit JSON")
    p.add_argument("--out-of-range", choices=OUT_OF_RANGE, default="clamp")
    p.add_argument("--system", default=None, help="score only this system (e.g. one strategy)")
    add_output(p, "write the full report as JSON here", required=False)
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    """`python -m finetune elue-score ...`"""
    baseline = load_baseline(args.baseline)
    systems = merge_systems([load_curves(path, role="points") for path in args.points])
    if args.system:
        if args.system not in systems:
            raise ConfigError(f"no system {args.system!r} in --points (have: {', '.join(systems)})")
        systems = {args.system: systems[args.system]}
    report = {name: elue_score(baseline, tasks, args.out_of_range) for name, tasks in systems.items()}
    for name, entry in report.items():
        print(format_table(name, entry))
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.output, report, indent=1)
    return 0
