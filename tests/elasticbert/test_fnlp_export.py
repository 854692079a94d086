"""Our models written in the official ElasticBERT layout (`elasticbert.fnlp_export`) run in the official classes.

The official classes are re-created in `tests/support/official_elasticbert.py` from fastnlp/ElasticBERT's public code
(static: `finetune-static/models/modeling_elasticbert.py`; dynamic: `finetune-dynamic/models/
modeling_elasticbert_entropy.py`): the written `pytorch_model.bin` (read with weights_only=True) and config.json
load into them with strict=True and give our logits, exit by exit. The export reads back into our classes too.
"""

import json
import shutil

import pytest
import torch
from official_elasticbert import OfficialEntropyClassifier, OfficialStaticClassifier, entropy, official_config
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification

from elasticbert import (
    ElasticBertForPreTraining,
    ElasticBertForSequenceClassification,
    ElasticBertModel,
    LayoutError,
    export_fnlp,
    load_pretrained,
    save_fnlp,
)
from elasticbert.configuration import official_exit_layers
from elasticbert.layouts import OFFICIAL_POSITION_IDS, apply_renames, official_head_names, official_head_renames

NUM_LABELS = 3
TOLERANCE = 1e-6
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(95)]


def _fine_tuned(directory, cfg, seed=0):
    """A classifier saved as `finetune train` saves RUN/best (float32), with weights of O(1) effect (the init's
    near-zero heads would make any logits agree); returned in float64."""
    torch.manual_seed(seed)
    model = ElasticBertForSequenceClassification(cfg).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    model.save_pretrained(directory)
    (directory / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return model.double()  # logits compared in float64: a wiring slip shows, float32 rounding (~5e-7) does not


def _official(directory, official_class):
    """The official class built from the written config.json, the written pytorch_model.bin loaded strictly."""
    config = json.loads((directory / "config.json").read_text())
    state = torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    model = official_class(official_config(config)).eval()
    model.load_state_dict(state, strict=True)
    return model.double(), config, state


def _our_logits(model, batch):
    with torch.no_grad():
        return model(*batch).exit_logits


def _assert_close(got, want):
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= TOLERANCE, (got, want)


@pytest.mark.parametrize("exit_layer", [4, 2])
def test_a_one_exit_model_runs_in_the_official_static_class(tmp_path, tiny_config, random_batch, exit_layer):
    cfg = tiny_config(num_labels=NUM_LABELS, exit_layers=[exit_layer])
    model = _fine_tuned(tmp_path / "ours", cfg)
    layout = export_fnlp(tmp_path / "ours", tmp_path / "fnlp")
    assert (layout.kind, layout.num_layers, layout.num_output_layers) == ("static", exit_layer, 1)

    official, config, state = _official(tmp_path / "fnlp", OfficialStaticClassifier)
    assert config["architectures"] == ["ElasticBertForSequenceClassification"] and config["model_type"] == "elasticbert"
    assert config["num_output_layers"] == 1 and config["num_hidden_layers"] == exit_layer
    encoder = official.elasticbert.encoder
    assert encoder.current_pooler_num == exit_layer - 1 and encoder.start_output_layer is None  # single-output path
    assert "classifier.weight" in state and not any(k.startswith(("exits.", "classifiers.")) for k in state)

    batch = random_batch(cfg)[:3]
    with torch.no_grad():
        got = official(*batch)
    _assert_close(got, _our_logits(model, batch)[0])

    safetensors = load_file(str(tmp_path / "fnlp" / "model.safetensors"))
    assert safetensors.keys() == state.keys() and all(torch.equal(safetensors[k], state[k]) for k in state)
    assert (tmp_path / "fnlp" / "vocab.txt").read_text() == (tmp_path / "ours" / "vocab.txt").read_text()
    assert config["id2label"] == {str(i): f"LABEL_{i}" for i in range(NUM_LABELS)}


def test_our_own_layout_sends_the_official_static_class_down_its_multi_output_path(tmp_path, tiny_config, random_batch):
    """Why the export rewrites the config: ours carries num_output_layers = the layer count."""
    cfg = tiny_config(num_labels=NUM_LABELS)
    _fine_tuned(tmp_path / "ours", cfg)
    ours = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert ours["num_output_layers"] == cfg.num_hidden_layers
    official = OfficialStaticClassifier(official_config(ours)).eval()
    with pytest.raises(TypeError), torch.no_grad():
        official(*random_batch(cfg)[:3])


@pytest.mark.parametrize("exits", [(1, 2, 3, 4), (1, 2, 3)])
def test_an_exit_on_every_layer_runs_in_the_official_dynamic_class(tmp_path, tiny_config, random_batch, exits):
    cfg = tiny_config(num_labels=NUM_LABELS, exit_layers=list(exits))
    model = _fine_tuned(tmp_path / "ours", cfg)
    layout = export_fnlp(tmp_path / "ours", tmp_path / "fnlp")
    assert (layout.kind, layout.num_layers, layout.num_output_layers) == ("dynamic", len(exits), len(exits))

    official, config, state = _official(tmp_path / "fnlp", OfficialEntropyClassifier)
    assert config["num_output_layers"] == config["num_hidden_layers"] == len(exits)
    assert sorted(k for k in state if k.startswith("classifiers.") and k.endswith(".weight")) == [
        f"classifiers.{i}.weight" for i in range(len(exits))
    ]
    batch = random_batch(cfg)[:3]
    want = _our_logits(model, batch)
    with torch.no_grad():
        got = official(*batch)
    assert len(got) == len(want) == len(exits)
    for official_exit, our_exit in zip(got, want):
        _assert_close(official_exit, our_exit)

    # its entropy early exit, one example at a time: leaves at our first exit under the threshold, with its logits
    # a threshold halfway between two neighbouring entropies: the median itself is one sample's entropy, which the
    # official per-example forward may compute a few ulps lower, and a sample AT the threshold may go either way
    ranked = torch.stack([entropy(w) for w in want]).flatten().sort().values
    threshold = ((ranked[len(ranked) // 2 - 1] + ranked[len(ranked) // 2]) / 2).item()
    for b in range(batch[0].shape[0]):
        example = [x[b : b + 1] for x in batch]
        with torch.no_grad():
            logits, layer = official.highway_forward(*example, threshold)
        under = [i + 1 for i, w in enumerate(want) if entropy(w[b : b + 1]).item() < threshold]
        assert layer == (under[0] if under else len(exits))
        _assert_close(logits, want[layer - 1][b : b + 1])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(exit_type="mha", exit_layers=[4]), r"exits at layers \[4\] are exit_type='mha'.*linear only"),
        (dict(exit_layers=[2, 4]), r"exits at layers \[2, 4\], none at \[1, 3\].*every layer"),
        (dict(exit_layers=[3, 4]), r"exits at layers \[3, 4\], none at \[1, 2\]"),
        (dict(position_ids_style="roberta", pad_token_id=1), r"position_ids_style='roberta'.*positions 0..T-1"),
    ],
)
def test_models_the_official_classes_cannot_run_are_refused_by_name(tmp_path, tiny_config, overrides, message):
    cfg = tiny_config(num_labels=NUM_LABELS, **overrides)
    _fine_tuned(tmp_path / "ours", cfg)
    with pytest.raises(LayoutError, match=message) as refusal:
        export_fnlp(tmp_path / "ours", tmp_path / "fnlp")
    assert str(tmp_path / "ours") in str(refusal.value)
    assert not (tmp_path / "fnlp").exists() and [p.name for p in tmp_path.iterdir()] == ["ours"]


@pytest.mark.parametrize("exits", [(4,), (2,), (1, 2, 3, 4)])
def test_our_loaders_read_the_fnlp_export_back(tmp_path, tiny_config, random_batch, exits):
    cfg = tiny_config(num_labels=NUM_LABELS, exit_layers=list(exits))
    model = _fine_tuned(tmp_path / "ours", cfg)
    export_fnlp(tmp_path / "ours", tmp_path / "fnlp")
    back, report = load_pretrained(ElasticBertForSequenceClassification, tmp_path / "fnlp")
    assert back.exit_layers == exits and back.config.num_hidden_layers == exits[-1]
    assert report.unused == [] and report.initialised_exits == [], report
    batch = random_batch(cfg)[:3]
    hf = AutoModelForSequenceClassification.from_pretrained(tmp_path / "fnlp").eval()
    for reloaded in (back.double(), hf.double()):
        for got, want in zip(_our_logits(reloaded, batch), _our_logits(model, batch), strict=True):
            _assert_close(got, want)


@pytest.mark.parametrize("num_layers, num_output_layers", [(4, 1), (4, 4), (4, 2), (12, 12), (12, 1)])
def test_the_inverse_head_names_undo_the_official_renames(num_layers, num_output_layers):
    forward = official_head_renames(num_layers, num_output_layers)
    inverse = official_head_names(num_layers, num_output_layers)
    ours = [f"exits.{layer}.classifier.weight" for layer in official_exit_layers(num_layers, num_output_layers)]
    written = [apply_renames(name, inverse) for name in ours]
    if num_output_layers == 1:
        assert written == ["classifier.weight"]
    else:
        assert written == [f"classifiers.{i}.weight" for i in range(num_output_layers)]
    assert [apply_renames(name, forward) for name in written] == ours


@pytest.mark.parametrize("model_class", [ElasticBertForPreTraining, ElasticBertModel])
def test_a_pretrained_model_is_written_in_the_released_shape(tmp_path, tiny_config, fnlp_layout_state, model_class):
    cfg = tiny_config()
    model = model_class(cfg).eval()
    layout = save_fnlp(model, tmp_path / "release")
    assert (layout.kind, layout.num_layers, layout.num_output_layers) == ("pre-trained", 4, 4)
    state = torch.load(tmp_path / "release" / "pytorch_model.bin", map_location="cpu", weights_only=True)
    release = fnlp_layout_state(cfg)  # the key names of fnlp/elasticbert-base: no MLM/SOP heads
    assert state.keys() == release.keys()
    assert all(state[k].shape == release[k].shape and state[k].dtype == release[k].dtype for k in release)
    ours = {("" if k.startswith("elasticbert.") else "elasticbert.") + k: v for k, v in model.state_dict().items()}
    assert all(torch.equal(state[k], ours[k]) for k in state if k != OFFICIAL_POSITION_IDS)
    config = json.loads((tmp_path / "release" / "config.json").read_text())
    assert config["num_output_layers"] == config["max_output_layers"] == 4 and "id2label" not in config
    assert "exit_layers" not in config and config["architectures"] == ["ElasticBertModel"]

    # what the official dynamic fine-tuning starts from: every backbone weight loads, only its classifiers are new
    official = OfficialEntropyClassifier(official_config(config))
    missing, unexpected = official.load_state_dict(state, strict=False)
    assert unexpected == [] and all(k.startswith("classifiers.") for k in missing)
    base, report = load_pretrained(ElasticBertModel, tmp_path / "release")
    assert report.initialised == [] and report.unused == [], report


def test_a_pretrained_directory_is_not_exported_as_a_classifier(tmp_path, tiny_config):
    """Our pre-trained export holds no trained exits; config.json's class says so, and the release shape is
    written (the exits it does not have are not invented)."""
    cfg = tiny_config()
    ElasticBertForPreTraining(cfg).save_pretrained(tmp_path / "pretrained")
    layout = export_fnlp(tmp_path / "pretrained", tmp_path / "fnlp")
    assert layout.kind == "pre-trained"
    headless = tmp_path / "headless"
    shutil.copytree(tmp_path / "pretrained", headless)
    config = json.loads((headless / "config.json").read_text())
    (headless / "config.json").write_text(json.dumps({**config, "architectures": None}))
    with pytest.raises(LayoutError, match=r"weights the export would write were never trained \(e\.g\. exits\.4\."):
        export_fnlp(headless, tmp_path / "fnlp2")
