"""Checkpoints in the released ElasticBERT layouts: fine-tuned heads load whole (both entry points agree), and the
pre-trained `fnlp/elasticbert-base` layout loads by hub name from an offline cache laid out here.

Key names follow fastnlp/ElasticBERT: `finetune-static/models/modeling_elasticbert.py` (static: `classifier`, one
pooler at the last layer) and `finetune-dynamic/models/modeling_elasticbert_entropy.py` (dynamic: `classifiers.{i}`
on the last `num_output_layers` layers' poolers); weights saved as `pytorch_model.bin`, as that code does.
"""

import json

import pytest
import torch
from hub_cache import add_to_hub_cache
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForSequenceClassification

from common.hub import HubError
from elasticbert import ElasticBertForSequenceClassification, ElasticBertModel, load_pretrained

NUM_LABELS = 3


def _official_config(cfg, num_output_layers, architecture):
    """config.json as the official ElasticBertConfig writes it (its fields, no `exit_layers`)."""
    return {
        "architectures": [architecture],
        "model_type": "elasticbert",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "max_output_layers": cfg.num_hidden_layers,
        "num_output_layers": num_output_layers,
        "intermediate_size": cfg.intermediate_size,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": cfg.max_position_embeddings,
        "type_vocab_size": 2,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "gradient_checkpointing": False,
        "position_embedding_type": "absolute",
        "use_cache": True,
        "id2label": {str(i): f"LABEL_{i}" for i in range(NUM_LABELS)},
        "label2id": {f"LABEL_{i}": i for i in range(NUM_LABELS)},
        "transformers_version": "4.6.1",
    }


def _fine_tuned(directory, cfg, state, num_output_layers):
    """An official fine-tuned checkpoint: poolers only where the official encoder builds them, plus its heads."""
    torch.manual_seed(1)
    first = cfg.num_hidden_layers - num_output_layers  # 0-based layer of the first output
    state = {k: v for k, v in state.items() if not _pooler_below(k, first)}
    h = cfg.hidden_size
    if num_output_layers == 1:
        state |= {"classifier.weight": torch.randn(NUM_LABELS, h), "classifier.bias": torch.randn(NUM_LABELS)}
    else:
        for i in range(num_output_layers):
            state |= {f"classifiers.{i}.weight": torch.randn(NUM_LABELS, h), f"classifiers.{i}.bias": torch.randn(3)}
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(state, directory / "pytorch_model.bin")
    config = _official_config(cfg, num_output_layers, "ElasticBertForSequenceClassification")
    (directory / "config.json").write_text(json.dumps(config))
    return state


def _pooler_below(key, first):
    parts = key.split(".")
    return key.startswith("elasticbert.encoder.pooler.") and int(parts[3]) < first


def _official_exit_logits(state, cfg, model, batch, layers, head):
    """The official eval forward, from the checkpoint's tensors: classifier(tanh(pooler_j(h_j[:, 0])))."""
    with torch.no_grad():
        states = model.elasticbert(*batch, exit_layers=layers).exit_hidden_states
    out = []
    for i, (layer, hidden) in enumerate(zip(layers, states)):
        p = f"elasticbert.encoder.pooler.{layer - 1}.dense."
        pooled = torch.tanh(hidden[:, 0] @ state[p + "weight"].T + state[p + "bias"])
        name = head if head == "classifier" else f"{head}.{i}"
        out.append(pooled @ state[f"{name}.weight"].T + state[f"{name}.bias"])
    return out


