"""The attention masks in the form scaled-dot-product attention takes; shared by the model and the early-exit engine.

Two kinds: the padding mask of one text per row (`attention_mask_for_sdpa`), and the block-diagonal mask of packed
rows, where several texts share a row and each attends only to its own tokens (`packed_attention_mask`).
"""

from __future__ import annotations

import torch


def attention_mask_for_sdpa(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """[B, T] 1/0 padding mask -> [B, 1, 1, T] boolean mask for SDPA (True = attend); None when nothing is padded
    (SDPA's faster path), except under torch.compile, where that data-dependent branch would break the graph."""
    if attention_mask is None:
        return None
    if not torch.compiler.is_compiling() and bool(attention_mask.all()):
        return None
    return attention_mask[:, None, None, :].bool()


def packed_attention_mask(sample_ids: torch.Tensor) -> torch.Tensor:
    """[R, T] sample number of each token of packed rows (1, 2, ... per text, 0 = padding) -> [R, 1, T, T] boolean
    block-diagonal mask (True = attend): a token sees the tokens of its own text only. Padding tokens see the row's
    other padding tokens, so no query row is empty (an all-masked softmax row is NaN in SDPA's fused kernels), and
    no text sees them.

    Why a dense boolean mask and not a variable-length kernel: FlashAttention's varlen path needs sm_80, and the
    users' V100s (sm_70) run SDPA's memory-efficient kernel, which takes an arbitrary mask (as an additive bias,
    broadcast over the heads; rows padded to a multiple of 8 keep its alignment). One mask per forward, shared by
    every layer: R·T² bytes (20 rows of 512: 5 MB)."""
    return (sample_ids[:, :, None] == sample_ids[:, None, :]).unsqueeze(1)
