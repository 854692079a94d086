"""One writer per output, on one machine or across the hosts of a cluster: a command claims its output before it
looks at it or writes it, and holds the claim until it ends (`common.outputs.check_output` takes it inside a command,
`common.cli.run_command` gives it back however the command ends; the trainers take their run directory's claim
themselves, `common.run_dir.RunLock`).

A claim is a folder beside the output, `.NAME.claim/`, in the output's parent with symbolic links resolved: two
spellings of one output meet at one claim (a bind mount or another case of the same folder is the same directory, so
the same files and locks). It holds one file per part of the job that writes the output (`Part`): `0` for a command
of one process; for a multi-rank training job (or a corpus tokenised by an array of tasks), each rank's own, so that
the parts of one job share the output and no other process does (a file each: Linux NFS emulates flock with
whole-file POSIX locks, so parts cannot share one file's lock). Each part holds an exclusive `flock` on its file
for its life, and has written who it is into it (pid, host, command, start time, job). The kernel drops a flock when
its holder ends, however it ends (SIGKILL included; NFS frees a crashed client's locks after its lease), so a held
lock is a live writer on any host that shares the file system, and a file whose lock anyone can take was left by a
dead one: a stale claim, taken over with a note that names it.

Taking a claim: lock this part's file (refused, naming the holder, when its lock is held), write who it is, then look
at the other parts' files: one held by a process of another job refuses this one too; a dead one's file is removed.
The record goes in before the look, not after: the ranks of a job all start at once, and each one reading another's
file must find its record there (a held file without one is waited for `RECORD_WAIT_S`, then refused as "not
written its name yet"); written after the look, every rank waited on the others' records while holding back its own,
and on a loaded node all of a 16-rank job refused one another. A file is
removed only by a process that holds its lock, and a lock taken on a file that its name no longer points to (removed
meanwhile) is taken again on the new one, so two processes never both hold one part. Released: the file, the folder
when no other part is left, and the folders that were made for it. Forked children (DataLoader workers, process
pools) close their copies of the lock at once, so a claim ends with the process that took it. On a file system
without `flock` (Lustre mounted without `-o flock`) the part's file is created exclusively instead: a live holder on
this host is told from a dead one by its pid, one on another host is refused with the file to remove if it is dead.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .dist import DistEnv
from .errors import UserError

SUFFIX = ".claim"
NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
RECORD_WAIT_S = 2.0  # how long a held claim may stay without its holder's record (the write after the lock)


class ClaimError(UserError):
    """Another live process writes this output: `holder` says who (`describe`), `file` is its claim file."""

    def __init__(self, message: str, holder: str = "", file: Path | None = None) -> None:
        super().__init__(message)
        self.holder, self.file = holder, file


@dataclass(frozen=True)
class Part:
    """Which part of a job this process is: `slot` (its rank, or its array task) and `job`, a key that every part of
    one job computes alike and no other job does (None: a process alone, which shares its output with nobody)."""

    slot: int = 0
    job: str | None = None

    @classmethod
    def of(cls, env: DistEnv) -> Part:
        """The part of a multi-rank job this rank is: its rank, in the job that its launcher, rendezvous address,
        world size and Slurm job step (or torchrun run id) name; a single process is `Part()`."""
        if env.world_size <= 1:
            return cls()
        key = [env.launcher, f"{env.master_addr}:{env.master_port}", f"world {env.world_size}"]
        if os.environ.get("SLURM_JOB_ID"):
            key.append(f"slurm {os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', '')}")
        if os.environ.get("TORCHELASTIC_RUN_ID"):
            key.append(f"run {os.environ['TORCHELASTIC_RUN_ID']}")
        return cls(env.rank, " ".join(key))

    @classmethod
    def task(cls, index: int, count: int) -> Part:
        """Task `index` of `count` that split one output's work between them (`data_prep tokenize`: a Slurm array's
        tasks, or `--num-tasks/--task-index`): one job, that of the array when Slurm runs it."""
        if count <= 1:
            return cls()
        array = os.environ.get("SLURM_ARRAY_JOB_ID")
        return cls(index, f"array {array} of {count} tasks" if array else f"{count} tasks")


class Claim:
    """This process's hold on one output (see the module docstring); `release()` gives it back. Taken again by the
    same process it is counted, and given back when the last holder releases it (or the command ends)."""

    def __init__(self, output: Path, file: Path, fd: int | None, made: list[Path]) -> None:
        self.output, self.file, self.fd, self.made = output, file, fd, made
        self.count = 1
        self.run_files: tuple[str, ...] = ()  # what a run writes in the output folder (common.run_dir's list)

    def release(self, force: bool = False) -> None:
        self.count -= 1
        if (self.count > 0 and not force) or _HELD.get(self.file) is not self:
            return
        del _HELD[self.file]
        with contextlib.suppress(OSError):
            self.file.unlink()  # under the lock: whoever opened it before finds it gone and tries again
        if self.fd is not None:
            os.close(self.fd)
        for folder in (self.file.parent, *reversed(self.made)):  # the last part out, and what was made for it
            with contextlib.suppress(OSError):
                folder.rmdir()


_HELD: dict[Path, Claim] = {}  # this process's claims, by their part file
_COMMAND: list[tuple[str, str]] = []  # (program, command line) running (common.cli.run_command); empty: not in one


def claim_folder(output: str | os.PathLike) -> Path:
    """`.NAME.claim` beside `output` (symbolic links resolved); `NAME/.claim` inside an existing output folder whose
    parent this user may not write (a shared project folder), where the folder's own writers claim it alike."""
    real = Path(os.path.realpath(os.path.expanduser(str(output))))
    beside = real.parent / f".{real.name or 'root'}{SUFFIX}"
    if real.is_dir() and real.parent.is_dir() and not os.access(real.parent, os.W_OK) and os.access(real, os.W_OK):
        return real / SUFFIX
    return beside


