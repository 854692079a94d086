"""HashEE on BERT- and RoBERTa-family checkpoints (`elasticbert.loading` maps them): with every token at the top it is
the backbone's own classifier, with a map a row alone equals the row in a padded batch (RoBERTa's positions count
real tokens only), and a saved HashEE directory loads through every path (our loader, the Auto classes, remote code)
with its map checked."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSequenceClassification, RobertaConfig, RobertaForSequenceClassification

from elasticbert import (
    CheckpointError,
    ElasticBertForSequenceClassification,
    ElasticBertHashEEForSequenceClassification,
    load_pretrained,
    minilm_dir,
)
from elasticbert.hash_maps import Buckets, random_consistent_map

TINY = dict(
    hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, max_position_embeddings=40
)


@pytest.fixture(scope="module")
def roberta_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("roberta")
    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=60, pad_token_id=1, type_vocab_size=1, num_labels=2, **TINY)
    RobertaForSequenceClassification(config).save_pretrained(directory)
    return directory


def batch(pad_id):
    ids = torch.tensor([[0, 7, 8, 9, 10, 11, 2], [0, 12, 13, 2, pad_id, pad_id, pad_id]])
    return ids, (ids != pad_id).long()


@pytest.mark.parametrize("backbone", ["roberta", "bert"])
def test_all_top_is_the_backbone_and_rows_do_not_depend_on_their_batch(backbone, roberta_dir):
    path, pad = (roberta_dir, 1) if backbone == "roberta" else (minilm_dir(), 0)
    overrides = {} if backbone == "roberta" else {"num_hidden_layers": 2, "num_labels": 2}
    plain, _ = load_pretrained(ElasticBertForSequenceClassification, path, **overrides)
    if backbone == "roberta":  # loading the backbone into the HashEE class (MiniLM, once: it is the slow one)
        hashee, _ = load_pretrained(ElasticBertHashEEForSequenceClassification, path, **overrides)
    else:
        hashee = ElasticBertHashEEForSequenceClassification(plain.config).eval()
    hashee.load_state_dict(plain.state_dict(), strict=False)  # the same (freshly initialised) exit head
    ids, mask = batch(pad)
    with torch.inference_mode():
        assert torch.equal(plain(ids, mask).logits, hashee(ids, mask).logits)
        layers = hashee.config.num_hidden_layers
        depth = random_consistent_map(hashee.config.vocab_size, 60, Buckets(layers, layers), [0, 1, 2], seed=1)
        hashee.elasticbert.set_token_map(depth, hash="random-consistent", buckets=layers, seed=1)
        batched = hashee(ids, mask).logits
        alone = hashee(ids[1:, :4], mask[1:, :4]).logits
    assert torch.allclose(batched[1], alone[0], atol=1e-6)
    assert not torch.allclose(batched, plain(ids, mask).logits)


def test_a_saved_hashee_model_loads_everywhere_with_its_map_checked(tmp_path, roberta_dir):
    model, _ = load_pretrained(ElasticBertHashEEForSequenceClassification, roberta_dir)
    depth = random_consistent_map(60, 60, Buckets(3, 3), [0, 1, 2], seed=4)
    model.elasticbert.set_token_map(depth, hash="random-consistent", buckets=3, seed=4)
    model.config.finetuning_task = "SST-2"
    model.save_pretrained(tmp_path)
    ids, mask = batch(1)
    expected = model(ids, mask).logits
    ours, _ = load_pretrained(ElasticBertForSequenceClassification, tmp_path)  # asked for the plain class
    auto = AutoModelForSequenceClassification.from_pretrained(tmp_path)
    remote = AutoModelForSequenceClassification.from_pretrained(tmp_path, trust_remote_code=True)
    for loaded in (ours, auto, remote):
        assert isinstance(loaded, ElasticBertHashEEForSequenceClassification)
        assert torch.allclose(loaded.eval()(ids, mask).logits, expected, atol=1e-6)
        assert np.array_equal(loaded.elasticbert.token_layers.numpy(), depth)
    state = load_file(tmp_path / "model.safetensors")
    state["elasticbert.token_layers"][5] = 1 if state["elasticbert.token_layers"][5] != 1 else 2
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    for load in (
        lambda: load_pretrained(ElasticBertForSequenceClassification, tmp_path),
        lambda: AutoModelForSequenceClassification.from_pretrained(tmp_path),
    ):
        with pytest.raises(CheckpointError, match="token map"):
            load()
    del state["elasticbert.token_layers"]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="missing or changed"):
        load_pretrained(ElasticBertForSequenceClassification, tmp_path)
