"""Tiny `finetune train` runs that a preemption signal stops at a chosen point, and what the tests compare between a
resumed run and an uninterrupted one (tests/finetune/test_preemption.py, tests/faults/test_finetune_preemption.py).

The runs are real: MiniLM's first two layers with exits 1 and 2, 12 RTE training pairs read in place from
../shared/data/glue (3 batches: a phase of six steps is two epochs, reshuffled), dropout on; the dev subset
evaluated every two steps. A signal is sent
by the process to itself (`os.kill`) at the point a test names, exactly as Slurm's would arrive there.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path

import pytest
import torch
from requirements import GLUE, require_data

from elasticbert import minilm_dir

STEPS = 6  # per phase
EVAL_EVERY = 2


def train_argv(out: Path, method: str = "jt", *extra: str) -> list[str]:
    require_data(GLUE / "RTE")
    return [
        "train",
        "--model",
        str(minilm_dir()),
        "--task",
        "RTE",
        "--data-dir",
        str(GLUE),
        "--exits",
        "1,2",
        "--method",
        method,
        "--max-length",
        "32",
        "--batch-size",
        "4",
        "--max-train-examples",
        "12",
        "--max-dev-examples",
        "16",
        "--train-steps",
        str(STEPS),
        "--eval-every",
        str(EVAL_EVERY),
        "--no-progress",
        "--output",
        str(out),
        *extra,
    ]


def state_digest(model: torch.nn.Module) -> str:
    """sha256 over every tensor of the model's state dict (names and bytes): equal iff bit-identical."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def record_phase_ends(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(phase, digest of the weights) at the end of each phase, before its best weights are restored: what the
    last steps of a phase made, which best/ alone would not show when an earlier evaluation was the best."""
    from finetune.train.trainer import Trainer

    seen: list[tuple[str, str]] = []
    original = Trainer.end_phase

    def end_phase(self: Trainer, phase: object) -> None:
        seen.append((phase.name, state_digest(self.model)))
        original(self, phase)

    monkeypatch.setattr(Trainer, "end_phase", end_phase)
    return seen


def signal_after_step(monkeypatch: pytest.MonkeyPatch, step: int, sig: int = signal.SIGTERM, rank: int = 0) -> None:
    """Send `sig` to this process right after its optimizer step `step` (counted over the run) on `rank`."""
    from finetune.train.trainer import Trainer

    original = Trainer.train_step

    def train_step(self: Trainer, *args: object, **kwargs: object) -> dict:
        stats = original(self, *args, **kwargs)
        if self.global_step == step and self.rank == rank:
            os.kill(os.getpid(), sig)
        return stats

    monkeypatch.setattr(Trainer, "train_step", train_step)


def results(out: Path) -> dict:
    """What must be equal between a resumed and an uninterrupted run: best/'s weights (bytes) and dev_scores.json
    but its wall-clock `seconds`."""
    scores = json.loads((out / "dev_scores.json").read_text())
    scores.pop("seconds")
    return {"best": hashlib.sha256((out / "best" / "model.safetensors").read_bytes()).hexdigest(), "scores": scores}
