"""The early-exit setting a model's config can carry (`config.early_exit`) and the meaningful range of each threshold.

Pure data, no torch: `configuration` validates `config.early_exit` with it when a config loads, `early_exit` builds
the rule from it at inference, `loading.save_early_exit` writes it into a model directory. The rules it names are the
ones that need no trained side model (BERxiT's learned exit head lives in `finetune.early_exit`):

- ``entropy`` (DeeBERT): exit when the entropy of the exit's softmax (nats) < τ;
- ``maxprob``: exit when the largest class probability ≥ τ;
- ``patience`` (PABEE): exit once the prediction is unchanged over τ = k consecutive exits (regression: |Δ| < δ,
  ``delta``);
- ``pcee`` (PCEE-BERT): exit after ``patience`` consecutive exits whose normalised entropy H / ln K < τ;
- ``static``: never exit early (the full model: only the last exit runs); takes no threshold.

Besides its range, each rule has thresholds at which its decision no longer depends on the input: every sample
leaves at the first exit it can by construction, whatever the text (`degenerate_problem`). For K labels: an entropy
is at most ln K, so τ >= ln K always fires; the top probability is at least 1/K, so τ <= 1/K always fires; the
normalised entropy is at most 1, so PCEE's τ >= 1 always counts (every sample leaves at its `patience`-th exit);
PABEE's patience k counts agreements between consecutive exits and k = 0 needs none. Such a setting measures the
first exit under another name: it is refused wherever a setting is checked (`EarlyExitSetting.problems`, so
`make_rule`, `save_early_exit`, a config's `early_exit`, `predict`), and a sweep drops such points, saying so.
Values within the 4-decimal rounding of the bound (`ROUNDING`: ln 2 written 0.6931) count as the bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

from common.config import choice_problem
from common.errors import ConfigError

Strategy = Literal["entropy", "maxprob", "patience", "pcee", "static"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)
CLASSIFICATION_ONLY = ("entropy", "maxprob", "pcee")  # they read class probabilities

# The meaningful range of each rule's threshold (checked before anything runs).
THRESHOLD_RANGES: dict[str, tuple[float, float, str]] = {
    "entropy": (0.0, math.inf, "an entropy in nats, >= 0"),
    "maxprob": (0.0, 1.0, "a probability within [0, 1]"),
    "patience": (0.0, math.inf, "a whole number of exits >= 0"),
    "pcee": (0.0, 1.0, "a normalised entropy H / ln K within [0, 1]"),
}


def threshold_problem(strategy: str, threshold: float, ranges: Mapping = THRESHOLD_RANGES) -> str | None:
    """Why `threshold` is outside the range of `strategy`'s threshold, or None (also None for a rule not in
    `ranges`)."""
    if strategy not in ranges:
        return None
    lo, hi, what = ranges[strategy]
    value = float(threshold)
    bad = math.isnan(value) or not lo <= value <= hi  # +inf is allowed where the range is open (always fires)
    if strategy == "patience" and not bad:
        bad = value != int(value)
    return f"{strategy} threshold {threshold:g}: must be {what}" if bad else None


ROUNDING = 5e-5  # a bound written to 4 decimals (ln 2 = 0.6931, 1/3 = 0.3333) is the bound


def degenerate_problem(strategy: str, threshold: float, num_labels: int | None = None) -> str | None:
    """Why `threshold` makes `strategy` send every sample out at the same exit whatever its input (see the module
    docstring), or None. The bounds that depend on the number of labels K are checked when `num_labels` is given."""
    value = float(threshold)
    if math.isnan(value):
        return None  # the range check names it
    k = num_labels if num_labels and num_labels > 1 else None
    why = None
    if strategy == "patience" and value < 1:
        why = "PABEE's patience counts agreements between consecutive exits; 0 needs none, so every sample leaves at "
        why += "the first exit: use k >= 1"
    elif strategy == "pcee" and value >= 1 - ROUNDING:
        why = "the normalised entropy H / ln K is at most 1, so at τ >= 1 every exit counts as confident and every "
        why += "sample leaves at its patience-th exit: use τ < 1 (the default sweep's highest is 0.8)"
    elif strategy == "entropy" and k and value >= math.log(k) - ROUNDING:
        why = f"an entropy over {k} labels is at most ln {k} = {math.log(k):.6f} nats, so at τ >= ln {k} (to 4 "
        why += "decimals) every sample leaves at the first exit: use a lower τ (the default sweep's highest is "
        why += f"{0.8 * math.log(k):.4f})"
    elif strategy == "maxprob" and k and value <= 1 / k + ROUNDING:
        why = f"the top probability over {k} labels is at least 1/{k} = {1 / k:.6f}, so at τ <= 1/{k} (to 4 "
        why += "decimals) every sample leaves at the first exit: use a higher τ (the default sweep's lowest is 0.7)"
    return f"{strategy} threshold {value:g}: {why}" if why else None


SETTING_KEYS = ("strategy", "threshold", "patience", "delta", "precision")
Precision = Literal["fp32", "int8"]  # elasticbert.precision: what a threshold was calibrated at
PRECISIONS: tuple[str, ...] = get_args(Precision)


@dataclass(frozen=True)
class EarlyExitSetting:
    """One operating point of an exit rule: what `config.early_exit` holds, e.g. `{"strategy": "entropy",
    "threshold": 0.3}`. `patience` is PCEE's count of consecutive confident exits, `delta` PABEE's regression
    tolerance; each is written only for the rule that reads it. `precision` is the inference precision the
    threshold was chosen at (`elasticbert.precision`), written when it is not fp32."""

    strategy: str
    threshold: float | None = None
    patience: int = 2
    delta: float = 0.1
    precision: str = "fp32"

    def problems(self, num_labels: int | None = None) -> list[str]:
        """Everything wrong with the setting (for a model with `num_labels` outputs, when given)."""
        problem = choice_problem("strategy", self.strategy, STRATEGIES)
        if problem:
            return [f"unknown {problem}"]
        problems = []
        if self.strategy == "static":
            if self.threshold is not None:
                problems.append("strategy 'static' (the full model) takes no threshold")
        elif self.threshold is None:
            problems.append(f"strategy {self.strategy!r} needs a threshold")
        elif isinstance(self.threshold, bool) or not isinstance(self.threshold, int | float):
            problems.append(f"threshold must be a number, got {self.threshold!r}")
        elif problem := threshold_problem(self.strategy, self.threshold) or degenerate_problem(
            self.strategy, self.threshold, num_labels
        ):
            problems.append(problem)
        if isinstance(self.patience, bool) or not isinstance(self.patience, int) or self.patience < 1:
            problems.append(
                "patience (PCEE's consecutive confident exits) must be a whole number >= 1 (0 would exit every "
                f"sample at the first exit whatever the threshold), got {self.patience!r}"
            )
        if isinstance(self.delta, bool) or not isinstance(self.delta, int | float) or not 0 <= self.delta < math.inf:
            problems.append(f"delta (PABEE's regression tolerance) must be a number >= 0, got {self.delta!r}")
        if problem := choice_problem("precision", self.precision, PRECISIONS):
            problems.append(f"unknown {problem}")
        if num_labels == 1 and self.strategy in CLASSIFICATION_ONLY:
            problems.append(
                f"strategy {self.strategy!r} needs class probabilities; for regression use 'patience' or 'static'"
            )
        return problems

    def validated(self, num_labels: int | None = None, source: str | None = None) -> EarlyExitSetting:
        """The setting itself, or a ConfigError listing its problems (`source` names where it came from)."""
        problems = self.problems(num_labels)
        if problems:
            raise ConfigError(problems, source)
        return self

    def to_dict(self) -> dict:
        """What `config.early_exit` holds: strategy and threshold, plus the parameter its rule reads."""
        out: dict = {"strategy": self.strategy}
        if self.threshold is not None:
            out["threshold"] = float(self.threshold)
        if self.strategy == "pcee":
            out["patience"] = int(self.patience)
        if self.strategy == "patience":
            out["delta"] = float(self.delta)
        if self.precision != "fp32":
            out["precision"] = self.precision
        return out

    @classmethod
    def from_dict(cls, value: object, num_labels: int | None = None, source: str = "early_exit") -> EarlyExitSetting:
        """A setting from `config.early_exit` (a mapping of `SETTING_KEYS`); a ConfigError names `source` and the
        key at fault."""
        if not isinstance(value, Mapping):
            raise ConfigError(
                f'{source} must be an object such as {{"strategy": "entropy", "threshold": 0.3}}, '
                f"got {type(value).__name__}"
            )
        unknown = sorted(set(value) - set(SETTING_KEYS))
        if unknown:
            raise ConfigError(f"{source}: unknown keys {unknown} (known: {', '.join(SETTING_KEYS)})")
        if "strategy" not in value:
            raise ConfigError(f"{source}: no 'strategy' (one of {', '.join(STRATEGIES)})")
        setting = cls(**value)
        problems = setting.problems(num_labels)
        if problems:
            raise ConfigError(f"{source}: " + "; ".join(problems))
        return setting
