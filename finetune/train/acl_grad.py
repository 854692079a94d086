"""ACL-Grad: per batch, drop the contrastive term when its gradient points away from the task (CE) gradient.

The angle between g_task = ∇ Σ_l w_l·task_l and g_con = ∇ Σ_l w_l·con_l is measured over a chosen set of tensors:
- "exit": the trainable exit parameters (heads, with the layer's pooler for linear exits): two `autograd.grad` calls
  that only traverse the small exit heads, then one ordinary backward of the chosen loss;
- "representation": the exit representations h^e (same cost profile, even smaller);
- "all": all trainable parameters. Here the two gradients are computed in full once each and the update is assembled
  from them ((1−λ)·g_task + λ·g_con, or (1−λ)·g_task when dropped), so the cost is two backward passes, not three.
Because each exit's tensors receive gradient only from that exit's terms (teacher items are detached), one pair of
`autograd.grad` calls gives every exit's angle as well as the global one; `granularity="exit"` gates per exit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class ExitTerms:
    """One exit's loss terms at this step; `weight` is its JT weight, `rep` its representation h^e."""

    layer: int
    weight: float
    task: torch.Tensor
    contrastive: torch.Tensor | None
    rep: torch.Tensor
    tensors: list[torch.Tensor] = field(default_factory=list)  # exit parameters (scope "exit")


@dataclass
class AngleRecord:
    """What ACL-Grad saw and did at one step."""

    angle: float | None  # degrees, over all exits together; None if a gradient was zero
    per_exit: dict[int, float | None]
    dropped: list[int]  # exits whose contrastive term was dropped
    num_exits: int

    @property
    def dropped_batch(self) -> bool:
        return bool(self.dropped)


def angle_from(dot: float, norm_a2: float, norm_b2: float) -> float | None:
    """Angle in degrees from a dot product and squared norms; None when either vector is zero."""
    if norm_a2 <= 0.0 or norm_b2 <= 0.0:
        return None
    cos = max(-1.0, min(1.0, dot / math.sqrt(norm_a2 * norm_b2)))
    return math.degrees(math.acos(cos))


def gradient_angle(a: Sequence[torch.Tensor | None], b: Sequence[torch.Tensor | None]) -> float | None:
    """Angle (degrees) between two gradients given as matching lists of tensors (None = zero)."""
    dot, na, nb = _pieces(a, b)
    return angle_from(dot, na, nb)


def _pieces(a: Sequence[torch.Tensor | None], b: Sequence[torch.Tensor | None]) -> tuple[float, float, float]:
    dot = na = nb = 0.0
    for x, y in zip(a, b):  # flat dot products: no copies of large gradients (e.g. the word embeddings)
        x = None if x is None else x.reshape(-1)
        y = None if y is None else y.reshape(-1)
        if x is not None:
            na += float(torch.dot(x, x))
        if y is not None:
            nb += float(torch.dot(y, y))
        if x is not None and y is not None:
            dot += float(torch.dot(x, y))
    return dot, na, nb


def combine(terms: Sequence[ExitTerms], lam: float, dropped: Sequence[int] = ()) -> torch.Tensor:
    """Σ_l w_l·((1−λ)·task_l + λ·con_l), leaving out con_l for dropped exits (and λ = 0 without contrastive terms)."""
    total = None
    for t in terms:
        if t.contrastive is None:
            part = t.task
        elif t.layer in dropped:
            part = (1.0 - lam) * t.task
        else:
            part = (1.0 - lam) * t.task + lam * t.contrastive
        total = t.weight * part if total is None else total + t.weight * part
    return total


def gated_backward(
    terms: Sequence[ExitTerms],
    lam: float,
    backward: Callable[[torch.Tensor], None],
    enabled: bool,
    scope: str = "exit",
    threshold: float = 90.0,
    granularity: str = "batch",
    measure: bool = True,
    trainable: Sequence[torch.nn.Parameter] = (),
    assign_grads: bool = True,
) -> tuple[torch.Tensor, AngleRecord | None]:
    """Backpropagate this step's loss, with ACL-Grad when `enabled`; returns (loss, what the gate saw).

    `backward(loss)` runs the ordinary backward (`loss.backward()` or a DeepSpeed engine's). With scope "all" and
    `assign_grads`, gradients are written to `.grad` directly from the two per-term gradients instead.
    """
    with_con = [t for t in terms if t.contrastive is not None]
    if not with_con or not (enabled or measure):
        loss = combine(terms, lam)
        backward(loss)
        return loss.detach(), None

    task_total = sum(t.weight * t.task for t in terms)
    con_total = sum(t.weight * t.contrastive for t in with_con)
    tensors, groups = _gradient_groups(with_con, scope, trainable)
    g_task = torch.autograd.grad(task_total, tensors, retain_graph=True, allow_unused=True)
    g_con = torch.autograd.grad(con_total, tensors, retain_graph=True, allow_unused=True)
    angle, per_exit = _angles(g_task, g_con, groups, per_exit=scope != "all")

    dropped: list[int] = []
    if enabled:
        if granularity == "exit" and scope != "all":
            dropped = [layer for layer, a in per_exit.items() if a is not None and a > threshold]
        elif angle is not None and angle > threshold:
            dropped = [t.layer for t in with_con]
    record = AngleRecord(angle=angle, per_exit=per_exit, dropped=dropped, num_exits=len(with_con))

    loss = combine(terms, lam, dropped)
    if scope == "all" and assign_grads:
        _assign_grads(tensors, g_task, g_con, lam, keep=not dropped)
    else:
        backward(loss)
    return loss.detach(), record


def _gradient_groups(
    with_con: Sequence[ExitTerms], scope: str, trainable: Sequence[torch.nn.Parameter]
) -> tuple[list[torch.Tensor], dict[int, list[int]]]:
    """The tensors the two gradients are taken on, and which of them belong to each exit (one group for "all")."""
    if scope == "all":
        tensors = [p for p in trainable if p.requires_grad]
        return tensors, {0: list(range(len(tensors)))}
    tensors, groups = [], {}
    for t in with_con:
        own = [t.rep] if scope == "representation" else [p for p in t.tensors if p.requires_grad]
        groups[t.layer] = list(range(len(tensors), len(tensors) + len(own)))
        tensors.extend(own)
    return tensors, groups


def _angles(
    g_task: Sequence[torch.Tensor | None],
    g_con: Sequence[torch.Tensor | None],
    groups: dict[int, list[int]],
    per_exit: bool,
) -> tuple[float | None, dict[int, float | None]]:
    """The angle between the two gradients over all groups, and (`per_exit`) each exit's own."""
    angles: dict[int, float | None] = {}
    totals = [0.0, 0.0, 0.0]
    for layer, idx in groups.items():
        dot, na, nb = _pieces([g_task[i] for i in idx], [g_con[i] for i in idx])
        totals = [totals[0] + dot, totals[1] + na, totals[2] + nb]
        if per_exit:
            angles[layer] = angle_from(dot, na, nb)
    return angle_from(*totals), angles


def _assign_grads(
    tensors: Sequence[torch.Tensor],
    g_task: Sequence[torch.Tensor | None],
    g_con: Sequence[torch.Tensor | None],
    lam: float,
    keep: bool,
) -> None:
    """Scope "all": `.grad` += (1-λ)·task gradient (+ λ·contrastive gradient when the batch is kept)."""
    for p, gt, gc in zip(tensors, g_task, g_con):
        g = None if gt is None else (1.0 - lam) * gt
        if keep and gc is not None:
            g = lam * gc if g is None else g + lam * gc
        if g is not None:
            p.grad = g if p.grad is None else p.grad + g