def take(output: str | os.PathLike, part: Part = Part(), flag: str = "--output") -> Claim:
    """Claim `output` for this process as `part` of its job (see the module docstring), or raise ClaimError naming
    the live holder. A stale claim (its holder is dead) is taken over with a note on stderr. An OSError (a read-only
    or full file system, no permission) names `output`."""
    folder = claim_folder(output)
    file = folder / str(part.slot)
    if file in _HELD:
        _HELD[file].count += 1
        return _HELD[file]
    try:
        return _take(Path(output), file, part, f"{flag} {output}")
    except OSError as err:
        if str(err.filename or "").startswith(str(folder)):
            err.filename = str(output)
        raise


def _take(output: Path, file: Path, part: Part, head: str) -> Claim:
    made: list[Path] = []
    for _ in range(100):  # a file or folder removed between two calls by a releasing holder: again
        made += _make_folders(file.parent.parent)
        got = _lock_part(file, head)
        if got is None:
            continue
        fd, stale = got
        claim = Claim(output, file, fd, made)
        _HELD[file] = claim
        try:
            _write(fd, file, part)  # first: the parts of one job check each other at the same instant
            stale += _check_other_parts(file.parent, part, head)
        except BaseException:
            claim.release(force=True)
            raise
        for record in stale:
            _say_taken_over(head, record)
        return claim
    raise ClaimError(f"{head}: cannot claim it ({file.parent} keeps changing under this process)")


def _make_folders(folder: Path) -> list[Path]:
    """Make `folder` and its missing parents; return those made (top first), to remove when the claim ends. A file
    in the way is ENOTDIR naming that file."""
    made = []
    for path in [p for p in (folder, *folder.parents) if not p.is_dir()][::-1]:
        try:
            path.mkdir()
            made.append(path)
        except (FileExistsError, NotADirectoryError):
            if path.is_dir():  # made meanwhile by another process
                continue
            blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(blocker)) from None
    return made


