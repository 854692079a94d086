"""Nothing loads silently from random weights, and every broken checkpoint is one CheckpointError naming the file."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertModel,
    ElectraConfig,
    ElectraModel,
    GPT2Config,
    GPT2Model,
    RobertaConfig,
    RobertaForMaskedLM,
    T5Config,
    T5EncoderModel,
)

from common.errors import UserError
from elasticbert import (
    CheckpointError,
    ElasticBertForPreTraining,
    ElasticBertForSequenceClassification,
    ElasticBertModel,
    load_pretrained,
)

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _save(model, directory, **config_changes):
    model.save_pretrained(directory)
    if config_changes:
        path = directory / "config.json"
        raw = json.loads(path.read_text()) | config_changes
        path.write_text(json.dumps({k: v for k, v in raw.items() if v is not None}))
    return directory


@pytest.mark.parametrize(
    "model, model_type",
    [
        (lambda: GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=16)), "gpt2"),
        (lambda: T5EncoderModel(T5Config(num_layers=2, d_model=32, d_ff=64, num_heads=4, vocab_size=50)), "t5"),
    ],
)
def test_a_model_type_we_do_not_understand_is_refused(tmp_path, model, model_type):
    _save(model(), tmp_path)
    with pytest.raises(CheckpointError, match=rf"config\.json: model_type '{model_type}' is not a BERT-family model"):
        load_pretrained(ElasticBertForSequenceClassification, tmp_path, num_labels=2)


def test_a_checkpoint_that_would_leave_the_encoder_random_is_refused_and_names_the_keys(tmp_path):
    """RoBERTa weights behind a config that says "bert" (today's RoBERTa-as-BERT route): nothing would load."""
    torch.manual_seed(0)
    _save(RobertaForMaskedLM(RobertaConfig(vocab_size=60, **TINY)), tmp_path, model_type="bert")
    with pytest.raises(CheckpointError) as err:
        load_pretrained(ElasticBertForSequenceClassification, tmp_path, num_labels=2)
    message = str(err.value)
    assert isinstance(err.value, UserError) and str(tmp_path) in message and "model_type 'bert'" in message
    assert "elasticbert.embeddings.LayerNorm.bias" in message and "(37 in all)" in message  # first few + count
    assert "roberta.embeddings." in message and "allow_random_encoder=True" in message

    model, report = load_pretrained(ElasticBertModel, tmp_path, allow_random_encoder=True)  # deliberate
    assert "embeddings.word_embeddings.weight" in report.initialised
    assert any(k.startswith("roberta.encoder.layer.") for k in report.unused)


def test_foreign_keys_behind_an_elasticbert_config_are_refused(tmp_path):
    _save(BertForMaskedLM(BertConfig(vocab_size=60, **TINY)), tmp_path, model_type="elasticbert")  # bert.* keys
    with pytest.raises(CheckpointError, match=r"model_type 'elasticbert' checkpoint: .* would stay random"):
        load_pretrained(ElasticBertModel, tmp_path)


def test_a_checkpoint_missing_one_layer_weight_is_refused(tmp_path):
    _save(BertModel(BertConfig(vocab_size=60, **TINY)), tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["encoder.layer.1.output.dense.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"1 embedding/layer weights .*encoder\.layer\.1\.output\.dense\.weight"):
        load_pretrained(ElasticBertForPreTraining, tmp_path)


def test_truncation_and_missing_heads_are_not_refusals(minilm):
    model, report = load_pretrained(ElasticBertForSequenceClassification, minilm, num_labels=2, num_hidden_layers=2)
    assert report.initialised_exits == [2] and any("encoder.layer.5." in k for k in report.unused)
    with pytest.raises(TypeError, match=r"unknown config overrides \['exit_layer'\]"):
        load_pretrained(ElasticBertForSequenceClassification, minilm, exit_layer=[2])


def test_what_the_config_cannot_reproduce_is_refused(tmp_path):
    _save(BertModel(BertConfig(vocab_size=60, **TINY)), tmp_path / "rel", position_embedding_type="relative_key")
    with pytest.raises(CheckpointError, match=r"config\.json: .*position_embedding_type='relative_key'"):
        load_pretrained(ElasticBertModel, tmp_path / "rel")
    electra = ElectraModel(ElectraConfig(vocab_size=60, embedding_size=16, **TINY))
    _save(electra, tmp_path / "electra")
    with pytest.raises(CheckpointError, match=r"config\.json: embedding_size=16 differs from hidden_size=32"):
        load_pretrained(ElasticBertModel, tmp_path / "electra")


@pytest.fixture
def saved(tmp_path, tiny_config):
    ElasticBertModel(tiny_config()).save_pretrained(tmp_path)
    return tmp_path


def test_config_json_that_is_not_utf8_json_names_the_file(saved):
    config = saved / "config.json"
    config.write_bytes(b'{"model_type": "elasticbert", "hidden_size": \xff\xfe}')
    with pytest.raises(CheckpointError, match=r"config\.json: not UTF-8"):
        load_pretrained(ElasticBertModel, saved)
    config.write_text('{"model_type": "elasticbert",')
    with pytest.raises(CheckpointError, match=r"config\.json:1:\d+: not valid JSON"):
        load_pretrained(ElasticBertModel, saved)
    config.write_text("[1, 2]")
    with pytest.raises(CheckpointError, match=r"config\.json: expected a JSON object"):
        load_pretrained(ElasticBertModel, saved)
    config.write_text(json.dumps({"model_type": "elasticbert", "hidden_size": 30, "num_attention_heads": 4}))
    with pytest.raises(CheckpointError, match=r"config\.json: .*not a multiple"):
        load_pretrained(ElasticBertModel, saved)


def test_corrupt_or_unsafe_bin_weights_name_the_file(saved):
    state = load_file(str(saved / "model.safetensors"))
    (saved / "model.safetensors").unlink()
    weights = saved / "pytorch_model.bin"
    torch.save(state, weights)
    load_pretrained(ElasticBertModel, saved)  # a good .bin loads
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: cannot read weights"):
        load_pretrained(ElasticBertModel, saved)
    torch.save({"weights": shutil.copyfileobj}, weights)  # a pickle that would run code: weights_only refuses it
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: cannot read weights"):
        load_pretrained(ElasticBertModel, saved)
    torch.save({"weights": "not a tensor"}, weights)
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: not a state dict of tensors"):
        load_pretrained(ElasticBertModel, saved)


def test_missing_weights_and_missing_shards_name_the_file(saved):
    state = load_file(str(saved / "model.safetensors"))
    (saved / "model.safetensors").unlink()
    (saved / "tf_model.h5").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"no model\.safetensors or pytorch_model\.bin \(only tf_model\.h5"):
        load_pretrained(ElasticBertModel, saved)
    names = sorted(state)
    half = len(names) // 2
    save_file({k: state[k] for k in names[:half]}, str(saved / "model-00001-of-00002.safetensors"))
    weight_map = {k: "model-00001-of-00002.safetensors" for k in names[:half]}
    weight_map |= {k: "model-00002-of-00002.safetensors" for k in names[half:]}
    (saved / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=r"model-00002-of-00002\.safetensors: weights shard .* is missing"):
        load_pretrained(ElasticBertModel, saved)
    save_file({k: state[k] for k in names[half:]}, str(saved / "model-00002-of-00002.safetensors"))
    model, report = load_pretrained(ElasticBertModel, saved)  # a complete sharded checkpoint loads whole
    assert report.initialised == [] and torch.equal(model.state_dict()[names[0]], state[names[0]])
