"""Fixtures: MiniLM (real weights) with an exit at every layer, real GLUE rows, and random exit heads centred and
scaled on those rows so that confidences differ from sample to sample (untrained heads are nearly constant)."""

from pathlib import Path

import pytest
import torch

from elasticbert import ElasticBertForSequenceClassification, load_pretrained, minilm_dir
from finetune.data import EncodedSplit, load_tokenizer
from finetune.tasks import get_task, load_split

GLUE = Path(__file__).resolve().parents[3] / "shared" / "data" / "glue"
EXITS = [1, 2, 3, 4, 5, 6]


def pytest_collection_modifyitems(config, items):
    if not GLUE.is_dir():  # pragma: no cover - the data is part of the environment
        skip = pytest.mark.skip(reason=f"GLUE data not found at {GLUE}")
        for item in items:
            if "finetune_early_exit" in str(item.fspath):
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a shared 2-core machine a second OpenMP thread mostly waits (3x slower under load).
    Results do not depend on it; the previous setting is restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def glue_dir():
    return GLUE


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer(minilm_dir())


def spread_heads(model, split, seed=0, logit_std=2.0):
    """Random exit heads, centred on `split`'s representations and scaled to `logit_std` across its samples."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        out = model(split.input_ids, attention_mask=split.attention_mask, token_type_ids=split.token_type_ids)
        for layer, rep in zip(model.exit_layers, out.representations):
            linear = model.exits[str(layer)].classifier
            weight = torch.randn(linear.weight.shape, generator=g)
            centred = rep - rep.mean(0)
            scale = (centred @ weight.T).std(0).clamp_min(1e-6)
            linear.weight.copy_(weight * (logit_std / scale)[:, None])
            linear.bias.copy_(-(rep.mean(0) @ linear.weight.T))
    return model


def _model(num_labels, split, exit_type="linear", seed=0):
    torch.manual_seed(seed)
    model, _ = load_pretrained(
        ElasticBertForSequenceClassification,
        minilm_dir(),
        num_labels=num_labels,
        exit_layers=EXITS,
        exit_type=exit_type,
    )
    model.eval()
    return spread_heads(model, split, seed=seed)


@pytest.fixture(scope="session")
def sst2_dev(tokenizer):
    examples = load_split(get_task("SST-2"), GLUE, "dev")[:32]
    return EncodedSplit.from_examples(tokenizer, examples, 128)


@pytest.fixture(scope="session")
def stsb_dev(tokenizer):
    examples = load_split(get_task("STS-B"), GLUE, "dev")[:32]
    return EncodedSplit.from_examples(tokenizer, examples, 128)


@pytest.fixture(scope="session")
def classifier(sst2_dev):
    return _model(2, sst2_dev)


@pytest.fixture(scope="session")
def regressor(stsb_dev):
    return _model(1, stsb_dev, seed=1)


@pytest.fixture(scope="session")
def mha_classifier(sst2_dev):
    return _model(2, sst2_dev, exit_type="mha", seed=2)
