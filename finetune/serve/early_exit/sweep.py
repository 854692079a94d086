"""Sweeps: the full-model reference, the static per-layer curve and every strategy's operating points, as one result.

An operating point is one rule at one threshold run over the split: its score, mean FLOPs per sample, exit histogram,
and FLOPs and wall-time speed-ups against the full model's own forward on the same batches. The result (a JSON-able
dict, format `RESULT_FORMAT`) is what `early-exit` writes, `elue-score` scores and `submission` re-runs on the test
split; `write_samples` keeps a per-sample TSV of each point.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from common.errors import ConfigError
from common.io import atomic_write_text, make_dirs
from elasticbert import ElasticBertForSequenceClassification
from elasticbert.early_exit import ExitRule, make_rule
from elasticbert.exit_setting import RULES, EarlyExitSetting, default_sweep, degenerate_problem, threshold_problem
from elasticbert.precision import model_precision

from ...data import Batch, EncodedSplit
from ...tasks import TaskSpec
from .engine import EarlyExitResult, exit_histogram, per_sample_flops, run_dataset, run_full_model, static_flops
from .lte import LearnedExitHead
from .rules import STRATEGIES

RESULT_KIND = "elasticbert-early-exit"
RESULT_FORMAT = f"{RESULT_KIND}/1"


def is_early_exit_result(data: object) -> bool:
    """Whether a loaded JSON is a result of `early-exit` (any version of the format)."""
    return isinstance(data, Mapping) and str(data.get("format", "")).startswith(RESULT_KIND)


@dataclass
class SweepConfig:
    """Everything a sweep needs besides the model and data; the `early-exit` options take their defaults from here."""

    strategies: list[str] = field(default_factory=lambda: list(STRATEGIES))
    thresholds: dict[str, list[float]] = field(default_factory=dict)  # per strategy; default: `default_sweep`
    batch_size: int = 32
    repeats: int = 1  # timing repeats; the minimum wall time is kept
    patience: int = 2  # PCEE: consecutive confident exits needed
    delta: float = 0.1  # PABEE regression: |Δ| below this counts as unchanged
    lte_head: LearnedExitHead | None = None
    samples_dir: Path | None = None  # per-sample TSVs of every operating point go here
    num_labels: int | None = None  # the task's, when known: given thresholds are judged for degeneracy up front
    num_exits: int | None = None  # the model's, when known (set by `sweep`): the bounds that count exits

    def validate(self) -> SweepConfig:
        """Every problem with the strategies, thresholds and numeric options, at once (a grid none of whose points
        depends on the input is one; a grid with some such points is run without them, see `usable_thresholds`)."""
        base = EarlyExitSetting("static", patience=self.patience, delta=self.delta)  # the rules' own parameters
        problems = [
            p for s in self.strategies for p in replace(base, strategy=s).rule_problems(self.num_labels, STRATEGIES)
        ]
        if self.batch_size < 1 or self.repeats < 1:
            problems.append(f"--batch-size and --repeats must be >= 1, got {self.batch_size} and {self.repeats}")
        problems += base.parameter_problems()
        for name, thresholds in self.thresholds.items():
            problems += [p for tau in thresholds if (p := threshold_problem(name, tau))]
            if thresholds and not problems and not self.usable(name, thresholds)[0]:
                problems.append(self.degenerate(name, thresholds[0]))
        if problems:
            raise ConfigError(problems)
        return self

    def degenerate(self, name: str, tau: float) -> str | None:
        """Why `name` at `tau` decides without the input for this sweep's labels, exits and PCEE patience."""
        return degenerate_problem(name, tau, self.num_labels, self.num_exits, self.patience)

    def usable(self, name: str, thresholds: Sequence[float]) -> tuple[list[float], str]:
        """`usable_thresholds` for this sweep."""
        return usable_thresholds(name, thresholds, self.num_labels, self.num_exits, self.patience)


