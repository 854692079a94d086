"""The queue engine (`elasticbert.exit_queues.ExitQueues`): one queue per layer, every layer call a full batch of rows
of whatever inputs reached that layer, and each input's answer the one it gets alone - on the ONNX Runtime int8
pieces exactly (per-token int8), in fp32 within float rounding - for every rule, with rows of mixed lengths and rule
state (PABEE's and PCEE's counters) travelling with the rows. Plus the bookkeeping, `max_wait`, the length-aware
choice of rows, `GraphedLayers` (CUDA graphs; its fixed-shape path runs on the CPU) and the serving stream."""

from __future__ import annotations

import math

import pytest
import torch
from thresholds import threshold_in_widest_gap

from elasticbert.early_exit import GraphedLayers, TorchLayers, entropy_nats, make_rule, per_sample_flops, run_batch
from elasticbert.exit_queues import ExitQueues, _nearest, length_groups
from elasticbert.layer_runner import LayerRunner, StepCost
from finetune.model import exit_logits
from finetune.serve.inputs import TextInput


def _rules(model, split):
    """Rules at thresholds in gaps of the first exit's values: rows leave at several exits, no float noise can flip a
    decision. PCEE with patience 2 and PABEE carry per-row counters from exit to exit."""
    with torch.inference_mode():
        out = model(split.input_ids, attention_mask=split.attention_mask, token_type_ids=split.token_type_ids)
    logits = exit_logits(out)
    first = logits[0]  # about half the rows leave at the first exit
    entropy = entropy_nats(first)
    both = torch.maximum(entropy, entropy_nats(logits[1])) / math.log(2)  # PCEE at patience 2: confident twice
    return {
        "entropy": make_rule("entropy", threshold_in_widest_gap(entropy), 2),
        "maxprob": make_rule("maxprob", threshold_in_widest_gap(torch.softmax(first, -1).amax(-1)), 2),
        "patience": make_rule("patience", 1, 2),
        "pcee": make_rule("pcee", threshold_in_widest_gap(both), 2, patience=2),
    }


def _alone(runner, split, rule):
    """Each row run by itself: the reference every batching must reproduce."""
    results = []
    for i, n in enumerate(split.lengths.tolist()):
        rows = (t[i : i + 1, :n] for t in (split.input_ids, split.attention_mask, split.token_type_ids))
        results.append(run_batch(runner, *rows, rule))
    return results


class _Spy(LayerRunner):
    """A runner that notes each step: (layer index, rows, padded length, whether it was padded). Its steps are the
    engine's layer calls unless `split` (then it has the runner's step cost: calls run as steps by length)."""

    def __init__(self, runner, split=False):
        self.runner, self.calls = runner, []
        self.config, self.exit_layers, self.device = runner.config, runner.exit_layers, runner.device
        self.training = False
        self.step_cost = runner.step_cost if split else None

    def step(self, index, inputs, mask, padded, with_exit):
        self.calls.append((index, mask.shape[0], mask.shape[1], padded))
        return self.runner.step(index, inputs, mask, padded, with_exit)


def _queued(runner, split, rule, batch, groups):
    """`split`'s rows handed to one engine in `groups` (sizes, in file order, unsorted), pumped after each, then
    flushed: per-row results in input order, and the engine."""
    engine = ExitQueues(runner, rule, batch_size=batch)
    start = 0
    for size in groups:
        rows = slice(start, start + size)
        longest = int(split.lengths[rows].max())
        engine.submit(*(t[rows, :longest] for t in (split.input_ids, split.attention_mask, split.token_type_ids)))
        engine.pump()
        start += size
    assert start == len(split)
    engine.flush()
    done = engine.take()
    order = torch.argsort(done.slots)
    return done, order, engine


GROUPS = [3, 5, 1, 7, 4, 2, 6, 4]  # 32 rows in uneven arrivals


