"""Which control-flow form ONNX Runtime runs the one-file early-exit model fastest in (issue 60, its doc page:
docs/onnx_single_file.md).

For one model (a fine-tuned RUN/best, or MiniLM with random MHA exits when none is given), one thread, batch 1 at a
given length, every row running to the last layer (so that every form does the same layers' work), best of
`--rounds` interleaved rounds of `--repeats` runs:

- `straight`: embeddings, every layer and the last exit as one graph, no control flow (the `static` rule's file);
- `nested If`: the early-exit file (`onnx_single`, entropy rule, threshold 0: nobody leaves, every `If` taken, every
  exit head runs), each layer's weights inside the branch that runs it (what the export writes);
- `nested If, weights outside`: the same graph with every branch's initializers moved to the top graph (branches read
  them from the outer scope: the form the issue's prototype measured 1.36-1.45x slower);
- `Loop`: embeddings, one `Loop` over the layers whose body gathers its layer's weights from tensors stacked over the
  layers (an `If` per layer is the other way to pick weights), then the last exit; no exit heads inside.

    .venv/bin/python bench/serving/serving_forms.py --model RUN/best --length 25 --rounds 5 [--without-prepacking]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

from bench.harness import Clock, clock, load_average  # noqa: E402
from elasticbert.exit_setting import EarlyExitSetting  # noqa: E402


def _files(model, precision: str) -> dict:
    from finetune.serve.onnx_export import trace_pieces
    from finetune.serve.onnx_single import rule_plan, single_file, single_metadata

    traced = trace_pieces(model)
    out = {}
    for name, setting in (("straight", EarlyExitSetting("static")), ("nested If", EarlyExitSetting("entropy", 0.1))):
        plan = rule_plan(setting, model.config.num_labels)
        metadata = single_metadata(model.config, setting, plan, list(model.exit_layers), 128)
        out[name] = single_file(traced, precision, plan, model.config, metadata)
    out["nested If, weights outside"] = _weights_outside(out["nested If"])
    out["Loop"] = _loop(traced, precision, model.config)
    return out


def _weights_outside(model):
    """A copy of `model` with every subgraph's initializers in the top graph."""
    import copy

    model = copy.deepcopy(model)
    hoisted = []

    def walk(graph) -> None:
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type == attribute.GRAPH:
                    hoisted.extend(attribute.g.initializer)
                    del attribute.g.initializer[:]
                    walk(attribute.g)

    walk(model.graph)
    model.graph.initializer.extend(hoisted)
    return model


def _loop(traced, precision: str, config):
    """Embeddings -> Loop over the layers (weights gathered from stacked tensors) -> the last exit."""
    from onnx import TensorProto, helper, numpy_helper

    from finetune.serve.onnx_single import ORT_DOMAIN, _Scope

    layers = traced.layers[precision]
    count = len(layers)
    body = _Scope("body/")
    first = layers[0]
    stacked = []
    for position, initializer in enumerate(first.graph.initializer):
        values = [numpy_helper.to_array(layer.graph.initializer[position]) for layer in layers]
        name = f"stacked_{position}"
        stacked.append(numpy_helper.from_array(np.stack(values), name))
        body.nodes.append(helper.make_node("Gather", [name, "i"], [initializer.name], axis=0))  # read unprefixed
    piece = helper.make_model(
        helper.make_graph(list(first.graph.node), "layer", first.graph.input, first.graph.output),
        opset_imports=first.opset_import,
    )
    links = {"hidden": "hidden_in", "mask": "attention_mask"}
    hidden = body.inline(piece, "", links)["hidden_out"]
    body.nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    body.nodes.append(helper.make_node("Identity", [hidden], ["hidden_loop_out"]))
    body_graph = helper.make_graph(
        body.nodes,
        "layers",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("hidden_in", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("hidden_loop_out", TensorProto.FLOAT, None),
        ],
    )
    top = _Scope("")
    embedded = top.inline(
        traced.embeddings, "embeddings/", {"input_ids": "input_ids", "token_type_ids": "token_type_ids"}
    )
    trips, cond = top.const(np.int64(count), "trips"), top.const(np.array(True), "cond")
    top.nodes.append(helper.make_node("Loop", [trips, cond, embedded["embedded"]], ["hidden_last"], body=body_graph))
    head = top.inline(traced.exits[max(traced.exits)], "exit/", {"hidden": "hidden_last", "mask": "attention_mask"})
    top.nodes.append(helper.make_node("Identity", [head["logits"]], ["logits"]))
    top.initializers += stacked
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["b", "t"]) for n in ("input_ids", "attention_mask")]
    inputs.append(helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["b", "t"]))
    graph = top.graph("loop", [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)], inputs)
    opsets = [helper.make_opsetid("", traced.opset)] + (
        [helper.make_opsetid(ORT_DOMAIN, 1)] if precision == "int8" else []
    )
    return helper.make_model(graph, opset_imports=opsets, ir_version=traced.ir_version)


