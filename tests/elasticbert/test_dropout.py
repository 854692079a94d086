"""`elasticbert.dropout`: eagerly exactly `F.dropout` / `F.scaled_dot_product_attention`; inside a compiled CPU
graph the same numbers and gradients from the same seed (the eager dropout draw, not inductor's own)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from elasticbert.dropout import Dropout, dropout, scaled_dot_product_attention


def _qkv_and_mask(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(3, 2, 9, 8, generator=g, requires_grad=True) for _ in range(3))
    mask = torch.ones(3, 1, 1, 9, dtype=torch.bool)
    mask[1, ..., 6:] = False  # a padded sequence
    return q, k, v, mask


def _run(fn, seed: int, *inputs):
    for t in inputs:
        t.grad = None
    torch.manual_seed(seed)
    out = fn(*inputs)
    out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
    return out.detach(), [t.grad.clone() for t in inputs]


def test_eagerly_it_is_pytorchs_dropout_and_attention():
    q, k, v, mask = _qkv_and_mask()
    for p in (0.0, 0.3):
        ours = _run(lambda q, k, v, p=p: scaled_dot_product_attention(q, k, v, mask, p), 5, q, k, v)
        sdpa = _run(
            lambda q, k, v, p=p: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p), 5, q, k, v
        )
        torch.testing.assert_close(ours, sdpa, rtol=0, atol=0)
    x = torch.randn(4, 7)
    torch.manual_seed(1)
    expected = F.dropout(x, 0.25, True)
    torch.manual_seed(1)
    assert torch.equal(Dropout(0.25)(x), expected) and torch.equal(Dropout(0.25).eval()(x), x)
    assert isinstance(Dropout(0.1), nn.Dropout) and Dropout(0.1).state_dict() == {}


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_a_compiled_graph_draws_the_eager_masks(p):
    q, k, v, mask = _qkv_and_mask(seed=2)

    def block(q, k, v):
        return dropout(scaled_dot_product_attention(q, k, v, mask, p) * 2.0, p, True)

    eager = _run(block, 7, q, k, v)
    compiled = _run(torch.compile(block, fullgraph=True), 7, q, k, v)
    other_seed = _run(block, 8, q, k, v)
    assert not torch.equal(eager[0], other_seed[0])  # the masks matter to the result
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-5, atol=1e-6)
    for got, want in zip(compiled[1], eager[1]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
