"""Validation during pre-training: every exit on a fixed slice of the held-out split, per-exit MLM loss and accuracy
(token-weighted) and SOP loss and accuracy, summed over the ranks in one all-reduce (`EvalSums`).

Every rank runs the same number of micro-batches (ZeRO-3's parameter gathers need every rank in each forward), so
the slice is the first `max_samples` samples cut to whole batches on every rank.

Validation pads one sample per row even when training packs (`data.packing`): packing computes the same per-sample
losses (tests/pretrain/test_packing.py), so nothing is gained in what it measures, while its cost is a small fixed
slice every `eval.interval` steps; and `EvalSums` counts a batch's samples by its rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .collation import Collator, to_device
from .stats import EvalSums, Group


def eval_keys(sizes: Sequence[int], max_samples: int, micro: int, group: Group) -> list[tuple[int, int]]:
    """This rank's share of the first `max_samples` held-out samples (corpus, sample), in whole batches on every
    rank; [] when the split is smaller than one batch per rank."""
    keys = [(k, i) for k, n in enumerate(sizes) for i in range(n)]
    n = min(len(keys), max_samples) // (micro * group.world) * (micro * group.world)
    per_rank = n // group.world
    return keys[group.rank * per_rank : (group.rank + 1) * per_rank]


def evaluate(
    engine: Any, valid: Sequence[Any], collator: Collator, group: Group, max_samples: int, micro: int, num_layers: int
) -> dict[str, Any] | None:
    """{"exits": [1..L], "samples", "mlm_loss", "mlm_accuracy", "sop_loss", "sop_accuracy"} (per-exit lists), or
    None when the held-out split is smaller than one batch per rank."""
    keys = eval_keys([len(d) for d in valid], max_samples, micro, group)
    if not keys:
        return None
    exits = tuple(range(1, num_layers + 1))
    one_per_row = collator.unpacked()
    sums = EvalSums.zeros(len(exits), engine.device)
    was_training = engine.module.training
    engine.eval()
    with torch.no_grad():
        for start in range(0, len(keys), micro):
            items = [valid[k][i] for k, i in keys[start : start + micro]]
            batch = to_device(one_per_row(items), engine.device)
            out = engine(**batch, active_exits=exits, gradient_equilibrium=False)
            sums.add_batch(out, batch)
    if was_training:
        engine.train()
    return {"exits": list(exits), **sums.all_reduce(group).means()}
