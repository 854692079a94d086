"""Early exit in one ONNX file: embeddings, every layer, every exit head and the saved rule in one graph.

`finetune export --layout onnx` writes it beside the per-layer steps (`onnx_export`): `onnx/early_exit.onnx` (fp32)
and `onnx/early_exit.int8.onnx` (the layers' matmuls per-token int8, `onnx_export.per_token_int8`). Each is
self-contained (no external data, no custom operator beyond ONNX Runtime's own `MatMulIntegerToFloat` in int8), so a
service in any language that has ONNX Runtime runs early exit with no code of ours:

    inputs   input_ids, attention_mask, token_type_ids   int64 [batch, length], right-padded (as tokenizers pad)
             threshold [, patience | delta]              optional (overridable initializers): the saved values
    outputs  logits [batch, K]          the answering exit's logits (K = 1: the regression value)
             probabilities [batch, K]   softmax of them (classification)
             label [batch]              argmax (classification)
             exit_layer [batch]         the 1-based layer whose exit answered
             flops [batch]              FLOPs of the row (ELUE conventions, `elasticbert.flops`: real length, exit,
                                        every exit head run), equal to `per_sample_flops`

How the graph runs (the nested `If` form; `docs/onnx_single_file.md` has the measurements behind it): the batch's
rows are taken in length order, `GROUP_ROWS` at a time, each group cut to its longest row (a `Loop` over the groups:
`SingleGraph.grouped`; a batch of 32 in input order is mostly padding otherwise). In a group, the first
segment (embeddings, the layers up to the first exit, that exit) runs on the whole batch; the rule decides per row;
the rows whose rule fired have their answer written into the batch's outputs (ScatterND at their row numbers), and
an `If` on "any row left" holds the rest of the model: its branch gathers the rows still running (Compress: hidden
states, mask, row numbers, lengths and the rule's per-row state), cuts them to the longest of them, runs the next
segment, and so on. The last exit takes every row still running. So a batch costs what its rows cost, and the graph
stops at the layer where its last row leaves. Every layer's weights are initializers of the branch that runs it (a
branch reading weights from the outer graph ran 1.36-1.45x slower than a straight graph in ONNX Runtime 1.32; inside
it, 1.05-1.07x: issue 60's prototype).

The rules are those of `elasticbert.early_exit` written as ONNX ops (`_decide`), state per row carried like the
engine's: entropy (nats) < τ, top probability >= τ, PABEE's agreements >= k (regression: |Δ| < δ), PCEE's
consecutive H / ln K < τ >= patience, LTE's sigmoid(w·r + b) < τ; static (the full model) runs the last exit only.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from elasticbert.exit_setting import EarlyExitSetting
from elasticbert.flops import sample_flops

from .onnx_graphs import ORT_DOMAIN, rename_tensors

SINGLE_FORMAT = "elasticbert-onnx-single/1"
SINGLE_FILES = {"fp32": "onnx/early_exit.onnx", "int8": "onnx/early_exit.int8.onnx"}
GROUP_ROWS = 8  # rows per length group inside the graph (`SingleGraph.grouped`; 0: one group, the batch as given)
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass
class Traced:
    """The traced pieces of a model (`onnx_export.trace_pieces`): embeddings (input_ids, token_type_ids ->
    embedded), each layer at each precision (hidden, mask -> hidden_out) and each exit head (hidden, mask ->
    representation, logits), as `onnx.ModelProto`s."""

    embeddings: Any
    layers: dict[str, list[Any]]
    exits: dict[int, Any]
    opset: int
    ir_version: int


@dataclass
class RulePlan:
    """What the graph's rule needs: its name and parameters (the defaults of its inputs), the labels K, and the LTE
    head's weights (`lte`)."""

    strategy: str
    threshold: float | None
    patience: int
    delta: float
    num_labels: int
    lte: tuple[np.ndarray, float] | None = None

    @property
    def fires(self) -> bool:
        return self.strategy != "static"

    def inputs(self) -> dict[str, Any]:
        """The rule's run-time inputs and their saved values."""
        if not self.fires:
            return {}
        out: dict[str, Any] = {"threshold": np.array(self.threshold, dtype=np.float32)}
        if self.strategy == "pcee":
            out["patience"] = np.array(self.patience, dtype=np.int64)
        if self.strategy == "patience" and self.num_labels == 1:
            out["delta"] = np.array(self.delta, dtype=np.float32)
        return out


