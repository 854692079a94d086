"""Exit rules: at each exit, which samples of a batch stop. One threshold τ each, swept to trace a score/FLOPs curve.

The rules that need no trained side model (entropy, maxprob, patience, PCEE, static) live in `elasticbert.early_exit`
- the model's own forward runs them when its config carries an early-exit setting - and are re-exported here. This
module adds BERxiT's learning-to-exit rule:

- ``lte`` (BERxiT learning-to-exit): a shared head predicts the exit's error (see `lte.py`); exit when it is < τ.

`Strategy` / `STRATEGIES` are the rules a sweep runs (`static` is the static curve, measured apart);
`PREDICT_STRATEGIES` adds `static` (the full model) for `predict`.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch

from common.config import choice_problem
from common.errors import ConfigError
from elasticbert.early_exit import (
    EntropyRule,
    ExitRule,
    MaxProbRule,
    PatienceRule,
    PCEERule,
    StaticRule,
    entropy_nats,
)
from elasticbert.early_exit import make_rule as make_inference_rule
from elasticbert.exit_setting import CLASSIFICATION_ONLY, degenerate_problem
from elasticbert.exit_setting import THRESHOLD_RANGES as INFERENCE_THRESHOLD_RANGES
from elasticbert.exit_setting import threshold_problem as inference_threshold_problem

from .lte import LearnedExitHead

Strategy = Literal["entropy", "maxprob", "patience", "pcee", "lte"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)
PREDICT_STRATEGIES: tuple[str, ...] = (*STRATEGIES, "static")


class LearnedExitRule(ExitRule):
    """BERxiT LTE: exit when the shared head predicts an error below τ."""

    name = "lte"

    def __init__(self, threshold: float, head: LearnedExitHead) -> None:
        super().__init__(threshold)
        self.head = head.eval()

    def decide(self, position: int, representation: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if self.head.linear.weight.device != representation.device:
            self.head.to(representation.device)
        return self.head(representation) < self.threshold


# The meaningful range of each rule's threshold (checked before anything runs).
THRESHOLD_RANGES = {**INFERENCE_THRESHOLD_RANGES, "lte": (0.0, math.inf, "a predicted error >= 0")}


def threshold_problem(strategy: str, threshold: float) -> str | None:
    """Why `threshold` is outside the range of `strategy`'s threshold, or None."""
    return inference_threshold_problem(strategy, threshold, THRESHOLD_RANGES)


def check_strategy(strategy: str, num_labels: int, known: tuple[str, ...] = STRATEGIES) -> None:
    """Refuse an unknown strategy name, or one that needs class probabilities on a regression task."""
    problem = choice_problem("strategy", strategy, known)
    if problem:
        raise ConfigError(f"unknown {problem}")
    if strategy in CLASSIFICATION_ONLY and num_labels == 1:
        raise ConfigError(f"strategy {strategy!r} needs class probabilities; for regression use 'patience' or 'lte'")


def make_rule(
    strategy: str,
    threshold: float | None,
    num_labels: int,
    patience: int = 2,
    delta: float = 0.1,
    lte_head: LearnedExitHead | None = None,
) -> ExitRule:
    """An exit rule by name (`PREDICT_STRATEGIES`); for `patience` the threshold is k. Rejects thresholds outside
    their range and rules that do not apply to regression."""
    check_strategy(strategy, num_labels, PREDICT_STRATEGIES)
    if strategy != "lte":
        return make_inference_rule(strategy, threshold, num_labels, patience, delta)
    problem = threshold_problem(strategy, threshold)
    if problem:
        raise ConfigError(problem)
    if lte_head is None:
        raise ConfigError("strategy 'lte' needs a trained LearnedExitHead (see train_lte_head / --lte-head)")
    return LearnedExitRule(threshold, lte_head)


def default_sweep(strategy: str, num_labels: int, num_exits: int) -> list[float]:
    """Thresholds that span 'exit almost everything early' to 'almost never exit' for each rule."""
    if strategy == "entropy":
        top = math.log(max(num_labels, 2))
        return [round(top * f, 4) for f in (0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8)]
    if strategy == "maxprob":
        return [0.995, 0.98, 0.95, 0.9, 0.85, 0.8, 0.7]
    if strategy == "patience":  # k = 0 would exit every sample at the first exit (`degenerate_problem`)
        return [float(k) for k in range(1, num_exits)]
    if strategy == "pcee":
        return [0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8]
    if strategy == "lte":  # a fixed grid; the sweep prefers the head's own quantiles (its outputs cluster tightly)
        return [0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.45]
    raise ConfigError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")


__all__ = [
    "CLASSIFICATION_ONLY",
    "PREDICT_STRATEGIES",
    "STRATEGIES",
    "THRESHOLD_RANGES",
    "EntropyRule",
    "ExitRule",
    "LearnedExitRule",
    "MaxProbRule",
    "PCEERule",
    "PatienceRule",
    "StaticRule",
    "Strategy",
    "check_strategy",
    "default_sweep",
    "degenerate_problem",
    "entropy_nats",
    "make_rule",
    "threshold_problem",
]