@pytest.mark.parametrize("kind", ["linear", "mha"])
@pytest.mark.parametrize("precision", ["int8", "fp32"])
def test_queued_answers_are_the_answers_alone(kind, precision, onnx_spread, sst2_dev):
    """Logits: int8 within 1e-4 and fp32 within 1e-2 of alone - the spread heads amplify float noise ~1e3
    (test_engine.py); the per-token int8 layers themselves answer alone as in a batch to ~1e-8
    (test_onnx_runtime.py, conditioned heads)."""
    from finetune.serve.onnx_runtime import OnnxLayers

    model, export = onnx_spread[kind]
    ort = OnnxLayers(export, precision, threads=1)
    for name, rule in _rules(model, sst2_dev).items():
        alone = _alone(ort, sst2_dev, rule)
        spy = _Spy(ort)
        done, order, engine = _queued(spy, sst2_dev, rule, 4, GROUPS)
        layers = done.exit_layers[order]
        assert layers.tolist() == [int(a.exit_layers[0]) for a in alone], name
        assert done.exits_evaluated[order].tolist() == [int(a.exits_evaluated[0]) for a in alone], name
        assert done.lengths[order].tolist() == sst2_dev.lengths.tolist()
        worst = max(float((done.logits[order][i] - a.logits[0]).abs().max()) for i, a in enumerate(alone))
        assert worst <= (1e-4 if precision == "int8" else 1e-2), (name, worst)
        assert name == "patience" or len(set(layers.tolist())) > 1, f"{name}: every row left at {set(layers.tolist())}"
        # rows of different arrivals and lengths shared padded calls past the first layer
        assert any(index > 0 and padded for index, _, _, padded in spy.calls), name
        partial = [sum(1 for i, rows, _, _ in spy.calls if i == index and rows < 4) for index in range(6)]
        assert all(n <= 1 for n in partial[1:]), (name, partial)  # past layer 1: one partial call per layer at most


def test_fp32_eager_queued_equals_alone_and_the_onnx_pieces(onnx_spread, sst2_dev):
    """Eager torch through the same engine: the same exits and labels as alone and as ONNX Runtime fp32."""
    from finetune.serve.onnx_runtime import OnnxLayers

    model, export = onnx_spread["mha"]
    rule = _rules(model, sst2_dev)["pcee"]
    alone = _alone(model, sst2_dev, rule)
    eager, order, _ = _queued(model, sst2_dev, rule, 8, GROUPS)
    assert eager.exit_layers[order].tolist() == [int(a.exit_layers[0]) for a in alone]
    torch.testing.assert_close(eager.logits[order], torch.cat([a.logits for a in alone]), atol=1e-2, rtol=0)
    onnx, order_onnx, _ = _queued(OnnxLayers(export, "fp32", 1), sst2_dev, rule, 8, GROUPS)
    assert torch.equal(eager.exit_layers[order], onnx.exit_layers[order_onnx])


def test_full_batches_and_the_bookkeeping_of_run_batch(classifier, sst2_dev):
    """A stream of 32 rows in groups at batch 4: every layer call but one partial per layer at the flush holds 4
    rows; the exits, heads run and FLOPs per sample are run_batch's on each row alone."""
    rule = _rules(classifier, sst2_dev)["entropy"]
    spy = _Spy(TorchLayers(classifier))
    done, order, engine = _queued(spy, sst2_dev, rule, 4, GROUPS)
    assert engine.fill() > 0.8 and sum(engine.rows_run) == sum(rows for _, rows, _, _ in spy.calls)
    for index in range(6):
        sizes = [rows for i, rows, _, _ in spy.calls if i == index]
        assert sum(size < 4 for size in sizes) <= (3 if index == 0 else 1), (index, sizes)  # groups of 1-3 at layer 1
    from elasticbert.exit_queues import EarlyExitResult

    queued = EarlyExitResult(*(x[order] for x in (done.logits, done.exit_layers, done.lengths, done.exits_evaluated)))
    queued.exits = engine.exits
    batched = run_batch(classifier, sst2_dev.input_ids, sst2_dev.attention_mask, sst2_dev.token_type_ids, rule)
    assert torch.equal(queued.exit_layers, batched.exit_layers)
    assert (per_sample_flops(classifier.config, queued)[0] == per_sample_flops(classifier.config, batched)[0]).all()