def rule_plan(setting: EarlyExitSetting, num_labels: int, lte_head: Any = None) -> RulePlan:
    """The plan of a (validated) setting; `lte_head`: the `LearnedExitHead` an `lte` setting reads."""
    lte = None
    if setting.strategy == "lte":
        if lte_head is None:
            raise ValueError("an lte rule needs its LearnedExitHead")
        weight = lte_head.linear.weight.detach().float().numpy().reshape(-1, 1)
        lte = (weight.astype(np.float32), float(lte_head.linear.bias.detach().float()[0]))
    return RulePlan(setting.strategy, setting.threshold, setting.patience, setting.delta, num_labels, lte)


# ---------------------------------------------------------------------------------------------------- the scope


@dataclass
class _Scope:
    """The nodes and initializers of one (sub)graph being written; every name it makes starts with `prefix`."""

    prefix: str
    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    value_info: list = field(default_factory=list)
    count: int = 0

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{self.prefix}{hint}_{self.count}"

    def const(self, value: Any, hint: str = "c") -> str:
        from onnx import numpy_helper

        name = self.name(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], hint: str = "", outputs: int = 1, **attrs: Any) -> Any:
        """A node of `op_type`; returns its output name (a list when `outputs` > 1)."""
        from onnx import helper

        names = [self.name(hint or op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, **attrs))
        return names[0] if outputs == 1 else names

    def inline(self, piece: Any, prefix: str, links: dict[str, str]) -> dict[str, str]:
        """`piece`'s nodes and initializers added here, its inputs read from `links` (input -> tensor); returns its
        outputs' names here."""
        from onnx import compose

        graph = compose.add_prefix_graph(piece.graph, self.prefix + prefix)
        mapping = {self.prefix + prefix + name: tensor for name, tensor in links.items()}
        rename_tensors(graph, mapping)
        self.nodes += list(graph.node)
        self.initializers += list(graph.initializer)
        self.value_info += list(graph.value_info)
        return {o.name: self.prefix + prefix + o.name for o in piece.graph.output}

    def graph(self, name: str, outputs: list[Any], inputs: list[Any] | None = None) -> Any:
        from onnx import helper

        return helper.make_graph(self.nodes, name, inputs or [], outputs, self.initializers, value_info=self.value_info)


# ---------------------------------------------------------------------------------------------------- the rules


def _entropy(scope: _Scope, logits: str) -> str:
    """Entropy of softmax(logits) in nats per row, as `early_exit.entropy_nats` computes it."""
    logp = scope.op("LogSoftmax", [logits], "logp", axis=-1)
    product = scope.op("Mul", [scope.op("Exp", [logp], "p"), logp], "plogp")
    return scope.op("Neg", [scope.op("ReduceSum", [product, scope.const(np.array([-1]), "axis")], keepdims=0)], "h")


def _counted(scope: _Scope, counts: str, condition: str) -> str:
    """counts + 1 where `condition`, else 0 (PABEE's and PCEE's per-row counters)."""
    one, zero = scope.const(np.int64(1), "one"), scope.const(np.int64(0), "zero")
    return scope.op("Where", [condition, scope.op("Add", [counts, one]), zero], "count")


