"""How the fine-tuning loop walks one phase of a method (the phases themselves: methods.py): how many optimizer steps
it takes, the batches it reads (a seeded reshuffle per epoch, rank r of R taking every R-th batch, a resumed phase
skipping what it already read), and what it freezes (2ST's stage 2: the backbone and the teacher exit)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from ..config import FinetuneConfig
from ..data import iterate_batches
from ..model import backbone_modules, exit_modules
from ..tasks import Example
from .methods import Phase


def phase_steps(cfg: FinetuneConfig, phase: Phase, examples: int, world: int) -> tuple[int, int]:
    """(optimizer steps of the phase, steps per epoch) for `examples` training examples over `world` ranks."""
    steps_per_epoch = max(1, math.ceil(examples / (cfg.train.batch_size * world)))
    epochs = cfg.value(phase.epochs_key)
    epochs = cfg.train.epochs if epochs is None else epochs
    return cfg.train.train_steps or max(1, int(math.ceil(epochs * steps_per_epoch))), steps_per_epoch


def phase_batches(
    cfg: FinetuneConfig,
    tokenizer: object,
    examples: list[Example],
    shard: tuple[int, int],
    total: int,
    start: int = 0,
) -> Iterator[dict[str, torch.Tensor]]:
    """Training batches `start`+1 .. `total` of the phase: seeded reshuffle each epoch; rank r of R (`shard`) takes
    every R-th batch. A resumed phase skips the epochs before `start` unread."""
    rank, world = shard
    per_epoch = len(range(rank * cfg.train.batch_size, len(examples), cfg.train.batch_size * world))
    epoch, skip = divmod(start, max(per_epoch, 1))
    produced = start
    while produced < total:
        stream = iterate_batches(
            tokenizer,
            examples,
            cfg.train.batch_size,
            cfg.data.max_length,
            shuffle=True,
            seed=cfg.train.seed * 1000 + epoch,
            shard=shard,
            start_batch=skip,
            group_by_length=cfg.data.group_by_length,
        )
        for batch in stream:
            yield batch
            produced += 1
            if produced == total:
                return
        epoch, skip = epoch + 1, 0


def frozen_modules(model: torch.nn.Module, phase: Phase) -> list[torch.nn.Module]:
    """2ST stage 2 freezes the backbone and the teacher (last) exit; other phases freeze nothing."""
    if not phase.freeze_backbone or phase.teacher is None:
        return []
    return backbone_modules(model) + exit_modules(model, phase.teacher)


def train_mode(model: torch.nn.Module, phase: Phase) -> None:
    """Training mode, except frozen modules (2ST stage 2's backbone and teacher), which stay in eval mode."""
    model.train()
    for module in frozen_modules(model, phase):
        module.eval()
