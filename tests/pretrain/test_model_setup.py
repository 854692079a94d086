"""Model construction as the trainer does it: from scratch (seeded), from the MiniLM BERT package, activation
checkpointing; per-micro-step dropout seeds."""

from __future__ import annotations

import pytest
import torch
from pretrain_testlib import TINY

from pretrain.config import ConfigError, load_config
from pretrain.model_setup import build_model, param_groups
from pretrain.schedule import micro_seed


def test_from_scratch_is_seeded_and_uses_the_data_vocab():
    cfg = load_config(TINY)
    a, origin = build_model(cfg, 30522, None)
    b, _ = build_model(cfg, 30522, None)
    assert origin == "from scratch" and a.config.vocab_size == 30522 and a.config.num_hidden_layers == 4
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    groups = param_groups(a, 0.01)
    n_decay, n_plain = len(groups[0]["params"]), len(groups[1]["params"])
    assert n_decay and n_plain and n_decay + n_plain == len(list(a.parameters()))
    assert all(p.ndim >= 2 for p in groups[0]["params"]) and all(p.ndim == 1 for p in groups[1]["params"])


def test_init_from_minilm_maps_bert_weights(prepared_gutenberg):
    from safetensors.torch import load_file

    from elasticbert import minilm_dir

    cfg = load_config(TINY, ["model.init_from=minilm", "model.num_hidden_layers=6", "data.max_length=128"])
    model, origin = build_model(cfg, 30522, prepared_gutenberg / "tokenizer")
    assert "Loaded" in origin and model.config.hidden_size == 384 and model.config.num_hidden_layers == 6
    src = load_file(minilm_dir() / "model.safetensors")
    key = next(k for k in src if k.endswith("embeddings.word_embeddings.weight"))
    assert torch.equal(model.elasticbert.embeddings.word_embeddings.weight, src[key])
    layer5 = next(k for k in src if k.endswith("encoder.layer.5.output.dense.weight"))
    assert torch.equal(model.elasticbert.encoder.layer[5].output.dense.weight, src[layer5])
    with pytest.raises(ConfigError, match="set model.num_hidden_layers=6"):
        build_model(load_config(TINY, ["model.init_from=minilm"]), 30522, None)


def test_init_from_checkpoint_with_another_vocabulary_is_refused(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
    cfg = load_config(TINY, ["model.init_from=minilm", "model.num_hidden_layers=6"])
    with pytest.raises(ConfigError, match="another vocabulary"):
        build_model(cfg, 30522, tmp_path)


def test_activation_checkpointing_gives_the_same_gradients():
    cfg = load_config(TINY, ["model.hidden_dropout_prob=0.0", "model.attention_probs_dropout_prob=0.0"])
    plain, _ = build_model(cfg, 1000, None)
    ckpt, _ = build_model(
        load_config(
            TINY,
            [
                "model.activation_checkpointing=true",
                "model.hidden_dropout_prob=0.0",
                "model.attention_probs_dropout_prob=0.0",
            ],
        ),
        1000,
        None,
    )
    assert ckpt.elasticbert.encoder.gradient_checkpointing
    torch.manual_seed(0)
    ids = torch.randint(5, 1000, (2, 32))
    labels = torch.full_like(ids, -100)
    labels[:, 3:8] = ids[:, 3:8]
    batch = dict(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        token_type_ids=torch.zeros_like(ids),
        mlm_labels=labels,
        sop_labels=torch.tensor([0, 1]),
        active_exits=(1, 3, 4),
        gradient_equilibrium=True,
    )
    for m in (plain, ckpt):
        m.train()
        m(**batch).loss.backward()
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_dropout_seed_depends_on_step_and_global_micro_batch_only():
    seeds = {micro_seed(1234, step, j) for step in range(20) for j in range(8)}
    assert len(seeds) == 160 and all(0 <= s < 2**63 for s in seeds)
    assert micro_seed(1234, 3, 5) == micro_seed(1234, 3, 5) != micro_seed(1235, 3, 5)


def test_init_from_a_hub_name_resolves_through_the_cache_when_the_run_starts(tmp_path, monkeypatch):
    """`model.init_from: bert-base-uncased` (the paper's recipe) is looked up in the Hugging Face cache offline; a
    hand-made cache holding the MiniLM weights under that name stands in for the real download."""
    from hub_cache import add_to_hub_cache
    from safetensors.torch import load_file

    from elasticbert import minilm_dir

    add_to_hub_cache(tmp_path / "hub", "bert-base-uncased", minilm_dir())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_config(TINY, ["model.init_from=bert-base-uncased", "model.num_hidden_layers=6"])
    model, origin = build_model(cfg, 30522, None)
    assert "snapshots" in origin and model.config.hidden_size == 384
    src = load_file(minilm_dir() / "model.safetensors")
    key = next(k for k in src if k.endswith("encoder.layer.3.attention.self.query.weight"))
    assert torch.equal(model.elasticbert.encoder.layer[3].attention.self.query.weight, src[key])
