"""The ELUE score: operating points against a baseline's per-exit curve (the `elue-score` command is in `cli.py`).

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

The baseline is named in every printed score and in the JSON report (`baseline`: name, source, files, kind), so a
score against a model's own static curve is never mistaken for one against the official ElasticBERT baseline.

Input files (baseline and points alike):
- JSON ``{"name": ..., "source": ..., "tasks": {"SST-2": [{"flops": 1.2e9, "score": 90.1}, ...], ...}}`` -
  ``name`` names the system (default: the file's stem), ``source`` says where the numbers come from (printed with
  every score; for the official baseline: the paper's table or the ELUE site and the date read) -, or the bare
  ``{"SST-2": [[flops, score], ...]}``;
- CSV with a header ``task,flops,score`` (optional ``system`` column; ``#`` lines are comments);
- a result JSON of ``python -m finetune early-exit``: as a baseline its static per-layer curve is used (named "own
  static curve of MODEL"), as points each strategy is one system.
FLOPs are per sample (> 0; the same convention in baseline and points, e.g. `early-exit`'s ``mean_flops``); scores
are percentages within [-100, 100] (accuracy and F1 in [0, 100]; a correlation or MCC at a broken exit can be
negative). A baseline with two different scores at the same FLOPs for one task is refused (it
would otherwise be averaged silently); exact duplicates count once. Every problem names the file, and the line (CSV,
malformed JSON) or the key.

This project ships no official ELUE baseline numbers: pass them as a file (``--baseline elasticbert_base.json``)
with their source.

Submission files (one directory per operating point, for the ELUE site) are written by `finetune.score.submission`.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.errors import ConfigError
from common.io import path_problem, read_object

from ..serve.early_exit.sweep import is_early_exit_result
from ..tasks import DataError, get_task

OUT_OF_RANGE = ("clamp", "extrapolate", "drop", "error")

Points = list[tuple[float, float]]


# ------------------------------------------------------------------------------------------------------------ score


def task_key(name: str) -> str:
    """One key per task whatever the spelling: GLUE and ELUE versions of SST-2 / MRPC / STS-B compare as one."""
    try:
        return get_task(name).name.removeprefix("elue/")
    except DataError:
        return name


def point_problem(flops: float, score: float) -> str | None:
    """Why (flops, score) is not a valid ELUE point, or None."""
    if not (math.isfinite(flops) and flops > 0):
        return f"FLOPs must be a finite number > 0, got {flops:g}"
    if not (math.isfinite(score) and -100.0 <= score <= 100.0):
        return f"score must be a percentage within [-100, 100] (correlations and MCC can be negative), got {score:g}"
    return None


@dataclass(frozen=True)
class BaselineCurve:
    """A baseline's points sorted by FLOPs (two different scores at one FLOPs value are refused)."""

    flops: np.ndarray
    scores: np.ndarray

    @classmethod
    def from_points(cls, points: Sequence[tuple[float, float]], where: str = "baseline") -> BaselineCurve:
        if not points:
            raise DataError(f"{where}: a baseline curve needs at least one point")
        by_flops: dict[float, float] = {}
        for f, s in points:
            problem = point_problem(float(f), float(s))
            if problem:
                raise DataError(f"{where}: point ({f:g}, {s:g}): {problem}")
            if float(f) in by_flops and by_flops[float(f)] != float(s):
                raise DataError(
                    f"{where}: two scores ({by_flops[float(f)]:g} and {s:g}) at FLOPs {f:g}; a baseline curve has one "
                    "score per FLOPs value (pass one baseline file per model, or fix the duplicate)"
                )
            by_flops[float(f)] = float(s)
        if len(by_flops) < 2:
            raise DataError(
                f"{where}: one point at FLOPs {next(iter(by_flops)):g} is not a curve; a baseline needs the scores "
                "of at least two exits (one point per exit layer, e.g. an early-exit result's static curve)"
            )
        flops = np.array(sorted(by_flops))
        return cls(flops, np.array([by_flops[f] for f in flops]))

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