def measure(models: dict, length: int, rounds: int, repeats: int, prepacking: bool = True) -> dict:
    """ms per run of each form; `prepacking` False: ONNX Runtime's `session.disable_prepacking` (its MatMul kernels
    then repack each constant weight on every call), to see which forms prepacking reaches."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads, options.log_severity_level = 1, 1, 3
    if not prepacking:
        options.add_session_config_entry("session.disable_prepacking", "1")
    sessions = {
        name: ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
        for name, proto in models.items()
    }
    ids = np.random.default_rng(0).integers(1000, 20000, size=(1, length)).astype(np.int64)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    extra = {"nested If": {"threshold": np.array(0.0, np.float32)}}
    extra["nested If, weights outside"] = extra["nested If"]
    reference = sessions["straight"].run(["logits"], feed)[0]
    for name, session in sessions.items():  # the same model in every form: the same logits
        logits = session.run(["logits"], {**feed, **extra.get(name, {})})[0]
        assert np.abs(logits - reference).max() < 1e-4, f"{name}: not the straight graph's logits"
    best = dict.fromkeys(sessions, np.inf)
    for _ in range(rounds):
        for name, session in sessions.items():
            run = {**feed, **extra.get(name, {})}
            session.run(None, run)
            start = clock()
            for _ in range(repeats):
                session.run(None, run)
            best[name] = min(best[name], (clock() - start) / repeats)
    return {name: 1e3 * seconds for name, seconds in best.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", type=Path, default=None, help="a fine-tuned RUN/best (default: MiniLM, random MHA exits)"
    )
    parser.add_argument("--length", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--precisions", nargs="+", default=["int8", "fp32"])
    parser.add_argument(
        "--without-prepacking",
        action="store_true",
        help="also time every form with ONNX Runtime's weight prepacking off (which forms does prepacking reach?)",
    )
    Clock.add_option(parser)
    args = parser.parse_args(argv)
    clock.use(args.clock)
    torch.set_num_threads(1)
    if args.model is not None:
        from finetune.model import load_finetuned

        model = load_finetuned(args.model, require_trained=True).eval()
    else:
        from elasticbert import ElasticBertForSequenceClassification, load_pretrained, minilm_dir

        model = load_pretrained(
            ElasticBertForSequenceClassification,
            minilm_dir(),
            num_labels=2,
            exit_layers=[1, 2, 3, 4, 5, 6],
            exit_type="mha",
        )[0].eval()
    for precision in args.precisions:
        with torch.no_grad():
            files = _files(model, precision)
        for prepacking in (True, False) if args.without_prepacking else (True,):
            ms = measure(files, args.length, args.rounds, args.repeats, prepacking)
            line = ", ".join(f"{name} {value:.3f} ms ({value / ms['straight']:.2f}x)" for name, value in ms.items())
            packed = "" if prepacking else ", prepacking off"
            print(f"{precision}, batch 1, {args.length} tokens, one thread{packed} (load {load_average():.1f}): {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
