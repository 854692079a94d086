"""Learning rate as a pure function of the optimizer step: resume needs no scheduler state, and the value at
step t is the same whatever the world size or how often the job was restarted."""

from __future__ import annotations

import math

from .config import OptimConfig


def learning_rate(step: int, total_steps: int, optim: OptimConfig) -> float:
    """lr for optimizer step `step` (0-based): linear warmup from lr/warmup to lr over `warmup_steps` (never 0, so
    the first update is not wasted), then linear / cosine decay to lr*min_lr_ratio at `total_steps`, or constant."""
    peak, floor = optim.lr, optim.lr * optim.min_lr_ratio
    if optim.warmup_steps > 0 and step < optim.warmup_steps:
        return peak * (step + 1) / optim.warmup_steps
    if optim.decay == "constant":
        return peak
    span = max(total_steps - optim.warmup_steps, 1)
    progress = min(max(step - optim.warmup_steps, 0) / span, 1.0)
    if optim.decay == "cosine":
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return peak - (peak - floor) * progress