def _lock_part(file: Path, head: str) -> tuple[int | None, list[dict]] | None:
    """`file` open and locked by this process with the record it held (a dead holder's, else none), or None when
    it changed meanwhile (try again). Without flock: (None, []) when this process created it."""
    try:
        file.parent.mkdir(exist_ok=True)
        try:
            fd, created = os.open(file, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            fd, created = os.open(file, os.O_RDWR), False
    except FileNotFoundError:  # the folder or the file went with its last holder meanwhile
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        record = _read_record(fd, wait=True)
        os.close(fd)
        raise _held(head, record, file) from None
    except OSError as err:
        os.close(fd)
        if err.errno not in NO_FLOCK:
            raise
        return (None, []) if created else _unlocked_part(file, head)
    if not _is_current(fd, file):
        os.close(fd)
        return None
    record = _read_record(fd)
    return fd, [record] if record else []


def _unlocked_part(file: Path, head: str) -> None:
    """Without flock, another process's part file: removed (try again) when its holder is a dead process of this
    host; else refused, with the file to remove if that process is gone."""
    record = read_record(file)
    if record.get("host") != socket.gethostname() or _alive(record.get("pid")):
        hint = f" (this file system has no locks: if that process is gone, remove {file})"
        raise _held(head, record, file, hint)
    _say_taken_over(head, record)
    with contextlib.suppress(FileNotFoundError):
        file.unlink()
    return None


def _say_taken_over(head: str, record: dict) -> None:
    note = f"{head}: taking over the claim of {describe(record)}, which ended without giving it back"
    print(f"{_prog()}note: {note}", file=sys.stderr, flush=True)


def _check_other_parts(folder: Path, part: Part, head: str) -> list[dict]:
    """Refuse when another part's file is held by a process of another job; remove the files of dead parts and
    return their records."""
    stale = []
    for other in sorted(folder.iterdir()):
        if other.name == str(part.slot) or not other.name.isdigit():
            continue
        try:
            fd = os.open(other, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                record = _read_record(fd, wait=True)
                if part.job is None or record.get("job") != part.job:
                    raise _held(head, record, other) from None
                continue
            except OSError as err:
                if err.errno not in NO_FLOCK:
                    raise
                record = read_record(other)
                if record.get("host") != socket.gethostname() or _alive(record.get("pid")):
                    if part.job is None or record.get("job") != part.job:
                        raise _held(head, record, other) from None
                    continue
            record = _read_record(fd)
            if _is_current(fd, other):
                with contextlib.suppress(FileNotFoundError):
                    other.unlink()
                stale += [record] if record else []
        finally:
            os.close(fd)
    return stale


def _held(head: str, record: dict, file: Path, hint: str = "") -> ClaimError:
    holder = describe(record)
    return ClaimError(
        f"{head} is being written by another process: {holder}, whose claim is {file}{hint}; an output has one "
        f"writer at a time: wait for it to end, stop it, or choose another {head.split()[0]}",
        holder,
        file,
    )


def _is_current(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is still the file at `path` (not removed, not replaced)."""
    try:
        st, now = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)


def _alive(pid: object) -> bool:
    if not isinstance(pid, int):
        return True  # no record yet: assume its writer is about to write it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write(fd: int | None, file: Path, part: Part) -> None:
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": _COMMAND[-1][1] if _COMMAND else _command_line(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "job": part.job,
        "slot": part.slot,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }
    data = (json.dumps(record) + "\n").encode()
    try:
        if fd is None:
            with open(file, "wb") as handle:
                handle.write(data)
        else:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            err.filename = err.filename or str(file)
            raise
        # a full disk: the lock holds without the record (a refused process says "not written its name yet"); the
        # command fails on its own first write, naming its own file
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0) if fd is not None else file.write_bytes(b"")


def _read_record(fd: int, wait: bool = False) -> dict:
    """The record in a claim file; `wait`: its holder has just locked it and may not have written it yet."""
    deadline = time.monotonic() + (RECORD_WAIT_S if wait else 0)
    while True:
        try:
            record = json.loads(os.pread(fd, 8192, 0).decode("utf-8") or "{}")
        except (OSError, UnicodeDecodeError, ValueError):
            record = {}
        if (isinstance(record, dict) and record) or time.monotonic() >= deadline:
            return record if isinstance(record, dict) else {}
        time.sleep(0.01)


def read_record(file: Path) -> dict:
    try:
        fd = os.open(file, os.O_RDONLY)
    except OSError:
        return {}
    try:
        return _read_record(fd)
    finally:
        os.close(fd)


def describe(record: dict) -> str:
    """'pid P on host H (COMMAND, started T, Slurm job J)', as far as the record says."""
    if "pid" not in record:
        return "a process that has not written its name yet"
    job = f", Slurm job {record['slurm_job_id']}" if record.get("slurm_job_id") else ""
    rank = f", rank {record['slot']}" if record.get("job") else ""
    command = record.get("command") or "?"
    return (
        f"pid {record['pid']} on host {record.get('host', '?')} ({command}, started {record.get('started')}{rank}{job})"
    )


def _command_line() -> str:
    """How this process was started, shortly: `python -m finetune predict --input x` (at most 300 characters)."""
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if argv and "python" in Path(argv[0]).name:
        argv[0] = "python"
    text = shlex.join(argv)
    return text if len(text) <= 300 else text[:297] + "..."


def _prog() -> str:
    return f"{_COMMAND[-1][0]}: " if _COMMAND else ""


@contextlib.contextmanager
def command(prog: str, text: str | None = None) -> Iterator[None]:
    """A command of `prog` runs (`common.cli.run_command`): `check_output` claims its outputs, recorded as `text`
    (`finetune predict --input ...`; default: how this process was started), and every claim taken meanwhile is given
    back when it ends, however it ends."""
    before = set(_HELD)
    text = text or _command_line()
    _COMMAND.append((prog, text[:297] + "..." if len(text) > 300 else text))
    try:
        yield
    finally:
        _COMMAND.pop()
        for file in [f for f in _HELD if f not in before]:
            _HELD[file].release(force=True)


def in_command() -> bool:
    """Whether a command runs (claims are taken by `check_output` only then: a library call's lifetime is its
    caller's to know)."""
    return bool(_COMMAND)


def held(output: str | os.PathLike) -> Claim | None:
    """This process's claim of `output` (as part 0 or any rank), if it holds one."""
    folder = claim_folder(output)
    return next((claim for file, claim in _HELD.items() if file.parent == folder), None)


def forget_in_child() -> None:
    """In a forked child: close the copies of the claims' descriptors (the parent's locks stay with the parent) and
    forget the claims, so that the child's exit never removes the parent's files."""
    for claim in _HELD.values():
        if claim.fd is not None:
            with contextlib.suppress(OSError):
                os.close(claim.fd)
    _HELD.clear()


def release_all() -> None:
    for claim in list(_HELD.values()):
        claim.release(force=True)


os.register_at_fork(after_in_child=forget_in_child)
atexit.register(release_all)
