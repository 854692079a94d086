"""What stops a training run loudly instead of letting it waste compute or overwrite a good checkpoint: a non-finite
step, and a write that failed (a full disk). Each has its own exit code, so a batch script never requeues them
(slurm/common.sh requeues on 75 only) and an operator can tell them from bad input (2).

Non-finite steps: the trainer *stops* (no rollback). After every optimizer step the all-reduced loss and DeepSpeed's
global gradient norm (identical on every rank, so every rank stops at the same step) must be finite; in fp16 a
gradient overflow that DeepSpeed skipped (the loss scaler's normal work) is not a failure, a non-finite loss is.
Nothing is saved after such a step, and the weights are checked once more before every save, so `latest` never
moves onto a state produced after a non-finite step. Rerunning the same command resumes from `latest` and, being
deterministic, meets the same step again: lower `optim.lr`, check the data, or resume from an older checkpoint.
"""

from __future__ import annotations

import errno
import math

from common.errors import EXIT_DIVERGED, EXIT_WRITE_FAILED, UserError


class TrainingDiverged(UserError):
    """A non-finite loss, gradient norm or weight: the run stopped without checkpointing it."""

    exit_code = EXIT_DIVERGED


class RunWriteError(UserError):
    """Writing a checkpoint or a log failed (ENOSPC, EIO, ...); `latest` still names the last committed one."""

    exit_code = EXIT_WRITE_FAILED


def step_problem(loss: float, grad_norm: float | None, step_skipped: bool, precision: str) -> str | None:
    """Why an optimizer step's result must not be trained on or saved, or None when it is sound."""
    if not math.isfinite(loss):
        return f"non-finite loss ({loss})"
    if grad_norm is not None and not math.isfinite(grad_norm):
        if precision == "fp16" and step_skipped:
            return None  # fp16 overflow: DeepSpeed skipped the update and lowered the loss scale
        return f"non-finite gradient norm ({grad_norm})"
    return None


def describe_write_error(err: BaseException) -> str:
    """An OSError (or the RuntimeError torch.save wraps one in) as one line, with a hint for a full disk."""
    text = f"{type(err).__name__}: {err}"
    full = isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)
    full = full or "No space left on device" in str(err) or "file write failed" in str(err)
    return text + (" (the disk or quota is full)" if full else "")