def task_score(baseline: Points, points: Points, out_of_range: str = "clamp", task: str = "") -> dict:
    """ELUE score of one system on one task, with every point's baseline value and status."""
    curve = BaselineCurve.from_points(baseline, f"baseline curve {task}".strip())
    detail, diffs = [], []
    for f, p in points:
        problem = point_problem(float(f), float(p))
        if problem:
            raise DataError(f"points of task {task or '?'}: ({f:g}, {p:g}): {problem}")
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


def elue_score(
    baseline: Mapping[str, Points],
    system: Mapping[str, Points],
    out_of_range: str = "clamp",
    baseline_info: Mapping | None = None,
) -> dict:
    """Per-task ELUE scores and their mean over the tasks the system has points for; `baseline_info` (name, source,
    files, kind) is carried into the report so that every score says what it was measured against."""
    base = {task_key(k): v for k, v in baseline.items()}
    tasks = {}
    for name, points in system.items():
        key = task_key(name)
        if key not in base:
            raise DataError(f"no baseline curve for task {name!r} (baseline has: {', '.join(sorted(base))})")
        tasks[key] = task_score(base[key], points, out_of_range, key)
    scored = [t["score"] for t in tasks.values() if t["score"] is not None]
    return {
        "score": float(np.mean(scored)) if scored else None,
        "baseline": dict(baseline_info or {"name": "unnamed baseline", "source": "not given"}),
        "tasks": tasks,
        "tasks_without_points": sorted(set(base) - set(tasks)),
        "out_of_range": out_of_range,
    }


# ------------------------------------------------------------------------------------------------------------ files


@dataclass
class CurveFile:
    """The systems of one file ({system: {task: points}}) and what the file says about itself."""

    path: Path
    systems: dict[str, dict[str, Points]]
    name: str
    source: str
    kind: str  # "points file" | "own static curve"


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or value is None or (isinstance(value, str) and not value.strip()):
        raise DataError(f"{where}: expected a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise DataError(f"{where}: expected a number, got {value!r}") from None
    return number


def _point(flops: object, score: object, where: str) -> tuple[float, float]:
    f, s = _number(flops, f"{where} flops"), _number(score, f"{where} score")
    problem = point_problem(f, s)
    if problem:
        raise DataError(f"{where}: {problem}")
    return f, s


def _points_from_list(rows: object, where: str) -> Points:
    if not isinstance(rows, list):
        raise DataError(f"{where}: expected a list of points, got {type(rows).__name__}")
    if not rows:
        raise DataError(f"{where}: no points; a task lists its operating points as [{{'flops': F, 'score': S}}, ...]")
    out = []
    for i, row in enumerate(rows):
        at = f"{where}[{i}]"
        if isinstance(row, Mapping):
            flops = row.get("flops", row.get("mean_flops"))
            if flops is None or row.get("score") is None:
                raise DataError(f"{at}: point {dict(row)!r} lacks 'flops' (or 'mean_flops') or 'score'")
            out.append(_point(flops, row["score"], at))
        elif isinstance(row, list | tuple) and len(row) == 2:
            out.append(_point(row[0], row[1], at))
        else:
            raise DataError(f"{at}: a point is {{'flops': F, 'score': S}} or [F, S], got {row!r}")
    return out


def _read_csv(path: Path) -> dict[str, dict[str, Points]]:
    systems: dict[str, dict[str, Points]] = {}
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err})") from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip() and line[:1] != "#"]
    if not lines:
        raise DataError(f"{path}: empty CSV (needs a header task,flops,score and rows)")
    reader = csv.DictReader([line for _, line in lines])
    missing = {"task", "flops", "score"} - set(reader.fieldnames or [])
    if missing:
        raise DataError(f"{path}:{lines[0][0]}: CSV header lacks {sorted(missing)} (needs task,flops,score)")
    for (number, _), row in zip(lines[1:], reader):
        where = f"{path}:{number}"
        if None in row or any(v is None for v in row.values()):
            raise DataError(f"{where}: expected {len(reader.fieldnames)} columns ({','.join(reader.fieldnames)})")
        if not row["task"].strip():
            raise DataError(f"{where}: empty task")
        name = (row.get("system") or "").strip() or path.stem
        systems.setdefault(name, {}).setdefault(row["task"].strip(), []).append(
            _point(row["flops"], row["score"], where)
        )
    if not systems:
        raise DataError(f"{path}: header only, no points")
    return systems


