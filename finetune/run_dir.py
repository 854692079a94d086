"""The run directory of `finetune train`: never clobber a finished or running run, lock it while training, and
clear what an interrupted attempt left.

- finished: `best/` or `dev_scores.json` is there. Refused unless `--overwrite` (which replaces the run's files and
  nothing else in the directory).
- running: another process holds the advisory lock `.train.lock` (`fcntl.flock`; the kernel releases it when that
  process dies, so a SIGKILLed run never leaves it stuck). Always refused.
- interrupted: `run_config.json` without `best/` or `dev_scores.json` (a run killed before its end, which writes
  `best/` and then `dev_scores.json`, each atomically). Nothing to resume: the attempt's files are removed, with a
  note, and training starts over.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import time
from pathlib import Path

from common.errors import EXIT_WRITE_FAILED, UserError

LOCK_NAME = ".train.lock"
FINISHED = ("best", "dev_scores.json")
RUN_FILES = ("best", "dev_scores.json", "run_config.json", "layer_curve.png", "acl_diagnostics.json", "angles.png")
RUN_DIRS = ("tensorboard",)


class RunDirError(UserError):
    """`--output` holds a run that must not be replaced (finished without --overwrite, or running)."""


class RunWriteError(UserError):
    """The run's results could not be written (disk full, I/O error); nothing half-written is left (exit 4)."""

    exit_code = EXIT_WRITE_FAILED


def no_flock(path: Path, err: OSError) -> None:
    """A filesystem without flock (e.g. Lustre without -o flock): warn and run unlocked, as pretrain does."""
    print(
        f"finetune: warning: cannot lock {path} ({err.strerror}: this filesystem has no flock); make sure no other "
        "`finetune train` writes this run",
        file=sys.stderr,
        flush=True,
    )


def run_state(run_dir: Path) -> str:
    """'new' (nothing of a run there), 'finished', or 'interrupted'; the lock is checked separately."""
    if any((run_dir / name).exists() for name in FINISHED):
        return "finished"
    if (run_dir / "run_config.json").exists() or list(run_dir.glob(".best.tmp*")):
        return "interrupted"
    return "new"


def holder(run_dir: Path) -> str:
    """What the lock file says about the process that holds it (pid and start time), for messages."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        text = (run_dir / LOCK_NAME).read_text(encoding="utf-8").strip()
        if text:
            return f" ({text})"
    return ""


def is_locked(run_dir: Path) -> bool:
    """Whether a live process holds the run's lock (a lock left by a killed process is not held)."""
    path = run_dir / LOCK_NAME
    if not path.is_file():
        return False
    with open(path, "rb") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:  # no flock on this filesystem: nobody can hold it
            return False
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    return False


def check_run_dir(run_dir: Path, overwrite: bool) -> None:
    """Refuse, before anything is loaded, a finished run (unless `overwrite`) or a running one; changes nothing."""
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"--output {run_dir}: is a file, not a directory")
    if not run_dir.is_dir():
        return
    if is_locked(run_dir):
        raise RunDirError(
            f"--output {run_dir}: another `finetune train` is writing this run{holder(run_dir)}; wait for it to "
            "finish or choose another --output"
        )
    if run_state(run_dir) == "finished" and not overwrite:
        found = ", ".join(name for name in FINISHED if (run_dir / name).exists())
        raise RunDirError(
            f"--output {run_dir}: holds a finished run ({found}); pass --overwrite to replace it, or choose another "
            "--output"
        )


class RunLock:
    """The advisory lock of a run directory, held from `claim_run_dir` until `release` (or the process's end)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self.handle = None

    def acquire(self) -> RunLock:
        handle = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held open while the run lasts
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise RunDirError(
                f"--output {self.path.parent}: another `finetune train` is writing this run{holder(self.path.parent)}"
                "; wait for it to finish or choose another --output"
            ) from None
        except OSError as err:
            no_flock(self.path, err)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        self.handle = handle
        return self

    def release(self) -> None:
        if self.handle is not None:
            with contextlib.suppress(OSError):
                self.handle.seek(0)
                self.handle.truncate()
            with contextlib.suppress(OSError):
                fcntl.flock(self.handle.fileno(), fcntl.LOCK_UN)
            self.handle.close()
            self.handle = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def claim_run_dir(run_dir: Path, overwrite: bool) -> RunLock:
    """Create and lock `run_dir` for a new run; replace a finished run's files (with `overwrite`) or an interrupted
    attempt's, and say so. Returns the held lock."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunLock(run_dir).acquire()
    try:
        check_run_dir_locked(run_dir, overwrite)
    except BaseException:
        lock.release()
        raise
    return lock


def check_run_dir_locked(run_dir: Path, overwrite: bool) -> None:
    state = run_state(run_dir)
    if state == "finished" and not overwrite:
        raise RunDirError(f"--output {run_dir}: holds a finished run; pass --overwrite to replace it")
    if state == "new":
        return
    reason = (
        "replacing the finished run there (--overwrite)"
        if state == "finished"
        else ("an earlier attempt there was interrupted before it wrote best/; starting over")
    )
    print(f"finetune: {run_dir}: {reason}", file=sys.stderr, flush=True)
    for name in RUN_FILES + RUN_DIRS:
        _remove(run_dir / name)
    for stale in run_dir.glob(".best.tmp*"):  # a best/ being written when its process died
        _remove(stale)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
