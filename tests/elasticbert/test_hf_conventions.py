"""Hugging Face conventions on every model class: hidden states as BertModel returns them, tuples, labels -> loss,
Auto classes, unknown arguments refused, and the text-classification pipeline reading the last exit."""

import pytest
import torch
import torch.nn.functional as F
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForPreTraining,
    AutoModelForSequenceClassification,
    BertModel,
    BertTokenizer,
    pipeline,
)

from elasticbert import (
    ElasticBertForPreTraining,
    ElasticBertForSequenceClassification,
    ElasticBertModel,
    load_pretrained,
)

CLASSES = [ElasticBertModel, ElasticBertForPreTraining, ElasticBertForSequenceClassification]


def test_output_hidden_states_equal_bert_models(minilm, batch):
    ours, _ = load_pretrained(ElasticBertModel, minilm)
    ref = BertModel.from_pretrained(minilm).eval()
    with torch.no_grad():
        got = ours(**batch, output_hidden_states=True).hidden_states
        want = ref(**batch, output_hidden_states=True).hidden_states
        assert len(got) == len(want) == 7  # embeddings + 6 layers
        for a, b in zip(got, want):
            assert (a - b).abs().max().item() <= 1e-5
        truncated = ours(**batch, exit_layers=[3], output_hidden_states=True).hidden_states
        assert len(truncated) == 4 and torch.equal(truncated[3], got[3])  # every layer computed, no more
        assert ours(**batch).hidden_states is None


