"""`exits_masked_lm_loss` computes what k separate `linear -> cross_entropy` calls compute: losses, accuracies and
the gradients of the rows, the decoder weight and the bias (float64: to rounding), in fp32 and under bf16 autocast."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from elasticbert.masked_lm import exits_masked_lm_loss


def _inputs(dtype, k=3, m=20, h=16, v=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(k * m, h, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(v, h, generator=g, dtype=dtype, requires_grad=True)
    bias = torch.randn(v, generator=g, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, v, (m,), generator=g)
    upstream = torch.randn(k, generator=g, dtype=dtype)  # unequal weights per exit reach the backward
    return rows, weight, bias, targets, upstream, k, m


def _reference(rows, weight, bias, targets, k, m):
    logits = [F.linear(rows[i * m : (i + 1) * m], weight, bias) for i in range(k)]
    losses = torch.stack([F.cross_entropy(x, targets) for x in logits])
    accuracy = torch.stack([(x.argmax(-1) == targets).float().mean() for x in logits])
    return losses, accuracy


def _grads(fn, rows, weight, bias, upstream):
    for t in (rows, weight, bias):
        t.grad = None
    losses, accuracy = fn()
    (losses * upstream).sum().backward()
    return losses.detach(), accuracy, [t.grad.clone() for t in (rows, weight, bias)]


def test_equals_per_exit_cross_entropy_in_float64():
    rows, weight, bias, targets, upstream, k, m = _inputs(torch.float64)
    ours = _grads(lambda: exits_masked_lm_loss(rows, weight, bias, targets, k), rows, weight, bias, upstream)
    ref = _grads(lambda: _reference(rows, weight, bias, targets, k, m), rows, weight, bias, upstream)
    torch.testing.assert_close(ours[0], ref[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(ours[1], ref[1])
    for a, b in zip(ours[2], ref[2]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_equals_per_exit_cross_entropy_in_fp32_and_counts_ties_as_hits():
    rows, weight, bias, targets, upstream, k, m = _inputs(torch.float32, k=12, m=64, h=32, v=300, seed=1)
    ours = _grads(lambda: exits_masked_lm_loss(rows, weight, bias, targets, k), rows, weight, bias, upstream)
    ref = _grads(lambda: _reference(rows, weight, bias, targets, k, m), rows, weight, bias, upstream)
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours[1], ref[1])
    for a, b in zip(ours[2], ref[2]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # every logit equal: argmax picks index 0, the tie rule counts every target as a hit
    flat = exits_masked_lm_loss(torch.zeros(4, 8), torch.zeros(5, 8), torch.zeros(5), torch.tensor([3, 1]), 2)
    assert flat[1].tolist() == [1.0, 1.0] and torch.allclose(flat[0], torch.log(torch.tensor(5.0)))


def test_under_bf16_autocast_the_product_runs_in_bf16_like_linear():
    rows, weight, bias, targets, upstream, k, m = _inputs(torch.float32, k=2, m=32, h=64, v=128, seed=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = _grads(lambda: exits_masked_lm_loss(rows, weight, bias, targets, k), rows, weight, bias, upstream)
        ref = _grads(lambda: _reference(rows, weight, bias, targets, k, m), rows, weight, bias, upstream)
    assert ours[0].dtype == torch.float32 and all(g.dtype == torch.float32 for g in ours[2])
    torch.testing.assert_close(ours[0], ref[0].float(), rtol=2e-2, atol=2e-2)
    for a, b in zip(ours[2], ref[2]):
        torch.testing.assert_close(a, b, rtol=5e-2, atol=5e-2)


def test_a_second_backward_is_refused_not_wrong():
    rows, weight, bias, targets, upstream, k, _ = _inputs(torch.float32)
    losses, _ = exits_masked_lm_loss(rows, weight, bias, targets, k)
    losses.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="one backward pass"):
        losses.sum().backward()


def test_the_step_buffers_are_reused_on_cpu_but_never_while_a_graph_still_needs_them():
    """The [k·M, V] log-probabilities come back for the next call only after their backward (or at once without
    one): two graphs alive at once, a no-grad call in between, and a larger M than the kept buffer all give the
    reference gradients; a call after a finished one runs in that one's memory."""
    from elasticbert.masked_lm import _spares

    cases = [_inputs(torch.float64, k=3, m=m, seed=s) for s, m in ((10, 20), (11, 20), (12, 30))]
    refs = [_grads(lambda c=c: _reference(*c[:4], c[5], c[6]), *c[:3], c[4])[2] for c in cases]

    def ours(c):
        return exits_masked_lm_loss(*c[:4], c[5])

    for c in cases:
        for t in c[:3]:
            t.grad = None
    live = [ours(c) for c in cases[:2]]  # two graphs alive at once
    with torch.no_grad():
        ours(cases[2])  # takes a buffer and gives it back meanwhile
    for (losses, _), c in reversed(list(zip(live, cases))):
        (losses * c[4]).sum().backward()
    (ours(cases[2])[0] * cases[2][4]).sum().backward()  # M = 30: more than any kept buffer holds
    for c, ref in zip(cases, refs):
        for got, want in zip((t.grad for t in c[:3]), ref):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)

    kept = _spares._kept["log_probs"].data_ptr()
    losses, _ = ours(cases[0])  # M = 20 fits: it runs in the kept memory, which its graph now holds alone
    assert "log_probs" not in _spares._kept
    losses.sum().backward()
    assert _spares._kept["log_probs"].data_ptr() == kept
