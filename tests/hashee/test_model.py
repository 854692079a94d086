"""HashEE's token-level exit model (`elasticbert.hashee`) on the tiny config: a case computed by hand, and the
invariants - an all-top map is the full model, the gathered layers equal the dense layer with exited tokens copied
forward (so every running token attends to the exited ones' frozen states), a token's state is frozen after its layer,
a row alone equals the row in a padded batch, the engine's steps equal the forward. The equality with the official
code itself is checked from outside (docs/hashee.md)."""

import math

import numpy as np
import pytest
import torch
from tiny_models import tiny_config

from elasticbert import (
    EarlyExitSetting,
    ElasticBertForSequenceClassification,
    ElasticBertHashEEForSequenceClassification,
)
from elasticbert.early_exit import rule_for, run_batch
from elasticbert.hash_maps import DRAWN, Buckets

LAYERS = 4


def models(seed=0, **overrides):
    """(the plain classifier, the HashEE classifier with the same weights), eval mode, 2 labels."""
    torch.manual_seed(seed)
    full = ElasticBertForSequenceClassification(tiny_config(num_labels=2, **overrides)).eval()
    hashee = ElasticBertHashEEForSequenceClassification(tiny_config(num_labels=2, **overrides)).eval()
    missing, unexpected = hashee.load_state_dict(full.state_dict(), strict=False)
    assert missing == ["elasticbert.token_layers"] and not unexpected
    return full, hashee


def padded_batch(seed=1, rows=4, length=10):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 100, (rows, length), generator=g)
    ids[:, 0] = 2  # a "[CLS]"
    mask = torch.ones_like(ids)
    for row, real in enumerate([length, 7, 4, 9][:rows]):
        mask[row, real:] = 0
        ids[row, real:] = 0
    return ids, mask


def random_map(seed=0, vocab=100, layers=LAYERS):
    depth = np.random.RandomState(seed).randint(1, layers + 1, size=vocab).astype(np.int16)
    depth[2] = layers  # the [CLS] stand-in runs every layer, as special tokens do in every map
    return depth


def masked_reference(model, ids, mask, depth):
    """The definition, computed the slow way: every layer dense over all tokens, then each token that does not run
    the layer put back to its state before it. Returns the states after each layer."""
    encoder = model.elasticbert
    hidden = encoder.embeddings(ids)
    sdpa_mask = mask[:, None, None, :].bool()
    states = []
    for index, layer in enumerate(encoder.encoder.layer):
        dense = layer(hidden, sdpa_mask)
        hidden = torch.where((depth > index).unsqueeze(-1), dense, hidden)
        states.append(hidden)
    return states


def test_an_all_top_map_is_the_full_model_exactly():
    full, hashee = models()
    ids, mask = padded_batch()
    assert torch.equal(full(ids, mask).logits, hashee(ids, mask).logits)


def test_gathered_layers_equal_the_dense_layer_with_exited_tokens_copied_forward():
    _, hashee = models()
    hashee.elasticbert.set_token_map(random_map(), hash="frequency", buckets=LAYERS)
    ids, mask = padded_batch()
    depth = hashee.elasticbert.token_depths(ids, mask)
    assert len(set(depth[mask.bool()].tolist())) == LAYERS  # every depth occurs: each layer gathers a real subset
    with torch.inference_mode():
        out = hashee.elasticbert(ids, mask, output_hidden_states=True)
        reference = masked_reference(hashee, ids, mask, depth)
    real = mask.bool()
    for ours, expected in zip(out.hidden_states[1:], reference):
        assert torch.allclose(ours[real], expected[real], atol=1e-5)


