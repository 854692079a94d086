"""Choosing an operating point from an `early-exit` result by a rule, for `predict` and `save-early-exit`.

`--operating-point RESULT.json[:RULE]`, RULE one of (default `fastest-within=1.0`):
- `fastest-within=D`: the point with the fewest mean FLOPs whose score is at least the full model's minus D (in the
  task's score units: accuracy points for SST-2); the full model itself (strategy `static`) is such a point, so the
  rule always finds one and says so when nothing faster qualifies;
- `best`: the highest score (ties: fewer FLOPs);
- `STRATEGY=THRESHOLD`, e.g. `entropy=0.1386`: that point of the sweep.
`--strategy S` next to it restricts the candidates to S's points. FLOPs are the deciding cost because they are exact
(wall times of a sweep are single noisy passes). `fastest-within` and `best` never choose a point whose threshold
decides without the input (`elasticbert.exit_setting.degenerate_problem`: patience 0 in sweeps of earlier versions).
The point is an `EarlyExitSetting` (the rule's parameters: PCEE's patience, PABEE's delta, the LTE head file the
sweep used, the precision it ran at) plus what the sweep measured of it and the maximum length it was measured at.
`chosen_setting` turns the options `predict` and `save-early-exit` share into a setting.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from common.config import finite_float
from common.errors import ConfigError
from common.io import read_object
from elasticbert.exit_setting import EarlyExitSetting, degenerate_problem
from elasticbert.precision import PRECISIONS

from ...tasks import DataError, get_task
from .rules import PREDICT_STRATEGIES
from .sweep import is_early_exit_result

DEFAULT_RULE = "fastest-within=1.0"


@dataclass(frozen=True)
class OperatingPoint:
    """A setting (one rule at one threshold, at the precision the sweep ran at, with the LTE head file it used) and
    what the sweep measured of it: score and mean FLOPs on the sweep's split, against the full model's."""

    setting: EarlyExitSetting
    score: float | None = None
    mean_flops: float | None = None
    full_score: float | None = None
    full_flops: float | None = None
    max_length: int | None = None
    model: str | None = None
    task: str | None = None
    source: str = ""
    model_dir: str | None = None  # the sweep's model folder, resolved when it ran (its result's identity)

    def describe(self) -> str:
        """One line for the log: the point, where it came from, and what it costs and scores against the full model."""
        parts = [f"{self.setting.describe()} ({self.setting.precision}) from {self.source}"]
        if self.score is not None and self.full_score is not None:
            parts.append(f"score {self.score:.2f} vs the full fp32 model's {self.full_score:.2f}")
        if self.mean_flops and self.full_flops:
            parts.append(f"FLOPs x{self.full_flops / self.mean_flops:.2f} fewer")
        return ", ".join(parts)


def chosen_setting(
    operating_point: str | OperatingPoint | None,
    strategy: str | None,
    threshold: float | None,
    **overrides: object,
) -> tuple[EarlyExitSetting | None, OperatingPoint | None]:
    """The setting options name, and the operating point it came from: `operating_point` (`RESULT.json[:RULE]`,
    among `strategy`'s points when given), else `strategy` at `threshold`, else (None, None); `overrides` that are
    not None (patience, delta, lte_head) replace the setting's. Only checks that the options do not contradict each
    other: the setting itself is checked where its rule is made (`elasticbert.early_exit.rule_for`)."""
    point = None
    if operating_point is not None:
        if threshold is not None:
            raise ConfigError("--operating-point chooses the threshold: pass it or --threshold, not both")
        point = operating_point
        if not isinstance(point, OperatingPoint):
            point = choose_operating_point(operating_point, strategy)
        setting = point.setting
    elif strategy is not None:
        setting = EarlyExitSetting(strategy, threshold)
    elif threshold is not None:
        raise ConfigError("--threshold needs --strategy (each strategy has its own threshold scale)")
    else:
        return None, None
    return replace(setting, **{k: v for k, v in overrides.items() if v is not None}), point


def run_precision(asked: str | None, calibrated: str | None, strategy: str) -> str:
    """The precision to run a threshold at: the one asked for, else the one it was chosen at (`calibrated`; None: a
    threshold given by hand), else fp32. A threshold chosen at one precision and run at another is refused (its
    accuracy was measured on other logits)."""
    if asked is not None and calibrated is not None and asked != calibrated and strategy != "static":
        raise ConfigError(
            f"precision {asked}: this {strategy} threshold was chosen at {calibrated}; sweep at {asked} "
            f"(early-exit --precision {asked}) for a threshold whose accuracy holds there, or pass --precision "
            f"{calibrated}"
        )
    return asked or calibrated or "fp32"


def load_result(path: str | Path) -> dict:
    """An `early-exit` result JSON; a missing, unreadable or foreign file names itself."""
    data = read_object(path, DataError, "an early-exit result", hint="pass the JSON `finetune early-exit` wrote")
    if not is_early_exit_result(data):
        raise DataError(f"{path}: not an early-exit result (its 'format' is not elasticbert-early-exit/...)")
    for key in ("full_model", "strategies"):
        if not isinstance(data.get(key), Mapping):
            raise DataError(f"{path}: the result has no {key!r} object")
    return data


def split_spec(spec: str) -> tuple[Path, str]:
    """`RESULT.json[:RULE]` -> (path, rule); the rule defaults to `DEFAULT_RULE`."""
    path, sep, rule = spec.rpartition(":")
    if not sep or not path or "/" in rule or rule.endswith(".json"):
        return Path(spec), DEFAULT_RULE
    return Path(path), rule.strip() or DEFAULT_RULE


def _number(text: str, what: str) -> float:
    try:
        return finite_float(text)
    except ValueError:
        raise ConfigError(f"--operating-point: {what} must be a finite number, got {text!r}") from None


def _candidates(result: Mapping, where: str, strategy: str | None) -> list[dict]:
    """Every point of the result (with its strategy and parameters), plus the full model as `static`."""
    full = result["full_model"]
    points = []
    if strategy in (None, "static"):
        static = {"strategy": "static", "threshold": None, "score": full.get("score")}
        points.append({**static, **_flops(full, f"{where}: full_model")})
    for name, entry in result["strategies"].items():
        if strategy not in (None, name):
            continue
        if not isinstance(entry, Mapping) or not isinstance(entry.get("points"), list):
            raise DataError(f"{where}: strategies.{name} has no 'points' list")
        params = entry.get("params", {})
        for i, point in enumerate(entry["points"]):
            if not isinstance(point, Mapping) or "threshold" not in point:
                raise DataError(f"{where}: strategies.{name}.points[{i}] has no 'threshold'")
            points.append(
                {
                    "strategy": name,
                    "threshold": float(point["threshold"]),
                    "score": point.get("score"),
                    "patience": int(point.get("patience", params.get("patience", 2))),
                    "delta": float(point.get("delta", params.get("delta", 0.1))),
                    **_flops(point, f"{where}: strategies.{name}.points[{i}]"),
                }
            )
    return points


def _flops(point: Mapping, where: str) -> dict:
    flops = point.get("mean_flops")
    if not isinstance(flops, int | float) or not flops > 0:
        raise DataError(f"{where}: 'mean_flops' must be a number > 0, got {flops!r}")
    return {"mean_flops": float(flops)}


def _pick(points: list[dict], rule: str, full_score: float | None, where: str) -> dict:
    """The point `rule` names among `points`."""
    name, _, value = rule.partition("=")
    if name in ("fastest-within", "best") and full_score is None:
        raise DataError(f"{where}: the sweep has no scores (an unlabelled split); choose with STRATEGY=THRESHOLD")
    scored = [p for p in points if p["score"] is not None]
    scored = [p for p in scored if not p.get("degenerate")]  # a rule's point only in name: never chosen by a rule
    if name in ("fastest-within", "best") and not scored:
        raise DataError(f"{where}: no point to choose from (each decides without its input, or has no score)")
    if name == "best" and not value:
        return max(scored, key=lambda p: (p["score"], -p["mean_flops"]))
    if name == "fastest-within":
        margin = _number(value, "fastest-within's margin")
        if margin < 0:
            raise ConfigError(f"--operating-point: fastest-within={value}: the margin must be >= 0")
        within = [p for p in scored if p["score"] >= full_score - margin - 1e-9]
        if not within:
            kinds = sorted({p["strategy"] for p in points})
            raise DataError(
                f"{where}: no {'/'.join(kinds)} point scores within {margin:g} of the full model's {full_score:.2f} "
                f"(the best: {max(p['score'] for p in scored):.2f}); widen the margin or drop --strategy"
            )
        return min(within, key=lambda p: (p["mean_flops"], -p["score"]))
    if name in PREDICT_STRATEGIES and value:
        tau = _number(value, f"{name}'s threshold")
        found = [p for p in points if p["strategy"] == name and math.isclose(p["threshold"], tau, abs_tol=1e-9)]
        if not found:
            known = ", ".join(f"{p['threshold']:g}" for p in points if p["strategy"] == name) or "none"
            raise DataError(f"{where}: no {name} point at threshold {tau:g} (the sweep's: {known})")
        return found[0]
    raise ConfigError(
        f"--operating-point rule {rule!r}: expected fastest-within=D, best, or STRATEGY=THRESHOLD "
        f"(STRATEGY one of {', '.join(PREDICT_STRATEGIES)})"
    )


def choose_operating_point(spec: str, strategy: str | None = None) -> OperatingPoint:
    """The operating point `spec` (`RESULT.json[:RULE]`) names, among `strategy`'s points when given."""
    path, rule = split_spec(spec)
    result = load_result(path)
    if strategy is not None and strategy != "static" and strategy not in result["strategies"]:
        raise ConfigError(
            f"--strategy {strategy}: {path} has only {', '.join(result['strategies']) or 'no strategies'}"
        )
    full = result["full_model"]
    candidates = _candidates(result, str(path), strategy)
    labels, exits = _num_labels(result), len(result.get("exit_layers") or []) or None
    for point in candidates:  # earlier versions' sweeps measured them (patience 0, k >= n - 1): `degenerate_problem`
        point["degenerate"] = point["strategy"] != "static" and bool(
            degenerate_problem(point["strategy"], point["threshold"], labels, exits, point.get("patience"))
        )
    if not candidates:
        raise DataError(f"{path}: the result holds no operating points")
    # a sweep at reduced precision is measured against the fp32 model's score: "within D" of the model as trained
    reference = result.get("full_model_fp32") or full
    point = _pick(candidates, rule, reference.get("score"), str(path))
    name = point["strategy"]
    setting = EarlyExitSetting(
        name,
        point["threshold"],
        point.get("patience", 2),
        point.get("delta", 0.1),
        _precision(result, str(path)),
        result.get("lte_head") if name == "lte" else None,
        result.get("task"),
    )
    return OperatingPoint(
        setting,
        score=point["score"],
        mean_flops=point["mean_flops"],
        full_score=reference.get("score"),
        full_flops=_flops(full, f"{path}: full_model")["mean_flops"],
        max_length=int(result["max_length"]) if result.get("max_length") else None,
        model=result.get("model"),
        task=result.get("task"),
        source=f"{path} ({rule})",
        model_dir=(result.get("identity") or {}).get("model_dir") if isinstance(result.get("identity"), dict) else None,
    )


def measured_elsewhere(point: OperatingPoint | None, directory: str | Path, use: str, *same: object) -> str | None:
    """The note `predict` and `save-early-exit` print when `point` was swept on another model than `directory` (or
    the models `same` names: an export's source): its threshold was chosen on that model's confidences. Folders are
    compared by what they are (device and inode: a symbolic link, a bind mount, `..`), not how they are spelled."""
    if point is None or not point.model:
        return None
    ours = [directory, *(s for s in same if s)]
    theirs = [p for p in (point.model_dir, point.model) if p]
    if any(_same_folder(a, b) for a in theirs for b in ours):
        return None
    return f"the operating point was measured on {point.model}, {use} {directory}"


def _same_folder(a: object, b: object) -> bool:
    try:
        return os.path.samefile(str(a), str(b))
    except OSError:  # one is gone (or a hub name): by their resolved spelling
        return Path(str(a)).resolve() == Path(str(b)).resolve()


def _num_labels(result: Mapping) -> int | None:
    """The number of labels of the result's task (None when it names none this project knows)."""
    try:
        return get_task(str(result.get("task"))).num_labels if result.get("task") else None
    except DataError:
        return None


def _precision(result: dict, path: str) -> str:
    precision = result.get("precision", "fp32")
    if precision not in PRECISIONS:
        raise DataError(f"{path}: precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    return precision
