"""Early exit in one ONNX file (`finetune.serve.onnx_single`): every rule inside the graph gives the Python engine's
answers (label, exit layer, FLOPs equal; probabilities within 1e-5 in fp32; int8 equal to the engine on the per-token
int8 pieces, and the same in a batch as alone), the file is sealed and self-describing, its thresholds are inputs
with the saved values as defaults, each layer's weights live in the branch that runs it, and our own classifier
serves it at batch 1 with the queues' answers. The same check on 400+ real dev rows per task: bench/serving_one_file.py
(docs/onnx_single_file.md)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from thresholds import threshold_in_widest_gap  # noqa: E402

from elasticbert.early_exit import EarlyExitSetting, entropy_nats, make_rule, per_sample_flops, run_batch  # noqa: E402
from finetune.model import exit_logits  # noqa: E402
from finetune.serve.early_exit.lte import LearnedExitHead  # noqa: E402
from finetune.serve.onnx_export import MANIFEST, trace_pieces  # noqa: E402
from finetune.serve.onnx_one_file import OneFileEngine  # noqa: E402
from finetune.serve.onnx_runtime import OnnxLayers  # noqa: E402
from finetune.serve.onnx_single import SINGLE_FILES, rule_plan, single_file, single_metadata  # noqa: E402
from finetune.serve.predict import EarlyExitClassifier  # noqa: E402


def _session(model_proto):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.log_severity_level = 1, 3
    return ort.InferenceSession(model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _settings(model, split):
    """A setting per rule, each at a threshold where rows leave at several exits, and the LTE head."""
    with torch.inference_mode():
        out = model(split.input_ids, attention_mask=split.attention_mask, token_type_ids=split.token_type_ids)
    logits, representation = exit_logits(out)[0], out.representations[0]
    entropy = entropy_nats(logits)
    head = LearnedExitHead(representation.shape[-1])
    torch.manual_seed(0)
    torch.nn.init.normal_(head.linear.weight, std=0.5)
    with torch.inference_mode():
        lte = head(representation)
    return head, {
        "entropy": EarlyExitSetting("entropy", threshold_in_widest_gap(entropy)),
        "maxprob": EarlyExitSetting("maxprob", threshold_in_widest_gap(torch.softmax(logits, -1).amax(-1))),
        "patience": EarlyExitSetting("patience", 1),
        "pcee": EarlyExitSetting("pcee", threshold_in_widest_gap(entropy / math.log(2)), patience=1),
        "lte": EarlyExitSetting("lte", threshold_in_widest_gap(lte)),
        "static": EarlyExitSetting("static"),
    }


def _run(session, ids, mask, types, **rule_inputs):
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types.numpy(), **rule_inputs}
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _batches(split, batch):
    """`split` `batch` rows at a time, each batch cut to its longest row (one row alone: no padding)."""
    for start in range(0, len(split), batch):
        rows = slice(start, start + batch)
        longest = int(split.lengths[rows].max())
        yield (
            split.input_ids[rows, :longest],
            split.attention_mask[rows, :longest],
            split.token_type_ids[rows, :longest],
        )


def _same_answers(reference, got, config, lte_width=0, tol=1e-5):
    assert np.array_equal(got["exit_layer"], reference.exit_layers.numpy())
    assert np.array_equal(got["label"], reference.predictions.numpy())
    flops = per_sample_flops(config, reference, lte_width)[0]
    assert np.array_equal(got["flops"], flops.astype(np.int64))
    probabilities = torch.softmax(reference.logits.double(), -1).numpy()
    assert float(np.abs(got["probabilities"] - probabilities).max()) <= tol


@pytest.fixture(scope="module")
def traced(onnx_models):
    return {kind: trace_pieces(model) for kind, (model, _) in onnx_models.items()}


@pytest.mark.parametrize("kind", ["mha", "linear"])
def test_fp32_one_file_gives_the_engines_answers_for_every_rule(kind, onnx_models, traced, sst2_dev):
    model = onnx_models[kind][0]
    head, settings = _settings(model, sst2_dev)
    names = list(settings) if kind == "mha" else ["entropy", "patience"]
    for name in names:
        setting = settings[name]
        plan = rule_plan(setting, 2, head if name == "lte" else None)
        metadata = single_metadata(model.config, setting, plan, list(model.exit_layers), 128)
        session = _session(single_file(traced[kind], "fp32", plan, model.config, metadata))
        rule = make_rule(name, setting.threshold, 2, patience=setting.patience, lte_head=head)
        layers = set()
        for batch in (1, 32):  # alone: the first 12 rows (CI time); in a batch: all 32
            for ids, mask, types in list(_batches(sst2_dev, batch))[: 12 if batch == 1 else None]:
                reference = run_batch(model, ids, mask, types, rule)
                _same_answers(reference, _run(session, ids, mask, types), model.config, rule.head_width)
                layers |= set(reference.exit_layers.tolist())
        assert name in ("static", "patience") or len(layers) > 1, f"{name}: every row left at {layers}"


def test_int8_one_file_equals_the_int8_engine_and_a_row_alone(single_file_export, sst2_dev):
    """int8: the file's answers are the per-layer int8 engine's (logits bit for bit alone, within float rounding in
    a batch, where the file pads each length group to its own longest row), and a row's answer in a batch of 32 is
    its answer alone (per-token activation scales: batch-invariant; logits within float rounding)."""
    model, export, setting = single_file_export
    pieces = OnnxLayers(export, "int8", threads=1)
    session = _session(onnx.load(str(export / SINGLE_FILES["int8"])))
    alone = {"logits": [], "exit_layer": []}
    for batch in (1, 32):
        for ids, mask, types in _batches(sst2_dev, batch):
            reference = run_batch(pieces, ids, mask, types, make_rule("entropy", setting.threshold, 2))
            got = _run(session, ids, mask, types)
            _same_answers(reference, got, model.config, tol=1e-6)
            if batch == 1:  # the same tokens: the same int8 arithmetic, bit for bit
                assert np.array_equal(got["logits"], reference.logits.numpy())
            else:  # the file pads each length group to its own longest row: float rounding apart
                assert float(np.abs(got["logits"] - reference.logits.numpy()).max()) <= 1e-5
            if batch == 1:
                alone["logits"].append(got["logits"])
                alone["exit_layer"].append(got["exit_layer"])
    assert float(np.abs(np.concatenate(alone["logits"]) - got["logits"]).max()) <= 1e-5  # float rounding of padding
    assert np.array_equal(np.concatenate(alone["exit_layer"]), got["exit_layer"])
    assert len(set(got["exit_layer"].tolist())) > 1


def test_the_file_is_sealed_self_describing_and_its_thresholds_are_inputs(single_file_export, sst2_dev):
    model, export, setting = single_file_export
    manifest = json.loads((export / MANIFEST).read_text())
    checksums = json.loads((export / "checksums.json").read_text())
    assert set(manifest["single_file"]["files"].values()) <= set(checksums["files"])
    for precision, name in SINGLE_FILES.items():
        proto = onnx.load(str(export / name))
        onnx.checker.check_model(proto, full_check=True)
        assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)
        props = {p.key: json.loads(p.value) for p in proto.metadata_props}
        assert props["precision"] == precision and props["rule"] == setting.to_dict()
        assert props["exit_layers"] == list(model.exit_layers) and props["id2label"] == {"0": "LABEL_0", "1": "LABEL_1"}
        assert [i.name for i in proto.graph.input] == ["input_ids", "attention_mask", "token_type_ids", "threshold"]
        (default,) = [t for t in proto.graph.initializer if t.name == "threshold"]
        assert float(onnx.numpy_helper.to_array(default)) == pytest.approx(setting.threshold)
    session = _session(onnx.load(str(export / SINGLE_FILES["fp32"])))
    ids, mask, types = next(_batches(sst2_dev, 32))
    saved = _run(session, ids, mask, types)["exit_layer"]
    given = _run(session, ids, mask, types, threshold=np.array(setting.threshold, np.float32))["exit_layer"]
    never = _run(session, ids, mask, types, threshold=np.array(0.0, np.float32))["exit_layer"]
    always = _run(session, ids, mask, types, threshold=np.array(10.0, np.float32))["exit_layer"]
    assert np.array_equal(saved, given) and 1 < len(set(saved.tolist()))
    assert set(never.tolist()) == {6} and set(always.tolist()) == {1}


def test_each_layers_weights_live_in_the_branch_that_runs_it(single_file_export):
    """The `Loop` over length groups holds the embeddings, layer 1 and exit 1; each `If`'s then-branch the next
    layer and exit and the next `If` (a branch reading weights from the outer graph ran 1.36-1.45x slower in ONNX
    Runtime)."""
    _, export, _ = single_file_export
    top = onnx.load(str(export / SINGLE_FILES["int8"])).graph
    assert not any("layer" in t.name for t in top.initializer)
    (loop,) = [node for node in top.node if node.op_type == "Loop"]  # over length groups of the batch's rows
    graph = next(a.g for a in loop.attribute if a.name == "body")
    depth = 0
    while True:
        prefix = f"s{depth}/" if depth else "g/"
        names = [t.name.removeprefix(prefix) for t in graph.initializer]
        assert {name.split("/")[0] for name in names if name.startswith("layer")} == {f"layer{depth}"}
        ifs = [node for node in graph.node if node.op_type == "If"]
        if not ifs:
            break
        (node,) = ifs
        graph = next(a.g for a in node.attribute if a.name == "then_branch")
        depth += 1
    assert depth == 5  # six exits: five decisions, each holding the rest of the model


def test_our_classifier_serves_the_one_file_at_batch_1_with_the_queues_answers(single_file_export, dev_texts):
    _, export, setting = single_file_export
    classifier = EarlyExitClassifier.from_pretrained(export, runtime="onnxruntime", precision="int8", threads=1)
    assert classifier.setting.strategy == "entropy"
    assert isinstance(classifier.stream(1).engine, OneFileEngine)
    assert not isinstance(classifier.stream(32).engine, OneFileEngine)
    one, queued = classifier.predict(dev_texts, batch_size=1), classifier.predict(dev_texts, batch_size=32)
    assert [r["label"] for r in one] == [r["label"] for r in queued]
    assert [r["exit_layer"] for r in one] == [r["exit_layer"] for r in queued]
    assert [r["flops"] for r in one] == [r["flops"] for r in queued]
    assert len({r["exit_layer"] for r in one}) > 1
    other = EarlyExitClassifier.from_pretrained(export, runtime="onnxruntime", strategy="patience", threshold=1)
    assert not isinstance(other.stream(1).engine, OneFileEngine)  # the file holds entropy: the queues serve