def test_a_tokens_state_is_frozen_after_its_layer_and_still_attended_to():
    _, hashee = models()
    hashee.elasticbert.set_token_map(random_map(), hash="frequency", buckets=LAYERS)
    ids, mask = padded_batch()
    depth = hashee.elasticbert.token_depths(ids, mask)
    with torch.inference_mode():
        states = hashee.elasticbert(ids, mask, output_hidden_states=True).hidden_states
    for row, col in mask.nonzero().tolist():
        d = int(depth[row, col])
        for later in range(d + 1, LAYERS + 1):
            assert torch.equal(states[later][row, col], states[d][row, col])
        assert not torch.equal(states[d][row, col], states[d - 1][row, col])  # it did run up to its layer
    # attended to: a running token's output changes when an exited key's frozen state does
    row, col = next((r, c) for r, c in mask.nonzero().tolist() if depth[r, c] == 1)
    frozen = torch.zeros_like(ids)
    frozen[row, col] = 1
    with torch.inference_mode():
        base = hashee.elasticbert(ids, mask, token_layers=depth, output_hidden_states=True).hidden_states
        moved = hashee.elasticbert(
            ids, mask, token_layers=torch.where(frozen.bool(), 2, depth), output_hidden_states=True
        )
    assert torch.equal(moved.hidden_states[2][row, 0], base[2][row, 0])  # [CLS] at layer 2 saw both at layer 1
    assert not torch.allclose(moved.hidden_states[3][row, 0], base[3][row, 0])  # layer 3 attends to its state


def test_a_small_case_by_hand():
    """Two layers, one head of width 2, three tokens with depths (2, 1, 2): layer 2 computed in numpy from the
    formulas (queries of the running tokens 0 and 2, keys and values of all three, token 1 at its layer-1 state)."""
    cfg = dict(hidden_size=2, num_attention_heads=1, intermediate_size=3, num_hidden_layers=2, vocab_size=10)
    _, hashee = models(seed=3, **cfg)
    ids = torch.tensor([[2, 5, 7]])
    depth = torch.tensor([[2, 1, 2]])
    with torch.inference_mode():
        states = hashee.elasticbert(ids, token_layers=depth, output_hidden_states=True).hidden_states
    h = states[1][0].double().numpy()  # every token's state after layer 1 (all three ran it)
    layer = hashee.elasticbert.encoder.layer[1]

    def w(linear):
        return linear.weight.detach().double().numpy(), linear.bias.detach().double().numpy()

    def layer_norm(x, norm):
        mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + norm.eps) * norm.weight.detach().double().numpy() + norm.bias.detach().numpy()

    (wq, bq), (wk, bk), (wv, bv) = (
        w(layer.attention.self.query),
        w(layer.attention.self.key),
        w(layer.attention.self.value),
    )
    running = h[[0, 2]]
    q, k, v = running @ wq.T + bq, h @ wk.T + bk, h @ wv.T + bv  # keys and values: all three tokens
    scores = q @ k.T / math.sqrt(2)
    probs = np.exp(scores - scores.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    wo, bo = w(layer.attention.output.dense)
    attended = layer_norm((probs @ v) @ wo.T + bo + running, layer.attention.output.LayerNorm)
    w1, b1 = w(layer.intermediate.dense)
    w2, b2 = w(layer.output.dense)
    inner = attended @ w1.T + b1
    gelu = 0.5 * inner * (1 + np.vectorize(math.erf)(inner / math.sqrt(2)))
    expected = layer_norm(gelu @ w2.T + b2 + attended, layer.output.LayerNorm)
    got = states[2][0].double().numpy()
    assert np.allclose(got[[0, 2]], expected, atol=1e-5)
    assert np.array_equal(got[1], h[1])  # token 1 exited after layer 1: carried unchanged


def test_a_row_alone_equals_the_row_in_a_padded_batch():
    _, hashee = models()
    hashee.elasticbert.set_token_map(random_map(1), hash="frequency", buckets=LAYERS)
    ids, mask = padded_batch()
    with torch.inference_mode():
        batched = hashee(ids, mask).logits
        alone = torch.cat([hashee(ids[r : r + 1, : int(mask[r].sum())]).logits for r in range(len(ids))])
    assert torch.allclose(batched, alone, atol=1e-6)


def test_the_engine_steps_equal_the_forward_and_count_each_rows_flops():
    """`predict` and `EarlyExitClassifier` run the model as its own LayerRunner (the depth rides as one extra
    channel between the steps); the static rule's answers equal the forward's."""
    _, hashee = models()
    hashee.elasticbert.set_token_map(random_map(2), hash="frequency", buckets=LAYERS)
    ids, mask = padded_batch()
    rule = rule_for(EarlyExitSetting("static"), 2, 1)
    with torch.inference_mode():
        result = run_batch(hashee, ids, mask, None, rule)
        forward = hashee(ids, mask).logits
    assert torch.allclose(result.logits, forward, atol=1e-6)
    assert result.exit_layers.tolist() == [LAYERS] * len(ids)
    flops = hashee.input_flops(ids, mask)
    alone = [
        hashee.input_flops(ids[r : r + 1, : int(mask[r].sum())], mask[r : r + 1, : int(mask[r].sum())])[0]
        for r in range(4)
    ]
    assert flops == alone and len(set(flops)) == 4


def test_gradients_through_the_gathered_layers_equal_the_masked_reference():
    _, hashee = models()
    hashee.elasticbert.set_token_map(random_map(4), hash="frequency", buckets=LAYERS)
    ids, mask = padded_batch()
    depth = hashee.elasticbert.token_depths(ids, mask)
    hashee.train()  # dropout is 0 in the tiny config: train mode, same numbers
    loss = hashee(ids, mask, labels=torch.tensor([0, 1, 1, 0])).loss
    loss.backward()
    ours = [p.grad.clone() for p in hashee.elasticbert.encoder.layer.parameters()]
    hashee.zero_grad()
    states = masked_reference(hashee, ids, mask, depth)
    _, logits = hashee.classify(LAYERS, states[-1], mask)
    torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 1, 0])).backward()
    reference = [p.grad for p in hashee.elasticbert.encoder.layer.parameters()]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(ours, reference))


