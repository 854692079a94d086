import pytest
import torch
from tiny_models import tiny_config
from transformers import BertTokenizer

from elasticbert import ElasticBertConfig, minilm_dir

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times.",
    "Call me Ishmael.",
]


@pytest.fixture(scope="session")
def minilm():
    return minilm_dir()


@pytest.fixture(scope="session")
def batch(minilm):
    tok = BertTokenizer.from_pretrained(minilm)
    enc = tok(SENTENCES[:2], SENTENCES[1:], padding=True, return_tensors="pt")
    assert not bool(enc["attention_mask"].all()), "the batch must contain padding"
    return dict(enc)


_tiny_config = tiny_config


def _random_batch(cfg: ElasticBertConfig, b: int = 3, t: int = 12, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, cfg.vocab_size, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[0, t - 3 :] = 0
    types = torch.zeros(b, t, dtype=torch.long)
    types[:, t // 2 :] = 1
    labels = torch.full((b, t), -100)
    pick = torch.rand(b, t, generator=g) < 0.3
    pick[:, 0] = False
    labels[pick] = ids[pick]
    return ids, mask, types, labels, torch.randint(0, 2, (b,), generator=g)


@pytest.fixture
def tiny_config():
    """Factory: a tiny ElasticBERT config without dropout (keyword overrides allowed)."""
    return _tiny_config


@pytest.fixture
def random_batch():
    """Factory: (input_ids, attention_mask with padding, token_type_ids, mlm_labels, sop_labels)."""
    return _random_batch


def _fnlp_layout_state(cfg):
    """Key names of the released fnlp/elasticbert-base checkpoint (from their public modeling code), written by hand
    so a renaming on our side breaks this test."""
    h, inter, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    state = {
        "elasticbert.embeddings.word_embeddings.weight": torch.randn(v, h),
        "elasticbert.embeddings.position_embeddings.weight": torch.randn(cfg.max_position_embeddings, h),
        "elasticbert.embeddings.token_type_embeddings.weight": torch.randn(2, h),
        "elasticbert.embeddings.LayerNorm.weight": torch.randn(h),
        "elasticbert.embeddings.LayerNorm.bias": torch.randn(h),
        "elasticbert.embeddings.position_ids": torch.arange(cfg.max_position_embeddings)[None],
    }
    for i in range(cfg.num_hidden_layers):
        p = f"elasticbert.encoder.layer.{i}."
        for name, shape in [
            ("attention.self.query", (h, h)),
            ("attention.self.key", (h, h)),
            ("attention.self.value", (h, h)),
            ("attention.output.dense", (h, h)),
            ("intermediate.dense", (inter, h)),
            ("output.dense", (h, inter)),
        ]:
            state[p + name + ".weight"] = torch.randn(shape)
            state[p + name + ".bias"] = torch.randn(shape[0])
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            state[p + ln + ".weight"] = torch.randn(h)
            state[p + ln + ".bias"] = torch.randn(h)
        state[f"elasticbert.encoder.pooler.{i}.dense.weight"] = torch.randn(h, h)
        state[f"elasticbert.encoder.pooler.{i}.dense.bias"] = torch.randn(h)
    return state


@pytest.fixture
def fnlp_layout_state():
    """Factory: random weights under the released fnlp/elasticbert-base key names (bare model, every pooler)."""
    return _fnlp_layout_state