def _same_weights(a, b, initialised=()):
    """Equal state dicts, except weights both loaders initialised (randomly, so differently)."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    different = [k for k in sa if k not in initialised and not torch.equal(sa[k], sb[k])]
    assert not different, different


@pytest.mark.parametrize("num_output_layers, exits", [(4, (1, 2, 3, 4)), (2, (3, 4)), (1, (4,))])
def test_official_fine_tuned_heads_become_our_exits(
    tmp_path, tiny_config, fnlp_layout_state, random_batch, num_output_layers, exits
):
    cfg = tiny_config()
    state = _fine_tuned(tmp_path / "official", cfg, fnlp_layout_state(cfg), num_output_layers)
    model, report = load_pretrained(ElasticBertForSequenceClassification, tmp_path / "official")
    assert model.exit_layers == exits and model.config.num_labels == NUM_LABELS
    assert report.unused == [] and report.initialised_exits == [], report
    first = cfg.num_hidden_layers - num_output_layers
    assert report.initialised == [
        f"elasticbert.encoder.pooler.{j}.dense.{w}" for j in range(first) for w in ("bias", "weight")
    ]
    ids, mask, types, _, _ = random_batch(cfg)
    with torch.no_grad():
        got = model(ids, mask, types).exit_logits
    want = _official_exit_logits(
        state, cfg, model, (ids, mask, types), exits, "classifier" if num_output_layers == 1 else "classifiers"
    )
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=1e-6)

    # transformers' entry point maps the same names (key_mapping hook) and agrees; it saves in our layout.
    hf, info = AutoModelForSequenceClassification.from_pretrained(tmp_path / "official", output_loading_info=True)
    assert type(hf) is ElasticBertForSequenceClassification and not info["unexpected_keys"], info
    assert set(info["missing_keys"]) == set(report.initialised)
    _same_weights(hf.eval(), model, report.initialised)
    hf.save_pretrained(tmp_path / "resaved")
    keys = load_file(str(tmp_path / "resaved" / "model.safetensors")).keys()
    assert f"exits.{exits[0]}.classifier.weight" in keys and not any(k.startswith("classifier") for k in keys)
    again, _ = load_pretrained(ElasticBertForSequenceClassification, tmp_path / "resaved")
    _same_weights(again, hf)


def test_exits_an_official_checkpoint_has_no_weights_for_are_reported(tmp_path, tiny_config, fnlp_layout_state):
    cfg = tiny_config()
    _fine_tuned(tmp_path, cfg, fnlp_layout_state(cfg), num_output_layers=1)
    model, report = load_pretrained(ElasticBertForSequenceClassification, tmp_path, exit_layers=[2, 4])
    assert report.initialised_exits == [2] and "exits without trained weights: [2]" in str(report)
    mha, report = load_pretrained(ElasticBertForSequenceClassification, tmp_path, exit_type="mha")
    assert report.initialised_exits == [4] and sorted(report.unused) == ["classifier.bias", "classifier.weight"]


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf" / "hub"


def test_fnlp_elasticbert_base_by_hub_name_offline(tmp_path, offline_hub, tiny_config, fnlp_layout_state):
    cfg = tiny_config()
    state = fnlp_layout_state(cfg)
    release = tmp_path / "release"
    release.mkdir()
    torch.save(state, release / "pytorch_model.bin")
    config = _official_config(cfg, cfg.num_hidden_layers, "ElasticBertForMaskedLM")
    (release / "config.json").write_text(json.dumps({k: v for k, v in config.items() if "label" not in k}))
    (release / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(95)])
    )
    add_to_hub_cache(offline_hub, "fnlp/elasticbert-base", release)

    model, report = load_pretrained(
        ElasticBertForSequenceClassification, "fnlp/elasticbert-base", num_labels=2, exit_layers=[2, 4]
    )
    assert report.source.startswith(str(offline_hub)) and report.unused == []
    assert report.initialised_exits == [2, 4] and all(k.startswith("exits.") for k in report.initialised)
    assert torch.equal(
        model.elasticbert.encoder.layer[3].output.dense.weight, state["elasticbert.encoder.layer.3.output.dense.weight"]
    )
    base, report = load_pretrained(ElasticBertModel, "fnlp/elasticbert-base")
    assert report.initialised == [] and report.unused == []
    hf = AutoModel.from_pretrained("fnlp/elasticbert-base", cache_dir=str(offline_hub)).eval()
    _same_weights(hf, base)
    with pytest.raises(
        HubError, match=r"fnlp/elasticbert-large: not a local directory and not in the Hugging Face cache"
    ):
        load_pretrained(ElasticBertModel, "fnlp/elasticbert-large")
