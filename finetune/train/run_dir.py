"""What a `finetune train` run directory holds, for `common.run_dir`'s rules (lock, finished-run refusal, clearing
an interrupted attempt):

- finished: `best/` or `dev_scores.json` is there. Refused unless `--overwrite` (which replaces the run's files and
  nothing else in the directory).
- running: another process holds the run directory's claim (`common.claims`: RUN's sibling `.RUN.claim/`). Always
  refused, naming it; a dead holder's claim is taken over with a note.
- preempted: `resume/latest` names a resume checkpoint (a run stopped by SIGTERM / SIGUSR1, `checkpoint.py`). The
  same command resumes it, keeping its files; with `--overwrite` it is discarded and training starts over.
- interrupted: `run_config.json` without `best/` or `dev_scores.json` and no committed resume checkpoint (a run
  killed before its end, which writes `best/` and then `dev_scores.json`, each atomically). Nothing to resume: the
  attempt's files are removed, with a note, and training starts over.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from common.dist import resolve_env
from common.outputs import FINETUNE_RUN, Output, check_output
from common.run_dir import RunLock, clear_run_files, prepare_run_dir, refuse_finished

from .checkpoint import RESUME, ResumePoint

WHO = "`finetune train`"
FINISHED = ("best", "dev_scores.json")
RUN_FILES = ("best", "dev_scores.json", "run_config.json", "layer_curve.png", "acl_diagnostics.json", "angles.png")
RUN_DIRS = ("tensorboard", RESUME)
LEFTOVERS = (".best.tmp*",)  # a best/ being written when its process died


RUN_OUTPUT = Output(
    "finetune train",
    "a fine-tuning run directory",
    folder=True,
    exclusive=True,
    accepts=(FINETUNE_RUN,),
    writes=RUN_FILES + RUN_DIRS,
)


def check_run_dir(run_dir: Path, overwrite: bool, inputs: Iterable[tuple[str, object]] = ()) -> None:
    """Refuse, before anything is loaded, a finished run (unless `overwrite`) or a running one, and a run directory
    that is a file, another command's folder (a model directory, a pre-training run, ...), one of the run's `inputs`
    (model, tokenizer, data, config files), inside one, or holding one, or one holding a file of the run's names that
    no run wrote (`common.outputs`: a run's files there may be replaced). Inside the command the run directory is
    claimed from here on (`common.claims`); nothing else changes."""
    check_output(run_dir, RUN_OUTPUT, inputs, overwrite)
    refuse_finished(run_dir, FINISHED, overwrite)


def claim_run_dir(run_dir: Path, overwrite: bool, resume: ResumePoint | None = None) -> RunLock:
    """Create and lock `run_dir` for a run: a new one replaces a finished run's files (with `overwrite`), a preempted
    one's (with `overwrite`) or an interrupted attempt's; a resumed one (`resume`) keeps them. Says which. Returns
    the held lock."""
    prepare_run_dir(run_dir)
    lock = RunLock.acquire(run_dir, resolve_env(export=False), who=WHO)
    try:
        if resume is not None:
            where = f"{resume.dir} ({resume.where})"
            print(f"finetune: {run_dir}: resuming the preempted run from {where}", file=sys.stderr, flush=True)
            return lock
        replacing = refuse_finished(run_dir, FINISHED, overwrite)
        preempted = (run_dir / RESUME / "latest").exists()
        interrupted = (run_dir / "run_config.json").exists() or any(run_dir.glob(LEFTOVERS[0]))
        if replacing or interrupted or preempted:
            if replacing:
                reason = "replacing the finished run there (--overwrite)"
            elif preempted:
                reason = "discarding the preempted run there and its resume checkpoint (--overwrite); starting over"
            else:
                reason = "an earlier attempt there was interrupted before it wrote best/; starting over"
            print(f"finetune: {run_dir}: {reason}", file=sys.stderr, flush=True)
            clear_run_files(run_dir, RUN_FILES + RUN_DIRS, LEFTOVERS)
    except BaseException:
        lock.release()
        raise
    return lock
