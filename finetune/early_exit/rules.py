"""Exit rules: at each exit, which samples of a batch stop. One threshold τ each, swept to trace a score/FLOPs curve.

- ``entropy``  (DeeBERT): exit when the entropy of the exit's softmax (nats) < τ.
- ``maxprob``: exit when the largest class probability ≥ τ.
- ``patience`` (PABEE): exit when the prediction is unchanged over τ = k consecutive exits (k further exits agree
  with the first); regression: |Δ| < δ counts as unchanged. k = 0 exits at the first exit.
- ``pcee`` (PCEE-BERT): exit after k consecutive exits (``--patience``) whose normalised entropy H / ln K < τ.
- ``lte`` (BERxiT learning-to-exit): a shared head predicts the exit's error (see `lte.py`); exit when it is < τ.
- ``static``: never fires (static truncation when given one exit).
The last exit always takes the samples still running (the engine's job, not the rules').
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch

from common.config import choice_problem
from common.errors import ConfigError

from .lte import LearnedExitHead

Strategy = Literal["entropy", "maxprob", "patience", "pcee", "lte"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)
CLASSIFICATION_ONLY = ("entropy", "maxprob", "pcee")


class ExitRule:
    """Decides, exit by exit, which samples of a batch stop. Holds per-sample state for one batch at a time.

    `start(b)` begins a batch; `decide(position, representation, logits)` is called at the exits in order (position =
    0-based index among the exits run) and returns a bool [b] mask of samples that exit now; `keep(index)` is called
    with the survivors' row indices so that per-sample state follows the shrinking batch.
    """

    name = "rule"

    def __init__(self, threshold: float) -> None:
        self.threshold = float(threshold)

    def start(self, batch_size: int) -> None:
        pass

    def decide(self, position: int, representation: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def keep(self, index: torch.Tensor) -> None:
        pass

    def params(self) -> dict[str, float]:
        """What identifies the operating point (written to the result JSON)."""
        return {"threshold": self.threshold}


def entropy_nats(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) in nats, per row."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


class EntropyRule(ExitRule):
    """DeeBERT: a confident exit has low entropy."""

    name = "entropy"

    def decide(self, position: int, representation: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return entropy_nats(logits) < self.threshold


class MaxProbRule(ExitRule):
    """Exit when the top class probability reaches τ."""

    name = "maxprob"

    def decide(self, position: int, representation: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits.float(), dim=-1).amax(-1) >= self.threshold


class _CountingRule(ExitRule):
    """Shared state for the rules that count consecutive exits: a counter per sample (and the last prediction)."""

    def __init__(self, threshold: float) -> None:
        super().__init__(threshold)
        self.count: torch.Tensor | None = None
        self.previous: torch.Tensor | None = None

    def start(self, batch_size: int) -> None:
        self.count = torch.zeros(batch_size, dtype=torch.long)
        self.previous = None

    def _count_on(self, device: torch.device) -> torch.Tensor:
        """The counters on the logits' device (the engine's bookkeeping is on the CPU, the model may not be)."""
        if self.count.device != device:
            self.count = self.count.to(device)
        return self.count

    def keep(self, index: torch.Tensor) -> None:
        self.count = self.count[index]
        if self.previous is not None:
            self.previous = self.previous[index]


class PatienceRule(_CountingRule):
    """PABEE: exit once the prediction has stayed the same for k consecutive exits (regression: |Δ| < δ)."""

    name = "patience"

    def __init__(self, patience: int, regression: bool = False, delta: float = 0.1) -> None:
        if patience < 0 or int(patience) != patience:
            raise ConfigError(f"patience must be a non-negative integer, got {patience}")
        super().__init__(int(patience))
        self.patience = int(patience)
        self.regression = regression
        self.delta = float(delta)

    def decide(self, position: int, representation: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        current = logits[:, 0].float() if self.regression else logits.argmax(-1)
        self._count_on(logits.device)
        if self.previous is not None:
            same = (current - self.previous).abs() < self.delta if self.regression else current == self.previous
            self.count = torch.where(same, self.count + 1, torch.zeros_like(self.count))
        self.previous = current
        return self.count >= self.patience

    def params(self) -> dict[str, float]:
        out: dict[str, float] = {"threshold": float(self.patience)}
        if self.regression:
            out["delta"] = self.delta
        return out


class PCEERule(_CountingRule):
    """PCEE-BERT: exit after k consecutive exits whose normalised entropy H / ln K is below τ."""

    name = "pcee"

    def __init__(self, threshold: float, patience: int = 2) -> None:
        super().__init__(threshold)
        if patience < 0:
            raise ConfigError(f"PCEE patience must be >= 0, got {patience}")
        self.patience = int(patience)

    def decide(self, position: int, representation: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        normalised = entropy_nats(logits) / math.log(logits.shape[-1])
        confident = normalised < self.threshold
        count = self._count_on(logits.device)
        self.count = torch.where(confident, count + 1, torch.zeros_like(count))
        return self.count >= self.patience

    def params(self) -> dict[str, float]:
        return {"threshold": self.threshold, "patience": float(self.patience)}


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


class StaticRule(ExitRule):
    """Never fires: every sample runs to the last exit it is given (static truncation when that is one exit)."""

    name = "static"

    def __init__(self) -> None:
        super().__init__(float("nan"))

    def decide(self, position: int, representation: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)


# The meaningful range of each rule's threshold (checked before anything runs).
THRESHOLD_RANGES = {
    "entropy": (0.0, math.inf, "an entropy in nats, >= 0"),
    "maxprob": (0.0, 1.0, "a probability within [0, 1]"),
    "patience": (0.0, math.inf, "a whole number of exits >= 0"),
    "pcee": (0.0, 1.0, "a normalised entropy H / ln K within [0, 1]"),
    "lte": (0.0, math.inf, "a predicted error >= 0"),
}


def threshold_problem(strategy: str, threshold: float) -> str | None:
    """Why `threshold` is outside the range of `strategy`'s threshold, or None."""
    if strategy not in THRESHOLD_RANGES:
        return None
    lo, hi, what = THRESHOLD_RANGES[strategy]
    value = float(threshold)
    bad = math.isnan(value) or not lo <= value <= hi  # +inf is allowed where the range is open (always fires)
    if strategy == "patience" and not bad:
        bad = value != int(value)
    return f"{strategy} threshold {threshold:g}: must be {what}" if bad else None