def test_rows_do_not_wait_longer_than_max_wait(classifier, sst2_dev):
    """With `max_wait`, `pump` runs a queue's partial batch once its oldest row has waited longer (a stream's bound
    on latency); without it the rows wait for a full batch or the flush."""
    now = [0.0]
    rule = make_rule("static", None, 2)
    ids, mask, types = sst2_dev.input_ids[:2], sst2_dev.attention_mask[:2], sst2_dev.token_type_ids[:2]
    for max_wait, ran in ((None, 0), (0.5, 6)):
        engine = ExitQueues(classifier, rule, batch_size=8, max_wait=max_wait, clock=lambda: now[0])
        engine.submit(ids, mask, types)
        engine.pump()
        assert sum(engine.calls) == 0 and engine.waiting == 2  # two rows of eight: nothing runs yet
        now[0] += 1.0
        engine.pump()  # every layer's partial batch is late in turn
        assert sum(engine.calls) == ran and engine.waiting == (2 if max_wait is None else 0)


def _plan_cost(lengths, groups, cost):
    return sum(cost.call_tokens + len(g) * int(lengths[g].max()) for g in groups)


def test_length_groups_are_the_cheapest_split_of_a_call_into_steps():
    """A layer call's rows split into steps of rows of similar length: every row once, each step a run of the rows in
    length order, none over the token cap unless it is one row, and the least cost of all such splits (checked
    against every split of 9 rows); none for a request alone or rows that pad less than a step costs."""
    import itertools

    cost = StepCost(call_tokens=14, max_tokens=512)
    generator = torch.Generator().manual_seed(0)
    for trial in range(30):
        rows = 9 if trial < 20 else 32
        lengths = torch.randint(3, 120, (rows,), generator=generator)
        groups = length_groups(lengths, cost)
        one_step = rows * int(lengths.max())
        if groups is None:  # one step is the cheapest
            groups = [torch.arange(rows)]
        flat = torch.cat(groups)
        assert sorted(flat.tolist()) == list(range(rows))
        ranked = lengths[flat].tolist()
        assert ranked == sorted(ranked, reverse=True)  # runs in length order, longest first
        assert all(len(g) == 1 or len(g) * int(lengths[g].max()) <= cost.max_tokens for g in groups)
        got = _plan_cost(lengths, groups, cost)
        if rows == 9:  # every split of the 9 rows in length order into runs
            order = torch.argsort(lengths, descending=True, stable=True)
            best = math.inf
            for cuts in itertools.product((False, True), repeat=rows - 1):
                bounds = [0, *(i + 1 for i, cut in enumerate(cuts) if cut), rows]
                plan = [order[a:b] for a, b in zip(bounds, bounds[1:])]
                if all(len(g) == 1 or len(g) * int(lengths[g].max()) <= cost.max_tokens for g in plan):
                    best = min(best, _plan_cost(lengths, plan, cost))
            assert got == best, (lengths.tolist(), got, best)
        elif one_step <= cost.max_tokens:
            assert got <= cost.call_tokens + one_step
    assert length_groups(torch.tensor([40]), cost) is None
    assert length_groups(torch.tensor([20, 20, 19, 18]), cost) is None  # 3 tokens of padding: not worth a step
    assert len(length_groups(torch.tensor([60, 8, 8, 8, 8, 8]), cost)) == 2  # the long row alone
    assert len(length_groups(torch.full((16,), 64), cost)) == 2  # 1,024 tokens: two steps of 512


def test_cpu_steps_split_by_length_answer_as_alone_and_pad_less(onnx_spread, sst2_dev):
    """On a runner with a step cost (ONNX Runtime, eager torch on a CPU) each layer call runs as steps of rows of
    similar length: the same answers as alone (int8: per-token scales), fewer padded tokens than one step per call,
    and the engine still counts full calls."""
    from finetune.serve.onnx_runtime import OnnxLayers

    model, export = onnx_spread["mha"]
    ort = OnnxLayers(export, "int8", threads=1)
    assert ort.step_cost is not None and TorchLayers(model).step_cost is not None
    rule = _rules(model, sst2_dev)["entropy"]
    alone = _alone(ort, sst2_dev, rule)
    padded = {}
    for split in (False, True):
        spy = _Spy(ort, split=split)
        done, order, engine = _queued(spy, sst2_dev, rule, 16, [16, 16])
        assert done.exit_layers[order].tolist() == [int(a.exit_layers[0]) for a in alone]
        worst = max(float((done.logits[order][i] - a.logits[0]).abs().max()) for i, a in enumerate(alone))
        assert worst <= 1e-4, (split, worst)
        assert sum(engine.steps) == len(spy.calls) and (sum(engine.steps) > sum(engine.calls)) == split
        padded[split] = sum(rows * length for _, rows, length, _ in spy.calls)
    real = int((sst2_dev.lengths * done.exit_layers[order]).sum())  # each row's tokens at every layer it ran
    assert padded[True] < padded[False] and padded[True] - real < (padded[False] - real) / 2, (padded, real)


