"""The classifier's own forward exits early when its config carries a setting (`config.early_exit`), so transformers'
pipelines need no code of ours; `save_early_exit` writes the setting; bad settings are refused where they are read.

The expected exits are derived here from the every-exit forward (each sample leaves at the first exit whose rule
fires), independently of the engine."""

import json
import math

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from common.errors import ConfigError
from elasticbert import (
    CheckpointError,
    ElasticBertConfig,
    ElasticBertForSequenceClassification,
    load_pretrained,
    make_rule,
    run_batch,
    save_early_exit,
)
from elasticbert.early_exit import entropy_nats

EXITS = [1, 2, 3, 4]


@pytest.fixture
def model_and_batch(tiny_config, random_batch):
    """A tiny 4-exit classifier whose heads give confidences that differ from sample to sample and exit to exit."""
    torch.manual_seed(0)
    cfg = tiny_config(exit_layers=EXITS, num_labels=2)
    model = ElasticBertForSequenceClassification(cfg).eval()
    with torch.no_grad():
        for layer in EXITS:
            model.exits[str(layer)].classifier.weight.normal_(0, 3.0)
    ids, mask, types, _, _ = random_batch(cfg, b=8, t=12, seed=1)
    mask[3, 6:] = 0
    mask[5, 9:] = 0
    return model, (ids, mask, types)


def _expected_entropy_exits(model, batch, tau):
    """(exit layer, logits) per sample from the every-exit forward: the first exit with entropy < τ, else the last."""
    with torch.no_grad():
        every = model(*batch, early_exit=False).exit_logits
    layers, logits = [], []
    for i in range(batch[0].shape[0]):
        k = next((k for k in range(len(EXITS) - 1) if float(entropy_nats(every[k][i : i + 1])) < tau), len(EXITS) - 1)
        layers.append(EXITS[k])
        logits.append(every[k][i])
    return torch.tensor(layers), torch.stack(logits)


def _spread_threshold(model, batch):
    """An entropy threshold in the widest gap of the inner exits' entropies: samples leave at several exits."""
    with torch.no_grad():
        every = model(*batch, early_exit=False).exit_logits
    values = torch.sort(torch.cat([entropy_nats(lg) for lg in every[:-1]])).values
    lo, hi = len(values) // 4, 3 * len(values) // 4
    gaps = values[lo + 1 : hi + 1] - values[lo:hi]
    i = int(gaps.argmax())
    return float((values[lo + i] + values[lo + i + 1]) / 2)


def test_forward_exits_early_when_the_config_says_so(model_and_batch):
    model, batch = model_and_batch
    tau = _spread_threshold(model, batch)
    want_layers, want_logits = _expected_entropy_exits(model, batch, tau)
    assert len(set(want_layers.tolist())) >= 2, "threshold too extreme"
    assert model(*batch).sample_exit_layers is None  # no setting: every exit, as before
    model.config.early_exit = {"strategy": "entropy", "threshold": tau}
    out = model(*batch)
    assert torch.equal(out.sample_exit_layers, want_layers)
    torch.testing.assert_close(out.logits, want_logits, atol=1e-5, rtol=0)
    # batch-shaped fields only (a pipeline splits each field into samples): no per-exit tuples, no exit list
    assert out.exit_layers is None and out.exit_logits is None and out.loss is None
    # the same engine as a direct call
    direct = run_batch(model, *batch, make_rule("entropy", tau, 2))
    assert torch.equal(direct.exit_layers, out.sample_exit_layers) and torch.equal(direct.logits, out.logits)
    # tuples: (logits, sample_exit_layers)
    logits, layers = model(*batch, return_dict=False)
    assert torch.equal(logits, out.logits) and torch.equal(layers, want_layers)


