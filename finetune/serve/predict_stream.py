"""Serving a stream of texts with the queue engine: texts in, one record per input out, in input order.

`EarlyExitClassifier.stream()` makes one; `EarlyExitClassifier.predict` (the Python API's batch call) and the
`predict` command (a file, or stdin as lines arrive) run everything through it:

- `submit(inputs)`: each input gets its verdict first (`verdicts`: one the model cannot read is answered with its
  flag, not classified); the others are tokenised with the tokenizer's Rust batch call, checked against the [UNK]
  guard, sorted by length (rows of similar length share the first layer's calls) and queued at the first layer of
  the engine (`elasticbert.exit_queues.ExitQueues`);
- `pump()` runs every full layer batch; `flush()` runs the rest (the end of the input, or a stream that went quiet);
- `ready()` hands out the records whose inputs and every earlier input are answered: input order, with the rows of
  later inputs free to overtake in the engine.

A layer call batches rows of any inputs that reached that layer, so an input's record does not depend on what else
was submitted (exit layer, label, FLOPs: the same as alone; probabilities the same on the ONNX Runtime int8 pieces,
within float rounding elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from elasticbert.early_exit import per_sample_flops
from elasticbert.exit_queues import EarlyExitResult, ExitQueues

from ..data import encode_examples
from ..tasks import Example
from .input_checks import check_kinds
from .inputs import TextInput
from .verdicts import Verdict, character_verdict


class PredictionStream:
    """Texts in, records out in input order, through one queue engine (see the module docstring)."""

    def __init__(self, classifier: Any, batch_size: int, max_wait: float | None = None, one_file: bool = True) -> None:
        """`classifier`: the `predict.EarlyExitClassifier` whose runner, rule, tokenizer and checks serve; `one_file`:
        the export's one file may serve (ONNX Runtime at batch 1: `onnx_one_file`), else always the queues."""
        self.classifier = classifier
        engine_of = getattr(classifier.runner, "one_file_engine", None) if one_file else None
        engine = engine_of(classifier.rule, batch_size) if engine_of is not None else None
        self.engine = engine or ExitQueues(classifier.runner, classifier.rule, batch_size, max_wait=max_wait)
        self.finished: dict[int, dict] = {}  # position -> record, until every earlier input is answered
        self.inputs: dict[int, TextInput] = {}  # position -> input, until its record is handed out
        self.position_of: dict[int, int] = {}  # engine slot -> position
        self.submitted = self.handed_out = 0

    def submit(self, inputs: Sequence[TextInput]) -> None:
        """Judge, tokenise and queue `inputs` (after those submitted before); runs the full batches."""
        check_kinds(inputs, self.classifier.task)
        start, self.submitted = self.submitted, self.submitted + len(inputs)
        singles, pairs = [], []
        for position, item in enumerate(inputs, start):
            self.inputs[position] = item
            if verdict := judged(item, character_verdict):
                self._answer(position, verdict)
            else:
                (pairs if item.text_b is not None else singles).append(position)
        for group in (singles, pairs):
            if group:
                self._queue(group)
        self.pump()

    def pump(self) -> None:
        self.engine.pump()
        self._collect()

    def flush(self) -> None:
        """Answer every input submitted so far."""
        self.engine.flush()
        self._collect()

    def ready(self) -> list[tuple[TextInput, dict]]:
        """(input, record) of every input answered whose predecessors all are, in input order, each once."""
        out = []
        while self.handed_out in self.finished:
            position = self.handed_out
            out.append((self.inputs.pop(position), self.finished.pop(position)))
            self.handed_out += 1
        return out

    @property
    def pending(self) -> int:
        """Inputs submitted and not yet handed out."""
        return self.submitted - self.handed_out

    # ------------------------------------------------------------------------------------------------- internals

    def _answer(self, position: int, verdict: Verdict) -> None:
        ident = self.inputs[position].id
        self.finished[position] = {"id": ident, **verdict.record()} if ident is not None else verdict.record()

    def _queue(self, positions: list[int]) -> None:
        """Tokenise `positions` (all single texts or all pairs), judge them on the vocabulary, queue the rest."""
        classifier = self.classifier
        items = [self.inputs[p] for p in positions]
        encoded = encode_examples(
            classifier.tokenizer, [Example(i.text_a, i.text_b, None, 0) for i in items], classifier.max_length
        )
        ids = encoded["input_ids"]
        keep = list(range(len(positions)))
        judge = classifier.checks.judge
        for row in judge.suspects(ids):
            if verdict := judged(items[row], judge.verdict):
                self._answer(positions[row], verdict)
                keep.remove(row)
        if not keep:
            return
        rows = torch.tensor(keep) if len(keep) < len(positions) else None
        tensors = [encoded[key] if rows is None else encoded[key][rows] for key in ("input_ids", "attention_mask")]
        types = encoded["token_type_ids"] if rows is None else encoded["token_type_ids"][rows]
        classifier.checks.check_unk(tensors[0])
        lengths = tensors[1].sum(1)
        order = torch.argsort(lengths, descending=True, stable=True) if len(keep) > 1 else None
        if order is not None:
            tensors, types, keep = [t[order] for t in tensors], types[order], [keep[i] for i in order.tolist()]
        slots = self.engine.submit(tensors[0], tensors[1], types)
        for slot, row in zip(slots, keep):
            self.position_of[slot] = positions[row]

    def _collect(self) -> None:
        if not self.engine.done:  # nothing left since the last look (a request's flush after its pump)
            return
        done = self.engine.take()
        classifier = self.classifier
        result = EarlyExitResult(done.logits, done.exit_layers, done.lengths, done.exits_evaluated, self.engine.exits)
        flops, _ = per_sample_flops(classifier.config, result, classifier.rule.head_width, classifier.flops_memo)
        for slot, record in zip(done.slots.tolist(), prediction_records(classifier.config, result, flops)):
            position = self.position_of.pop(slot)
            ident = self.inputs[position].id
            self.finished[position] = {"id": ident, **record} if ident is not None else record


def judged(item: TextInput, judge: Callable[[str, str], Verdict | None]) -> Verdict | None:
    """`judge`'s verdict on an input: its text, or each text of a pair (the reason names which)."""
    if item.text_b is None:
        return judge(item.text_a, "")
    return judge(item.text_a, "the first text: ") or judge(item.text_b, "the second text: ")


def prediction_records(config: Any, result: EarlyExitResult, flops: np.ndarray) -> list[dict]:
    """The prediction records of `result`'s rows, in row order (`predict.py`'s module docstring; the id is the
    caller's), for a model of `config`: one numpy pass over the rows' logits, each row's softmax its own."""
    scores = result.logits.numpy().astype(np.float64)
    if config.num_labels == 1:
        heads = [{"value": value} for value in scores[:, 0].tolist()]
    else:
        names = [config.id2label[k] for k in range(scores.shape[1])]
        probabilities = np.exp(scores - scores.max(1, keepdims=True))
        probabilities /= probabilities.sum(1, keepdims=True)
        heads = [
            {"label": names[best], "probabilities": dict(zip(names, row))}
            for best, row in zip(scores.argmax(1).tolist(), probabilities.tolist())
        ]
    return [
        {**head, "exit_layer": layer, "flops": round(cost), "tokens": tokens}
        for head, layer, cost, tokens in zip(
            heads, result.exit_layers.tolist(), flops.tolist(), result.lengths.tolist()
        )
    ]
