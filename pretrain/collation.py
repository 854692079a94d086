"""How a micro-batch's samples become the model's tensors: one sample per padded row (`collate`), or several
samples packed into each row of at most `max_length` (`pack_rows`, `row_plan`, `pack`; `data.packing`), and the
picklable `Collator` the DataLoader workers run.

Packed rows keep everything that makes a step what it is: the same samples in the same order (per-sample tensors —
SOP labels, [CLS] positions, keys — stay in batch order), the same masked tokens, and each sample alone in its
attention and its positions (the model reads `sample_ids`: `elasticbert.masks.packed_attention_mask`). Only the
padding goes: a step's losses and gradients are those of the padded step (tests/pretrain/test_packing.py).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence

import numpy as np
import torch

from common.torch_private import mark_dynamic_size

IGNORE_INDEX = -100  # the MLM label of a token that is not a target (cross-entropy's default ignore_index)
# A micro-batch is packed only when that removes at least this share of its padded tokens (at 32 samples: one row);
# otherwise it keeps one sample per padded row (the same losses). Why: attention over packed rows takes a
# [rows, 1, T, T] mask, read for every head, where padded rows take a [rows, 1, 1, T] one: on CPU, hidden 768, seq
# 512, the same 32 x 512 batch stepped as 32 packed rows took 1.01x the padded step (bench/pretrain/packing.py, "the
# block-diagonal mask alone"); a packed micro-batch that saves nothing would pay that for nothing.
PACKING_MIN_SAVING = 0.02


def masked_positions(labels: np.ndarray) -> torch.Tensor:
    """The masked tokens of a micro-batch as flattened indices, ascending: found here on the host, they reach the
    model's sparse MLM prediction without the `nonzero` it would otherwise run on the device (a host sync per
    micro-batch on a GPU: the host waits for the whole forward before it can queue the heads and the backward)."""
    return torch.from_numpy(np.flatnonzero(labels.reshape(-1) != IGNORE_INDEX))


def collate(items: list[dict[str, np.ndarray]], pad_id: int = 0, multiple: int = 8) -> dict[str, torch.Tensor]:
    """Pad to the longest sample (rounded up to `multiple`): deterministic, and cheaper than max_length."""
    longest = max(len(it["input_ids"]) for it in items)
    length = -(-longest // multiple) * multiple
    n = len(items)
    input_ids = np.full((n, length), pad_id, dtype=np.int64)
    types = np.zeros((n, length), dtype=np.int64)
    labels = np.full((n, length), IGNORE_INDEX, dtype=np.int64)
    attention = np.zeros((n, length), dtype=np.int64)
    for r, it in enumerate(items):
        t = len(it["input_ids"])
        input_ids[r, :t] = it["input_ids"]
        types[r, :t] = it["token_type_ids"]
        labels[r, :t] = it["mlm_labels"]
        attention[r, :t] = 1
    batch = {
        "input_ids": torch.from_numpy(input_ids),
        "token_type_ids": torch.from_numpy(types),
        "attention_mask": torch.from_numpy(attention),
        "mlm_labels": torch.from_numpy(labels),
        "mlm_positions": masked_positions(labels),
        "sop_labels": torch.from_numpy(np.asarray([it["sop_label"] for it in items], dtype=np.int64)),
    }
    if "key" in items[0]:
        batch["keys"] = torch.from_numpy(np.stack([it["key"] for it in items]))
    return batch


def pack_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Which samples share which row: best-fit decreasing over the length histogram.

    Samples are taken longest first (a counting sort over the `capacity + 1` possible lengths, ties in batch order);
    each goes into the open row whose room left is the smallest that fits it (`bisect` over the sorted rooms), or
    opens a new row. Deterministic (a pure function of the lengths), O(n log n + capacity) for n samples: 30-140 µs
    for a micro-batch of 32 here (bench/pretrain/packing.py). Within a row the samples keep their batch order. Returns
    the rows as lists of sample indices, in the order they were opened."""
    by_length: list[list[int]] = [[] for _ in range(capacity + 1)]
    for i, n in enumerate(lengths):
        if not 0 < n <= capacity:
            raise ValueError(f"sample {i} has {n} tokens; a packed row holds 1..{capacity}")
        by_length[n].append(i)
    rows: list[list[int]] = []
    rooms: list[tuple[int, int]] = []  # (room left, row), sorted: the best fit is the first with room >= n
    for n in range(capacity, 0, -1):
        for i in by_length[n]:
            at = bisect.bisect_left(rooms, (n, -1))
            if at == len(rooms):
                row, room = len(rows), capacity - n
                rows.append([i])
            else:
                room, row = rooms.pop(at)
                rows[row].append(i)
                room -= n
            if room > 0:
                bisect.insort(rooms, (room, row))
    return [sorted(row) for row in rows]


