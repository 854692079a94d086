"""The model card an exported or fine-tuned directory carries: what, how trained, per-exit scores, how to load."""

import re

import pytest
import torch
from transformers import BertTokenizer

from elasticbert import (
    CheckpointError,
    ElasticBertForPreTraining,
    ElasticBertForSequenceClassification,
    write_model_card,
)


def test_classifier_card_states_scores_and_its_loading_code_runs(tmp_path, tiny_config, minilm):
    cfg = tiny_config(exit_layers=[2, 4], num_labels=2, vocab_size=30522)  # the MiniLM tokenizer's vocabulary
    model = ElasticBertForSequenceClassification(cfg).eval()
    directory = tmp_path / "sst2-elasticbert"
    model.save_pretrained(directory)
    BertTokenizer.from_pretrained(minilm).save_pretrained(directory)
    path = write_model_card(
        directory,
        what="A tiny SST-2 classifier with exits at layers 2 and 4.",
        training={"recipe": "elasticbert-dynamic", "epochs": 3, "lr": 2e-5, "data": "SST-2 train"},
        exit_scores={4: {"accuracy": 91.25, "f1": 90.5}, 2: {"accuracy": 85.0}},
    )
    card = path.read_text()
    assert path == directory / "README.md" and card.startswith("---\nlibrary_name: transformers\n")
    assert "pipeline_tag: text-classification" in card and "# sst2-elasticbert" in card
    assert "A tiny SST-2 classifier" in card and "- recipe: elasticbert-dynamic" in card and "- lr: 2e-05" in card
    assert "- exits: layers [2, 4] (linear heads)" in card
    assert "| exit layer | accuracy | f1 |" in card
    assert "| 2 | 85.00 | - |" in card and "| 4 | 91.25 | 90.50 |" in card  # sorted by layer
    code = re.search(r"```python\n(.*?)```", card, re.S).group(1).replace("path/to/sst2-elasticbert", str(directory))
    scope = {}
    exec(code, scope)  # the card's own instructions load this directory
    assert type(scope["model"]) is ElasticBertForSequenceClassification and scope["report"].initialised == []
    with torch.no_grad():
        batch = scope["tokenizer"](["fine"], return_tensors="pt")
        assert torch.equal(scope["model"].eval()(**batch).logits, model(**batch).logits)


def test_pretraining_card_without_scores_and_bad_inputs(tmp_path, tiny_config):
    ElasticBertForPreTraining(tiny_config()).save_pretrained(tmp_path)
    card = write_model_card(tmp_path, what="Pre-trained.", training="From scratch, 10 steps.").read_text()
    assert "pipeline_tag" not in card and "Not measured for this directory." in card
    assert "AutoModelForPreTraining.from_pretrained" in card and "From scratch, 10 steps." in card
    with pytest.raises(ValueError, match=r"layer 9 is not within 1\.\.4"):
        write_model_card(tmp_path, what="x", training="y", exit_scores={9: 50.0})
    with pytest.raises(ValueError, match=r"layer 2 score=nan is not a finite number"):
        write_model_card(tmp_path, what="x", training="y", exit_scores={2: float("nan")})
    with pytest.raises(CheckpointError, match="no config.json"):
        write_model_card(tmp_path / "missing", what="x", training="y")
