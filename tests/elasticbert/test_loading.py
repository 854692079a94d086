"""Saving and loading: our own format, AutoModel, plain BERT, the fnlp layout, and bad checkpoints."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModel, AutoModelForPreTraining, AutoModelForSequenceClassification

from elasticbert import (
    CheckpointError,
    ElasticBertConfig,
    ElasticBertForPreTraining,
    ElasticBertForSequenceClassification,
    ElasticBertModel,
    load_pretrained,
)


def _same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_save_pretrained_round_trip_bit_exact(tmp_path, tiny_config, random_batch):
    model = ElasticBertForPreTraining(tiny_config()).eval()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    assert AutoConfig.from_pretrained(tmp_path).model_type == "elasticbert"

    again = ElasticBertForPreTraining.from_pretrained(tmp_path).eval()
    _same_state(model, again)
    auto = AutoModelForPreTraining.from_pretrained(tmp_path)
    assert type(auto) is ElasticBertForPreTraining
    _same_state(model, auto)
    assert auto.cls.predictions.decoder.weight is auto.elasticbert.embeddings.word_embeddings.weight

    base = AutoModel.from_pretrained(tmp_path).eval()
    assert type(base) is ElasticBertModel
    _same_state(model.elasticbert, base)
    ids, mask, types, _, _ = random_batch(model.config)
    with torch.no_grad():
        assert torch.equal(
            base(ids, mask, types).last_hidden_state, model.elasticbert(ids, mask, types).last_hidden_state
        )

    ours, report = load_pretrained(ElasticBertForPreTraining, tmp_path)
    _same_state(model, ours)
    assert report.initialised == [] and report.unused == []


def test_classifier_from_pretraining_export(tmp_path, tiny_config):
    ElasticBertForPreTraining(tiny_config()).save_pretrained(tmp_path)
    clf = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=3, exit_layers=[1, 4])
    assert type(clf) is ElasticBertForSequenceClassification and clf.exit_layers == (1, 4)
    ours, report = load_pretrained(ElasticBertForSequenceClassification, tmp_path, num_labels=3, exit_layers=[2])
    assert all(k.startswith("exits.") for k in report.initialised)
    assert any(k.startswith("cls.") for k in report.unused)


def test_plain_bert_minilm_maps_every_exit(minilm):
    model, report = load_pretrained(ElasticBertForPreTraining, minilm)
    assert report.layout == "bert"
    weights = load_file(str(minilm / "model.safetensors"))
    pooler = weights["pooler.dense.weight"]
    for i in range(6):
        assert torch.equal(model.elasticbert.encoder.pooler[i].dense.weight, pooler)
    assert torch.equal(
        model.elasticbert.encoder.layer[5].output.dense.weight, weights["encoder.layer.5.output.dense.weight"]
    )
    # MiniLM has no MLM/SOP heads: exactly those are initialised, and the report says so.
    assert report.initialised and all(k.startswith("cls.") for k in report.initialised)
    assert "initialised" in str(report)
    # Static truncation while loading.
    small, report = load_pretrained(ElasticBertModel, minilm, num_hidden_layers=3)
    assert len(small.encoder.layer) == 3
    assert any("encoder.layer.5." in k for k in report.unused)


def test_fnlp_layout_loads_with_no_missing_keys(tmp_path, tiny_config, fnlp_layout_state):
    cfg = tiny_config()
    state = fnlp_layout_state(cfg)
    save_file(state, str(tmp_path / "model.safetensors"))
    fnlp_config = cfg.to_dict() | {"num_output_layers": 1, "max_output_layers": cfg.num_hidden_layers}
    (tmp_path / "config.json").write_text(json.dumps(fnlp_config))
    model, report = load_pretrained(ElasticBertModel, tmp_path)
    assert report.initialised == [] and report.unused == [], report
    assert torch.equal(model.encoder.pooler[2].dense.weight, state["elasticbert.encoder.pooler.2.dense.weight"])
    assert torch.equal(
        model.encoder.layer[3].attention.self.key.bias, state["elasticbert.encoder.layer.3.attention.self.key.bias"]
    )
    hf = ElasticBertModel.from_pretrained(tmp_path, output_loading_info=True)[1]
    assert hf["missing_keys"] == set() or hf["missing_keys"] == [], hf


def test_corrupt_and_wrong_shape_checkpoints_name_the_problem(tmp_path, tiny_config):
    ElasticBertModel(tiny_config()).save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"

    state = load_file(str(weights))
    state["encoder.layer.1.intermediate.dense.weight"] = torch.zeros(3, 3)
    save_file(state, str(weights))
    with pytest.raises(CheckpointError, match=r"encoder\.layer\.1\.intermediate\.dense\.weight.*shape"):
        load_pretrained(ElasticBertModel, tmp_path)

    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_pretrained(ElasticBertModel, tmp_path)

    weights.unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_pretrained(ElasticBertModel, tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_pretrained(ElasticBertModel, tmp_path)


def test_config_validation_errors():
    with pytest.raises(ValueError, match="exit layers"):
        ElasticBertConfig(num_hidden_layers=4, exit_layers=[5])
    with pytest.raises(ValueError, match="exit_type"):
        ElasticBertConfig(exit_type="cnn")
    with pytest.raises(ValueError, match="not a multiple"):
        ElasticBertConfig(hidden_size=30, num_attention_heads=4)


# ------------------------------------------------------------------------------------- checksums where weights load


def _sealed(directory, tiny_config):
    """A classifier saved and sealed as the project's writers do (`common.integrity.seal` after the last file)."""
    from common.integrity import seal

    torch.manual_seed(0)
    model = ElasticBertForSequenceClassification(tiny_config(num_labels=2, exit_layers=[2, 4])).eval()
    model.save_pretrained(directory)
    seal(directory)
    return model