def _early_exit_curves(path: Path, data: Mapping, role: str) -> CurveFile:
    for key in ("task", "static", "strategies"):
        if key not in data:
            raise DataError(f"{path}: early-exit result lacks the key {key!r}")
    task, model = data["task"], data.get("model", "?")
    if role == "baseline":
        name = f"own static curve of {model}"
        source = (
            f"{path}: the static per-layer curve of the model's own exits (`finetune early-exit`), not ElasticBERT's"
        )
        return CurveFile(
            path,
            {"static": {task: _points_from_list(data["static"], f"{path}: static")}},
            name,
            source,
            "own static curve",
        )
    if not isinstance(data["strategies"], Mapping):
        raise DataError(f"{path}: 'strategies' must map a strategy to its points")
    systems = {}
    for name, entry in data["strategies"].items():
        if not isinstance(entry, Mapping) or "points" not in entry:
            raise DataError(f"{path}: strategies.{name} lacks 'points'")
        systems[name] = {task: _points_from_list(entry["points"], f"{path}: strategies.{name}.points")}
    return CurveFile(path, systems, str(model), str(path), "early-exit result")


def read_curve_file(path: str | Path, role: str = "points") -> CurveFile:
    """One baseline or points file (see the module docstring); `role`="baseline" reads an early-exit result's static
    curve, "points" its strategies (one system each)."""
    path = Path(path)
    if problem := path_problem(path):
        raise DataError(f"{path}: {problem}")
    if path.suffix.lower() == ".csv":
        systems = _read_csv(path)
        return CurveFile(path, systems, " + ".join(systems), str(path), "points file")
    data = read_object(path, DataError, "a JSON object (see `finetune elue-score --help` for the formats)")
    if is_early_exit_result(data):
        return _early_exit_curves(path, data, role)
    if "tasks" in data:
        tasks, name = data["tasks"], str(data.get("name") or path.stem)
        if not isinstance(tasks, Mapping):
            raise DataError(f"{path}: 'tasks' must map a task name to its points")
    else:
        tasks, name = data, path.stem
    if not tasks:
        raise DataError(f"{path}: no tasks")
    curves = {task: _points_from_list(rows, f"{path}: tasks.{task}") for task, rows in tasks.items()}
    source = str(data.get("source") or f"{path} (no 'source' given)")
    return CurveFile(path, {name: curves}, name, source, "points file")


def load_curves(path: str | Path, role: str = "points") -> dict[str, dict[str, Points]]:
    """{system: {task: [(flops, score), ...]}} from a JSON/CSV file (see `read_curve_file`)."""
    return read_curve_file(path, role).systems


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
    return load_baseline_with_info(paths)[0]


def load_baseline_with_info(paths: Sequence[str | Path]) -> tuple[dict[str, Points], dict]:
    """Baseline curves by task, and what they are: name, source, files and kind (printed with every score)."""
    merged: dict[str, Points] = {}
    files = [read_curve_file(path, role="baseline") for path in paths]
    for part in files:
        for tasks in part.systems.values():
            for task, points in tasks.items():
                merged.setdefault(task_key(task), []).extend(points)
    for task, points in merged.items():  # duplicates and ranges refused here, naming the files
        BaselineCurve.from_points(points, f"baseline {', '.join(str(f.path) for f in files)}: task {task}")
    info = {
        "name": " + ".join(f.name for f in files),
        "source": "; ".join(f.source for f in files),
        "files": [str(f.path) for f in files],
        "kind": " + ".join(sorted({f.kind for f in files})),
    }
    return merged, info
