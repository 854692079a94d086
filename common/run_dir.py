"""The run directory both trainers write (`--output RUN`): proven writable before anything expensive starts, claimed
while a trainer uses it, never silently replaced when it holds a finished run, cleared of what an interrupted attempt
left, and never a place where a run appends to or replaces a file it did not create. Failed writes become one error
naming the file and the errno (`RunWriteError`, exit 4).

The claim (`RunLock`) is the one every output has (`common.claims`): each rank of a trainer holds its part of the run
directory's claim, RUN's sibling `.RUN.claim/{rank}` (an exclusive `flock` naming its holder: pid, host, command,
Slurm job), the ranks of one job share it, and a second trainer - on this host or another sharing the file system -
stops before it writes anything, naming the holder. The kernel releases a flock when its holder dies, SIGKILL
included, so a killed run never leaves the directory stuck (on NFS the server frees a crashed node's lock after its
lease, ~90 s); the next run takes over the stale claim with a note. Forked children (DataLoader workers) close their
copies at once, so the claim dies with the trainer, not its workers.

What a run wrote: RUN/.run_files.json lists the names (glob patterns) its command writes at the top of RUN
(`common.outputs.Output.writes`), recorded when the run starts (`prepare_run_dir`), before it writes any of them. The
`--output` rule refuses a run directory holding one of those names that the list does not have - a user's own
`events.jsonl` or `ds_config.json` put there - instead of appending to it or replacing it; a run directory of the
command's own kind written before such lists were kept is taken as its own.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from . import claims
from .claims import ClaimError, Part
from .dist import DistEnv
from .errors import EXIT_WRITE_FAILED, UserError, describe_os_error
from .io import atomic_write_json, peek_object

RUN_FILES = ".run_files.json"


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
    """Create RUN, prove this rank can write there (shared filesystems differ per node), and (rank 0) record the
    names the run writes there (RUN/.run_files.json, from its claim: `common.outputs.check_output`) before it writes
    any of them."""
    try:
        if run_dir.exists() and not run_dir.is_dir():
            raise RunDirError(f"run directory {run_dir} is a file, not a directory")
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write_probe_{rank}_{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
        claim = claims.held(run_dir)
        if rank == 0 and claim is not None and claim.run_files:  # one writer (another host's temporary looks dead)
            record_run_files(run_dir, claim.run_files)
    except OSError as e:
        raise RunDirError(f"run directory {run_dir} is not writable: {e.strerror or e}") from None


def listed_run_files(run_dir: Path) -> list[str] | None:
    """The names (glob patterns) RUN/.run_files.json lists, or None without one."""
    record = peek_object(Path(run_dir) / RUN_FILES)
    files = None if record is None else record.get("files")
    return [str(f) for f in files] if isinstance(files, list) else None


def record_run_files(run_dir: Path, patterns: Iterable[str]) -> None:
    """Add `patterns` to RUN/.run_files.json (atomically)."""
    listed = set(listed_run_files(run_dir) or ())
    wanted = listed | set(patterns)
    if wanted != listed:
        atomic_write_json(Path(run_dir) / RUN_FILES, {"format": "elasticbert-run-files/1", "files": sorted(wanted)})


def foreign_run_files(run_dir: Path, patterns: Iterable[str], own_kind: bool) -> list[str]:
    """The entries at the top of `run_dir` that match the names a run writes there (`patterns`) but that no run
    wrote: not in RUN/.run_files.json. Without the list, a folder of the command's own kind (`own_kind`: a run of an
    earlier version) is taken as the run's own; any other folder's matching entries are someone else's."""
    patterns = tuple(patterns)
    if not patterns or not Path(run_dir).is_dir():
        return []
    listed = listed_run_files(run_dir)
    if listed is None and own_kind:
        return []
    ours = tuple(listed or ())
    return sorted(
        entry.name
        for entry in Path(run_dir).iterdir()
        if _matches(entry.name, patterns) and not _matches(entry.name, ours)
    )


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


class RunLock:
    """One rank's part of its run directory's claim (`common.claims`), held until `release()` or the process ends.
    Taken again where the command's `--output` rule took it already (`common.outputs.check_output`)."""

    def __init__(self, path: Path, claim: claims.Claim) -> None:
        self.path = path  # this rank's claim file
        self.claim: claims.Claim | None = claim

    @classmethod
    def acquire(cls, run_dir: Path, env: DistEnv, who: str = "trainer") -> RunLock:
        """Claim `run_dir` as this rank of its job, or raise RunDirError naming the `who` (e.g. "`finetune train`")
        and the process that holds it."""
        try:
            claim = claims.take(run_dir, Part.of(env))
        except ClaimError as err:
            raise in_use(run_dir, who, f"{err.holder} holds {err.file}") from None
        return cls(claim.file, claim)

    def release(self) -> None:
        if self.claim is not None:
            self.claim.release()
            self.claim = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def in_use(run_dir: Path, who: str, holder: str) -> RunDirError:
    return RunDirError(
        f"run directory {run_dir} is in use by another {who}: {holder}. Two of them on one run directory would "
        "interleave their files; wait for it to end, stop it, or use another --output"
    )


def release_inherited_locks() -> None:
    """In a forked child (a DataLoader worker): close the copies of the claims' descriptors, so that the claim lives
    and dies with the trainer process alone (done at every fork already: `common.claims`; kept for callers)."""
    claims.forget_in_child()


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
