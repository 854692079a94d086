"""The early-exit setting (one record for a rule's parameters, what `config.early_exit` holds) and the rule table.

Pure data, no torch. `RULES` is the one table of exit rules: each `Rule` names itself, its threshold's range, its
factory, whether it reads class probabilities and what side model it needs. `early_exit` registers the rules that
need no trained side model - a config can carry those - and `finetune.serve.early_exit.rules` registers BERxiT's learned
exit head (``lte``); every strategy list, range check and factory call reads this table:

- ``entropy`` (DeeBERT): exit when the entropy of the exit's softmax (nats) < τ;
- ``maxprob``: exit when the largest class probability ≥ τ;
- ``patience`` (PABEE): exit once the prediction is unchanged over τ = k consecutive exits (regression: |Δ| < δ,
  ``delta``);
- ``pcee`` (PCEE-BERT): exit after ``patience`` consecutive exits whose normalised entropy H / ln K < τ;
- ``static``: never exit early (the full model: only the last exit runs); takes no threshold.

`EarlyExitSetting` is checked in one place, `problems` (`validated`, `from_dict`, and `early_exit.rule_for` call it).
Besides its range, each rule has thresholds at which its decision no longer depends on the input: every sample
leaves at the first exit it can by construction, whatever the text (`degenerate_problem`). For K labels: an entropy
is at most ln K, so τ >= ln K always fires; the top probability is at least 1/K, so τ <= 1/K always fires; the
normalised entropy is at most 1, so PCEE's τ >= 1 always counts (every sample leaves at its `patience`-th exit);
PABEE's patience k counts agreements between consecutive exits and k = 0 needs none. The other way, some thresholds
never let a sample out before the last exit (`never_exits_problem`): an entropy (or PCEE's normalised one) is never
below τ = 0; the top probability reaches τ = 1 only by float rounding; with n exits PABEE counts at most n - 2
agreements before the last one (k >= n - 1 never fires) and PCEE at most n - 1 confident exits (a patience >= n
never fires). Either kind measures a fixed exit under the name of a rule: it is refused wherever a setting is
checked (naming the rule and why), and a sweep drops such points, saying so. Values within the 4-decimal rounding of
a bound (`ROUNDING`: ln 2 written 0.6931) count as the bound.

A setting chosen from a sweep records the task it was measured on (`task`); a model fine-tuned on another task
refuses it (`task_problem`), wherever the two meet: a config.json's `early_exit` as it loads (so every forward and
`pipeline(...)`), `save_early_exit`, `predict` and `EarlyExitClassifier`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from common.config import choice_problem
from common.errors import ConfigError


@dataclass(frozen=True)
class Rule:
    """One exit rule of the table."""

    name: str
    build: Callable[..., Any]  # (setting, num_labels, **extras) -> an `early_exit.ExitRule`
    range: tuple[float, float] | None  # the threshold's meaningful range; None: the rule takes no threshold
    what: str  # the threshold in words (the rule itself when it takes none), for messages
    classification_only: bool = False  # reads class probabilities: no rule for a regression model
    whole: bool = False  # the threshold counts exits
    side_model: str = ""  # what it needs besides the model, which a config.json cannot carry ('' : nothing)
    grid: Callable[[int, int], list[float]] | None = None  # default sweep: (num_labels, num_exits) -> thresholds


RULES: dict[str, Rule] = {}


def register_rule(rule: Rule) -> Rule:
    """Add `rule` to the table (the fine-tuning side registers its learned exit head here)."""
    RULES[rule.name] = rule
    return rule


def rule_names(*, swept: bool | None = None, configurable: bool | None = None) -> tuple[str, ...]:
    """The rules' names in the order they were registered; `swept`: only those with a threshold to sweep (static is
    the static curve instead), `configurable`: only those a config can carry (no side model)."""
    return tuple(
        name
        for name, rule in RULES.items()
        if swept in (None, rule.range is not None) and configurable in (None, not rule.side_model)
    )


def threshold_problem(strategy: str, threshold: float) -> str | None:
    """Why `threshold` is outside the range of `strategy`'s threshold, or None (also for a rule without one)."""
    rule = RULES.get(strategy)
    if rule is None or rule.range is None:
        return None
    value = float(threshold)
    bad = math.isnan(value) or not rule.range[0] <= value <= rule.range[1]  # +inf where the range is open: fires
    bad = bad or (rule.whole and value != int(value))
    return f"{strategy} threshold {threshold:g}: must be {rule.what}" if bad else None


