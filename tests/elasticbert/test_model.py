"""The ElasticBERT model against transformers' BERT, autograd and FLOP counting."""

import itertools
import random

import pytest
import torch
import torch.nn.functional as F
from transformers import BertModel

from elasticbert import (
    ElasticBertForPreTraining,
    ElasticBertForSequenceClassification,
    ElasticBertModel,
    exit_groups,
    load_pretrained,
)


def test_every_layer_matches_transformers_bert(minilm, batch):
    ours, report = load_pretrained(ElasticBertModel, minilm)
    assert report.initialised == [], report  # MiniLM has embeddings, 6 layers and a pooler: nothing left random
    with torch.no_grad():
        out = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        valid = batch["attention_mask"].bool()
        for impl in ("sdpa", "eager"):
            ref = BertModel.from_pretrained(minilm, attn_implementation=impl).eval()
            expected = ref(**batch, output_hidden_states=True).hidden_states[1:]
            assert len(out.exit_hidden_states) == len(expected) == 6
            for layer, (a, b) in enumerate(zip(out.exit_hidden_states, expected), start=1):
                # Padded positions hold arbitrary values whose rounding depends on the attention kernel: compare all
                # positions against SDPA, the real tokens against eager attention.
                diff = (a - b).abs() if impl == "sdpa" else (a - b)[valid].abs()
                assert diff.max().item() <= 1e-5, (impl, layer, diff.max().item())


def test_pooler_matches_bert_pooler(minilm, batch):
    ours, _ = load_pretrained(ElasticBertModel, minilm)
    ref = BertModel.from_pretrained(minilm).eval()
    with torch.no_grad():
        pooled = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], output_pooled=True)
        assert torch.allclose(pooled.pooled_outputs[-1], ref(**batch).pooler_output, atol=1e-5)


def test_sparse_mlm_equals_dense_head(tiny_config, random_batch):
    cfg = tiny_config()
    model = ElasticBertForPreTraining(cfg).eval()
    ids, mask, types, mlm, sop = random_batch(cfg)
    exits = (1, 3, 4)
    with torch.no_grad():
        out = model(ids, mask, types, mlm_labels=mlm, sop_labels=sop, active_exits=exits)
        states = model.elasticbert(ids, mask, types, exit_layers=exits).exit_hidden_states
        positions = (mlm.reshape(-1) != -100).nonzero(as_tuple=True)[0]
        sparse = model.masked_lm_logits(exits, states, positions).view(len(exits), len(positions), -1)
        for i, (layer, state) in enumerate(zip(exits, states)):
            dense = model.cls.predictions.logits(layer, state)  # [B, T, V] at every token
            assert torch.allclose(sparse[i], dense.reshape(-1, cfg.vocab_size)[positions], atol=1e-6)
            ref_loss = F.cross_entropy(dense.reshape(-1, cfg.vocab_size), mlm.reshape(-1), ignore_index=-100)
            assert torch.allclose(out.mlm_loss[i], ref_loss, atol=1e-6)
    assert out.exit_layers == exits
    assert torch.allclose(out.loss, (out.mlm_loss + out.sop_loss).sum())


def test_decoder_is_tied_to_word_embeddings(tiny_config):
    model = ElasticBertForPreTraining(tiny_config())
    assert model.cls.predictions.decoder.weight is model.elasticbert.embeddings.word_embeddings.weight


def _layer_output_grads(model, ids, mask, types, mlm, sop, exits, gradient_equilibrium):
    """Gradient of the summed loss at every layer's output (before any rescaling), via hooks."""
    captured = {}

    def keep(index):
        def hook(module, args, output):
            output.retain_grad()
            captured[index] = output

        return hook

    handles = [layer.register_forward_hook(keep(i + 1)) for i, layer in enumerate(model.elasticbert.encoder.layer)]
    out = model(
        ids, mask, types, mlm_labels=mlm, sop_labels=sop, active_exits=exits, gradient_equilibrium=gradient_equilibrium
    )
    out.loss.backward()
    for h in handles:
        h.remove()
    return {layer: t.grad.clone() for layer, t in captured.items()}


