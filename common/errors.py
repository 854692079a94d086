"""The one base class of errors a user can fix, and the exit code every command maps it to.

The one table of exit codes (also in the README's conventions): 0 done, 1 `data_prep verify` found problems,
2 bad input, 3 training diverged, 4 a write failed, 5 another rank of the job died, 74 the operating system refused a
read or write no command expected (`describe_os_error`), 75 preempted (requeue), 130 interrupted.

Each package raises its own subclasses (`data_prep.DataPrepError`, `elasticbert.CheckpointError`,
`pretrain.checkpoint.ResumeError`, `finetune.tasks.DataError`, ...) with a message that names the file, line or key
at fault and what to do; `common.cli.run_command` prints it as `PROG: error: MESSAGE` and exits with
`EXIT_USER_ERROR`, never with a traceback.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence

EXIT_OK = 0
EXIT_USER_ERROR = 2  # bad input: config, data, paths, incompatible checkpoint
EXIT_DIVERGED = 3  # pretrain: a non-finite loss / gradient norm / weight; stopped without saving
EXIT_WRITE_FAILED = 4  # a checkpoint or log could not be written (disk full, I/O error); nothing half-written kept
EXIT_PEER_LOST = 5  # pretrain: a collective failed because another rank is gone; resubmit to resume from `latest`
EXIT_OS_ERROR = 74  # EX_IOERR: the OS refused a read or write (read-only, disk full, no permission, file vs folder)
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: checkpoint written after SIGTERM/SIGUSR1; requeue and rerun the same command
EXIT_INTERRUPTED = 130  # Ctrl-C


class UserError(ValueError):
    """A problem the user can fix; the message says where (file, line, key) and, where it can, how."""

    exit_code = EXIT_USER_ERROR


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
    reason = err.strerror or str(err) or type(err).__name__
    hint = OS_ERROR_HINTS.get(err.errno or 0)
    hint = f": {hint}" if hint and hint.lower() != reason.lower() else ""
    where = paths or "an operating-system call"
    return f"{where}: {reason} ({name or type(err).__name__}{hint})".replace(os.linesep, " ")