ROW_COUNTS_TRIED = 4  # balanced plans for the fewest rows that could hold a micro-batch and the next three


def row_plan(lengths: Sequence[int], capacity: int, multiple: int = 8) -> tuple[list[list[int]], int]:
    """Which samples share which row, and how wide the rows are: the plan of least rows x width (least padding;
    ties: the narrower, whose attention is cheaper) among a few candidates, each polished by `_lower_fullest_row`:
    best fit at `capacity` (`pack_rows`: always feasible), and the samples balanced over k rows for the fewest k that
    could hold them and the next `ROW_COUNTS_TRIED - 1` (`_balanced_rows`), the width then the fullest row rounded
    up to `multiple` (kept only when it is within `capacity`).

    Why not best fit into rows of `capacity` alone: it fills every row but the last one or two, and at 32 samples a
    part-filled row of 512 is several points of padding, where the same samples balanced over as many rows make every
    row a little shorter (WikiText-2, seq 512, micro-batches of 32: 7.1 % padding in best-fit rows of 512, 1.6 %
    balanced; bench/pretrain/packing.py). Every sample still sits whole in one row with its own positions, so nothing a
    step computes changes. Deterministic (a pure function of the lengths); ~0.7 ms per micro-batch of 32 at 512, in the
    DataLoader's workers. Rows come back with their samples in batch order."""
    total = sum(lengths)
    fewest = -(-total // capacity)
    candidates = [pack_rows(lengths, capacity)]
    candidates += [
        _balanced_rows(lengths, k) for k in range(fewest, min(len(lengths), fewest + ROW_COUNTS_TRIED - 1) + 1)
    ]
    best: tuple[int, int, list[list[int]]] | None = None
    for rows in candidates:
        rows, fullest = _lower_fullest_row(lengths, rows)
        if fullest > capacity:
            continue
        width = min(-(-fullest // multiple) * multiple, capacity)
        if best is None or (len(rows) * width, width) < best[:2]:
            best = (len(rows) * width, width, rows)
    assert best is not None  # best fit at capacity is always feasible
    return [sorted(row) for row in best[2]], best[1]


def _balanced_rows(lengths: Sequence[int], rows: int) -> list[list[int]]:
    """The samples over `rows` rows, longest first, each into the row with the fewest tokens so far (ties: the
    first row): the longest-processing-time rule, whose fullest row is within 4/3 of the best possible."""
    plan: list[list[int]] = [[] for _ in range(rows)]
    fills = [(0, r) for r in range(rows)]  # a heap of (tokens, row)
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        tokens, r = heapq.heappop(fills)
        plan[r].append(i)
        heapq.heappush(fills, (tokens + lengths[i], r))
    return plan


def _lower_fullest_row(lengths: Sequence[int], rows: list[list[int]]) -> tuple[list[list[int]], int]:
    """Local search on a plan: while moving one sample out of the fullest row into another, or swapping it for a
    shorter one there, leaves both rows below the fullest's tokens, make the best such change. Each change lowers
    the fullest row or the number of rows that full, so it ends; returns the plan and its fullest row's tokens."""
    rows = [list(row) for row in rows]
    fills = [sum(lengths[i] for i in row) for row in rows]
    while True:
        top = max(range(len(rows)), key=lambda r: (fills[r], -r))
        best: tuple[int, int, int, int | None] | None = None  # (new fuller of the two rows, row, moved out, moved in)
        for other in range(len(rows)):
            if other == top:
                continue
            for out in rows[top]:
                for back in [None, *rows[other]]:
                    shift = lengths[out] - (0 if back is None else lengths[back])
                    if shift <= 0:
                        continue
                    fuller = max(fills[top] - shift, fills[other] + shift)
                    if fuller < fills[top] and (best is None or fuller < best[0]):
                        best = (fuller, other, out, back)
        if best is None:
            return rows, max(fills)
        _, other, out, back = best
        rows[top].remove(out)
        rows[other].append(out)
        shift = lengths[out]
        if back is not None:
            rows[other].remove(back)
            rows[top].append(back)
            shift -= lengths[back]
        fills[top] -= shift
        fills[other] += shift


def pack(
    items: list[dict[str, np.ndarray]],
    pad_id: int = 0,
    multiple: int = 8,
    capacity: int = 512,
    min_saving: float = PACKING_MIN_SAVING,
) -> dict[str, torch.Tensor]:
    """The samples of a micro-batch packed into rows of at most `capacity` tokens, as wide as `row_plan` finds least
    padded; `collate`'s one sample per padded row instead when packing would remove less than `min_saving` of its
    tokens. Per token, as `collate` gives them: input_ids,
    token_type_ids, mlm_labels (and mlm_positions, the masked tokens' flattened indices: `masked_positions`),
    attention_mask (1 = a real token: the trainer's token and padding counts read it);
    and what keeps the samples apart: sample_ids (1 + the sample's place in the batch, 0 = padding), from which the
    model builds its block-diagonal attention mask and each sample's positions. Per sample, in batch order (the
    micro-batch's samples and their order are unchanged): sop_labels, cls_positions (the flattened token index of
    its [CLS]) and keys; sop_labels.numel() is the sample count, input_ids.shape[0] the row count."""
    lengths = [len(it["input_ids"]) for it in items]
    rows, width = row_plan(lengths, capacity, multiple)
    if len(rows) * width > (1 - min_saving) * len(items) * -(-max(lengths) // multiple) * multiple:
        return collate(items, pad_id, multiple)
    shape = (len(rows), width)
    input_ids = np.full(shape, pad_id, dtype=np.int64)
    types = np.zeros(shape, dtype=np.int64)
    labels = np.full(shape, IGNORE_INDEX, dtype=np.int64)
    sample_ids = np.zeros(shape, dtype=np.int64)
    cls_positions = np.empty(len(items), dtype=np.int64)
    for r, row in enumerate(rows):
        at = 0
        for i in row:
            it, end = items[i], at + lengths[i]
            input_ids[r, at:end] = it["input_ids"]
            types[r, at:end] = it["token_type_ids"]
            labels[r, at:end] = it["mlm_labels"]
            sample_ids[r, at:end] = i + 1
            cls_positions[i] = r * width + at
            at = end
    batch = {
        "input_ids": torch.from_numpy(input_ids),
        "token_type_ids": torch.from_numpy(types),
        "attention_mask": torch.from_numpy((sample_ids > 0).astype(np.int64)),
        "mlm_labels": torch.from_numpy(labels),
        "mlm_positions": masked_positions(labels),
        "sop_labels": torch.from_numpy(np.asarray([it["sop_label"] for it in items], dtype=np.int64)),
        "sample_ids": torch.from_numpy(sample_ids),
        "cls_positions": torch.from_numpy(cls_positions),
    }
    if "key" in items[0]:
        batch["keys"] = torch.from_numpy(np.stack([it["key"] for it in items]))
    return batch


def sample_lengths(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each sample's real length (float64, in batch order, on the batch's device) of a collated micro-batch: packed,
    the tokens of each `sample_ids` value; padded, each row's mask. A scatter over the known sample count, not
    `bincount`, whose output size would be read from the device (a host sync per micro-batch on a GPU)."""
    if "sample_ids" in batch:
        ids = batch["sample_ids"].reshape(-1)
        counts = torch.zeros(batch["sop_labels"].numel() + 1, dtype=torch.float64, device=ids.device)
        return counts.scatter_add_(0, ids, torch.ones_like(ids, dtype=torch.float64))[1:]
    return batch["attention_mask"].sum(1, dtype=torch.float64)


def to_device(batch: dict[str, torch.Tensor], device: torch.device | str, non_blocking: bool = False) -> dict:
    """A collated micro-batch on the model's device (its host-only `keys` left behind), with the number of masked
    tokens marked as a dynamic size: it varies batch to batch, and a compiled model (`train.compile`) then builds each
    graph once with that size symbolic, instead of once with the first batch's count and again, dynamic, at the first
    batch that changes it (a quarter of the compiles of a run: tests/pretrain/test_compile.py counts them). Marking
    costs nothing when the model is not compiled."""
    on_device = {name: t.to(device, non_blocking=non_blocking) for name, t in batch.items() if name != "keys"}
    if "mlm_positions" in on_device:
        mark_dynamic_size(on_device["mlm_positions"], 0)
    return on_device


class Collator:
    """Picklable collate with its settings bound (DataLoader workers pickle it): the pad id, the length multiple,
    and whether samples are packed several to a row (`data.packing`: `pack`, rows of `max_length`) or padded one to
    a row (`collate`). A compiled model gets every unpacked batch padded to `max_length` (multiple = max_length):
    one static shape (packing varies the row count, so the config refuses it with `train.compile`). The masked
    positions still vary in number: `to_device` marks that size dynamic, so each graph compiles once, and has no
    host sync at the `nonzero` it would otherwise run."""

    def __init__(self, pad_id: int, multiple: int = 8, packing: bool = False, max_length: int | None = None) -> None:
        if packing and max_length is None:
            raise ValueError("Collator: packing needs max_length (the row capacity)")
        self.pad_id = pad_id
        self.multiple = multiple
        self.packing = packing
        self.max_length = max_length

    def __call__(self, items: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
        if self.packing:
            return pack(items, self.pad_id, self.multiple, self.max_length)
        return collate(items, self.pad_id, self.multiple)

    def unpacked(self) -> Collator:
        """The same collation, one sample per row."""
        return Collator(self.pad_id, self.multiple, False, self.max_length)
