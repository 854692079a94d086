"""Preemption for the pre-training loop: the flag and the signal handling are `common.preemption`'s (shared with
`finetune train`); here the trainer checks the flag at each step boundary, all ranks agree through the step's
statistics all-reduce (any rank signalled -> all save), save a checkpoint and exit with EXIT_PREEMPTED.

Slurm sends SIGTERM before killing a preempted or timed-out job (SIGUSR1 with `--signal=USR1@120`); the sbatch
script requeues on EXIT_PREEMPTED and the next start resumes from `latest`.
"""

from __future__ import annotations

from common.preemption import EXIT_PREEMPTED, HANDLED, PreemptionFlag, ignore_preemption_signals

__all__ = ["EXIT_PREEMPTED", "HANDLED", "PreemptionFlag", "ignore_preemption_signals"]
