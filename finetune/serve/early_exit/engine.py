"""The early-exit engine over a split: the batched engine itself (`run_batch`, samples leave the batch as their rule
fires) lives in `elasticbert.early_exit` - the model's own forward runs it - and is re-exported here with
`EarlyExitResult`, `per_sample_flops` and `exit_histogram`. This module maps it over a split's batches
(`run_dataset`), measures the full-model reference (`run_full_model`) and the static per-layer FLOPs.

Batches are length-sorted (right padding is required; see `finetune.data.EncodedSplit.batches`) so that the engine's
trim is effective and little time goes to padding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from elasticbert import ElasticBertForSequenceClassification
from elasticbert.early_exit import EarlyExitResult, ExitRule, exit_histogram, per_sample_flops, run_batch
from elasticbert.flops import sample_flops

from ...data import Batch, forward_in_order
from ...model import exit_logits


def run_dataset(
    model: ElasticBertForSequenceClassification,
    batches: Sequence[Batch],
    rule: ExitRule,
    exit_layers: Sequence[int] | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[EarlyExitResult, float]:
    """Early exit over pre-built batches; returns per-sample results in dataset order and the wall time (seconds) of
    the model work alone (tokenisation and batching happen before the clock starts). `progress(n)` is called after
    each batch with its number of rows."""

    def forward(ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> EarlyExitResult:
        return run_batch(model, ids, mask, types, rule, exit_layers)

    return forward_in_order(forward, batches, progress)


def run_full_model(
    model: ElasticBertForSequenceClassification,
    batches: Sequence[Batch],
    layer: int | None = None,
) -> tuple[torch.Tensor, float]:
    """The reference a speed-up is measured against: the model's own forward, truncated at one exit (default: the
    last), on the same batches. Returns logits in dataset order (on the CPU) and wall time."""
    layer = layer or model.exit_layers[-1]
    device = model.device

    def forward(ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        out = model(
            ids.to(device), attention_mask=mask.to(device), token_type_ids=types.to(device), exit_layers=[layer]
        )
        return exit_logits(out)[0]

    with torch.inference_mode():
        logits, elapsed = forward_in_order(forward, batches)
    return logits.float(), elapsed


def static_flops(config: object, lengths: torch.Tensor, layer: int) -> np.ndarray:
    """Per-sample FLOPs of static truncation at `layer` (one exit head): the ELUE per-exit baseline points."""
    return np.array([sample_flops(config, int(n), layer).total for n in lengths.tolist()])


__all__ = [
    "EarlyExitResult",
    "exit_histogram",
    "per_sample_flops",
    "run_batch",
    "run_dataset",
    "run_full_model",
    "static_flops",
]