def default_sweep(strategy: str, num_labels: int, num_exits: int) -> list[float]:
    """Thresholds that span 'exit almost everything early' to 'almost never exit' for a rule (its `grid`)."""
    if problem := choice_problem("strategy", strategy, rule_names(swept=True)):
        raise ConfigError(f"unknown {problem}")
    return RULES[strategy].grid(num_labels, num_exits)


ROUNDING = 5e-5  # a bound written to 4 decimals (ln 2 = 0.6931, 1/3 = 0.3333) is the bound


def degenerate_problem(
    strategy: str,
    threshold: float,
    num_labels: int | None = None,
    num_exits: int | None = None,
    patience: int | None = None,
) -> str | None:
    """Why `threshold` makes `strategy` decide without the input (see the module docstring): every sample out at the
    same exit (`always_exits_problem`) or none before the last one (`never_exits_problem`), or None. The bounds that
    depend on the number of labels K or of exits n are checked when `num_labels` / `num_exits` are given; PCEE's
    `patience` with n."""
    value = float(threshold)
    if math.isnan(value):
        return None  # the range check names it
    why = always_exits_problem(strategy, value, num_labels) or never_exits_problem(strategy, value, num_exits, patience)
    return f"{strategy} threshold {value:g}: {why}" if why else None


def always_exits_problem(strategy: str, value: float, num_labels: int | None) -> str | None:
    """Why every sample leaves at the first exit it can at threshold `value`, whatever its input, or None."""
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
    elif strategy == "lte" and value >= 1 - ROUNDING:
        why = "the learned exit head's predicted error is a sigmoid, below 1, so at τ >= 1 every sample leaves at "
        why += "the first exit: use τ < 1"
    return why


NEVER = "no sample leaves before the last exit (the full model's answers, at the cost of every exit head): "


def never_exits_problem(
    strategy: str, value: float, num_exits: int | None = None, patience: int | None = None
) -> str | None:
    """Why no sample can leave before the last exit at threshold `value`, whatever its input, or None. The engine
    asks the rule at every exit but the last (which takes the samples still running): with n exits, at n - 1 places.
    PABEE's agreement count at the p-th of them is at most p - 1 (the first has nothing to agree with), so k >= n - 1
    never fires; PCEE's count of confident exits is at most p, so a patience >= n never fires."""
    n = num_exits if num_exits and num_exits > 0 else None
    why = None
    if strategy == "entropy" and value <= 0:
        why = "an entropy is never below 0, so at τ = 0 " + NEVER + "use τ > 0, or static for the full model"
    elif strategy == "pcee" and value <= 0:
        why = "the normalised entropy is never below 0, so at τ = 0 " + NEVER + "use τ > 0, or static"
    elif strategy == "lte" and value <= 0:
        why = "the learned exit head's predicted error is a sigmoid, above 0, so at τ = 0 " + NEVER + "use τ > 0"
    elif strategy == "maxprob" and value >= 1 - ROUNDING:
        why = "the top probability reaches 1 only where float rounding hides every other label, so at τ = 1 (to 4 "
        why += "decimals) " + NEVER + "use τ < 1, or static for the full model"
    elif strategy == "patience" and n and value >= n - 1:
        why = f"PABEE counts agreements between consecutive exits: with {n} exits it can count at most {n - 2} "
        fix = f"use k <= {n - 2}, or static" if n > 2 else "no k lets a sample out early: use another rule, or static"
        why += f"before the last one, so at k >= {n - 1} " + NEVER + fix
    elif strategy == "pcee" and n and patience is not None and patience >= n:
        why = f"PCEE's patience {patience} counts confident exits: with {n} exits at most {n - 1} come before the "
        why += "last one, so " + NEVER + f"use --patience <= {max(n - 1, 1)}, or static"
    return why