def check_strategy(strategy: str, num_labels: int) -> None:
    """Refuse an unknown strategy name, or one that needs class probabilities on a regression task."""
    problem = choice_problem("strategy", strategy, STRATEGIES)
    if problem:
        raise ConfigError(f"unknown {problem}")
    if strategy in CLASSIFICATION_ONLY and num_labels == 1:
        raise ConfigError(f"strategy {strategy!r} needs class probabilities; for regression use 'patience' or 'lte'")


def make_rule(
    strategy: str,
    threshold: float,
    num_labels: int,
    patience: int = 2,
    delta: float = 0.1,
    lte_head: LearnedExitHead | None = None,
) -> ExitRule:
    """An exit rule by name; for `patience` the threshold is k. Rejects rules that do not apply to regression."""
    check_strategy(strategy, num_labels)
    problem = threshold_problem(strategy, threshold)
    if problem:
        raise ConfigError(problem)
    if strategy == "entropy":
        return EntropyRule(threshold)
    if strategy == "maxprob":
        return MaxProbRule(threshold)
    if strategy == "patience":
        if threshold != int(threshold):
            raise ConfigError(f"patience thresholds are whole numbers of exits, got {threshold}")
        return PatienceRule(int(threshold), regression=num_labels == 1, delta=delta)
    if strategy == "pcee":
        return PCEERule(threshold, patience=patience)
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
    if strategy == "patience":
        return [float(k) for k in range(num_exits)]
    if strategy == "pcee":
        return [0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8]
    if strategy == "lte":  # a fixed grid; the sweep prefers the head's own quantiles (its outputs cluster tightly)
        return [0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.45]
    raise ConfigError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