def test_drawn_maps_draw_per_occurrence_and_keep_specials_at_the_top():
    _, hashee = models()
    depth = np.full(100, DRAWN, dtype=np.int16)
    depth[2] = LAYERS
    hashee.elasticbert.set_token_map(depth, hash="random-inconsistent", buckets=LAYERS, seed=5)
    ids = torch.full((1, 40), 9)
    ids[0, 0] = 2
    drawn = hashee.elasticbert.token_depths(ids, torch.ones_like(ids))
    assert drawn[0, 0] == LAYERS
    assert len(set(drawn[0, 1:].tolist())) == LAYERS  # one id, different layers at different occurrences
    assert set(drawn[0].tolist()) <= set(Buckets(LAYERS, LAYERS).depths)
    ids2 = torch.cat([ids, torch.zeros(1, 5, dtype=torch.long)], 1)
    mask2 = torch.cat([torch.ones(1, 40, dtype=torch.long), torch.zeros(1, 5, dtype=torch.long)], 1)
    again = hashee.elasticbert.token_depths(ids2, mask2)
    assert torch.equal(again[0, :40], drawn[0]) and again[0, 40:].eq(0).all()  # padding changes nothing


def test_bad_maps_and_settings_are_refused():
    _, hashee = models()
    with pytest.raises(ValueError, match="depths 1..4"):
        hashee.elasticbert.set_token_map(np.full(100, 5), hash="frequency", buckets=4)
    with pytest.raises(ValueError, match="vocabulary"):
        hashee.elasticbert.set_token_map(np.full(99, 1), hash="frequency", buckets=4)
    with pytest.raises(ValueError, match="token_exit.hash"):
        hashee.elasticbert.set_token_map(np.full(100, 1), hash="md5", buckets=4)
    with pytest.raises(ValueError, match="sentence-level"):
        ElasticBertHashEEForSequenceClassification(tiny_config(early_exit={"strategy": "entropy", "threshold": 0.3}))
    with pytest.raises(ValueError, match="packed rows"):
        hashee.elasticbert(torch.ones(1, 3, dtype=torch.long), sample_ids=torch.ones(1, 3, dtype=torch.long))
