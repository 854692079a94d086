"""Preemption and resume of a fine-tuning run, as the loop sees them (the files: checkpoint.py).

At every step boundary the ranks agree whether any of them was signalled (SIGTERM / SIGUSR1, `common.preemption`);
if so every rank saves a resume checkpoint — unless nothing was trained yet, or the newest checkpoint already holds
this very position (a resumed run signalled before its first step) — and raises `Preempted` (exit 75). A resumed run
starts at the checkpoint's phase and continues its steps, seconds and bookkeeping from there."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from common.preemption import Preempted, PreemptionFlag

from .checkpoint import Ranks, ResumePoint, Snapshot, save_resume_point, tag_for


class Resumption:
    """The run's side of preemption: the signal flag, the resume point it started from, the newest saved tag."""

    def __init__(self, run_dir: Path, ranks: Ranks, preempt: PreemptionFlag, resume: ResumePoint | None) -> None:
        self.run_dir, self.ranks, self.preempt, self.resume = run_dir, ranks, preempt, resume
        self.saved_tag = resume.tag if resume else None  # the position the newest resume checkpoint holds

    @property
    def first_phase(self) -> int:
        """The index of the phase a run starts with: earlier phases are in the resume checkpoint's weights."""
        return self.resume.state["phase_index"] if self.resume else 0

    def resumes(self, index: int) -> bool:
        """Whether the `index`-th phase continues from the resume checkpoint (rather than starting at step 0)."""
        return self.resume is not None and index == self.resume.state["phase_index"]

    @property
    def seconds_before(self) -> float:
        """Seconds of training of the starts before this one."""
        return float(self.resume.state.get("seconds", 0.0)) if self.resume else 0.0

    def stop_if_signalled(
        self,
        device: torch.device,
        phase: str,
        done: int,
        total: int,
        trained: bool,
        snapshot: Callable[[str], Snapshot],
    ) -> None:
        """A step boundary (`done` steps of `phase` behind): when any rank was signalled, every rank saves
        `snapshot(tag)` (unless there is nothing to save) and raises `Preempted`."""
        if not self.ranks.any(self.preempt.requested, device):
            return
        how = f"{self.preempt.name} at {phase} step {done} of {total}"
        tag = tag_for(phase, done)
        if not trained and self.resume is None:
            message = f"{how}: nothing trained yet, nothing saved; rerun the same command to start the run"
        elif tag == self.saved_tag:  # a resumed run signalled before its first step: its checkpoint is this one
            message = f"{how}: the resume checkpoint {self.resume.dir} stays; rerun the same command to resume"
        else:
            where = save_resume_point(self.run_dir, snapshot(tag), self.ranks)
            self.saved_tag = tag
            message = f"{how}: saved a resume checkpoint in {where}; rerun the same command (same --output) to resume"
        raise Preempted(message if self.ranks.rank == 0 else "")
