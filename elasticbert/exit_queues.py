"""The early-exit engine: one queue per layer, so that every layer call runs a full batch.

A batch that runs until its deepest sample leaves makes its later layers smaller, not cheaper per row: on a GPU a layer
of 3 rows costs what a layer of 32 does, and on any runtime each call has a fixed cost. `ExitQueues` keeps instead
one queue per layer. Inputs enter the first queue (`submit`); a layer call takes up to `batch_size` rows from its queue,
runs the layer (and its exit), and the rows whose rule does not fire join the next layer's queue, where they wait for
rows of later inputs that reach the same layer. `pump` runs every queue that holds a full batch, deepest first (the
rows nearest to their answer, and the queues stay at most two batches deep); `flush` then runs what is left, shallowest
first, so that the partial batches merge on their way down (at most one partial call per layer). A row never waits
longer than `max_wait` seconds after its submission for rows to share its calls with, when a bound is set (`pump`
runs a late row's partial batches).

Rows of different lengths share a layer call: each batch is right-padded to its longest row and masked (attention per
row), and a row's padding is cut again as it leaves a batch. On a runner with a `step_cost` (the CPU runners) a layer
call runs as the few steps of rows of similar length that cost least by it (`length_groups`): a CPU pays for padding
and for oversized steps, not for a step's fixed cost alone (SST-2 dev at batch 32: 44 % of the tokens of its first
layer calls were padding); a GPU runner runs each call as one step.

The rule's per-row state (PABEE's and PCEE's counters, the previous prediction) travels with the row
(`ExitRule.initial_state`). So an input's answer - exit layer, exit heads run, logits - is the one it gets alone,
whichever rows it shares its calls and steps with: exactly on the ONNX Runtime int8 pieces (activations quantized per
token), within float rounding in fp32 (tests/finetune_early_exit/test_exit_queues.py).

`run_batch` is this engine on one batch with no later inputs: the batch shrinks as rows leave, each layer's rows cut to
the longest that stayed, as before the queues. Everything about rows (which, how long, what they left with) is
bookkeeping on the host; hidden states, masks, rule state and logits stay on the runner's device, and each layer call
with an exit makes one host sync - the rule's decision, needed to route the rows (a batch of one reads a bool).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .layer_runner import LayerRunner, StepCost, as_runner


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


def exits_to_run(model: LayerRunner, exit_layers: Sequence[int] | None, rule: Any) -> tuple[int, ...]:
    """The exits a run uses: `exit_layers` (default: all the model has), only the last when the rule never fires."""
    exits = tuple(sorted(set(exit_layers))) if exit_layers is not None else tuple(model.exit_layers)
    unknown = sorted(set(exits) - set(model.exit_layers))
    if unknown:
        raise ValueError(f"layers {unknown} have no exit; this model's exits are {list(model.exit_layers)}")
    if not exits:
        raise ValueError("early exit needs at least one exit layer")
    return exits if rule.can_fire else exits[-1:]  # a rule that never fires needs no exit but the last


def check_right_padded(attention_mask: torch.Tensor, lengths: torch.Tensor) -> None:
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    if not torch.equal(attention_mask.bool(), positions[None, :] < lengths.to(attention_mask.device)[:, None]):
        raise ValueError("early exit needs right-padded inputs (attention_mask = ones then zeros per row)")


# ------------------------------------------------------------------------------------------------------ rows


def _map(fn: Callable[[torch.Tensor], torch.Tensor], x: Any) -> Any:
    """`fn` on a tensor, or on each tensor of a tuple (the embedding inputs; None stays None)."""
    if isinstance(x, tuple):
        return tuple(None if t is None else fn(t) for t in x)
    return fn(x)


class _Block:
    """Rows waiting at one layer, as one batch right-padded to its longest row: `inputs` (hidden states [b, T, d], or
    before the first layer the embedding inputs), `mask` [b, T] and the rule's per-row `state` on the device;
    `slots` (each row's output slot) and `lengths` on the host; `since`: when the oldest of them was submitted."""

    __slots__ = ("inputs", "mask", "slots", "lengths", "state", "since")

    def __init__(self, inputs: Any, mask: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor, state: dict):
        self.inputs, self.mask, self.slots, self.lengths, self.state = inputs, mask, slots, lengths, state
        self.since = 0.0

    @property
    def rows(self) -> int:
        return self.slots.shape[0]

    def padded(self) -> bool:
        return self.mask.shape[1] > int(self.lengths.min())

    def select(self, index: torch.Tensor | slice, inputs: Any = None) -> _Block:
        """Rows `index` (a host index, or a slice: views), with `inputs` in place of the block's when given, cut to
        the longest of them."""
        lengths = self.lengths[index]
        longest = int(lengths.max())
        rows = index if isinstance(index, slice) else index.to(self.mask.device)
        block = _Block(
            _map(lambda t: t[rows, :longest], self.inputs if inputs is None else inputs),
            self.mask[rows, :longest],
            self.slots[index],
            lengths,
            {key: value[rows] for key, value in self.state.items()},
        )
        block.since = self.since
        return block

    def split(self, n: int) -> tuple[_Block, _Block]:
        """The first `n` rows and the rest (views), each cut to its longest row."""
        return self.select(slice(0, n)), self.select(slice(n, None))


def _join(blocks: list[_Block]) -> _Block:
    """One batch of several blocks: each padded to the longest row of all (zeros, masked out), then stacked."""
    if len(blocks) == 1:
        return blocks[0]
    longest = max(block.mask.shape[1] for block in blocks)

    def stacked(parts: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(
            [F.pad(p, (0, 0, 0, longest - p.shape[1]) if p.dim() == 3 else (0, longest - p.shape[1])) for p in parts]
        )

    first = blocks[0]
    if isinstance(first.inputs, tuple):
        inputs: Any = tuple(
            None if part is None else stacked([block.inputs[k] for block in blocks])
            for k, part in enumerate(first.inputs)
        )
    else:
        inputs = stacked([block.inputs for block in blocks])
    joined = _Block(
        inputs,
        stacked([block.mask for block in blocks]),
        torch.cat([block.slots for block in blocks]),
        torch.cat([block.lengths for block in blocks]),
        {key: torch.cat([block.state[key] for block in blocks]) for key in first.state},
    )
    joined.since = min(block.since for block in blocks)
    return joined


def _nearest(lengths: torch.Tensor, size: int, anchor: int = 0) -> torch.Tensor:
    """Indices of `size` of the rows with `lengths`: row `anchor` (the oldest) and the others of the run of `size`
    rows in length order around it that pads least (sorted)."""
    order = torch.argsort(lengths, stable=True)
    ranked = lengths[order]
    where = int((order == anchor).nonzero()[0])
    first, last = max(0, where - size + 1), min(where, len(lengths) - size)
    windows = ranked.unfold(0, size, 1)[first : last + 1]  # each candidate run of `size` rows holding row 0
    padding = windows.max(1).values * size - windows.sum(1)
    start = first + int(padding.argmin())
    return torch.sort(order[start : start + size]).values


def length_groups(lengths: torch.Tensor, cost: StepCost) -> list[torch.Tensor] | None:
    """The rows with `lengths` split into steps of rows of similar length that cost least by `cost`: each step
    `call_tokens` plus its rows x its longest row, none over `max_tokens` unless it is one row (an exact partition of
    the rows in length order, by dynamic programming). Row indices per step, longest first; None when one step of
    all the rows is cheapest (a request alone, rows of equal length, little padding)."""
    rows = lengths.shape[0]
    if rows == 1:
        return None
    longest, total = int(lengths.max()), int(lengths.sum())
    if rows * longest <= cost.max_tokens and rows * longest - total <= cost.call_tokens:
        return None  # splitting saves less padding than a step costs
    order = torch.argsort(lengths, descending=True, stable=True)
    width = lengths[order].numpy().astype(np.float64)  # a step of sorted rows i..j-1 is padded to width[i]
    best, start = np.zeros(rows + 1), np.zeros(rows + 1, dtype=np.int64)
    for end in range(1, rows + 1):
        size = end - np.arange(end)
        tokens = size * width[:end]
        cost_to = best[:end] + cost.call_tokens + tokens
        cost_to[(tokens > cost.max_tokens) & (size > 1)] = np.inf
        start[end] = int(cost_to.argmin())
        best[end] = cost_to[start[end]]
    bounds, end = [], rows
    while end:
        bounds.append((int(start[end]), end))
        end = bounds[-1][0]
    if len(bounds) == 1:
        return None
    return [order[first:last] for first, last in reversed(bounds)]


@dataclass
class Finished:
    """Rows that left, in the order they left: output `slots` and what each left with (logits on the host)."""

    slots: torch.Tensor
    logits: torch.Tensor
    exit_layers: torch.Tensor
    exits_evaluated: torch.Tensor
    lengths: torch.Tensor


# ----------------------------------------------------------------------------------------------------- engine


class ExitQueues:
    """The early-exit engine over a `LayerRunner` (or a model: its eager runner) and an exit rule; see the module
    docstring. `batch_size`: the rows of a full layer call; `max_wait`: the longest, in seconds, an input waits for
    rows to share its layer calls with, counted from its submission (None: until its batches fill or `flush`); once
    late, its rows run at every layer without waiting; `exit_layers`: the exits the engine may use (default: all the
    model has); `split_by_length`: run a layer call as the runner's cheapest steps by length (`length_groups`, when
    the runner has a step cost), else as one step."""

    def __init__(
        self,
        model: nn.Module | LayerRunner,
        rule: Any,
        batch_size: int = 32,
        exit_layers: Sequence[int] | None = None,
        max_wait: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        split_by_length: bool = True,
    ) -> None:
        self.runner = as_runner(model)
        if self.runner.training:
            raise ValueError("early exit needs model.eval() (dropout would make exits random)")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.rule, self.batch_size, self.max_wait, self.clock = rule, batch_size, max_wait, clock
        self.step_cost = self.runner.step_cost if split_by_length else None
        self.exits = exits_to_run(self.runner, exit_layers, rule)
        self.last = self.exits[-1]
        self.position = {layer: i for i, layer in enumerate(self.exits)}  # exit layer -> its index among the exits
        self.queues: list[deque[_Block]] = [deque() for _ in range(self.last)]
        self.counts = [0] * self.last  # rows waiting per queue
        self.calls = [0] * self.last  # layer calls run, per layer
        self.steps = [0] * self.last  # the runner's steps they ran as (more than calls: split by length)
        self.rows_run = [0] * self.last  # rows those calls ran
        self.next_slot, self.positions_given = 0, None
        self.done: list[tuple] = []  # what left since the last `take` (empty: nothing to take)

    @property
    def waiting(self) -> int:
        """Rows in the queues."""
        return sum(self.counts)

    def submit(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> range:
        """Queue a right-padded batch of inputs at the first layer; returns their output slots (consecutive, in the
        order given). Nothing runs until `pump` or `flush`."""
        if input_ids.shape[0] == 0:
            return range(self.next_slot, self.next_slot)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        lengths = attention_mask.sum(1).cpu()
        shortest = int(lengths.min())
        if shortest < 1:
            raise ValueError("early exit needs at least one token per input")
        if shortest < attention_mask.shape[1]:
            check_right_padded(attention_mask, lengths)
        if self.positions_given is None:
            self.positions_given = position_ids is not None
        elif self.positions_given != (position_ids is not None):
            raise ValueError("pass position_ids with every submitted batch or with none")
        device, longest, rows = self.runner.device, int(lengths.max()), input_ids.shape[0]
        types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        inputs = tuple(None if t is None else t[:, :longest].to(device) for t in (input_ids, types, position_ids))
        slots = torch.arange(self.next_slot, self.next_slot + rows)
        self.next_slot += rows
        state = self.rule.initial_state(rows, device)
        block = _Block(inputs, attention_mask[:, :longest].to(device), slots, lengths, state)
        block.since = self.clock()
        self._enqueue(0, block)
        return range(int(slots[0]), self.next_slot)

    def pump(self) -> None:
        """Run every full batch (deepest queue first), and the partial batch of any queue holding a row submitted
        more than `max_wait` ago (shallowest first)."""
        with torch.inference_mode():
            while True:
                index = next((i for i in range(self.last - 1, -1, -1) if self.counts[i] >= self.batch_size), None)
                if index is None:
                    index = self._late()
                if index is None:
                    return
                self._run(index, self._take(index))

    def flush(self) -> None:
        """Run everything: full batches first, then the shallowest partial one, whose rows may fill the next."""
        with torch.inference_mode():
            while self.waiting:
                self.pump()
                index = next((i for i in range(self.last) if self.counts[i]), None)
                if index is not None:
                    self._run(index, self._take(index))

    def take(self) -> Finished:
        """The rows that left since the last `take`, in the order they left (logits moved to the host at once)."""
        done, self.done = self.done, []
        if not done:
            empty = torch.empty(0, dtype=torch.long)
            return Finished(empty, torch.empty(0, 0), empty, empty, empty)
        if len(done) == 1:  # one call's rows (a request served alone): no concatenation
            slots, logits, layer, count, lengths = done[0]
            rows = slots.shape[0]
            return Finished(
                slots, logits.float().cpu(), torch.full((rows,), layer), torch.full((rows,), count), lengths
            )
        slots, logits, layers, counts, lengths = zip(*done)
        sizes = torch.tensor([len(s) for s in slots])
        return Finished(
            torch.cat(slots),
            torch.cat(logits).float().cpu(),
            torch.tensor(layers).repeat_interleave(sizes),
            torch.tensor(counts).repeat_interleave(sizes),
            torch.cat(lengths),
        )

    def fill(self) -> float:
        """Rows per layer call over `batch_size`, all layers together: 1.0 when every call ran a full batch."""
        calls = sum(self.calls)
        return sum(self.rows_run) / (calls * self.batch_size) if calls else 0.0

    # ------------------------------------------------------------------------------------------------- internals

    def _late(self) -> int | None:
        if self.max_wait is None:
            return None
        due = self.clock() - self.max_wait
        return next((i for i, q in enumerate(self.queues) if q and min(b.since for b in q) < due), None)

    def _enqueue(self, index: int, block: _Block) -> None:
        self.queues[index].append(block)
        self.counts[index] += block.rows

    def _take(self, index: int) -> _Block:
        """Up to `batch_size` rows of queue `index`, as one batch: all of them when they fit, else a row of the oldest
        input there and the rows nearest to it in length (`_nearest`), so that a full batch carries little padding
        and no row waits behind rows that came later. One block (a submitted batch, already in length order) is
        taken from the front."""
        queue, limit = self.queues[index], self.batch_size
        if self.counts[index] <= limit or len(queue) == 1:
            taken, need = [], limit
            while need and queue:
                block = queue[0]
                if block.rows > need:
                    taken_part, queue[0] = block.split(need)
                    taken.append(taken_part)
                    need = 0
                else:
                    taken.append(queue.popleft())
                    need -= block.rows
            self.counts[index] -= limit - need
            return _join(taken)
        oldest = min(range(len(queue)), key=lambda i: queue[i].since)
        chosen = _nearest(
            torch.cat([block.lengths for block in queue]), limit, sum(b.rows for b in list(queue)[:oldest])
        )
        taken, kept, start = [], deque(), 0
        for block in queue:
            mine = chosen[(chosen >= start) & (chosen < start + block.rows)] - start
            start += block.rows
            if len(mine) == block.rows:
                taken.append(block)
                continue
            if len(mine):
                rest = torch.ones(block.rows, dtype=torch.bool)
                rest[mine] = False
                taken.append(block.select(mine))
                block = block.select(rest.nonzero().squeeze(1))
            kept.append(block)
        self.queues[index] = kept
        self.counts[index] -= limit
        return _join(taken)

    def _finish(self, slots: torch.Tensor, lengths: torch.Tensor, logits: torch.Tensor, layer: int) -> None:
        self.done.append((slots, logits, layer, self.position[layer] + 1, lengths))

    def _run(self, index: int, block: _Block) -> None:
        """One layer call: layer `index` (0-based) on `block`'s rows, as one step or, on a runner with a step cost,
        as the cheapest steps of rows of similar length (`length_groups`)."""
        self.calls[index] += 1
        self.rows_run[index] += block.rows
        groups = length_groups(block.lengths, self.step_cost) if self.step_cost is not None else None
        if groups is None:
            self._step(index, block)
            return
        for rows in groups:
            self._step(index, block.select(rows))

    def _step(self, index: int, block: _Block) -> None:
        """Layer `index` (0-based) on `block` and, at an exit, the rule; rows leave or join the next queue."""
        layer = index + 1
        with_exit = layer in self.position
        out = self.runner.step(index, block.inputs, block.mask, block.padded(), with_exit)
        self.steps[index] += 1
        if not with_exit:
            block.inputs = out.hidden
            self._enqueue(layer, block)
            return
        if layer == self.last:
            self._finish(block.slots, block.lengths, out.logits, layer)
            return
        fire = self.rule.decide(self.position[layer], out.representation, out.logits, block.state)
        if block.rows == 1:  # a request served alone: one bool, no index bookkeeping
            if bool(fire):
                self._finish(block.slots, block.lengths, out.logits, layer)
            else:
                block.inputs = out.hidden
                self._enqueue(layer, block)
            return
        fire = fire.cpu()  # the one host sync of the call: which rows leave
        fired = int(fire.sum())
        if fired == block.rows:
            self._finish(block.slots, block.lengths, out.logits, layer)
            return
        if fired:
            leaving = fire.nonzero().squeeze(1)
            logits = out.logits[leaving.to(out.logits.device)]
            self._finish(block.slots[leaving], block.lengths[leaving], logits, layer)
            block = block.select((~fire).nonzero().squeeze(1), inputs=out.hidden)
        else:
            block.inputs = out.hidden
        self._enqueue(layer, block)


def run_batch(
    model: nn.Module | LayerRunner,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    token_type_ids: torch.Tensor | None,
    rule: Any,
    exit_layers: Sequence[int] | None = None,
    position_ids: torch.Tensor | None = None,
) -> EarlyExitResult:
    """Early-exit inference on one batch of an `ElasticBertForSequenceClassification` (in eval mode) or any
    `LayerRunner`: the queue engine with nothing after this batch, so rows leave as their rule fires and the rest
    continue, cut to their longest real length. `exit_layers` restricts which exits run (default: all the model has).
    Inputs move to the model's device; the result is on the CPU, in input order. Each layer call is one step: this is
    the evaluation's and the model's own forward, whose fp32 numbers stay those of one batched forward (the serving
    stream splits its calls by length, `ExitQueues`)."""
    engine = ExitQueues(
        model, rule, batch_size=max(input_ids.shape[0], 1), exit_layers=exit_layers, split_by_length=False
    )
    engine.submit(input_ids, attention_mask, token_type_ids, position_ids)
    engine.flush()
    done = engine.take()
    order = torch.argsort(done.slots)
    return EarlyExitResult(
        done.logits[order], done.exit_layers[order], done.lengths[order], done.exits_evaluated[order], engine.exits
    )


__all__ = [
    "EarlyExitResult",
    "ExitQueues",
    "Finished",
    "check_right_padded",
    "exits_to_run",
    "logits_to_predictions",
    "run_batch",
]
