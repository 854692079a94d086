"""The one base class of errors a user can fix, and the exit code every command maps it to.

The one table of exit codes (also in docs/reliability.md): 0 done, 1 `data_prep verify` found problems,
2 bad input, 3 training diverged, 4 a write failed, 5 another rank of the job died, 74 the operating system refused a
read or write no command expected (`describe_os_error`), 75 preempted (requeue), 130 interrupted (Ctrl-C), 143
terminated (SIGTERM, where the command has no handler of its own: the trainers checkpoint and exit 75).

Each package raises its own subclasses (`data_prep.DataPrepError`, `elasticbert.CheckpointError`,
`pretrain.checkpoint.ResumeError`, `finetune.tasks.DataError`, ...) with a message that names the file, line or key
at fault and what to do; `common.cli.run_command` prints it as `PROG: error: MESSAGE` and exits with
`EXIT_USER_ERROR`, never with a traceback.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Sequence

EXIT_OK = 0
EXIT_USER_ERROR = 2  # bad input: config, data, paths, incompatible checkpoint
EXIT_DIVERGED = 3  # pretrain: a non-finite loss / gradient norm / weight; stopped without saving
EXIT_WRITE_FAILED = 4  # a checkpoint or log could not be written (disk full, I/O error); nothing half-written kept
EXIT_PEER_LOST = 5  # pretrain: a collective failed because another rank is gone; resubmit to resume from `latest`
EXIT_OS_ERROR = 74  # EX_IOERR: the OS refused a read or write (read-only, disk full, no permission, file vs folder)
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: checkpoint written after SIGTERM/SIGUSR1; requeue and rerun the same command
EXIT_INTERRUPTED = 130  # Ctrl-C
EXIT_TERMINATED = 143  # SIGTERM (128 + 15) where the command installs no handler of its own: cleaned up, as Ctrl-C


class UserError(ValueError):
    """A problem the user can fix; the message says where (file, line, key) and, where it can, how."""

    exit_code = EXIT_USER_ERROR


class Terminated(BaseException):
    """SIGTERM reached a command that has no handler of its own (`kill`, `timeout`, a job's end): raised in its main
    thread like a KeyboardInterrupt, so that it stops the same way - temporaries removed, claims given back - and
    exits `EXIT_TERMINATED` (`common.interrupts`)."""


class ConfigError(UserError):
    """An invalid run configuration (a YAML run config or a command's options).

    `ConfigError("--lambda must be within [0, 1]")` carries one message; `ConfigError([...], source="x.yaml")`
    collects every problem found so that one run shows them all, one per line.
    """

    def __init__(self, problems: str | Sequence[str], source: str | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if source is None and len(self.problems) == 1:
            message = self.problems[0]
        else:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            message = f"invalid {source or 'config'}:\n{lines}"
        super().__init__(message)


OS_ERROR_HINTS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is full",
    errno.EROFS: "the filesystem is read-only",
    errno.EACCES: "permission denied: check the owner and mode of the path",
    errno.EPERM: "not permitted: check the owner and mode of the path",
    errno.ENOTDIR: "a file stands where a folder is expected",
    errno.EISDIR: "a folder stands where a file is expected",
    errno.ENOENT: "no such file or folder",
}


def describe_os_error(err: OSError) -> str:
    """One line for an OSError: the path(s), what the OS said, its errno name, and what that usually means."""
    paths = " -> ".join(str(p) for p in (err.filename, err.filename2) if p)
    name = errno.errorcode.get(err.errno or 0, "")
    reason = err.strerror or (str(err.args[0]) if err.args else "") or type(err).__name__
    hint = OS_ERROR_HINTS.get(err.errno or 0)
    hint = f": {hint}" if hint and hint.lower() != reason.lower() else ""
    where = paths or "an operating-system call"
    return f"{where}: {reason} ({name or type(err).__name__}{hint})".replace(os.linesep, " ")


# Libraries that write files in native code report a failed write in their own words: safetensors (Rust) as
# "I/O error: No space left on device (os error 28)", torch.save's zip writer as "unexpected pos N vs M" or "file
# write failed" (a short write, which on a local disk means it is full). `os_error_of` turns such an exception back
# into the OSError it stands for, so that it is reported as one (the path, the errno, exit 74) instead of as a
# traceback or a "corrupt position".
_OS_ERROR_NUMBER = re.compile(r"\(os error (\d+)\)")
_ERRNO_WORDS = {
    "No space left on device": errno.ENOSPC,
    "Disk quota exceeded": errno.EDQUOT,
    "Read-only file system": errno.EROFS,
    "Permission denied": errno.EACCES,
}
_SHORT_WRITE = ("unexpected pos", "file write failed", "PytorchStreamWriter failed writing")
# numpy's `tofile`/`save` on a full disk: OSError("100000 requested and 2032 written"), no errno: as it stands it
# prints "[Errno None] None" once a file name is attached
_SHORT_WRITE_OS = re.compile(r"\d+ requested and \d+ written")
LOW_SPACE_BYTES = 1 << 20  # a filesystem with less free than this after a short write was full


def os_error_of(err: BaseException, path: str | os.PathLike | None = None) -> OSError | None:
    """The OSError `err` stands for, naming `path` when it names no file itself (None: `err` is not about the
    operating system): an OSError as it is (one of a short write that gives no errno, numpy's, as below); a
    library's exception that wraps one (see above) as a new OSError. A short write with no reason given is ENOSPC
    when the filesystem of `path` is (nearly) full, else EIO."""
    if isinstance(err, OSError):
        if err.errno is None and _SHORT_WRITE_OS.search(str(err.args[0]) if err.args else ""):
            where = path if path is not None else err.filename
            code = errno.ENOSPC if _nearly_full(where) else errno.EIO
            return OSError(code, os.strerror(code), None if where is None else str(where))
        if path is not None and not err.filename:
            err.filename = str(path)
        return err
    if isinstance(err, UserError):  # already a message for the user (it may quote an OS error's words)
        return None
    text = str(err)
    number = _OS_ERROR_NUMBER.search(text)
    code = int(number.group(1)) if number else next((c for w, c in _ERRNO_WORDS.items() if w in text), None)
    if code is None and any(marker in text for marker in _SHORT_WRITE):
        code = errno.ENOSPC if _nearly_full(path) else errno.EIO
    if code is None:
        return None
    return OSError(code, os.strerror(code), None if path is None else str(path))


def _nearly_full(path: str | os.PathLike | None) -> bool:
    """Whether the filesystem holding `path` (or its nearest existing parent) has almost no free space left."""
    if path is None:
        return False
    place = os.path.abspath(path)
    while place and not os.path.exists(place):
        place = os.path.dirname(place)
    try:
        return shutil.disk_usage(place or "/").free < LOW_SPACE_BYTES
    except OSError:
        return False
