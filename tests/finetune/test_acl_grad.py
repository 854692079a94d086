"""ACL-Grad on constructed gradients whose angle is known, for every scope and granularity."""

import math

import pytest
import torch

from finetune.train.acl_grad import ExitTerms, combine, gated_backward, gradient_angle


def _direction(degrees):
    r = math.radians(degrees)
    return torch.tensor([math.cos(r), math.sin(r)], dtype=torch.float64)


def _terms(angles, scale=3.0):
    """One exit per angle: parameter w_l, representation r_l = 2·w_l; task = a·r, con = scale·b_θ·r."""
    terms, params = [], []
    for layer, theta in enumerate(angles, start=1):
        w = torch.tensor([0.3, -0.2], dtype=torch.float64, requires_grad=True)
        rep = w * 2.0
        task = _direction(0) @ rep
        con = scale * _direction(theta) @ rep
        terms.append(ExitTerms(layer, 1.0, task, con, rep, [w]))
        params.append(w)
    return terms, params


@pytest.mark.parametrize("scope", ["exit", "representation", "all"])
@pytest.mark.parametrize("theta,dropped", [(60.0, False), (89.0, False), (91.0, True), (150.0, True)])
def test_known_angle_keeps_below_and_drops_above_90(scope, theta, dropped):
    lam = 0.25
    terms, (w,) = _terms([theta])
    _, record = gated_backward(terms, lam, torch.Tensor.backward, enabled=True, scope=scope, trainable=[w])
    assert record.angle == pytest.approx(theta, abs=1e-6)
    assert record.dropped_batch is dropped
    a, b = _direction(0) * 2, 3.0 * _direction(theta) * 2  # d/dw of task and con
    expected = (1 - lam) * a + (0.0 if dropped else lam * b)
    torch.testing.assert_close(w.grad, expected)


def test_disabled_measures_but_never_drops():
    terms, (w,) = _terms([170.0])
    _, record = gated_backward(terms, 0.5, torch.Tensor.backward, enabled=False, measure=True)
    assert record.angle == pytest.approx(170.0) and record.dropped == []
    torch.testing.assert_close(w.grad, 0.5 * _direction(0) * 2 + 0.5 * 3.0 * _direction(170.0) * 2)


def test_granularity_exit_drops_only_the_conflicting_exit_and_batch_uses_global_angle():
    terms, (w1, w2) = _terms([30.0, 120.0])
    _, record = gated_backward(terms, 0.5, torch.Tensor.backward, enabled=True, granularity="exit")
    assert record.per_exit[1] == pytest.approx(30.0) and record.per_exit[2] == pytest.approx(120.0)
    assert record.dropped == [2]
    torch.testing.assert_close(w1.grad, 0.5 * _direction(0) * 2 + 0.5 * 3 * _direction(30.0) * 2)
    torch.testing.assert_close(w2.grad, 0.5 * _direction(0) * 2)
    # Batch granularity: the global angle (over both exits' concatenated gradients) decides for all exits.
    terms, _ = _terms([30.0, 120.0])
    _, record = gated_backward(terms, 0.5, torch.Tensor.backward, enabled=True, granularity="batch")
    g_task = torch.cat([_direction(0), _direction(0)])
    g_con = torch.cat([_direction(30.0), _direction(120.0)])
    assert record.angle == pytest.approx(gradient_angle([g_task], [g_con]))
    assert record.angle == pytest.approx(math.degrees(math.acos((math.cos(math.radians(30)) - 0.5) / 2)))
    assert record.dropped == []  # 79.5° < 90°: kept everywhere


def test_without_contrastive_terms_plain_backward():
    w = torch.ones(2, requires_grad=True)
    terms = [ExitTerms(1, 2.0, (w * 3).sum(), None, w, [w])]
    loss, record = gated_backward(terms, 0.3, torch.Tensor.backward, enabled=True)
    assert record is None and float(loss) == 12.0
    torch.testing.assert_close(w.grad, torch.full((2,), 6.0))
    assert float(combine(terms, 0.3).detach()) == 12.0


def test_zero_contrastive_gradient_gives_no_angle_and_keeps():
    w = torch.ones(2, dtype=torch.float64, requires_grad=True)
    terms = [ExitTerms(1, 1.0, w.sum(), (w * 0.0).sum(), w, [w])]
    _, record = gated_backward(terms, 0.5, torch.Tensor.backward, enabled=True)
    assert record.angle is None and record.dropped == []