def _decide(scope: _Scope, plan: RulePlan, position: int, logits: str, representation: str, state: dict) -> str:
    """The rule at exit `position` (0-based among the exits): a bool [b] of the rows that leave; updates `state`
    (name -> tensor of this scope) as the torch rule updates its row state."""
    tau = "threshold"
    if plan.strategy == "entropy":
        return scope.op("Less", [_entropy(scope, logits), tau], "fire")
    if plan.strategy == "maxprob":
        top = scope.op("ReduceMax", [scope.op("Softmax", [logits], axis=-1)], axes=[-1], keepdims=0)
        return scope.op("GreaterOrEqual", [top, tau], "fire")
    if plan.strategy == "pcee":
        normalised = scope.op("Div", [_entropy(scope, logits), scope.const(np.float32(math.log(plan.num_labels)))])
        state["count"] = _counted(scope, state["count"], scope.op("Less", [normalised, tau]))
        return scope.op("GreaterOrEqual", [state["count"], "patience"], "fire")
    if plan.strategy == "patience":
        if plan.num_labels == 1:
            current = scope.op("Squeeze", [logits, scope.const(np.array([1]), "axis")], "value")
        else:
            current = scope.op("ArgMax", [logits], "prediction", axis=-1, keepdims=0)
        if position > 0:  # the first exit has nothing to agree with
            if plan.num_labels == 1:
                change = scope.op("Abs", [scope.op("Sub", [current, state["previous"]])])
                same = scope.op("Less", [change, "delta"], "same")
            else:
                same = scope.op("Equal", [current, state["previous"]], "same")
            state["count"] = _counted(scope, state["count"], same)
        state["previous"] = current
        counted = scope.op("Cast", [state["count"]], to=1)  # k is a whole number held as a float threshold
        return scope.op("GreaterOrEqual", [counted, tau], "fire")
    if plan.strategy == "lte":
        weight, bias = plan.lte
        score = scope.op(
            "Add",
            [
                scope.op("MatMul", [representation, scope.const(weight, "lte_w")]),
                scope.const(np.array([bias], dtype=np.float32), "lte_b"),
            ],
        )
        error = scope.op("Squeeze", [scope.op("Sigmoid", [score]), scope.const(np.array([1]), "axis")], "error")
        return scope.op("Less", [error, tau], "fire")
    raise ValueError(f"no ONNX form of the {plan.strategy!r} rule")


def _initial_state(scope: _Scope, plan: RulePlan, rows: str) -> dict[str, str]:
    """The rule's per-row state before the first exit ({} for a rule that remembers nothing)."""
    if plan.strategy not in ("patience", "pcee"):
        return {}
    zeros = scope.op("ConstantOfShape", [scope.op("Shape", [rows])], "zeros", value=_tensor(np.array([0], np.int64)))
    state = {"count": zeros}
    if plan.strategy == "patience":
        state["previous"] = zeros if plan.num_labels > 1 else scope.op("Cast", [zeros], to=1)
    return state


def _tensor(value: np.ndarray) -> Any:
    from onnx import numpy_helper

    return numpy_helper.from_array(value)


# ---------------------------------------------------------------------------------------------------- FLOPs


def flops_coefficients(config: Any, exit_type: str | None = None) -> dict[str, tuple[int, int, int]]:
    """(c0, c1, c2) of the embeddings', one layer's and one exit head's FLOPs as c0 + c1·n + c2·n² in the real
    length n (`elasticbert.flops`: each is a quadratic in n), read off the counter itself at n = 0, 1, 2."""
    emb_layer = [sample_flops(config, n, 1, exits_evaluated=[]).total for n in range(3)]
    emb_layer2 = [sample_flops(config, n, 2, exits_evaluated=[]).total for n in range(3)]
    with_exit = [sample_flops(config, n, 1, exits_evaluated=[1], exit_type=exit_type).total for n in range(3)]
    layer = [b - a for a, b in zip(emb_layer, emb_layer2)]
    parts = {"embeddings": [a - b for a, b in zip(emb_layer, layer)], "layer": layer}
    parts["exit"] = [b - a for a, b in zip(emb_layer, with_exit)]
    out = {}
    for name, (f0, f1, f2) in parts.items():
        c2 = (f2 - 2 * f1 + f0) / 2
        out[name] = (int(round(f0)), int(round(f1 - f0 - c2)), int(round(c2)))
    return out