def usable_thresholds(
    name: str,
    thresholds: Sequence[float],
    num_labels: int | None,
    num_exits: int | None = None,
    patience: int | None = None,
) -> tuple[list[float], str]:
    """The thresholds of a grid at which `name` depends on its input, and a line naming the others, which would
    send every sample out at the same exit, or none before the last, by construction
    (`elasticbert.exit_setting.degenerate_problem`), or ''. A grid is a range chosen once for several models or label
    counts: its degenerate ends are dropped, not run under a name that suggests a measurement of the rule."""
    kept, dropped, why = [], [], ""
    for tau in thresholds:
        problem = degenerate_problem(name, tau, num_labels, num_exits, patience)
        if problem is None:
            kept.append(tau)
        else:
            dropped.append(f"{tau:g}")
            why = why or problem.split(": ", 1)[1]
    if not dropped:
        return kept, ""
    return kept, f"{name}: dropped τ={', '.join(dropped)} from the sweep: {why}"


def parse_thresholds(text: str | None) -> list[float] | None:
    if not text:
        return None
    try:
        values = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ConfigError(f"--sweep takes comma-separated numbers, got {text!r}") from None
    if not values:
        raise ConfigError(f"--sweep {text!r}: no thresholds given")
    return values


def resolve_strategies(text: str, num_labels: int) -> list[str]:
    """`--strategy`: a comma list or 'all' (for regression, 'all' leaves out the rules that need probabilities; named,
    they are refused by `SweepConfig.validate`, as is an unknown name)."""
    if text != "all":
        return [s.strip() for s in text.split(",") if s.strip()]
    return [name for name in STRATEGIES if num_labels != 1 or not RULES[name].classification_only]


# ----------------------------------------------------------------------------------------------- operating points


def score_logits(task: TaskSpec, logits: torch.Tensor, labels: torch.Tensor | None) -> dict[str, float]:
    """The task's metrics in percent (with `score`), or {} for an unlabelled split."""
    if labels is None:
        return {}
    return task.compute_metrics(logits.numpy(), labels.numpy())


@dataclass
class Reference:
    """The full model on the same batches: FLOPs and wall time every speed-up is relative to."""

    mean_flops: float
    wall_time_s: float
    metrics: dict[str, float]


def _timed(run: Callable[[], tuple], repeats: int) -> tuple[object, float]:
    """`run()` -> (output, seconds), `repeats` times: the last output and the fastest time."""
    times, output = [], None
    for _ in range(max(repeats, 1)):
        output, elapsed = run()
        times.append(elapsed)
    return output, min(times)


def measure_reference(
    model: ElasticBertForSequenceClassification,
    split: EncodedSplit,
    task: TaskSpec,
    batches: Sequence[Batch],
    repeats: int = 1,
) -> Reference:
    last = model.exit_layers[-1]
    logits, wall = _timed(lambda: run_full_model(model, batches, last), repeats)
    return Reference(
        mean_flops=float(static_flops(model.config, split.lengths, last).mean()),
        wall_time_s=wall,
        metrics=score_logits(task, logits, split.labels),
    )


def add_speedups(point: dict, reference: Reference) -> dict:
    """FLOPs and wall-time speed-ups of one point against the full model, and wall ÷ FLOPs (1 = FLOPs saved are time
    saved)."""
    point["flops_speedup"] = reference.mean_flops / point["mean_flops"]
    point["wall_speedup"] = reference.wall_time_s / point["wall_time_s"]
    point["speedup_ratio"] = point["wall_speedup"] / point["flops_speedup"]
    return point


def evaluate_point(
    model: ElasticBertForSequenceClassification,
    split: EncodedSplit,
    task: TaskSpec,
    rule: ExitRule,
    batches: Sequence[Batch],
    reference: Reference,
    repeats: int = 1,
) -> tuple[dict, EarlyExitResult]:
    """One operating point: score, mean FLOPs, FLOPs and wall-time speed-ups against `reference`, exit histogram."""
    result, wall = _timed(lambda: run_dataset(model, batches, rule), repeats)
    total, _ = per_sample_flops(model.config, result, rule.head_width)
    metrics = score_logits(task, result.logits, split.labels)
    point = {
        **rule.params(),
        "score": metrics.get("score"),
        "metrics": metrics,
        "mean_flops": float(total.mean()),
        "wall_time_s": wall,
        "mean_exit_layer": float(result.exit_layers.float().mean()),
        "exit_histogram": exit_histogram(result),
    }
    add_speedups(point, reference)
    return point, result


