"""The run directory (`train --output RUN`): created and proven writable by every rank before the process group
exists, locked so that no second trainer can use it at the same time, and given the resolved configs that say
exactly what ran.

RUN/
  config.yaml, ds_config.json   the resolved run config and the filled DeepSpeed config (rank 0, atomic writes)
  locks/rank{R}.lock            held (flock) by rank R of the running trainer for its whole life; holds its pid/host
  checkpoints/                  see pretrain.checkpoint
  metrics.jsonl, events.jsonl, eval.jsonl, tensorboard/   see pretrain.metrics

The lock: every rank takes an exclusive `fcntl.flock` on its own file (one file per rank, because Linux NFS
emulates flock with whole-file POSIX locks shared across nodes). A second trainer on the same directory finds rank
R's lock taken and stops before it writes anything, naming the holder; with equal world sizes every one of its ranks
stops at once, with another world size the launcher stops the rest (torchrun at once, srun after `--wait`). The
kernel releases a flock when its holder dies, SIGKILL included, so a killed run never leaves the directory stuck
(on NFS the server frees the lock of a crashed node after its lease, ~90 s). DataLoader workers close their
inherited copy of the descriptor (`release_inherited_locks`), so the lock dies with the trainer, not its workers.
On a filesystem without flock (Lustre mounted without `-o flock`) the trainer warns and runs unlocked.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from common.dist import DistEnv
from common.errors import UserError
from common.io import atomic_write_text

from .config import RunConfig, save_config

_HELD_FDS: set[int] = set()  # lock descriptors of this process (closed in forked DataLoader workers)


class RunDirError(UserError):
    """The run directory cannot be created or written, or another trainer is using it."""


class RunLock:
    """This rank's exclusive lock on the run directory, held until `release()` or the process ends."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path = path
        self.fd = fd

    @classmethod
    def acquire(cls, run_dir: Path, env: DistEnv) -> RunLock:
        """Take RUN/locks/rank{R}.lock or raise RunDirError naming the trainer that holds it."""
        path = run_dir / "locks" / f"rank{env.rank}.lock"
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
            raise RunDirError(
                f"run directory {run_dir} is in use by another trainer: {holder} holds {path}. Two trainers on "
                "one run directory would interleave checkpoints and logs; wait for it to end, stop it, or train "
                "with another --output"
            ) from None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            os.close(fd)
            print(
                f"warning: cannot lock {path} ({e.strerror}: this filesystem has no flock); make sure no other "
                "trainer uses this run directory",
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
            os.close(self.fd)  # closing the last descriptor releases the flock
            self.fd = None


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
    """'pid P on host H (rank R of W, since T, Slurm job J)' from a held lock file, as far as it says."""
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


def release_inherited_locks() -> None:
    """In a forked child (a DataLoader worker): close the copies of the lock descriptors, so that the lock lives
    and dies with the trainer process alone. The parent's lock is untouched (its descriptor stays open)."""
    for fd in list(_HELD_FDS):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD_FDS.clear()


def prepare_run_dir(run_dir: Path, rank: int) -> None:
    """Create RUN/checkpoints and prove this rank can write there (shared filesystems differ per node)."""
    try:
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write_probe_{rank}_{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise RunDirError(f"run directory {run_dir} is not writable: {e.strerror or e}") from None


def write_resolved_configs(run_dir: Path, cfg: RunConfig, ds_config: dict[str, Any]) -> None:
    save_config(cfg, run_dir / "config.yaml")
    atomic_write_text(run_dir / "ds_config.json", json.dumps(ds_config, indent=2))