LOADERS = {
    "load_pretrained": lambda d, **kw: load_pretrained(ElasticBertForSequenceClassification, d, **kw)[0],
    "AutoModelForSequenceClassification": lambda d, **kw: AutoModelForSequenceClassification.from_pretrained(d, **kw),
    "class from_pretrained": lambda d, **kw: ElasticBertForSequenceClassification.from_pretrained(d, **kw),
    "ElasticBertConfig": lambda d, **kw: ElasticBertConfig.from_pretrained(d, **kw),
}


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_every_entry_point_verifies_a_sealed_directory(tmp_path, tiny_config, loader):
    """Flipped tensor bytes, a config.json changed by hand and a lost checksums.json are refused by whichever entry
    point loads the directory, naming the file and the way to load it anyway; `verify_checksums=False` loads it."""
    from common.integrity import SEALED_FIELD

    _sealed(tmp_path / "sealed", tiny_config)
    config = json.loads((tmp_path / "sealed" / "config.json").read_text())
    assert config[SEALED_FIELD] == "checksums.json"  # the directory says it was sealed
    load = LOADERS[loader]
    load(tmp_path / "sealed")  # intact: loads

    faults = {}
    for name in ("weights", "config", "seal"):
        faults[name] = tmp_path / name
        shutil.copytree(tmp_path / "sealed", faults[name])
    data = bytearray((faults["weights"] / "model.safetensors").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (faults["weights"] / "model.safetensors").write_bytes(bytes(data))
    text = (faults["config"] / "config.json").read_text().replace('"layer_norm_eps": 1e-12', '"layer_norm_eps": 1e-19')
    (faults["config"] / "config.json").write_text(text)
    (faults["seal"] / "checksums.json").unlink()
    expected = {
        "weights": "model.safetensors: contents differ from the sha256 in checksums.json",
        "config": "config.json: contents differ from the sha256 in checksums.json",
        "seal": "checksums.json is missing, but",
    }
    for name, directory in faults.items():
        with pytest.raises(CheckpointError) as refused:
            load(directory)
        assert expected[name] in str(refused.value) and "verify_checksums=False" in str(refused.value), name
        load(directory, verify_checksums=False)


def test_unsealed_directories_load_as_before_and_the_marker_is_not_kept_in_memory(tmp_path, tiny_config, minilm):
    """A directory nobody sealed (the MiniLM package, a plain `save_pretrained`) has nothing to verify; a model loaded
    from a sealed one and saved elsewhere is not sealed (the marker describes the directory, not the model), and
    saving into a sealed directory drops its stale seal (the writer seals it again)."""
    from common.integrity import SEALED_FIELD

    load_pretrained(ElasticBertModel, minilm)
    ElasticBertModel(tiny_config()).save_pretrained(tmp_path / "plain")
    AutoModel.from_pretrained(tmp_path / "plain")
    model = _sealed(tmp_path / "sealed", tiny_config)
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "sealed")
    assert not hasattr(loaded.config, SEALED_FIELD)
    loaded.save_pretrained(tmp_path / "copy")
    assert SEALED_FIELD not in json.loads((tmp_path / "copy" / "config.json").read_text())
    load_pretrained(ElasticBertForSequenceClassification, tmp_path / "copy")
    model.config.layer_norm_eps = 1e-6
    model.save_pretrained(tmp_path / "sealed")  # rewritten in place: the old checksums.json would refuse it
    assert not (tmp_path / "sealed" / "checksums.json").exists()
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "sealed")
    assert reloaded.config.layer_norm_eps == 1e-6
