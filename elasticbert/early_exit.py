"""Early-exit inference: the exit rules that need no trained side model, and the batched engine that runs them.

`ElasticBertForSequenceClassification.forward` runs this engine when its config carries an early-exit setting
(`config.early_exit`, see `exit_setting`), so `transformers.pipeline("text-classification")` exits early with no
code of ours; `finetune.early_exit` re-exports it and adds BERxiT's learned exit head, sweeps and the `early-exit`
command. One engine serves all of them.

Rules (one threshold τ each), registered below in `exit_setting.RULES`, the one rule table, with their threshold
ranges (see `exit_setting` for those and for the thresholds at which a rule no longer depends on its input, which
`rule_for` refuses): ``entropy`` (DeeBERT: entropy of the exit's softmax in nats < τ), ``maxprob`` (top class
probability ≥ τ), ``patience`` (PABEE: the prediction unchanged over τ = k >= 1 consecutive exits; regression:
|Δ| < δ counts as unchanged), ``pcee`` (PCEE-BERT: ``patience`` consecutive exits with H / ln K < τ), ``static``
(never fires: the engine then runs the last exit only).
The last exit always takes the samples still running (the engine's job, not the rules').

Why batched the way it is: at every exit the samples whose rule fires *leave the batch* (their hidden states, mask rows
and rule state are index-selected away) and the padded length of what remains is cut to its longest survivor. The
work done per layer is therefore proportional to the samples still running, so FLOPs saved by exiting early become
wall time saved, at batch 1 and at batch 32 alike. Inputs must be right-padded; length-sorted batches (as
`finetune.data.EncodedSplit.batches` makes) spend little time on padding. The bookkeeping (rows, lengths, outputs)
stays on the CPU whatever the model's device; the rules keep their state on the logits' device.

FLOPs per sample come from `elasticbert.flops.sample_flops` (ELUE conventions) with the sample's real length, its
exit layer and every exit head it ran - the same function as static truncation uses - plus 2·d per call of a learned
exit head of input width d (BERxiT's LTE, when a caller's rule uses one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from .exit_setting import RULES, EarlyExitSetting, Rule, register_rule
from .flops import sample_flops
from .masks import attention_mask_for_sdpa

# ------------------------------------------------------------------------------------------------------------ rules


class ExitRule:
    """Decides, exit by exit, which samples of a batch stop. Holds per-sample state for one batch at a time.

    `start(b)` begins a batch; `decide(position, representation, logits)` is called at the exits in order (position =
    0-based index among the exits run) and returns a bool [b] mask of samples that exit now; `keep(index)` is called
    with the survivors' row indices so that per-sample state follows the shrinking batch. A rule whose `can_fire` is
    False never stops a sample early: the engine then runs only the last exit.
    """

    name = "rule"
    can_fire = True
    head_width = 0  # input width d of a learned exit head the rule calls at each exit (2·d FLOPs a call), 0: none
    setting: EarlyExitSetting | None = None  # the setting it was built from (`rule_for`)
    checked_exits: int | None = None  # the number of exits `rule_for` checked the setting for (None: not known)

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
        self.patience = int(patience)

    def decide(self, position: int, representation: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        normalised = entropy_nats(logits) / math.log(logits.shape[-1])
        confident = normalised < self.threshold
        count = self._count_on(logits.device)
        self.count = torch.where(confident, count + 1, torch.zeros_like(count))
        return self.count >= self.patience

    def params(self) -> dict[str, float]:
        return {"threshold": self.threshold, "patience": float(self.patience)}


class StaticRule(ExitRule):
    """Never fires: every sample runs to the last exit, and no other exit head runs (the full model; static
    truncation at layer l when the engine is given exit l alone)."""

    name = "static"
    can_fire = False

    def __init__(self) -> None:
        super().__init__(float("nan"))

    def decide(self, position: int, representation: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
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


# ----------------------------------------------------------------------------------------------------------- engine


def logits_to_predictions(logits: Any) -> Any:
    """[N, K] logits -> class ids [N]; [N, 1] (regression) -> the value [N]. The one place this is decided; works on
    numpy arrays and torch tensors alike (argmax returns the first of tied maxima in both)."""
    return logits[:, 0] if logits.shape[-1] == 1 else logits.argmax(-1)


@dataclass
class EarlyExitResult:
    """Per-sample outputs, in input order: logits at the exit taken, exit layer, real length, exit heads run."""

    logits: torch.Tensor  # [N, K]
    exit_layers: torch.Tensor  # [N]
    lengths: torch.Tensor  # [N]
    exits_evaluated: torch.Tensor  # [N], number of exit heads run (a prefix of the exits used)
    exits: tuple[int, ...] = ()  # the exits the run could use, in order

    @property
    def predictions(self) -> torch.Tensor:
        """Class ids, or the regression value when there is one output."""
        return logits_to_predictions(self.logits)

    def trace(self, i: int) -> tuple[int, ...]:
        """The exit heads sample i ran (layers), in order."""
        return self.exits[: int(self.exits_evaluated[i])]


def exit_histogram(result: EarlyExitResult) -> dict[str, int]:
    """Samples per exit layer (every exit listed, zeros included)."""
    counts = torch.bincount(result.exit_layers, minlength=max(result.exits) + 1)
    return {str(layer): int(counts[layer]) for layer in result.exits}


def _check_right_padded(attention_mask: torch.Tensor, lengths: torch.Tensor) -> None:
    if bool(attention_mask.all()):
        return
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    if not torch.equal(attention_mask.bool(), positions[None, :] < lengths.to(attention_mask.device)[:, None]):
        raise ValueError("early exit needs right-padded inputs (attention_mask = ones then zeros per row)")


class LayerRunner:
    """What the engine runs a model through, piece by piece: embeddings, one layer, one exit. `TorchLayers` runs an
    `ElasticBertForSequenceClassification` (fp32 or int8) in eager torch; `finetune.onnx_runtime.OnnxLayers` runs
    the ONNX pieces `finetune export --layout onnx` writes. Hidden states and logits are torch tensors on the
    runner's `device` whatever runs them, so the rules and the bookkeeping are the same code for every runner."""

    config: Any
    exit_layers: tuple[int, ...]
    device: torch.device
    training = False

    def embed(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, position_ids: torch.Tensor | None
    ) -> torch.Tensor:
        raise NotImplementedError

    def layer_mask(self, attention_mask: torch.Tensor) -> Any:
        """What `run_layer` takes for this padding (None: no padding left, the layers need no mask)."""
        raise NotImplementedError

    def run_layer(self, index: int, hidden: torch.Tensor, layer_mask: Any) -> torch.Tensor:
        raise NotImplementedError

    def classify(
        self, layer: int, hidden: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(representation, logits) of exit `layer` (1-based); `attention_mask` None: no padding."""
        raise NotImplementedError


class TorchLayers(LayerRunner):
    """The eager runner: the model's own modules."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.config, self.exit_layers = model, model.config, tuple(model.exit_layers)
        self.device, self.training = model.device, model.training

    def embed(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, position_ids: torch.Tensor | None
    ) -> torch.Tensor:
        return self.model.elasticbert.embeddings(input_ids, token_type_ids, position_ids)

    def layer_mask(self, attention_mask: torch.Tensor) -> torch.Tensor | None:
        return attention_mask_for_sdpa(attention_mask)

    def run_layer(self, index: int, hidden: torch.Tensor, layer_mask: Any) -> torch.Tensor:
        return self.model.elasticbert.encoder.run_layer(index, hidden, layer_mask)

    def classify(
        self, layer: int, hidden: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.classify(layer, hidden, attention_mask)


def as_runner(model: nn.Module | LayerRunner) -> LayerRunner:
    """The runner of a model: itself when it is one, else its eager `TorchLayers`."""
    return model if isinstance(model, LayerRunner) else TorchLayers(model)


def _exits_to_run(model: LayerRunner, exit_layers: Sequence[int] | None, rule: ExitRule) -> tuple[int, ...]:
    exits = tuple(sorted(set(exit_layers))) if exit_layers is not None else tuple(model.exit_layers)
    unknown = sorted(set(exits) - set(model.exit_layers))
    if unknown:
        raise ValueError(f"layers {unknown} have no exit; this model's exits are {list(model.exit_layers)}")
    if not exits:
        raise ValueError("early exit needs at least one exit layer")
    return exits if rule.can_fire else exits[-1:]  # a rule that never fires needs no exit but the last


class _Outputs:
    """What each sample left with, filled in as samples leave the batch. Kept on the CPU whatever the model's device
    (as is the rows bookkeeping: a CUDA tensor indexed by a CPU index is fine; the reverse is not)."""

    def __init__(self, batch: int, num_labels: int) -> None:
        self.logits = torch.empty(batch, num_labels)
        self.layer = torch.empty(batch, dtype=torch.long)
        self.count = torch.empty(batch, dtype=torch.long)

    def record(self, rows: torch.Tensor, logits: torch.Tensor, layer: int, position: int) -> None:
        self.logits[rows], self.layer[rows], self.count[rows] = logits.float().cpu(), layer, position


class _Running:
    """The samples still in the batch: their original rows, real lengths, hidden states and masks."""

    def __init__(
        self, runner: LayerRunner, hidden: torch.Tensor, attention_mask: torch.Tensor, lengths: torch.Tensor
    ) -> None:
        self.runner = runner
        self.rows = torch.arange(hidden.shape[0])
        self.lengths = lengths
        self.hidden = hidden
        self.attention_mask = attention_mask
        self.sdpa_mask = runner.layer_mask(attention_mask)

    def keep(self, survivors: torch.Tensor) -> None:
        """Index the survivors and cut the padding to the longest of them."""
        self.rows, self.lengths = self.rows[survivors], self.lengths[survivors]
        longest = int(self.lengths.max())
        self.hidden = self.hidden[survivors, :longest]
        self.attention_mask = self.attention_mask[survivors, :longest]
        self.sdpa_mask = self.runner.layer_mask(self.attention_mask)


def _on(device: torch.device, tensor: torch.Tensor | None, longest: int) -> torch.Tensor | None:
    """`tensor` [B, T] on `device`, cut to its first `longest` columns (None stays None)."""
    return None if tensor is None else tensor[:, :longest].to(device)


def run_batch(
    model: nn.Module | LayerRunner,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    token_type_ids: torch.Tensor | None,
    rule: ExitRule,
    exit_layers: Sequence[int] | None = None,
    position_ids: torch.Tensor | None = None,
) -> EarlyExitResult:
    """Early-exit inference on one batch of an `ElasticBertForSequenceClassification` (in eval mode). Samples whose
    rule fires leave the batch; the rest continue, trimmed to their longest real length. `exit_layers` restricts
    which exits run (default: all the model has). Inputs move to the model's device; the result is on the CPU.
    `model` may be any `LayerRunner` (ONNX Runtime pieces): same engine, same rules."""
    model = as_runner(model)
    if model.training:
        raise ValueError("run_batch needs model.eval() (dropout would make exits random)")
    exits = _exits_to_run(model, exit_layers, rule)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    lengths = attention_mask.sum(1).cpu()
    _check_right_padded(attention_mask, lengths)
    device, longest = model.device, int(lengths.max())
    input_ids, attention_mask = _on(device, input_ids, longest), _on(device, attention_mask, longest)
    token_type_ids, position_ids = _on(device, token_type_ids, longest), _on(device, position_ids, longest)
    out = _Outputs(input_ids.shape[0], model.config.num_labels)
    rule.start(input_ids.shape[0])
    with torch.inference_mode():
        hidden = model.embed(input_ids, token_type_ids, position_ids)
        _run_layers(model, rule, exits, _Running(model, hidden, attention_mask, lengths), out)
    return EarlyExitResult(out.logits, out.layer, lengths, out.count, exits)


def _run_layers(model: LayerRunner, rule: ExitRule, exits: tuple[int, ...], run: _Running, out: _Outputs) -> None:
    """Layer by layer up to the last exit; at each exit, the samples whose rule fires are recorded and leave."""
    exit_set, last = set(exits), exits[-1]
    position = 0
    for index in range(last):
        run.hidden = model.run_layer(index, run.hidden, run.sdpa_mask)
        layer = index + 1
        if layer not in exit_set:
            continue
        # no padding left (always so at batch 1): the exit needs no mask, which saves the MHA exit a mask op
        exit_mask = run.attention_mask if run.sdpa_mask is not None else None
        representation, logits = model.classify(layer, run.hidden, exit_mask)
        position += 1
        if layer == last:
            out.record(run.rows, logits, layer, position)
            return
        fire = rule.decide(position - 1, representation, logits).cpu()  # one host sync per exit (it is needed anyway)
        if run.rows.numel() == 1:  # batch-1 fast path: no index bookkeeping
            if bool(fire):
                out.record(run.rows, logits, layer, position)
                return
            continue
        fired = int(fire.sum())
        if fired == 0:
            continue
        if fired == run.rows.numel():
            out.record(run.rows, logits, layer, position)
            return
        leaving = fire.nonzero().squeeze(1)
        out.record(run.rows[leaving], logits[leaving], layer, position)
        survivors = (~fire).nonzero().squeeze(1)
        rule.keep(survivors)
        run.keep(survivors)


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
    "ExitRule",
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
]
