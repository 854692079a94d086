"""The early-exit engine: one batch with samples leaving it, a whole split, the full-model reference, FLOPs per sample.

Why batched the way it is: at every exit the samples whose rule fires *leave the batch* (their hidden states, mask rows
and rule state are index-selected away) and the padded length of what remains is cut to its longest survivor. The
work done per layer is therefore proportional to the samples still running, so FLOPs saved by exiting early become
wall time saved, at batch 1 and at batch 32 alike. Batches are length-sorted (right padding is required; see
`finetune.data.EncodedSplit.batches`) so that the trim is effective and little time goes to padding.

FLOPs per sample come from `elasticbert.flops.sample_flops` (ELUE conventions) with the sample's real length, its
exit layer and every exit head it ran - the same function as static truncation uses - plus 2·d per LTE head call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from elasticbert import ElasticBertForSequenceClassification
from elasticbert.flops import sample_flops
from elasticbert.modeling import attention_mask_for_sdpa

from ..data import Batch, forward_in_order
from ..model import exit_logits
from ..tasks import logits_to_predictions
from .rules import ExitRule


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


def _exits_to_run(model: ElasticBertForSequenceClassification, exit_layers: Sequence[int] | None) -> tuple[int, ...]:
    exits = tuple(sorted(set(exit_layers))) if exit_layers is not None else model.exit_layers
    unknown = sorted(set(exits) - set(model.exit_layers))
    if unknown:
        raise ValueError(f"layers {unknown} have no exit; this model's exits are {list(model.exit_layers)}")
    return exits


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

    def __init__(self, hidden: torch.Tensor, attention_mask: torch.Tensor, lengths: torch.Tensor) -> None:
        self.rows = torch.arange(hidden.shape[0])
        self.lengths = lengths
        self.hidden = hidden
        self.attention_mask = attention_mask
        self.sdpa_mask = attention_mask_for_sdpa(attention_mask)

    def keep(self, survivors: torch.Tensor) -> None:
        """Index the survivors and cut the padding to the longest of them."""
        self.rows, self.lengths = self.rows[survivors], self.lengths[survivors]
        longest = int(self.lengths.max())
        self.hidden = self.hidden[survivors, :longest]
        self.attention_mask = self.attention_mask[survivors, :longest]
        self.sdpa_mask = attention_mask_for_sdpa(self.attention_mask)


def run_batch(
    model: ElasticBertForSequenceClassification,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    token_type_ids: torch.Tensor | None,
    rule: ExitRule,
    exit_layers: Sequence[int] | None = None,
) -> EarlyExitResult:
    """Early-exit inference on one batch. Samples whose rule fires leave the batch; the rest continue, trimmed to
    their longest real length. `exit_layers` restricts which exits run (default: all the model has)."""
    if model.training:
        raise ValueError("run_batch needs model.eval() (dropout would make exits random)")
    exits = _exits_to_run(model, exit_layers)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    lengths = attention_mask.sum(1).cpu()
    _check_right_padded(attention_mask, lengths)
    longest = int(lengths.max())
    input_ids, attention_mask = input_ids[:, :longest], attention_mask[:, :longest]
    if token_type_ids is not None:
        token_type_ids = token_type_ids[:, :longest]
    out = _Outputs(input_ids.shape[0], model.config.num_labels)
    rule.start(input_ids.shape[0])
    with torch.inference_mode():
        hidden = model.elasticbert.embeddings(input_ids, token_type_ids)
        _run_layers(model, rule, exits, _Running(hidden, attention_mask, lengths), out)
    return EarlyExitResult(out.logits, out.layer, lengths, out.count, exits)


def _run_layers(
    model: ElasticBertForSequenceClassification, rule: ExitRule, exits: tuple[int, ...], run: _Running, out: _Outputs
) -> None:
    """Layer by layer up to the last exit; at each exit, the samples whose rule fires are recorded and leave."""
    exit_set, last = set(exits), exits[-1]
    position = 0
    for index in range(last):
        run.hidden = model.elasticbert.encoder.run_layer(index, run.hidden, run.sdpa_mask)
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


def run_dataset(
    model: ElasticBertForSequenceClassification,
    batches: Sequence[Batch],
    rule: ExitRule,
    exit_layers: Sequence[int] | None = None,
) -> tuple[EarlyExitResult, float]:
    """Early exit over pre-built batches; returns per-sample results in dataset order and the wall time (seconds) of
    the model work alone (tokenisation and batching happen before the clock starts)."""
    return forward_in_order(lambda ids, mask, types: run_batch(model, ids, mask, types, rule, exit_layers), batches)


def run_full_model(
    model: ElasticBertForSequenceClassification,
    batches: Sequence[Batch],
    layer: int | None = None,
) -> tuple[torch.Tensor, float]:
    """The reference a speed-up is measured against: the model's own forward, truncated at one exit (default: the
    last), on the same batches. Returns logits in dataset order and wall time."""
    layer = layer or model.exit_layers[-1]

    def forward(ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        return exit_logits(model(ids, attention_mask=mask, token_type_ids=types, exit_layers=[layer]))[0]

    with torch.inference_mode():
        logits, elapsed = forward_in_order(forward, batches)
    return logits.float(), elapsed


def per_sample_flops(
    config: object, result: EarlyExitResult, lte_in_features: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(total, matmul) FLOPs per sample: `sample_flops` with the real length, exit layer and the exit heads run, plus
    2·d for each LTE head call. `matmul` is what a matmul-level counter (FlopCounterMode) sees."""
    total = np.empty(len(result.lengths))
    matmul = np.empty(len(result.lengths))
    for i, (length, layer) in enumerate(zip(result.lengths.tolist(), result.exit_layers.tolist())):
        trace = result.trace(i)
        flops = sample_flops(config, int(length), int(layer), exits_evaluated=trace)
        lte_calls = len(trace) - 1 if trace and trace[-1] == result.exits[-1] else len(trace)
        extra = 2 * lte_in_features * lte_calls  # the last exit takes everyone without asking the head
        total[i], matmul[i] = flops.total + extra, flops.matmul + extra
    return total, matmul


def static_flops(config: object, lengths: torch.Tensor, layer: int) -> np.ndarray:
    """Per-sample FLOPs of static truncation at `layer` (one exit head): the ELUE per-exit baseline points."""
    return np.array([sample_flops(config, int(n), layer).total for n in lengths.tolist()])
