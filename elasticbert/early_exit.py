"""Early-exit inference: the exit rules that need no trained side model, and the per-sample bookkeeping.

`ElasticBertForSequenceClassification.forward` runs the engine when its config carries an early-exit setting
(`config.early_exit`, see `exit_setting`), so `transformers.pipeline("text-classification")` exits early with no
code of ours; `finetune.serve.early_exit` re-exports it and adds BERxiT's learned exit head, sweeps and the
`early-exit` command; `finetune.serve.predict` serves it. One engine serves all of them: `exit_queues.ExitQueues` (one
queue per layer, so that every layer call runs a full batch; `run_batch` is it on one batch) over a
`layer_runner.LayerRunner` (eager torch, CUDA graphs, or `finetune.serve.onnx_runtime.OnnxLayers`), all
re-exported here.

Rules (one threshold τ each), registered below in `exit_setting.RULES`, the one rule table, with their threshold
ranges (see `exit_setting` for those and for the thresholds at which a rule no longer depends on its input, which
`rule_for` refuses): ``entropy`` (DeeBERT: entropy of the exit's softmax in nats < τ), ``maxprob`` (top class
probability ≥ τ), ``patience`` (PABEE: the prediction unchanged over τ = k >= 1 consecutive exits; regression:
|Δ| < δ counts as unchanged), ``pcee`` (PCEE-BERT: ``patience`` consecutive exits with H / ln K < τ), ``static``
(never fires: the engine then runs the last exit only).
The last exit always takes the samples still running (the engine's job, not the rules'). A rule keeps no rows: what
it remembers of a row is the row's state, which travels with the row from batch to batch (`ExitRule`).

FLOPs per sample come from `elasticbert.flops.sample_flops` (ELUE conventions) with the sample's real length, its
exit layer and every exit head it ran - the same function as static truncation uses - plus 2·d per call of a learned
exit head of input width d (BERxiT's LTE, when a caller's rule uses one).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .exit_queues import EarlyExitResult, ExitQueues, logits_to_predictions, run_batch
from .exit_setting import RULES, EarlyExitSetting, Rule, register_rule
from .flops import sample_flops
from .layer_runner import GraphedLayers, LayerRunner, TorchLayers, as_runner, serving_runner

# ------------------------------------------------------------------------------------------------------------ rules


class ExitRule:
    """Decides, exit by exit, which rows stop. A rule object holds no rows: what it remembers about a row (PABEE's
    and PCEE's counters, the previous prediction) is the row's `state`, which the engine keeps with the row as it
    leaves one batch and joins another (`exit_queues`).

    `initial_state(rows, device)` is a row's state before its first exit (a dict of per-row tensors; {} for a rule
    that remembers nothing); `decide(position, representation, logits, state)` is called at the exits in order
    (position = 0-based index among the exits run; every row of a call is at the same one), updates `state`'s
    entries for these rows in place and returns a bool [b] mask of the rows that exit now, on the logits' device. A
    rule whose `can_fire` is False never stops a row early: the engine then runs only the last exit.
    """

    name = "rule"
    can_fire = True
    head_width = 0  # input width d of a learned exit head the rule calls at each exit (2·d FLOPs a call), 0: none
    setting: EarlyExitSetting | None = None  # the setting it was built from (`rule_for`)
    checked_exits: int | None = None  # the number of exits `rule_for` checked the setting for (None: not known)

    def __init__(self, threshold: float) -> None:
        self.threshold = float(threshold)

    def initial_state(self, rows: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        return {}

    def decide(
        self, position: int, representation: torch.Tensor, logits: torch.Tensor, state: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        raise NotImplementedError

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

    def decide(
        self, position: int, representation: torch.Tensor, logits: torch.Tensor, state: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        return entropy_nats(logits) < self.threshold


class MaxProbRule(ExitRule):
    """Exit when the top class probability reaches τ."""

    name = "maxprob"

    def decide(
        self, position: int, representation: torch.Tensor, logits: torch.Tensor, state: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        return torch.softmax(logits.float(), dim=-1).amax(-1) >= self.threshold


class PatienceRule(ExitRule):
    """PABEE: exit once the prediction has stayed the same for k consecutive exits (regression: |Δ| < δ). A row's
    state: its count of agreements and its previous prediction."""

    name = "patience"

    def __init__(self, patience: int, regression: bool = False, delta: float = 0.1) -> None:
        super().__init__(int(patience))
        self.patience = int(patience)
        self.regression = regression
        self.delta = float(delta)

    def initial_state(self, rows: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        previous = torch.zeros(rows, device=device, dtype=torch.float32 if self.regression else torch.long)
        return {"count": torch.zeros(rows, dtype=torch.long, device=device), "previous": previous}

    def decide(
        self, position: int, representation: torch.Tensor, logits: torch.Tensor, state: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        current = logits[:, 0].float() if self.regression else logits.argmax(-1)
        if position > 0:  # the first exit has nothing to agree with
            previous = state["previous"]
            same = (current - previous).abs() < self.delta if self.regression else current == previous
            state["count"] = torch.where(same, state["count"] + 1, torch.zeros_like(state["count"]))
        state["previous"] = current
        return state["count"] >= self.patience

    def params(self) -> dict[str, float]:
        out: dict[str, float] = {"threshold": float(self.patience)}
        if self.regression:
            out["delta"] = self.delta
        return out


class PCEERule(ExitRule):
    """PCEE-BERT: exit after k consecutive exits whose normalised entropy H / ln K is below τ. A row's state: its
    count of consecutive confident exits."""

    name = "pcee"

    def __init__(self, threshold: float, patience: int = 2) -> None:
        super().__init__(threshold)
        self.patience = int(patience)

    def initial_state(self, rows: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        return {"count": torch.zeros(rows, dtype=torch.long, device=device)}

    def decide(
        self, position: int, representation: torch.Tensor, logits: torch.Tensor, state: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        normalised = entropy_nats(logits) / math.log(logits.shape[-1])
        count = state["count"]
        state["count"] = torch.where(normalised < self.threshold, count + 1, torch.zeros_like(count))
        return state["count"] >= self.patience

    def params(self) -> dict[str, float]:
        return {"threshold": self.threshold, "patience": float(self.patience)}


class StaticRule(ExitRule):
    """Never fires: every sample runs to the last exit, and no other exit head runs (the full model; static
    truncation at layer l when the engine is given exit l alone)."""

    name = "static"
    can_fire = False

    def __init__(self) -> None:
        super().__init__(float("nan"))

    def decide(
        self, position: int, representation: torch.Tensor, logits: torch.Tensor, state: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        return torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)

    def params(self) -> dict[str, float]:
        return {}


def rule_for(
    setting: EarlyExitSetting,
    num_labels: int,
    num_exits: int | None = None,
    model_task: str | None = None,
    **extras: Any,
) -> ExitRule:
    """The rule of a setting, from the rule table, for a model with `num_labels` outputs and `num_exits` exits,
    fine-tuned on `model_task` (the last two when known): the setting is validated here (a ConfigError lists its
    problems: a threshold out of range, one that decides without the input, another task's), the one check on a
    threshold's way to the rule. `extras` go to the rule's factory (`lte_head=` for the learned exit head)."""
    setting.validated(num_labels, num_exits=num_exits, model_task=model_task)
    rule = RULES[setting.strategy].build(setting, num_labels, **extras)
    rule.setting, rule.checked_exits = setting, num_exits
    return rule


def make_rule(
    strategy: str,
    threshold: float | None,
    num_labels: int,
    patience: int = 2,
    delta: float = 0.1,
    num_exits: int | None = None,
    **extras: Any,
) -> ExitRule:
    """`rule_for` a setting given by its fields: for `patience` the threshold is k, `static` takes none (None)."""
    return rule_for(EarlyExitSetting(strategy, threshold, patience, delta), num_labels, num_exits, **extras)


def _fixed(*grid: float) -> Any:
    return lambda num_labels, num_exits: list(grid)


def _entropy_grid(num_labels: int, num_exits: int) -> list[float]:
    top = math.log(max(num_labels, 2))
    return [round(top * f, 4) for f in (0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8)]


for _rule in (
    Rule(
        "entropy",
        lambda s, k, **_: EntropyRule(s.threshold),
        (0.0, math.inf),
        "an entropy in nats, >= 0",
        classification_only=True,
        grid=_entropy_grid,
    ),
    Rule(
        "maxprob",
        lambda s, k, **_: MaxProbRule(s.threshold),
        (0.0, 1.0),
        "a probability within [0, 1]",
        classification_only=True,
        grid=_fixed(0.995, 0.98, 0.95, 0.9, 0.85, 0.8, 0.7),
    ),
    Rule(
        "patience",
        lambda s, k, **_: PatienceRule(int(s.threshold), regression=k == 1, delta=s.delta),
        (0.0, math.inf),
        "a whole number of exits >= 0",
        whole=True,
        grid=lambda num_labels, num_exits: [float(k) for k in range(1, max(num_exits - 1, 2))],
    ),  # k = 0 always exits, k >= n - 1 never does (exit_setting.never_exits_problem)
    Rule(
        "pcee",
        lambda s, k, **_: PCEERule(s.threshold, patience=s.patience),
        (0.0, 1.0),
        "a normalised entropy H / ln K within [0, 1]",
        classification_only=True,
        grid=_fixed(0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8),
    ),
    Rule("static", lambda s, k, **_: StaticRule(), None, "the full model"),
):
    register_rule(_rule)


# ----------------------------------------------------------------------------------------------- bookkeeping


def exit_histogram(result: EarlyExitResult) -> dict[str, int]:
    """Samples per exit layer (every exit listed, zeros included)."""
    counts = torch.bincount(result.exit_layers, minlength=max(result.exits) + 1)
    return {str(layer): int(counts[layer]) for layer in result.exits}


def per_sample_flops(
    config: object, result: EarlyExitResult, lte_in_features: int = 0, memo: dict | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(total, matmul) FLOPs per sample: `sample_flops` with the real length, exit layer and the exit heads run, plus
    2·d for each call of a learned exit head of input width d = `lte_in_features` (0: none). `matmul` is what a
    matmul-level counter (FlopCounterMode) sees. `memo`: a dict a caller keeps for one model and head width (a
    serving classifier), so that each (length, exit, heads run) is counted once rather than per request."""
    total = np.empty(len(result.lengths))
    matmul = np.empty(len(result.lengths))
    memo = {} if memo is None else memo
    for i, (length, layer) in enumerate(zip(result.lengths.tolist(), result.exit_layers.tolist())):
        trace = result.trace(i)
        key = (length, layer, trace)
        if key not in memo:
            flops = sample_flops(config, int(length), int(layer), exits_evaluated=trace)
            head_calls = len(trace) - 1 if trace and trace[-1] == result.exits[-1] else len(trace)
            extra = 2 * lte_in_features * head_calls  # the last exit takes everyone without asking the head
            memo[key] = (flops.total + extra, flops.matmul + extra)
        total[i], matmul[i] = memo[key]
    return total, matmul


__all__ = [
    "EarlyExitResult",
    "EarlyExitSetting",
    "EntropyRule",
    "ExitQueues",
    "ExitRule",
    "GraphedLayers",
    "LayerRunner",
    "MaxProbRule",
    "PCEERule",
    "PatienceRule",
    "StaticRule",
    "TorchLayers",
    "as_runner",
    "entropy_nats",
    "exit_histogram",
    "logits_to_predictions",
    "make_rule",
    "per_sample_flops",
    "rule_for",
    "run_batch",
    "serving_runner",
]
