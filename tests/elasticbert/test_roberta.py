"""RoBERTa and other BERT-family backbones load with every encoder weight used and reproduce transformers' models
layer by layer (random tiny weights built here, saved with save_pretrained, BPE tokenizer files beside them)."""

import pytest
import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import (
    AutoModel,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    CamembertConfig,
    CamembertModel,
    ElectraConfig,
    ElectraModel,
    RobertaConfig,
    RobertaForMaskedLM,
    RobertaForSequenceClassification,
    RobertaModel,
    RobertaTokenizer,
    XLMRobertaConfig,
    XLMRobertaModel,
)

from elasticbert import (
    ElasticBertForPreTraining,
    ElasticBertForSequenceClassification,
    ElasticBertModel,
    load_pretrained,
)

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Call me Ishmael.",
    "It was the best of times, it was the worst of times.",
]
ROBERTA = dict(type_vocab_size=1)  # as roberta-base ships (transformers' RobertaConfig defaults to 2)
TINY = dict(
    hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, max_position_embeddings=72
)


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    """vocab.json + merges.txt of a byte-level BPE trained on three sentences, RoBERTa's special tokens (pad = 1)."""
    directory = tmp_path_factory.mktemp("bpe")
    bpe = ByteLevelBPETokenizer()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    bpe.train_from_iterator(TEXTS * 3, vocab_size=300, min_frequency=1, special_tokens=specials, show_progress=False)
    bpe.save_model(str(directory))
    return directory


def _checkpoint(tmp_path, bpe_dir, model_class, config_class, seed=0, **fields):
    tokenizer = RobertaTokenizer.from_pretrained(bpe_dir)
    torch.manual_seed(seed)
    config = config_class(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **(TINY | fields))
    model = model_class(config).eval()
    _randomise_layer_norms(model)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return model, tokenizer


