"""BERxiT's learning-to-exit rule, registered into the model package's one rule table (`elasticbert.exit_setting.RULES`,
where the rules that need no side model are): ``lte`` exits when a shared head's predicted error (`lte.py`) is < τ.

`STRATEGIES` are the rules a sweep runs (every rule with a threshold: `static` is the static curve, measured apart),
`PREDICT_STRATEGIES` every rule, `static` (the full model) included.
"""

from __future__ import annotations

import math

import torch

from common.errors import ConfigError
from elasticbert.early_exit import ExitRule
from elasticbert.exit_setting import EarlyExitSetting, Rule, register_rule, rule_names

from .lte import LearnedExitHead


class LearnedExitRule(ExitRule):
    """BERxiT LTE: exit when the shared head predicts an error below τ."""

    name = "lte"

    def __init__(self, threshold: float, head: LearnedExitHead) -> None:
        super().__init__(threshold)
        self.head = head.eval()
        self.head_width = head.linear.in_features

    def decide(
        self, position: int, representation: torch.Tensor, logits: torch.Tensor, state: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        if self.head.linear.weight.device != representation.device:
            self.head.to(representation.device)
        return self.head(representation) < self.threshold


def _learned_exit_rule(
    setting: EarlyExitSetting, num_labels: int, lte_head: LearnedExitHead | None = None, **_: object
) -> LearnedExitRule:
    """The `lte` rule with `lte_head`, else the head file the setting names."""
    head = lte_head if lte_head is not None or not setting.lte_head else LearnedExitHead.load(setting.lte_head)
    if head is None:
        raise ConfigError(
            "strategy 'lte' needs a trained LearnedExitHead (--lte-head FILE, the operating point's, or train_lte_head)"
        )
    return LearnedExitRule(setting.threshold, head)


register_rule(
    Rule(
        "lte",
        _learned_exit_rule,
        (0.0, math.inf),
        "a predicted error >= 0",
        side_model="LTE needs its head file: use predict --strategy lte --lte-head FILE",
        # a fixed grid; the sweep prefers the head's own quantiles (its outputs cluster tightly)
        grid=lambda num_labels, num_exits: [0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.45],
    )
)
STRATEGIES = rule_names(swept=True)
PREDICT_STRATEGIES = rule_names()

__all__ = ["PREDICT_STRATEGIES", "STRATEGIES", "LearnedExitRule"]
