"""The run directory both trainers write (`--output RUN`): proven writable before anything expensive starts, locked
while a trainer uses it, never silently replaced when it holds a finished run, and cleared of what an interrupted
attempt left. Failed writes become one error naming the file and the errno (`RunWriteError`, exit 4).

The lock: every rank of a trainer takes an exclusive `fcntl.flock` on its own file, RUN/locks/rank{R}.lock (one file
per rank, because Linux NFS emulates flock with whole-file POSIX locks shared across nodes), and writes who it is
into it (pid, host, rank, Slurm job). A second trainer on the same directory finds a lock taken and stops before it
writes anything, naming the holder. The kernel releases a flock when its holder dies, SIGKILL included, so a killed
run never leaves the directory stuck (on NFS the server frees a crashed node's lock after its lease, ~90 s). Forked
children (DataLoader workers) close their inherited copies (`release_inherited_locks`), so the lock dies with the
trainer, not its workers. On a filesystem without flock (Lustre mounted without `-o flock`) a warning, and no lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from .dist import DistEnv
from .errors import EXIT_WRITE_FAILED, UserError, describe_os_error

LOCKS = "locks"
_HELD_FDS: set[int] = set()  # lock descriptors of this process (closed in forked children)


class RunDirError(UserError):
    """The run directory cannot be created or written, holds a finished run, or another trainer is using it."""


class RunWriteError(UserError):
    """A command's results, checkpoint, export or log could not be written (disk full, I/O error); nothing
    half-written is left, and what was committed before stays as it was (exit 4)."""

    exit_code = EXIT_WRITE_FAILED


def describe_write_error(err: BaseException) -> str:
    """An OSError (or the RuntimeError torch.save wraps one in) as one line, with a hint for a full disk."""
    if isinstance(err, OSError):
        return describe_os_error(err)
    text = f"{type(err).__name__}: {err}"
    full = isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)
    full = full or "No space left on device" in str(err) or "file write failed" in str(err)
    return text + (" (the disk or quota is full)" if full else "")


def prepare_run_dir(run_dir: Path, rank: int = 0) -> None:
    """Create RUN and prove this rank can write there (shared filesystems differ per node)."""
    try:
        if run_dir.exists() and not run_dir.is_dir():
            raise RunDirError(f"run directory {run_dir} is a file, not a directory")
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write_probe_{rank}_{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise RunDirError(f"run directory {run_dir} is not writable: {e.strerror or e}") from None


class RunLock:
    """One rank's exclusive lock on a run directory, held until `release()` or the process ends."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path = path
        self.fd = fd

    @classmethod
    def acquire(cls, run_dir: Path, env: DistEnv, who: str = "trainer") -> RunLock:
        """Take RUN/locks/rank{R}.lock or raise RunDirError naming the `who` (e.g. "`finetune train`") that holds
        it."""
        path = Path(run_dir) / LOCKS / f"rank{env.rank}.lock"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise RunDirError(f"cannot create the run lock {path}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise in_use(run_dir, who, f"{holder} holds {path}") from None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            os.close(fd)
            print(
                f"warning: cannot lock {path} ({e.strerror}: this filesystem has no flock); make sure no other "
                f"{who} uses this run directory",
                file=sys.stderr,
                flush=True,
            )
            return cls(path, None)
        _write_holder(fd, env)
        _HELD_FDS.add(fd)
        return cls(path, fd)

    def release(self) -> None:
        if self.fd is not None:
            _HELD_FDS.discard(self.fd)
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)  # a lock file left behind names no one
            os.close(self.fd)  # closing the last descriptor releases the flock
            self.fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def in_use(run_dir: Path, who: str, holder: str) -> RunDirError:
    return RunDirError(
        f"run directory {run_dir} is in use by another {who}: {holder}. Two of them on one run directory would "
        "interleave their files; wait for it to end, stop it, or use another --output"
    )


def lock_holder(run_dir: Path) -> str | None:
    """Who holds one of the run directory's locks (a live process), or None: the check before a trainer loads
    anything. A lock file left by a killed process is not held."""
    for path in sorted((Path(run_dir) / LOCKS).glob("rank*.lock")):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return f"{_read_holder(fd)} holds {path}"
        except OSError:  # no flock on this filesystem: nobody can hold it
            pass
        finally:
            os.close(fd)
    return None


def release_inherited_locks() -> None:
    """In a forked child (a DataLoader worker): close the copies of the lock descriptors, so that the lock lives
    and dies with the trainer process alone. The parent's lock is untouched (its descriptor stays open)."""
    for fd in list(_HELD_FDS):
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD_FDS.clear()


def _write_holder(fd: int, env: DistEnv) -> None:
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "rank": env.rank,
        "world_size": env.world_size,
        "launcher": env.launcher,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)


def _read_holder(fd: int) -> str:
    """'pid P on host H (rank R of W, started T, Slurm job J)' from a held lock file, as far as it says."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode("utf-8") or "{}")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "a process (it has not written its name yet)"
    job = f", Slurm job {info['slurm_job_id']}" if info.get("slurm_job_id") else ""
    return (
        f"pid {info['pid']} on host {info.get('host', '?')} (rank {info.get('rank', '?')} of "
        f"{info.get('world_size', '?')}, started {info.get('started', '?')}{job})"
    )


# ---------------------------------------------------------------------------------------- finished and interrupted
def refuse_finished(run_dir: Path, finished: Iterable[str], overwrite: bool, what: str = "run") -> bool:
    """Raise RunDirError when RUN holds a finished run (any of `finished` exists) and not `overwrite`; returns
    whether it holds one (to be replaced)."""
    found = [name for name in finished if (Path(run_dir) / name).exists()]
    if found and not overwrite:
        raise RunDirError(
            f"--output {run_dir}: holds a finished {what} ({', '.join(found)}); pass --overwrite to replace it, or "
            "choose another --output"
        )
    return bool(found)


def clear_run_files(run_dir: Path, names: Iterable[str], leftovers: Iterable[str] = ()) -> None:
    """Remove a replaced or interrupted run's own files and directories (`names`) and the temporaries matching the
    glob patterns `leftovers`; nothing else in the directory."""
    run_dir = Path(run_dir)
    paths = [run_dir / name for name in names] + [p for pattern in leftovers for p in run_dir.glob(pattern)]
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
