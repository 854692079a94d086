"""Dropout and attention that draw the same dropout masks eagerly and under `torch.compile` on CPU.

Eagerly, PyTorch's CPU dropout is a Bernoulli noise tensor from the default generator (MKL's vectorized draw),
multiplied in. Under `torch.compile`, inductor generates its own Philox numbers inside its fused kernels instead:
on CPU one counter-based draw per element (71 of a 1,000 ms step at hidden 256, most of it for the attention
probabilities), and other masks than the eager run's. Here a compiled CPU graph calls the eager draw as one opaque
op (`elasticbert::dropout_noise`) and fuses only the multiply: compiled and eager runs draw the same masks from the
same generator, and the compiled step is the faster one. Eagerly, and on GPUs (where inductor's fused Philox is the
fast path), nothing changes: `F.dropout` and `F.scaled_dot_product_attention` run as before.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from common.torch_private import safe_softmax


@torch.library.custom_op("elasticbert::dropout_noise", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def dropout_noise(like: torch.Tensor, p: float) -> torch.Tensor:
    """PyTorch's CPU dropout noise for `like`'s shape: Bernoulli(1 - p) / (1 - p), from the default generator."""
    return torch.empty_like(like).bernoulli_(1 - p).div_(1 - p)


@dropout_noise.register_fake
def _dropout_noise_shape(like: torch.Tensor, p: float) -> torch.Tensor:
    return torch.empty_like(like)


def _eager_noise_in_graph(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and torch.compiler.is_compiling()


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`F.dropout(x, p, training)`, with the eager draw inside a compiled CPU graph."""
    if training and p > 0.0 and _eager_noise_in_graph(x):
        return x * dropout_noise(x.detach(), p)
    return F.dropout(x, p, training)


class Dropout(nn.Dropout):
    """`nn.Dropout` through `dropout` (no parameters: state dicts are unchanged)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def scaled_dot_product_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, dropout_p: float
) -> torch.Tensor:
    """`F.scaled_dot_product_attention` (boolean `mask`, True = attend). Inside a compiled CPU graph with dropout,
    its own CPU path for dropout written out (the same scaling, masking, safe softmax and noise), so the
    probabilities' mask comes from the eager draw."""
    if dropout_p == 0.0 or not _eager_noise_in_graph(query):
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p)
    root_scale = math.sqrt(1.0 / math.sqrt(query.shape[-1]))
    scores = (query * root_scale) @ (key.transpose(-2, -1) * root_scale)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = safe_softmax(scores, -1)
    return (probs * dropout_noise(probs.detach(), dropout_p)) @ value