def check_flops_coefficients(config: Any, coefficients: dict, max_length: int, exit_type: str | None = None) -> None:
    """The quadratics equal the counter at every length up to `max_length` (else the counter is not what they
    assume: the export refuses rather than write a FLOPs output that differs)."""
    lengths = np.arange(1, max_length + 1, dtype=np.float64)

    def value(name: str) -> np.ndarray:
        c0, c1, c2 = coefficients[name]
        return c0 + c1 * lengths + c2 * lengths**2

    deepest = int(config.num_hidden_layers)
    for layer, heads in {(1, 1), (min(3, deepest), min(2, deepest))}:  # (a model of 1 or 2 layers has no third)
        expected = [sample_flops(config, int(n), layer, [1] * heads, exit_type).total for n in lengths]
        got = value("embeddings") + layer * value("layer") + heads * value("exit")
        if not np.array_equal(np.array(expected), got):
            raise ValueError("the FLOPs counter is not a quadratic in the length: the graph's FLOPs would differ")


# ---------------------------------------------------------------------------------------------------- the graph


@dataclass
class _Rows:
    """The rows still running in a scope: hidden states (or, before the first layer, none), mask, their row
    numbers in the batch, their lengths and the rule's state, each a tensor name."""

    hidden: str | None
    mask: str
    rows: str
    lengths: str
    state: dict[str, str]
    tokens: tuple[str, str] = ("input_ids", "token_type_ids")  # what the embeddings read (before the first layer)