def static_curve(
    model: ElasticBertForSequenceClassification,
    split: EncodedSplit,
    task: TaskSpec,
    batches: Sequence[Batch],
    reference: Reference,
    repeats: int = 1,
) -> list[dict]:
    """Static truncation at every exit (each exit alone): the per-layer curve and the ELUE baseline's form."""
    points = []
    for layer in model.exit_layers:
        logits, wall = _timed(lambda layer=layer: run_full_model(model, batches, layer), repeats)
        metrics = score_logits(task, logits, split.labels)
        mean_flops = float(static_flops(model.config, split.lengths, layer).mean())
        point = {"layer": layer, "score": metrics.get("score"), "metrics": metrics, "mean_flops": mean_flops}
        points.append(add_speedups({**point, "wall_time_s": wall}, reference))
    return points


def write_samples(path: Path, split: EncodedSplit, result: EarlyExitResult, flops: np.ndarray) -> None:
    """Per-sample record of one operating point: id, prediction, label, exit layer, real length, FLOPs, exits run."""
    make_dirs(path.parent)
    preds = result.predictions.tolist()
    labels = split.labels.tolist() if split.labels is not None else [""] * len(preds)
    lines = ["index\tprediction\tlabel\texit_layer\tlength\tflops\texits_run\n"]
    for i, (idx, pred, label) in enumerate(zip(split.index.tolist(), preds, labels)):
        trace = ",".join(str(layer) for layer in result.trace(i))
        lines.append(
            f"{idx}\t{pred}\t{label}\t{int(result.exit_layers[i])}\t{int(result.lengths[i])}\t{flops[i]:.0f}\t{trace}\n"
        )
    atomic_write_text(path, "".join(lines))


# -------------------------------------------------------------------------------------------------------- the sweep


def sweep(
    model: ElasticBertForSequenceClassification,
    split: EncodedSplit,
    task: TaskSpec,
    config: SweepConfig,
    log: Callable[[str], None] = print,
) -> dict:
    """The static curve, the full-model reference and every strategy's operating points, as one JSON-able dict."""
    config.num_exits = config.num_exits or len(model.exit_layers)
    config.validate()
    batches = split.batches(config.batch_size, device=model.device)
    run_full_model(model, batches)  # warm-up: the first pass over each batch shape is slower (allocation, kernels)
    reference = measure_reference(model, split, task, batches, config.repeats)
    static = static_curve(model, split, task, batches, reference, config.repeats)
    log(f"full model: score {reference.metrics.get('score')} mean FLOPs {reference.mean_flops:.4g}")
    swept = {
        name: sweep_strategy(model, split, task, config, name, batches, reference, log) for name in config.strategies
    }
    strategies = {
        name: {"params": {"patience": config.patience, "delta": config.delta}, "points": points}
        for name, points in swept.items()
        if points  # a strategy skipped (no usable threshold for this model) is not a strategy of the result
    }
    if not strategies:
        raise ConfigError(f"no strategy of {', '.join(config.strategies)} has a usable threshold for this model")
    # The reference time is the fastest of: runs before the sweep, one after it, and static truncation at the last
    # exit (the same computation). On a shared machine this keeps load drift from inflating the speed-ups.
    reference.wall_time_s = min(reference.wall_time_s, static[-1]["wall_time_s"], run_full_model(model, batches)[1])
    for point in static + [p for entry in strategies.values() for p in entry["points"]]:
        add_speedups(point, reference)
    return {
        "format": RESULT_FORMAT,
        "task": task.name,
        "metric_name": "+".join(task.metrics),
        "num_samples": len(split),
        "batch_size": config.batch_size,
        "exit_layers": list(model.exit_layers),
        "exit_type": model.config.exit_type,
        "threads": torch.get_num_threads(),
        "precision": model_precision(model),
        "full_model": {
            "layer": model.exit_layers[-1],
            "score": reference.metrics.get("score"),
            "metrics": reference.metrics,
            "mean_flops": reference.mean_flops,
            "wall_time_s": reference.wall_time_s,
        },
        "static": static,
        "strategies": strategies,
    }