def _reference_equilibrium_grads(model, ids, mask, types, mlm, sop, exits):
    """The DESIGN.md formula, built independently: each layer runs on a detached copy of its input, each exit's own
    loss gives g_own, and vector-Jacobian products carry g_deeper down one layer at a time."""
    bert = model.elasticbert
    attn = None if bool(mask.all()) else mask[:, None, None, :].bool()
    hidden = bert.embeddings(ids, types)
    inputs, outputs = [], []
    for layer in bert.encoder.layer[: max(exits)]:
        x = hidden.detach().requires_grad_(True)
        inputs.append(x)
        hidden = layer(x, attn)
        outputs.append(hidden)
    own = {}
    for layer in exits:
        h = outputs[layer - 1].detach().requires_grad_(True)
        loss = model(ids, mask, types, mlm_labels=mlm, sop_labels=sop, active_exits=[layer]).loss  # shape check
        del loss
        single = _single_exit_loss(model, h, layer, mlm, sop)
        own[layer] = torch.autograd.grad(single, h)[0]
    k = len(exits)
    grads, deeper = {}, None
    for layer in range(max(exits), 0, -1):
        if layer in exits:
            i = exits.index(layer) + 1
            g = own[layer] if deeper is None else (own[layer] + (k - i) * deeper) / (k - i + 1)
        else:
            g = deeper
        grads[layer] = g
        deeper = torch.autograd.grad(outputs[layer - 1], inputs[layer - 1], g)[0]
    return grads


def _single_exit_loss(model, hidden, layer, mlm, sop):
    positions = (mlm.reshape(-1) != -100).nonzero(as_tuple=True)[0]
    logits = model.masked_lm_logits([layer], [hidden], positions)
    mlm_loss = F.cross_entropy(logits, mlm.reshape(-1)[positions])
    pooled = model.elasticbert.encoder.pooler[layer - 1](hidden)
    sop_loss = F.cross_entropy(model.cls.seq_relationship[layer - 1](pooled), sop)
    return mlm_loss + sop_loss


@pytest.mark.parametrize(
    "exits",
    [tuple(range(1, 13)), exit_groups(12, 2)[0], exit_groups(12, 2)[1], (12,)]
    + [tuple(sorted(random.Random(s).sample(range(1, 13), random.Random(s + 99).randint(2, 6)))) for s in range(3)],
)
def test_gradient_equilibrium_matches_formula(tiny_config, random_batch, exits):
    torch.manual_seed(0)
    cfg = tiny_config(num_hidden_layers=12, hidden_size=16, num_attention_heads=2, intermediate_size=32)
    model = ElasticBertForPreTraining(cfg).double().eval()
    ids, mask, types, mlm, sop = random_batch(cfg, b=2, t=8)
    exits = list(exits)
    got = _layer_output_grads(model, ids, mask, types, mlm, sop, exits, gradient_equilibrium=True)
    want = _reference_equilibrium_grads(model, ids, mask, types, mlm, sop, exits)
    assert set(got) == set(want) == set(range(1, max(exits) + 1))  # no layer above the deepest exit ran
    for layer in want:
        assert torch.allclose(got[layer], want[layer], rtol=1e-9, atol=1e-12), layer