def test_the_oldest_row_goes_with_the_rows_nearest_in_length():
    """A queue holding more than a batch gives its oldest row and the rows nearest to it in length: little padding,
    and no row overtaken for ever."""
    lengths = torch.tensor([30, 5, 31, 6, 29, 7, 28, 8])
    assert _nearest(lengths, 4).tolist() == [0, 2, 4, 6]  # the oldest (30 tokens) and the long ones: 4 pads
    assert _nearest(lengths, 4, anchor=1).tolist() == [1, 3, 5, 7]  # the oldest is short: the short ones
    assert _nearest(torch.tensor([9, 1, 2, 3, 4, 20]), 3).tolist() == [0, 3, 4]  # 3, 4, 9 tokens: 11 pads


def test_graphed_layers_run_fixed_shapes_on_the_cpu_and_match(classifier, sst2_dev):
    """`GraphedLayers` rounds each call up to a few shapes (rows: a power of two; length: a multiple of 16) with
    one-token dummy rows and masked columns; on the CPU it captures no graph and runs the same buffers eagerly, and
    every real row's answer is `TorchLayers`'s."""
    graphed = GraphedLayers(classifier)
    assert not graphed.capture and graphed.pool is None
    with pytest.raises(ValueError, match="CUDA"):
        GraphedLayers(classifier, capture=True)
    rule = _rules(classifier, sst2_dev)["entropy"]
    eager, order, _ = _queued(TorchLayers(classifier), sst2_dev, rule, 4, GROUPS)
    spy = _Spy(graphed)
    fixed, order_fixed, _ = _queued(spy, sst2_dev, rule, 4, GROUPS)
    assert torch.equal(eager.exit_layers[order], fixed.exit_layers[order_fixed])
    torch.testing.assert_close(eager.logits[order], fixed.logits[order_fixed], atol=2e-2, rtol=0)  # spread heads
    shapes = set(graphed.shapes)
    assert all(rows in (1, 2, 4) and length % 16 == 0 for _, _, rows, length, _ in shapes), shapes
    assert len(shapes) < len({(i, rows, length) for i, rows, length, _ in spy.calls})  # fewer shapes to capture


def test_the_stream_answers_in_input_order(saved_model, entropy_tau, dev_texts):
    """Texts submitted in arrivals of different sizes, unreadable ones among them: records come out in input order,
    each once, and equal the batch call's."""
    from finetune.serve.predict import EarlyExitClassifier

    classifier = EarlyExitClassifier.from_pretrained(saved_model, strategy="entropy", threshold=entropy_tau)
    texts = [*dev_texts[:5], "", *dev_texts[5:12], "!!!", *dev_texts[12:]]
    inputs = [TextInput(t, None, f"line {i + 1}") for i, t in enumerate(texts)]
    stream = classifier.stream(batch_size=4)
    answered = []
    for start, size in ((0, 3), (3, 7), (10, 1), (11, 7)):
        stream.submit(inputs[start : start + size])
        answered += stream.ready()
    stream.flush()
    answered += stream.ready()
    assert [item.where for item, _ in answered] == [item.where for item in inputs] and stream.pending == 0
    records = [record for _, record in answered]
    assert records[5]["flag"] == "empty" and records[13]["flag"] == "no-words"
    batch = classifier.predict(texts)
    for got, want in zip(records, batch):
        assert {k: v for k, v in got.items() if k != "probabilities"} == {
            k: v for k, v in want.items() if k != "probabilities"
        }