def thresholds_for(
    name: str, config: SweepConfig, num_labels: int, num_exits: int, log: Callable[[str], None] = print
) -> list[float]:
    """The thresholds swept for one strategy: given, else the LTE head's own quantiles, else `default_sweep`;
    those at which the rule does not depend on its input are dropped with one line (`usable_thresholds`)."""
    given = config.thresholds.get(name)
    thresholds = given
    if not thresholds and name == "lte" and config.lte_head is not None:
        thresholds = config.lte_head.suggested_thresholds
    grid = thresholds or default_sweep(name, num_labels, num_exits)
    kept, note = usable_thresholds(name, grid, num_labels, num_exits, config.patience)
    if not kept and given:
        raise ConfigError(note.replace("dropped", "no usable threshold:", 1))
    if not kept:  # a default grid, none of whose points this model can use (PABEE or PCEE on two exits)
        log(note.replace("dropped", "skipped: no usable threshold among", 1))
    elif note:
        log(note)
    return kept


def sweep_strategy(
    model: ElasticBertForSequenceClassification,
    split: EncodedSplit,
    task: TaskSpec,
    config: SweepConfig,
    name: str,
    batches: Sequence[Batch],
    reference: Reference,
    log: Callable[[str], None] = print,
) -> list[dict]:
    """Every threshold of one strategy: its operating points (speed-ups provisional until the reference settles)."""
    num_labels = model.config.num_labels
    points = []
    for tau in thresholds_for(name, config, num_labels, len(model.exit_layers), log):
        rule = make_rule(
            name, tau, num_labels, config.patience, config.delta, len(model.exit_layers), lte_head=config.lte_head
        )
        point, result = evaluate_point(model, split, task, rule, batches, reference, config.repeats)
        points.append(point)
        if config.samples_dir is not None:
            flops, _ = per_sample_flops(model.config, result, rule.head_width)
            write_samples(config.samples_dir / f"{name}_{tau:g}.tsv", split, result, flops)
        score = "n/a" if point["score"] is None else f"{point['score']:.2f}"
        log(
            f"{name:8s} tau={tau:<7g} score={score}"
            f" FLOPs x{point['flops_speedup']:.2f} wall x{point['wall_speedup']:.2f} (provisional)"
            f" hist {point['exit_histogram']}"
        )
    return points


def summary_table(results: dict) -> str:
    """The operating points with their final speed-ups (after the reference time is settled)."""
    full = results["full_model"]
    lines = [
        f"full model (exit {full['layer']}): score {full['score']:.2f}  mean FLOPs {full['mean_flops'] / 1e6:.1f}M  "
        f"wall {full['wall_time_s']:.2f}s",
        f"{'strategy':9s} {'tau':>7s} {'score':>6s} {'MFLOPs':>7s} {'FLOPs x':>7s} {'wall x':>6s} {'ratio':>5s} "
        "exit histogram",
    ]
    rows = [("static", p["layer"], p) for p in results["static"]]
    rows += [(name, p["threshold"], p) for name, e in results["strategies"].items() for p in e["points"]]
    for name, tau, p in rows:
        hist = " ".join(f"{v}" for v in p["exit_histogram"].values()) if "exit_histogram" in p else ""
        score = f"{p['score']:6.2f}" if p["score"] is not None else "   n/a"
        lines.append(
            f"{name:9s} {tau:>7g} {score} {p['mean_flops'] / 1e6:>7.1f} {p['flops_speedup']:>7.2f} "
            f"{p['wall_speedup']:>6.2f} {p['wall_speedup'] / p['flops_speedup']:>5.2f} {hist}"
        )
    return "\n".join(lines)


def merge_results(previous: dict, current: dict) -> dict:
    """Keep strategies of an earlier run of the same model/task/split/batch size that this run did not redo, so one
    plot can show every strategy even when each was swept separately. (Kept points keep the wall speed-ups measured
    against their own run's reference; FLOPs speed-ups are exact either way.) A kept LTE strategy keeps its head."""
    keys = ("model", "task", "split", "batch_size", "num_samples")
    same_precision = previous.get("precision", "fp32") == current.get("precision", "fp32")
    if (
        previous.get("format") != RESULT_FORMAT
        or not same_precision
        or any(previous.get(k) != current.get(k) for k in keys)
    ):
        return current
    merged = dict(current)
    merged["strategies"] = {**previous.get("strategies", {}), **current["strategies"]}
    if "lte" in merged["strategies"] and not current.get("lte_head"):
        merged["lte_head"] = previous.get("lte_head")
    return merged
