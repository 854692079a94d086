"""Preemption: SIGTERM / SIGUSR1 only set a flag; the training loop checks it at each step boundary, all ranks
agree through an all-reduce (any rank signalled -> all save), save a checkpoint and exit with EXIT_PREEMPTED.

Slurm sends SIGTERM before killing a preempted or timed-out job (SIGUSR1 with `--signal=USR1@120`); the sbatch
script requeues on EXIT_PREEMPTED and the next start resumes from `latest`.
"""

from __future__ import annotations

import signal
from types import FrameType

from common.errors import EXIT_PREEMPTED

__all__ = ["EXIT_PREEMPTED", "HANDLED", "PreemptionFlag", "ignore_preemption_signals"]

HANDLED = (signal.SIGTERM, signal.SIGUSR1)


class PreemptionFlag:
    """Installs handlers for SIGTERM and SIGUSR1 that record the signal; `restore()` puts the old ones back."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> PreemptionFlag:
        for sig in HANDLED:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def ignore_preemption_signals(_worker_id: int) -> None:
    """DataLoader `worker_init_fn`: workers share the job's process group, and a preemption SIGTERM must not kill
    them while the trainer saves."""
    for sig in HANDLED:
        signal.signal(sig, signal.SIG_IGN)