def _randomise_layer_norms(model):
    """transformers initialises LayerNorms to (1, 0) and biases to 0: random values make a wrong mapping visible."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name or name.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if name.endswith("weight") else 0.0))


def _batch(tokenizer, side="right", pairs=False):
    tokenizer.padding_side = side
    second = TEXTS[1:] + TEXTS[:1] if pairs else None
    enc = tokenizer(TEXTS, second, padding=True, return_tensors="pt", return_token_type_ids=True)
    assert not bool(enc["attention_mask"].all()), "the batch must contain padding"
    return dict(enc)


def _assert_same_layers(ours, ref, batch):
    with torch.no_grad():
        got = ours(**batch, output_hidden_states=True).hidden_states
        want = ref(**batch, output_hidden_states=True).hidden_states
    assert len(got) == len(want) == ref.config.num_hidden_layers + 1  # embeddings + every layer
    for layer, (a, b) in enumerate(zip(got, want)):
        diff = (a - b).abs().max().item()
        assert diff <= 1e-5, (layer, diff)


@pytest.mark.parametrize("side", ["right", "left"])
def test_roberta_model_every_layer_matches_transformers(tmp_path, bpe_dir, side):
    ref, tokenizer = _checkpoint(tmp_path, bpe_dir, RobertaModel, RobertaConfig, **ROBERTA)
    assert not any(k.startswith("roberta.") for k in ref.state_dict())  # bare RobertaModel keys
    ours, report = load_pretrained(ElasticBertModel, tmp_path)
    assert report.layout == "roberta" and report.model_type == "roberta"
    assert report.initialised == [] and report.unused == [], report  # embeddings, layers and pooler: all used
    cfg = ours.config
    assert (cfg.position_ids_style, cfg.type_vocab_size, cfg.pad_token_id) == ("roberta", 1, 1)
    assert cfg.max_sequence_length == 72 - 2  # RoBERTa's positions start at pad_token_id + 1
    _assert_same_layers(ours, ref, _batch(tokenizer, side))  # left padding moves BERT positions, not RoBERTa's


def test_roberta_export_reproduces_roberta_through_automodel(tmp_path, bpe_dir):
    """The config carries what differs, so our saved model reproduces RoBERTa with no loader in between."""
    ref, tokenizer = _checkpoint(tmp_path / "roberta", bpe_dir, RobertaModel, RobertaConfig, seed=3, **ROBERTA)
    ours, _ = load_pretrained(ElasticBertForPreTraining, tmp_path / "roberta")
    ours.save_pretrained(tmp_path / "export")
    again = AutoModel.from_pretrained(tmp_path / "export").eval()
    assert type(again) is ElasticBertModel and again.config.position_ids_style == "roberta"
    _assert_same_layers(again, ref, _batch(tokenizer))


def test_roberta_lm_head_maps_onto_every_mlm_head(tmp_path, bpe_dir):
    ref, tokenizer = _checkpoint(tmp_path, bpe_dir, RobertaForMaskedLM, RobertaConfig, seed=1, **ROBERTA)
    assert any(k.startswith("roberta.") for k in ref.state_dict()) and any(
        k.startswith("lm_head.") for k in ref.state_dict()
    )
    ours, report = load_pretrained(ElasticBertForPreTraining, tmp_path)
    # Everything but heads RobertaForMaskedLM lacks (SOP classifiers, poolers) comes from the checkpoint.
    heads = ("cls.seq_relationship.", "elasticbert.encoder.pooler.")
    assert report.initialised and all(k.startswith(heads) for k in report.initialised), report
    assert report.unused == [], report
    batch = _batch(tokenizer)
    with torch.no_grad():
        want = ref(**batch).logits
        states = ours.elasticbert(**batch).exit_hidden_states
        for layer in (1, 3):  # every exit's transform is a copy of the one head
            got = ours.cls.predictions.logits(layer, states[-1])
            assert (got - want).abs().max().item() <= 1e-5
        logits = ours(**batch).prediction_logits  # no labels: the deepest exit's logits, as transformers returns them
    assert (logits - want).abs().max().item() <= 1e-5


@pytest.mark.parametrize(
    "model_class, config_class, fields",
    [(RobertaForSequenceClassification, RobertaConfig, ROBERTA), (BertForSequenceClassification, BertConfig, {})],
)
def test_sequence_classification_head_becomes_the_last_exit(tmp_path, bpe_dir, model_class, config_class, fields):
    ref, tokenizer = _checkpoint(tmp_path, bpe_dir, model_class, config_class, seed=2, num_labels=3, **fields)
    ours, report = load_pretrained(ElasticBertForSequenceClassification, tmp_path)
    assert ours.exit_layers == (3,) and report.initialised_exits == [] and report.unused == [], report
    batch = _batch(tokenizer, pairs=True)
    with torch.no_grad():
        assert (ours(**batch).logits - ref(**batch).logits).abs().max().item() <= 1e-5
    multi, report = load_pretrained(ElasticBertForSequenceClassification, tmp_path, exit_layers=[1, 2, 3])
    assert report.initialised_exits == [1, 2] and "exits without trained weights: [1, 2]" in str(report)


@pytest.mark.parametrize(
    "model_class, config_class, prefix",
    [
        (XLMRobertaModel, XLMRobertaConfig, "xlm-roberta"),
        (CamembertModel, CamembertConfig, "camembert"),
        (ElectraModel, ElectraConfig, "electra"),
        (BertModel, BertConfig, "bert"),
    ],
)
def test_other_bert_family_backbones_match_transformers(tmp_path, bpe_dir, model_class, config_class, prefix):
    extra = {"embedding_size": TINY["hidden_size"]} if config_class is ElectraConfig else {}
    roberta_like = prefix in ("xlm-roberta", "camembert")
    extra |= ROBERTA if roberta_like else {}
    ref, tokenizer = _checkpoint(tmp_path, bpe_dir, model_class, config_class, **extra)
    ours, report = load_pretrained(ElasticBertModel, tmp_path)
    assert report.layout == prefix and report.unused == [], report
    assert ours.config.position_ids_style == ("roberta" if roberta_like else "bert")
    assert all(k.startswith("encoder.pooler.") for k in report.initialised), report  # ELECTRA has no pooler
    _assert_same_layers(ours, ref, _batch(tokenizer))


def test_roberta_fine_tunes_a_step_with_its_own_tokenizer(tmp_path, bpe_dir):
    """Padding id 1, one token type: a training step runs and moves the encoder (nothing silently frozen)."""
    _checkpoint(tmp_path, bpe_dir, RobertaModel, RobertaConfig, **ROBERTA)
    model, _ = load_pretrained(ElasticBertForSequenceClassification, tmp_path, num_labels=2, exit_layers=[2, 3])
    model.train()
    batch = _batch(RobertaTokenizer.from_pretrained(tmp_path), pairs=True)
    before = model.elasticbert.encoder.layer[0].attention.self.query.weight.clone()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(**batch, labels=torch.tensor([0, 1, 1])).loss.backward()
    optimizer.step()
    assert not torch.equal(before, model.elasticbert.encoder.layer[0].attention.self.query.weight)
