"""Preemption, for both trainers: SIGTERM / SIGUSR1 only set a flag; the training loop looks at it at a step boundary
(all ranks agree: any rank signalled -> all save), saves what resuming needs, says where, and exits with
EXIT_PREEMPTED (75, EX_TEMPFAIL). SIGINT is not one of them: Ctrl-C stays an interruption (exit 130).

Slurm sends SIGTERM before it kills a preempted or timed-out job (SIGUSR1 with `--signal=B:USR1@SECONDS`, forwarded
to the job step by slurm/common.sh); the batch script requeues on EXIT_PREEMPTED and the next start of the same
command resumes. The trainers differ only in what they save (pretrain.checkpointer, finetune.train.checkpoint) and in
how the ranks vote (pretrain: inside the step's statistics all-reduce; finetune: `finetune.train.checkpoint.agreed`).
"""

from __future__ import annotations

import signal
from types import FrameType

from .errors import EXIT_PREEMPTED

__all__ = ["EXIT_PREEMPTED", "HANDLED", "Preempted", "PreemptionFlag", "ignore_preemption_signals", "signal_name"]

HANDLED = (signal.SIGTERM, signal.SIGUSR1)


class PreemptionFlag:
    """Installs handlers for SIGTERM and SIGUSR1 that record the signal; `restore()` puts the old ones back.

    A second signal while the trainer saves only records itself again: the save is never cut short by the signals
    that asked for it."""

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

    @property
    def name(self) -> str:
        """The signal's name (SIGTERM, SIGUSR1), or "a peer rank" when another rank asked."""
        return signal_name(self.signum)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def __enter__(self) -> PreemptionFlag:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.restore()


def signal_name(signum: int | None) -> str:
    return signal.Signals(signum).name if signum else "a peer rank"


class Preempted(Exception):
    """A trainer saved what resuming needs after a preemption signal (or had nothing to save yet): the command prints
    the message as one line and exits EXIT_PREEMPTED. Not a `UserError`: nothing went wrong."""

    exit_code = EXIT_PREEMPTED


def ignore_preemption_signals(_worker_id: int = 0) -> None:
    """DataLoader `worker_init_fn`: workers share the job's process group, and a preemption SIGTERM must not kill
    them while the trainer saves."""
    for sig in HANDLED:
        signal.signal(sig, signal.SIG_IGN)
