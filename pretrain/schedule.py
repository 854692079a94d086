"""What is a pure function of the optimizer step: the learning rate, the dropout seeds, and when to save and
evaluate. Resume needs no scheduler state, and each value at step t is the same whatever the world size or how often
the job was restarted."""

from __future__ import annotations

import math

import numpy as np

from .config import OptimConfig


def learning_rate(step: int, total_steps: int, optim: OptimConfig) -> float:
    """lr for optimizer step `step` (0-based): linear warmup from lr/warmup to lr over the warm-up steps
    (`optim.warmup_for`; never 0, so the first update is not wasted), then linear / cosine decay to lr*min_lr_ratio
    at `total_steps`, or constant."""
    peak, floor = optim.lr, optim.lr * optim.min_lr_ratio
    warmup = optim.warmup_for(total_steps)
    if warmup > 0 and step < warmup:
        return peak * (step + 1) / warmup
    if optim.decay == "constant":
        return peak
    span = max(total_steps - warmup, 1)
    progress = min(max(step - warmup, 0) / span, 1.0)
    if optim.decay == "cosine":
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return peak - (peak - floor) * progress


def micro_seed(seed: int, step: int, global_micro: int) -> int:
    """Dropout seed of global micro-batch j of step t: the same for a given micro-batch whatever the world size
    (j = rank * accum + m holds the same samples for a fixed micro-batch size)."""
    return int(np.random.SeedSequence([seed, 3, step, global_micro]).generate_state(1, np.uint64)[0] >> 1)


def due(step: int, end_step: int, interval: int) -> bool:
    """Whether a checkpoint / validation falls after optimizer step `step` (1-based, just finished): every
    `interval` steps and at the run's last step `end_step`; never when `interval` is 0."""
    return interval > 0 and (step % interval == 0 or step == end_step)