class SingleGraph:
    """Writes the one-graph early-exit model of `traced` at `precision` with the rule of `plan` (module docstring)."""

    def __init__(
        self, traced: Traced, precision: str, plan: RulePlan, config: Any, group_rows: int = GROUP_ROWS
    ) -> None:
        self.traced, self.precision, self.plan, self.config = traced, precision, plan, config
        self.group_rows = group_rows
        exits = sorted(traced.exits)
        self.exits = exits if plan.fires else exits[-1:]  # a rule that never fires runs the last exit only
        self.num_labels = plan.num_labels
        self.layers: dict[int, Any] = {}

    def layer(self, index: int) -> Any:
        """Layer `index`'s piece at the file's precision, its residual additions ahead of a LayerNormalization written
        as `Sum` (`unfused_residuals`)."""
        if index not in self.layers:
            self.layers[index] = unfused_residuals(self.traced.layers[self.precision][index])
        return self.layers[index]

    def segment_layers(self, position: int) -> range:
        """The layers (0-based) run between exit `position - 1` and exit `position`."""
        start = self.exits[position - 1] if position else 0
        return range(start, self.exits[position])

    def model(self) -> Any:
        """The `onnx.ModelProto`: inputs, the first segment (and through its `If`, the rest), the outputs."""
        from onnx import TensorProto, helper

        top = _Scope("")
        lengths = top.op("ReduceSum", ["attention_mask", top.const(np.array([1]), "axis")], "lengths", keepdims=0)
        if self.group_rows:
            logits, layers = self.grouped(top, lengths)
        else:
            batch = top.op("Gather", [top.op("Shape", ["input_ids"]), top.const(np.int64(0))], "batch")
            rows = top.op("Range", [top.const(np.int64(0)), batch, top.const(np.int64(1))], "rows")
            running = _Rows(None, "attention_mask", rows, lengths, _initial_state(top, self.plan, rows))
            logits, layers = self.segment(top, 0, running, None)
        outputs = self.answers(top, logits, layers, lengths)
        inputs = [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "length"]) for name in INPUTS]
        for name, value in self.plan.inputs().items():
            inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), []))
            top.initializers.append(_named(value, name))
        graph = top.graph("elasticbert_early_exit", outputs, inputs)
        opsets = [helper.make_opsetid("", self.traced.opset)]
        if self.precision == "int8":
            opsets.append(helper.make_opsetid(ORT_DOMAIN, 1))
        return helper.make_model(graph, opset_imports=opsets, ir_version=self.traced.ir_version)

    def grouped(self, top: _Scope, lengths: str) -> tuple[str, str]:
        """The batch's rows in length order (longest first), `group_rows` at a time, each group cut to its longest
        row: a `Loop` whose body is the early-exit model on one group (its branches and weights inside the body), its
        answers scattered into the batch's outputs at the group's row numbers. Why: rows of one call are padded to the
        longest of them; a batch of 32 in input order was 44 % padding at SST-2's first layer (`exit_queues`)."""
        from onnx import TensorProto, helper

        size = self.group_rows
        batch = top.op("Shape", ["input_ids"], "batch", start=0, end=1)
        order = top.op("TopK", [lengths, batch], "by_length", outputs=2, largest=1, sorted=1)[1]
        groups = top.op("Div", [top.op("Add", [batch, top.const(np.array([size - 1]))]), top.const(np.array([size]))])
        trips = top.op("Squeeze", [groups, top.const(np.array([0]), "axis")], "groups")
        shape = top.op("Concat", [batch, top.const(np.array([self.num_labels]))], "shape", axis=0)
        zeros = top.op("ConstantOfShape", [shape], "no_logits", value=_tensor(np.zeros(1, np.float32)))
        no_layers = top.op("ConstantOfShape", [batch], "no_layers", value=_tensor(np.zeros(1, np.int64)))
        body = _Scope("g/")
        start = body.op("Mul", [body.op("Unsqueeze", ["g/i", body.const(np.array([0]))]), body.const(np.array([size]))])
        rows = body.op("Slice", [order, start, body.op("Add", [start, body.const(np.array([size]))])], "rows")
        group_lengths = body.op("Gather", [lengths, rows], "lengths", axis=0)
        longest = body.op("ReduceMax", [group_lengths], "longest", keepdims=1)
        zero, one = body.const(np.array([0])), body.const(np.array([1]))
        cut = {
            name: body.op("Slice", [body.op("Gather", [name, rows], axis=0), zero, longest, one], name)
            for name in INPUTS
        }
        state = _initial_state(body, self.plan, rows)
        running = _Rows(
            None, cut["attention_mask"], rows, group_lengths, state, (cut["input_ids"], cut["token_type_ids"])
        )
        logits, layers = self.segment(body, 0, running, ("g/logits_in", "g/layers_in"))
        body.nodes += [
            helper.make_node("Identity", ["g/cond_in"], ["g/cond_out"]),
            helper.make_node("Identity", [logits], ["g/logits_out"]),
            helper.make_node("Identity", [layers], ["g/layers_out"]),
        ]
        scalar = [("g/i", TensorProto.INT64), ("g/cond_in", TensorProto.BOOL)]
        inputs = [helper.make_tensor_value_info(name, kind, []) for name, kind in scalar]
        inputs += [_info("g/logits_in"), _info("g/layers_in", TensorProto.INT64)]
        outputs = [helper.make_tensor_value_info("g/cond_out", TensorProto.BOOL, [])]
        outputs += [_info("g/logits_out"), _info("g/layers_out", TensorProto.INT64)]
        loop = body.graph("group", outputs, inputs)
        keep_going = top.const(np.array(True), "true")
        final = top.op("Loop", [trips, keep_going, zeros, no_layers], "final", outputs=2, body=loop)
        return final[0], final[1]

    def segment(self, scope: _Scope, position: int, running: _Rows, done: tuple[str, str] | None) -> tuple[str, str]:
        """Segment `position` in `scope` on the `running` rows (their layers, their exit, the rule, the If holding
        the rest); `done`: the batch's logits and exit layers so far (None before the first exit). Returns the
        batch's final logits and exit layers."""
        hidden = running.hidden
        for index in self.segment_layers(position):
            if hidden is None:
                links = {"input_ids": running.tokens[0], "token_type_ids": running.tokens[1]}
                hidden = scope.inline(self.traced.embeddings, "embeddings/", links)["embedded"]
            piece = self.layer(index)
            hidden = scope.inline(piece, f"layer{index}/", {"hidden": hidden, "mask": running.mask})["hidden_out"]
        layer = self.exits[position]
        head = scope.inline(self.traced.exits[layer], f"exit{layer}/", {"hidden": hidden, "mask": running.mask})
        logits, exit_layer = head["logits"], scope.const(np.int64(layer), "exit_at")
        if done is None:  # every row of the batch, in order
            layers = scope.op("Expand", [exit_layer, scope.op("Shape", [running.rows])], "exit_layers")
        else:
            where = scope.op("Unsqueeze", [running.rows, scope.const(np.array([1]), "axis")], "where")
            logits = scope.op("ScatterND", [done[0], where, logits], "logits")
            layers = scope.op(
                "ScatterND",
                [done[1], where, scope.op("Expand", [exit_layer, scope.op("Shape", [running.rows])])],
                "exit_layers",
            )
        if position == len(self.exits) - 1:  # the last exit takes every row still running
            return logits, layers
        state = dict(running.state)
        fire = _decide(scope, self.plan, position, head["logits"], head["representation"], state)
        keep = scope.op("Not", [fire], "keep")
        left = scope.op("ReduceSum", [scope.op("Cast", [keep], to=7), scope.const(np.array([0]), "axis")], keepdims=0)
        any_left = scope.op("Greater", [left, scope.const(np.int64(0))], "any_left")
        rest = self.rest(
            position + 1, _Rows(hidden, running.mask, running.rows, running.lengths, state), keep, (logits, layers)
        )
        stop = _Scope(f"stop{position}/")
        stop_outputs = [stop.op("Identity", [logits], "logits"), stop.op("Identity", [layers], "exit_layers")]
        outputs = scope.op(
            "If",
            [any_left],
            "final",
            outputs=2,
            then_branch=rest,
            else_branch=stop.graph(f"stop_{position}", [_info(stop_outputs[0]), _info(stop_outputs[1], 7)]),
        )
        return outputs[0], outputs[1]

    def rest(self, position: int, running: _Rows, keep: str, done: tuple[str, str]) -> Any:
        """The branch that runs segments `position`... on the rows `keep` selects."""
        branch = _Scope(f"s{position}/")

        def kept(name: str) -> str:
            return branch.op("Compress", [name, keep], "kept", axis=0)

        lengths = kept(running.lengths)
        longest = branch.op("ReduceMax", [lengths], "longest", keepdims=1)
        zero, one = branch.const(np.array([0])), branch.const(np.array([1]))

        def cut(name: str) -> str:
            return branch.op("Slice", [kept(name), zero, longest, one], "cut")

        rows = _Rows(
            cut(running.hidden),
            cut(running.mask),
            kept(running.rows),
            lengths,
            {key: kept(value) for key, value in running.state.items()},
        )
        logits, layers = self.segment(branch, position, rows, done)
        return branch.graph(f"segment_{position}", [_info(logits), _info(layers, 7)])

    def answers(self, scope: _Scope, logits: str, layers: str, lengths: str) -> list[Any]:
        """The graph's outputs: logits, [probabilities, label,] exit_layer and flops per row."""
        from onnx import TensorProto, helper

        k = self.num_labels
        scope.nodes.append(helper.make_node("Identity", [logits], ["logits"]))
        scope.nodes.append(helper.make_node("Identity", [layers], ["exit_layer"]))
        infos = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", k])]
        if k > 1:
            scope.nodes.append(helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1))
            scope.nodes.append(helper.make_node("ArgMax", ["logits"], ["label"], axis=-1, keepdims=0))
            infos.append(helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", k]))
            infos.append(helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"]))
        scope.nodes.append(helper.make_node("Identity", [self.flops(scope, lengths, "exit_layer")], ["flops"]))
        return infos + [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch"]) for n in ("exit_layer", "flops")]

    def flops(self, scope: _Scope, lengths: str, layers: str) -> str:
        """Per row: embeddings + layers · layer + heads · exit head (+ the LTE head's calls), int64."""
        coefficients = flops_coefficients(self.config)

        def quadratic(name: str) -> str:
            c0, c1, c2 = (scope.const(np.int64(c)) for c in coefficients[name])
            inner = scope.op("Add", [c1, scope.op("Mul", [c2, lengths])])
            return scope.op("Add", [c0, scope.op("Mul", [lengths, inner])], name)

        heads_of = np.zeros(max(self.exits) + 1, dtype=np.int64)
        for position, layer in enumerate(self.exits):
            heads_of[layer] = position + 1
        heads = scope.op("Gather", [scope.const(heads_of, "heads_of"), layers], "heads")
        total = scope.op("Add", [quadratic("embeddings"), scope.op("Mul", [layers, quadratic("layer")])])
        total = scope.op("Add", [total, scope.op("Mul", [heads, quadratic("exit")])], "flops")
        if self.plan.lte is not None:  # 2·d per call of the learned head; the last exit asks it nothing
            calls = scope.op(
                "Sub",
                [heads, scope.op("Cast", [scope.op("Equal", [layers, scope.const(np.int64(self.exits[-1]))])], to=7)],
            )
            width = scope.const(np.int64(2 * self.plan.lte[0].shape[0]))
            total = scope.op("Add", [total, scope.op("Mul", [calls, width])], "flops")
        return total


def unfused_residuals(piece: Any) -> Any:
    """A copy of the layer `piece` whose residual additions that feed a LayerNormalization are `Sum` nodes (the same
    a + b, bit for bit). Why: ONNX Runtime's default optimizations fuse Add → LayerNormalization into its
    SkipLayerNormalization kernel, which on the CPU is slower than the kernels it replaces (`onnx_runtime`'s
    DISABLED_FUSIONS: a step 389 → 487 µs); our sessions turn that fusion off, a user's plain session would not — the
    fusion matches `Add` only, so the file itself opts out."""
    import copy

    piece = copy.deepcopy(piece)
    producer = {name: node for node in piece.graph.node for name in node.output}
    for node in piece.graph.node:
        add = producer.get(node.input[0]) if node.op_type == "LayerNormalization" else None
        if add is not None and add.op_type == "Add":
            add.op_type = "Sum"
    return piece


def _named(value: np.ndarray, name: str) -> Any:
    from onnx import numpy_helper

    return numpy_helper.from_array(value, name)


def _info(name: str, elem_type: int = 1) -> Any:
    """A branch output: its name and element type (float: the logits; 7, int64: the exit layers)."""
    from onnx import helper

    return helper.make_tensor_value_info(name, elem_type, None)


def single_file(
    traced: Traced,
    precision: str,
    plan: RulePlan,
    config: Any,
    metadata: dict[str, Any],
    group_rows: int = GROUP_ROWS,
) -> Any:
    """The one-graph model at `precision`, checked (`onnx.checker`, with shape inference), `metadata` in its
    metadata_props (JSON values); `group_rows`: rows per length group (0: none)."""
    import onnx
    from onnx import helper

    model = SingleGraph(traced, precision, plan, config, group_rows).model()
    check_flops_coefficients(config, flops_coefficients(config), int(metadata.get("max_length") or 512))
    props = {"format": SINGLE_FORMAT, "precision": precision, **metadata}
    helper.set_model_props(model, {key: json.dumps(value) for key, value in props.items()})
    onnx.checker.check_model(model, full_check=True)
    return model


def single_metadata(config: Any, setting: EarlyExitSetting, plan: RulePlan, exits: list[int], max_length: int) -> dict:
    """What a user reads from the file (`metadata_props`, JSON): the contract of its inputs and outputs."""
    labels = {str(k): v for k, v in (getattr(config, "id2label", None) or {}).items()} if plan.num_labels > 1 else {}
    return {
        "exit_layers": list(exits if plan.fires else exits[-1:]),
        "rule": setting.to_dict() if setting.strategy != "lte" else {**setting.to_dict(), "lte_head": "inside"},
        "rule_inputs": {name: float(value) for name, value in plan.inputs().items()},
        "id2label": labels,
        "max_length": int(max_length),
        "inputs": list(INPUTS),
        "padding": "right (attention_mask: ones then zeros per row)",
        "flops": "ELUE conventions (elasticbert.flops): real length, exit layer, every exit head run",
    }
