"""Gradient equilibrium (Li et al., 2019) for an arbitrary set of active exits.

At active exit e_i (of k, sorted), the gradient flowing down from the hidden state h must be
    g = (g_own + (k - i) * g_deeper) / (k - i + 1),
so the exit's own head and the k - i deeper exits weigh equally. With `rescale(x, w)` (identity forward, gradient times
w backward): `h_exit = rescale(h, 1/(k-i+1))` feeds the exit head and `h_next = rescale(h_exit, k-i)` feeds the next
layer, which yields exactly the formula because d/dh of both paths passes through the first rescale.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class _GradientRescale(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, weight: float) -> torch.Tensor:
        ctx.weight = weight
        return x.view_as(x)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.weight, None


def rescale_gradient(x: torch.Tensor, weight: float) -> torch.Tensor:
    """Identity in the forward pass; multiplies the incoming gradient by `weight` in the backward pass."""
    return _GradientRescale.apply(x, weight)


def equilibrium_weights(active_exits: Sequence[int]) -> dict[int, tuple[float, float]]:
    """For each active exit layer: (weight before the exit head, weight towards deeper layers)."""
    exits = sorted(active_exits)
    k = len(exits)
    return {layer: (1.0 / (k - i + 1), float(k - i)) for i, layer in enumerate(exits, start=1)}
