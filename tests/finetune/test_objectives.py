"""SCL / ACL-Embed / ACL-CL / KD against loop-based references written from the formulas in DESIGN.md."""

import math

import pytest
import torch
import torch.nn.functional as F

from finetune.config import ConfigError, from_shortcuts
from finetune.train.objectives import (
    acl_cl_loss,
    acl_embed_loss,
    kd_loss,
    scl_loss,
    supervised_contrastive,
)


def reference_scl(items, labels, tau):
    """L = −Σ_i 1/|P(i)| Σ_{p∈P(i)} log(exp(z_i·z_p/τ) / Σ_{a≠i} exp(z_i·z_a/τ)); anchors without positives skipped."""
    z = [F.normalize(v.double(), dim=0) for v in items]
    y = [int(v) for v in labels]
    total = 0.0
    for i in range(len(z)):
        positives = [p for p in range(len(z)) if p != i and y[p] == y[i]]
        if not positives:
            continue
        denominator = sum(math.exp(float(z[i] @ z[a]) / tau) for a in range(len(z)) if a != i)
        total += -sum(math.log(math.exp(float(z[i] @ z[p]) / tau) / denominator) for p in positives) / len(positives)
    return total


CASES = [
    # (labels, K): ties, a single-member class, K = 2 and 3
    ([0, 1, 0, 1, 1, 0], 2),
    ([0, 1, 2, 2, 0, 2, 1], 3),
    ([2, 0, 0, 0, 1], 3),  # classes 1 and 2 have one member each
    ([1, 1, 1, 1], 2),  # one class only
]


@pytest.mark.parametrize("labels,k", CASES)
@pytest.mark.parametrize("tau", [0.5, 0.1])
def test_scl_matches_reference(labels, k, tau):
    g = torch.Generator().manual_seed(len(labels) * 7 + k)
    reps = torch.randn(len(labels), 8, generator=g, dtype=torch.float64)
    reps[1] = reps[0]  # an exact tie
    y = torch.tensor(labels)
    assert float(scl_loss(reps, y, tau)) == pytest.approx(reference_scl(list(reps), y, tau), rel=1e-9)
    n_valid = sum(1 for i, a in enumerate(labels) if labels.count(a) > 1)
    if n_valid:
        assert float(scl_loss(reps, y, tau, reduction="mean")) == pytest.approx(
            reference_scl(list(reps), y, tau) / n_valid, rel=1e-9
        )


@pytest.mark.parametrize("labels,k", CASES)
def test_acl_embed_matches_reference(labels, k):
    g = torch.Generator().manual_seed(11 + k)
    reps = torch.randn(len(labels), 6, generator=g, dtype=torch.float64)
    emb = torch.randn(k, 6, generator=g, dtype=torch.float64) * 3.0  # normalisation must not matter
    y = torch.tensor(labels)
    items = list(reps) + list(emb)
    item_labels = labels + list(range(k))
    expected = reference_scl(items, torch.tensor(item_labels), 0.5)
    assert float(acl_embed_loss(reps, y, emb, 0.5)) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("labels,k", CASES[:3])
def test_acl_cl_matches_reference_and_teacher_gets_no_gradient(labels, k):
    g = torch.Generator().manual_seed(5 + k)
    reps = torch.randn(len(labels), 6, generator=g, dtype=torch.float64, requires_grad=True)
    emb = torch.randn(k, 6, generator=g, dtype=torch.float64, requires_grad=True)
    t_reps = torch.randn(len(labels), 6, generator=g, dtype=torch.float64, requires_grad=True)
    t_emb = torch.randn(k, 6, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.tensor(labels)
    loss = acl_cl_loss(reps, y, emb, t_reps, t_emb, 0.5)
    items = list(reps.detach()) + list(emb.detach()) + list(t_reps.detach()) + list(t_emb.detach())
    item_labels = labels + list(range(k)) + labels + list(range(k))
    assert float(loss.detach()) == pytest.approx(reference_scl(items, torch.tensor(item_labels), 0.5), rel=1e-9)
    loss.backward()
    assert t_reps.grad is None and t_emb.grad is None  # teacher items are detached
    assert emb.grad is not None and emb.grad.abs().sum() > 0  # the student's label embeddings learn
    assert reps.grad.abs().sum() > 0


def test_gradients_match_autograd_of_reference_in_float64():
    labels = torch.tensor([0, 1, 0, 2, 1, 2, 2])
    reps = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    ours = torch.autograd.grad(supervised_contrastive(reps, labels, 0.3), reps)[0]

    def ref(x):
        z = F.normalize(x, dim=1)
        total = x.new_zeros(())
        for i in range(len(z)):
            pos = [p for p in range(len(z)) if p != i and labels[p] == labels[i]]
            if not pos:
                continue
            den = torch.logsumexp(torch.stack([z[i] @ z[a] / 0.3 for a in range(len(z)) if a != i]), 0)
            total = total - sum(z[i] @ z[p] / 0.3 - den for p in pos) / len(pos)
        return total

    expected = torch.autograd.grad(ref(reps), reps)[0]
    torch.testing.assert_close(ours, expected)


def test_no_positive_keeps_graph_and_is_zero():
    reps = torch.randn(3, 4, requires_grad=True)
    loss = scl_loss(reps, torch.tensor([0, 1, 2]), 0.5)
    assert float(loss.detach()) == 0.0
    loss.backward()
    assert torch.equal(reps.grad, torch.zeros_like(reps))


def test_kd_is_zero_for_identical_logits_and_positive_otherwise():
    logits = torch.randn(4, 3)
    assert float(kd_loss(logits, logits, 2.0)) == pytest.approx(0.0, abs=1e-6)
    teacher = torch.randn(4, 3)
    p, q = F.softmax(teacher / 2, -1), F.log_softmax(logits / 2, -1)
    expected = (p * (p.log() - q)).sum(-1).mean() * 4
    assert float(kd_loss(logits, teacher, 2.0)) == pytest.approx(float(expected), rel=1e-5)
    assert float(kd_loss(torch.ones(3, 1), torch.zeros(3, 1), 2.0)) == pytest.approx(1.0)  # regression: MSE


@pytest.mark.parametrize("objective", ["ce+scl", "acl", "acl-cl"])
def test_regression_refuses_contrastive_objectives(objective):
    cfg = from_shortcuts(model="m", task="STS-B", objective=objective)
    with pytest.raises(ConfigError, match="needs class labels .* STS-B is regression"):
        cfg.validate(num_labels=1)
    from_shortcuts(model="m", task="STS-B").validate(num_labels=1)  # CE (MSE) is fine