def test_what_turns_early_exit_off_and_what_refuses_it(model_and_batch):
    model, batch = model_and_batch
    model.config.early_exit = {"strategy": "entropy", "threshold": 0.5}
    with torch.no_grad():
        every = model(*batch, early_exit=False)
    assert every.sample_exit_layers is None and len(every.exit_logits) == len(EXITS)
    for kwargs in (
        {"exit_layers": [2, 4]},
        {"output_hidden_states": True},
        {"labels": torch.zeros(8, dtype=torch.long)},
    ):
        out = model(*batch, **kwargs)
        assert out.sample_exit_layers is None and out.exit_logits is not None, kwargs
    assert model(*batch, labels=torch.zeros(8, dtype=torch.long)).loss is not None
    model.train()
    assert model(*batch).sample_exit_layers is None  # training: every exit (dropout, losses)
    with pytest.raises(ValueError, match="training mode"):
        model(*batch, early_exit=True)
    model.eval()
    with pytest.raises(ValueError, match="labels"):
        model(*batch, early_exit=True, labels=torch.zeros(8, dtype=torch.long))
    # early_exit=True with exit_layers restricts the exits the engine may use
    assert set(model(*batch, early_exit=True, exit_layers=[2, 4]).sample_exit_layers.tolist()) <= {2, 4}
    model.config.early_exit = None
    with pytest.raises(ValueError, match="no early-exit setting"):
        model(*batch, early_exit=True)


def test_static_setting_is_the_full_model(model_and_batch):
    model, batch = model_and_batch
    with torch.no_grad():
        full = model(*batch, early_exit=False).logits
    model.config.early_exit = {"strategy": "static"}
    out = model(*batch)
    assert out.sample_exit_layers.eq(EXITS[-1]).all()
    torch.testing.assert_close(out.logits, full, atol=1e-5, rtol=0)
    assert run_batch(model, *batch, make_rule("static", None, 2)).exits_evaluated.eq(1).all()  # only the last head ran


def test_save_early_exit_round_trip_and_refusals(model_and_batch, tmp_path):
    model, batch = model_and_batch
    model.save_pretrained(tmp_path)
    setting = save_early_exit(tmp_path, "patience", 1)
    assert setting == {"strategy": "patience", "threshold": 1.0, "delta": 0.1}
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["early_exit"] == setting and raw["exit_layers"] == EXITS  # the other fields kept
    for loaded in (
        ElasticBertForSequenceClassification.from_pretrained(tmp_path),
        AutoModelForSequenceClassification.from_pretrained(tmp_path),
        load_pretrained(ElasticBertForSequenceClassification, tmp_path)[0],
    ):
        assert loaded.config.early_exit == setting and not loaded.training
        layers = loaded(*batch).sample_exit_layers
        assert layers is not None and torch.equal(
            layers, run_batch(model, *batch, make_rule("patience", 1, 2)).exit_layers
        )
    assert save_early_exit(tmp_path, None) is None
    assert "early_exit" not in json.loads((tmp_path / "config.json").read_text())
    assert ElasticBertForSequenceClassification.from_pretrained(tmp_path)(*batch).sample_exit_layers is None

    before = (tmp_path / "config.json").read_bytes()
    for args, message in [
        (("entropy", -1.0), "entropy threshold -1: must be an entropy in nats"),
        (("maxprob", 1.5), "probability within [0, 1]"),
        (("entropie", 0.3), "did you mean 'entropy'"),
        (("lte", 0.3), "strategy 'lte'"),  # unknown here, or (once finetune registered it) not for a config
        (("entropy", None), "needs --threshold"),
    ]:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            save_early_exit(tmp_path, *args)
    assert (tmp_path / "config.json").read_bytes() == before  # nothing written
    with pytest.raises(CheckpointError, match="not a local model directory"):
        save_early_exit(tmp_path / "missing", "entropy", 0.3)


def test_settings_that_do_not_fit_the_model_are_refused_when_the_config_loads(tiny_config, tmp_path):
    regression = ElasticBertForSequenceClassification(tiny_config(exit_layers=EXITS, num_labels=1))
    regression.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="needs class probabilities"):
        save_early_exit(tmp_path, "entropy", 0.3)
    assert save_early_exit(tmp_path, "patience", 2, delta=0.05) == {
        "strategy": "patience",
        "threshold": 2.0,
        "delta": 0.05,
    }
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["early_exit"] = {"strategy": "entropy", "threshold": math.inf, "colour": "red"}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"config.json: early_exit: unknown keys \['colour'\]"):
        load_pretrained(ElasticBertForSequenceClassification, tmp_path)
    with pytest.raises(ValueError, match="early_exit must be an object"):
        ElasticBertConfig(early_exit="entropy")
    with pytest.raises(ValueError, match="static.*takes no threshold"):
        ElasticBertConfig(early_exit={"strategy": "static", "threshold": 0.1})