@pytest.mark.parametrize("model_class", CLASSES)
def test_hidden_states_tuples_and_unknown_arguments_on_every_class(tiny_config, random_batch, model_class):
    cfg = tiny_config(exit_layers=[2, 4], num_labels=2)
    model = model_class(cfg).eval()
    ids, mask, types, _, _ = random_batch(cfg)
    with torch.no_grad():
        reference = ElasticBertModel(cfg).eval()
        reference.load_state_dict(
            model.state_dict() if model_class is ElasticBertModel else model.elasticbert.state_dict()
        )
        want = reference(ids, mask, types, output_hidden_states=True).hidden_states
        out = model(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
        assert len(out.hidden_states) == 5 and all(torch.equal(a, b) for a, b in zip(out.hidden_states, want))
        model.config.output_hidden_states = True  # the config default, as transformers reads it
        assert len(model(ids, attention_mask=mask).hidden_states) == 5
        model.config.output_hidden_states = False
        as_tuple = model(ids, attention_mask=mask, token_type_ids=types, return_dict=False)
        as_dict = model(ids, attention_mask=mask, token_type_ids=types)
    assert isinstance(as_tuple, tuple) and len(as_tuple) == len(as_dict.to_tuple())
    first = next(v for v in as_dict.values() if v is not None)
    assert torch.equal(as_tuple[0], first)
    model.config.return_dict = False  # the config default, as transformers reads it
    with torch.no_grad():
        assert isinstance(model(ids, attention_mask=mask), tuple)
    model.config.return_dict = True
    with pytest.raises(TypeError, match="unexpected"):
        model(ids, attention_mask=mask, head_mask=None)  # transformers 5 would ignore it silently
    with pytest.raises(ValueError, match="output_attentions"):
        model(ids, output_attentions=True)


def test_classifier_loss_follows_transformers_problem_type(tiny_config, random_batch):
    ids, mask, types, _, _ = random_batch(tiny_config())
    model = ElasticBertForSequenceClassification(tiny_config(exit_layers=[1, 3, 4], num_labels=3)).eval()
    with torch.no_grad():
        single = torch.tensor([2, 0, 1])
        out = model(ids, mask, types, labels=single)
        assert torch.allclose(out.loss, torch.stack([F.cross_entropy(lg, single) for lg in out.exit_logits]).mean())
        partial = model(ids, mask, types, labels=single, exit_layers=[1])  # averaged over the exits that ran
        assert torch.allclose(partial.loss, F.cross_entropy(out.exit_logits[0], single))
        multi = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
        out = model(ids, mask, types, labels=multi)
        bce = [F.binary_cross_entropy_with_logits(lg, multi) for lg in out.exit_logits]
        assert torch.allclose(out.loss, torch.stack(bce).mean())
        model.config.problem_type = "regression"
        out = model(ids, mask, types, labels=multi)
        assert torch.allclose(out.loss, torch.stack([F.mse_loss(lg, multi) for lg in out.exit_logits]).mean())
        model.config.problem_type = None
        loss, logits = model(ids, mask, types, labels=single, return_dict=False)[:2]
        assert loss.ndim == 0 and logits.shape == (3, 3)


def test_pretraining_takes_transformers_label_names_and_returns_logits_without_labels(tiny_config, random_batch):
    cfg = tiny_config()
    model = ElasticBertForPreTraining(cfg).eval()
    ids, mask, types, mlm, sop = random_batch(cfg)
    with torch.no_grad():
        ours = model(ids, mask, types, mlm_labels=mlm, sop_labels=sop).loss
        hf = model(ids, attention_mask=mask, token_type_ids=types, labels=mlm, sentence_order_label=sop).loss
        assert torch.equal(ours, hf)
        out = model(ids, mask, types)
        hidden = model.elasticbert(ids, mask, types).last_hidden_state
        assert out.loss is None and out.prediction_logits.shape == (*ids.shape, cfg.vocab_size)
        assert torch.allclose(out.prediction_logits, model.cls.predictions.logits(cfg.num_hidden_layers, hidden))
        assert out.sop_logits.shape == (ids.shape[0], 2)
    with pytest.raises(ValueError, match="both MLM labels"):
        model(ids, mask, types, labels=mlm)
    with pytest.raises(ValueError, match="not both"):
        model(ids, mask, types, mlm_labels=mlm, labels=mlm, sop_labels=sop)


def test_auto_classes_cover_every_head(tiny_config):
    fields = {k: v for k, v in tiny_config().to_dict().items() if k != "model_type"}
    config = AutoConfig.for_model("elasticbert", **fields)
    assert type(AutoModel.from_config(config)) is ElasticBertModel
    assert type(AutoModelForPreTraining.from_config(config)) is ElasticBertForPreTraining
    assert type(AutoModelForSequenceClassification.from_config(config)) is ElasticBertForSequenceClassification


def test_text_classification_pipeline_reads_the_last_exit(tmp_path, minilm):
    model, _ = load_pretrained(
        ElasticBertForSequenceClassification,
        minilm,
        num_labels=2,
        exit_layers=[2, 6],
        id2label={0: "negative", 1: "positive"},
        label2id={"negative": 0, "positive": 1},
    )
    torch.manual_seed(0)
    with torch.no_grad():  # make the two exits disagree, so reading the wrong one shows
        model.exits["2"].classifier.weight.normal_(0, 1.0)
        model.exits["6"].classifier.weight.normal_(0, 1.0)
    model.save_pretrained(tmp_path)
    tokenizer = BertTokenizer.from_pretrained(minilm)
    tokenizer.save_pretrained(tmp_path)
    texts = ["A gripping, beautiful film.", "Dull.", "I would not watch it again, not even for free."]
    with torch.no_grad():
        out = model(**tokenizer(texts, padding=True, return_tensors="pt"))
    want = out.logits.softmax(-1)
    assert not torch.allclose(want, out.exit_logits[0].softmax(-1), atol=1e-3)
    classify = pipeline("text-classification", model=str(tmp_path))
    for batch_size in (1, 2):
        results = classify(texts, top_k=None, batch_size=batch_size)
        for row, scores in zip(want, results):
            by_label = {r["label"]: r["score"] for r in scores}
            assert by_label["negative"] == pytest.approx(row[0].item(), abs=1e-5)
            assert by_label["positive"] == pytest.approx(row[1].item(), abs=1e-5)