SETTING_KEYS = ("strategy", "threshold", "patience", "delta", "precision", "task")  # a config.json's early_exit
Precision = Literal["fp32", "int8"]  # elasticbert.precision: what a threshold was calibrated at
PRECISIONS: tuple[str, ...] = get_args(Precision)


@dataclass(frozen=True)
class EarlyExitSetting:
    """One exit rule at one threshold: what `config.early_exit` holds, e.g. `{"strategy": "entropy",
    "threshold": 0.3}`, what an operating point measured and what a classifier runs. `patience` is PCEE's count of
    consecutive confident exits, `delta` PABEE's regression tolerance; each is written only for the rule that reads
    it. `precision` is the inference precision the threshold was chosen at (`elasticbert.precision`), written when it
    is not fp32. `task` is the task the threshold was measured on (an operating point's; None: given by hand), which
    must be the model's own (`task_problem`). `lte_head` is the file of a learned exit head (the side model of
    ``lte``; never in a config)."""

    strategy: str
    threshold: float | None = None
    patience: int = 2
    delta: float = 0.1
    precision: str = "fp32"
    lte_head: str | None = None
    task: str | None = None

    def problems(
        self, num_labels: int | None = None, in_config: bool = False, num_exits: int | None = None
    ) -> list[str]:
        """Everything wrong with the setting (for a model with `num_labels` outputs and `num_exits` exits, when
        given; `in_config`: as a config.json's `early_exit`, which carries no side model)."""
        problems = self.rule_problems(num_labels, rule_names(configurable=True) if in_config else None)
        if problems:
            return problems
        problems = self._threshold_problems(RULES[self.strategy], num_labels, num_exits) + self.parameter_problems()
        if self.task is not None and (isinstance(self.task, bool) or not isinstance(self.task, str) or not self.task):
            problems.append(f"task must be a task name, got {self.task!r}")
        return problems

    def rule_problems(self, num_labels: int | None = None, among: tuple[str, ...] | None = None) -> list[str]:
        """An unknown rule (not in the table, or not `among` these), or one that needs class probabilities on a
        regression model (`num_labels` 1)."""
        rule = RULES.get(self.strategy)
        if among is not None and rule is not None and self.strategy not in among and rule.side_model:
            return [
                f"strategy {self.strategy!r} cannot be saved in a config ({', '.join(among)} can): {rule.side_model}"
            ]
        if problem := choice_problem("strategy", self.strategy, among if among is not None else tuple(RULES)):
            return [f"unknown strategy {self.strategy!r}{problem.removeprefix(f'strategy={self.strategy!r}')}"]
        if num_labels == 1 and rule.classification_only:
            others = " or ".join(repr(name) for name, r in RULES.items() if not r.classification_only)
            return [f"strategy {self.strategy!r} needs class probabilities; for regression use {others}"]
        return []

    def _threshold_problems(self, rule: Rule, num_labels: int | None, num_exits: int | None = None) -> list[str]:
        if rule.range is None:
            return [] if self.threshold is None else [f"strategy {self.strategy!r} ({rule.what}) takes no threshold"]
        if self.threshold is None:
            return [f"strategy {self.strategy!r} needs --threshold τ ({rule.what}; or --operating-point RESULT.json)"]
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, int | float):
            return [f"threshold must be a number, got {self.threshold!r}"]
        problem = threshold_problem(self.strategy, self.threshold)
        patience = self.patience if isinstance(self.patience, int) and not isinstance(self.patience, bool) else None
        problem = problem or degenerate_problem(self.strategy, self.threshold, num_labels, num_exits, patience)
        return [problem] if problem else []

    def parameter_problems(self) -> list[str]:
        """What is wrong with the rule's parameters besides its threshold (PCEE's patience, PABEE's delta, the
        precision)."""
        problems = []
        if isinstance(self.patience, bool) or not isinstance(self.patience, int) or self.patience < 1:
            problems.append(
                "--patience (PCEE's consecutive confident exits) must be >= 1, a whole number (0 would exit every "
                f"sample at the first exit whatever the threshold), got {self.patience!r}"
            )
        if isinstance(self.delta, bool) or not isinstance(self.delta, int | float) or not 0 <= self.delta < math.inf:
            problems.append(f"--delta must be >= 0 (PABEE's regression tolerance), got {self.delta!r}")
        if problem := choice_problem("precision", self.precision, PRECISIONS):
            problems.append(f"unknown {problem}")
        return problems

    def validated(
        self,
        num_labels: int | None = None,
        source: str | None = None,
        in_config: bool = False,
        num_exits: int | None = None,
        model_task: str | None = None,
    ) -> EarlyExitSetting:
        """The setting itself, or a ConfigError listing its problems (`source` names where it came from), for a model
        with `num_labels` outputs and `num_exits` exits fine-tuned on `model_task` (each when known)."""
        problems = self.problems(num_labels, in_config, num_exits)
        problems += [problem] if (problem := task_problem(self.task, model_task)) else []
        if problems:
            raise ConfigError(problems, source)
        return self

    def describe(self) -> str:
        """The rule in a few words, for logs: `entropy τ=0.2`, `static (the full model)`."""
        if self.threshold is None:
            return f"{self.strategy} ({RULES[self.strategy].what})" if self.strategy in RULES else self.strategy
        return f"{self.strategy} τ={self.threshold:g}"

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
        if self.task is not None:
            out["task"] = self.task
        return out

    @classmethod
    def from_dict(
        cls,
        value: object,
        num_labels: int | None = None,
        source: str = "early_exit",
        num_exits: int | None = None,
        model_task: str | None = None,
    ) -> EarlyExitSetting:
        """A setting from `config.early_exit` (a mapping of `SETTING_KEYS`) of a model with `num_labels` outputs,
        `num_exits` exits, fine-tuned on `model_task` (each when known); a ConfigError names `source` and the key at
        fault."""
        if not isinstance(value, Mapping):
            raise ConfigError(
                f'{source} must be an object such as {{"strategy": "entropy", "threshold": 0.3}}, '
                f"got {type(value).__name__}"
            )
        unknown = sorted(set(value) - set(SETTING_KEYS))
        if unknown:
            raise ConfigError(f"{source}: unknown keys {unknown} (known: {', '.join(SETTING_KEYS)})")
        if "strategy" not in value:
            raise ConfigError(f"{source}: no 'strategy' (one of {', '.join(rule_names(configurable=True))})")
        setting = cls(**value)
        problems = setting.problems(num_labels, in_config=True, num_exits=num_exits)
        problems += [problem] if (problem := task_problem(setting.task, model_task)) else []
        if problems:
            raise ConfigError(f"{source}: " + "; ".join(problems))
        return setting


def task_problem(measured: str | None, model_task: str | None) -> str | None:
    """Why a threshold measured on task `measured` does not belong to a model fine-tuned on `model_task`, or None
    (also when either is unknown: a setting given by hand, a model that records no task). Its scores and its
    confidences were measured on another task's data and another head."""
    if not measured or not model_task or _task_key(measured) == _task_key(model_task):
        return None
    return (
        f"the threshold was measured on {measured}, but the model was fine-tuned on {model_task}: its exit rule "
        "would run another task's operating point; sweep this model (finetune early-exit) and save its own"
    )


def _task_key(name: str) -> str:
    """A task's name as compared (GLUE names are case-insensitive; MNLI's matched and mismatched sets are one task)."""
    key = str(name).strip().lower()
    return "mnli" if key in ("mnli-m", "mnli-mm", "mnli_matched", "mnli_mismatched") else key