def test_gradient_equilibrium_changes_nothing_with_one_exit_and_is_identity_forward(tiny_config, random_batch):
    cfg = tiny_config()
    model = ElasticBertForPreTraining(cfg).double().eval()
    ids, mask, types, mlm, sop = random_batch(cfg)
    a = model(ids, mask, types, mlm_labels=mlm, sop_labels=sop, active_exits=[1, 2, 4], gradient_equilibrium=True)
    b = model(ids, mask, types, mlm_labels=mlm, sop_labels=sop, active_exits=[1, 2, 4], gradient_equilibrium=False)
    assert torch.equal(a.loss, b.loss)
    g_on = _layer_output_grads(model, ids, mask, types, mlm, sop, [4], True)
    model.zero_grad()
    g_off = _layer_output_grads(model, ids, mask, types, mlm, sop, [4], False)
    for layer in g_on:
        assert torch.equal(g_on[layer], g_off[layer])


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_truncated_model_equals_first_layers_and_stops_early(tiny_config, random_batch, depth):
    cfg = tiny_config()
    full = ElasticBertModel(cfg).eval()
    ids, mask, types, _, _ = random_batch(cfg)
    calls = []
    for i, layer in enumerate(full.encoder.layer):
        layer.register_forward_hook(lambda m, a, o, i=i: calls.append(i))
    with torch.no_grad():
        all_states = full(ids, mask, types).exit_hidden_states
        calls.clear()
        truncated = full(ids, mask, types, exit_layers=[depth])
    assert calls == list(range(depth))
    assert torch.equal(truncated.last_hidden_state, all_states[depth - 1])

    # A model built with only `depth` layers from the full one's weights gives the same states.
    small = ElasticBertModel(tiny_config(num_hidden_layers=depth)).eval()
    missing, unexpected = small.load_state_dict(full.state_dict(), strict=False)
    assert not missing and unexpected and all(int(k.split(".")[2]) >= depth for k in unexpected)
    with torch.no_grad():
        assert torch.equal(small(ids, mask, types).last_hidden_state, all_states[depth - 1])


@pytest.mark.parametrize("exit_type", ["linear", "mha"])
def test_classifier_exits_and_regression(tiny_config, random_batch, exit_type):
    cfg = tiny_config(exit_layers=[2, 4], exit_type=exit_type, num_labels=3)
    model = ElasticBertForSequenceClassification(cfg).eval()
    ids, mask, types, _, _ = random_batch(cfg)
    labels = torch.tensor([0, 2, 1])
    out = model(ids, mask, types, labels=labels)
    assert out.exit_layers == (2, 4) and [lg.shape for lg in out.exit_logits] == [(3, 3), (3, 3)]
    assert torch.equal(out.logits, out.exit_logits[-1])  # transformers' `logits` [B, K]: the deepest exit's
    per_exit = torch.stack([F.cross_entropy(lg, labels) for lg in out.exit_logits])
    assert torch.allclose(out.exit_losses, per_exit) and torch.allclose(out.loss, per_exit.mean())
    only_two = model(ids, mask, types, exit_layers=[2])
    assert torch.equal(only_two.exit_logits[0], out.exit_logits[0]) and torch.equal(only_two.logits, out.exit_logits[0])
    with pytest.raises(ValueError, match="no exit"):
        model(ids, mask, types, exit_layers=[3])
    reg = ElasticBertForSequenceClassification(tiny_config(num_labels=1, exit_type=exit_type)).eval()
    target = torch.tensor([0.5, 1.0, 4.0])
    out = reg(ids, mask, types, labels=target)
    assert out.logits.shape == (3, 1) and torch.allclose(out.loss, F.mse_loss(out.logits.squeeze(-1), target))


def test_mha_exit_reads_cls_query_only_equals_full_self_attention(tiny_config, random_batch):
    cfg = tiny_config(exit_type="mha", num_labels=2)
    model = ElasticBertForSequenceClassification(cfg).eval()
    ids, mask, types, _, _ = random_batch(cfg)
    exit_module = model.exits["4"]
    with torch.no_grad():
        hidden = model.elasticbert(ids, mask, types, exit_layers=[4]).last_hidden_state
        rep, _ = exit_module(hidden, mask)
        x = torch.tanh(exit_module.projection(hidden))
        full, _ = exit_module.attention(x, x, x, key_padding_mask=mask == 0)
    assert torch.allclose(rep, torch.tanh(full[:, 0]), atol=1e-6)


def test_exit_groups():
    assert exit_groups(12, 2) == [(1, 3, 5, 7, 9, 11, 12), (2, 4, 6, 8, 10, 12)]
    large = exit_groups(24, 3)
    assert large[0] == (1, 4, 7, 10, 13, 16, 19, 22, 24) and large[2] == (3, 6, 9, 12, 15, 18, 21, 24)
    assert set(itertools.chain(*large)) == set(range(1, 25))
    assert exit_groups(6, 1) == [(1, 2, 3, 4, 5, 6)]
    with pytest.raises(ValueError):
        exit_groups(12, 0)
