"""The padding mask in the form scaled-dot-product attention takes; shared by the model and the early-exit engine."""

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
