"""The one exception type data_prep raises for problems a user can fix (bad input, wrong directory, disk full, ...),
and the conversion of a failed write (disk full, read-only, no permission) into one."""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator

from common.errors import UserError, os_error_of

DISK_FULL = {errno.ENOSPC: "disk full (no space left on device)", errno.EDQUOT: "disk quota exceeded"}
_TEMP_PART = re.compile(r"(^|/)\.([^/]+)\.tmp\d+(?=/|$)")  # `common.io.temporary_sibling` names: .NAME.tmpPID


class DataPrepError(UserError):
    """A user-facing problem; the message names the file (and line/record) concerned.

    A `common.errors.UserError` (so a ValueError): the CLI prints it as one line and exits with code 2, without a
    traceback.
    """


def with_path(err: OSError, path: str | os.PathLike) -> OSError:
    """`err` naming `path` when it names no file (a failed `write()` on an open file carries no file name), with its
    errno when the writer gave none (numpy's short write on a full disk: `common.errors.os_error_of`)."""
    return os_error_of(err, path)


def write_error(err: OSError, out: str | os.PathLike, after: str) -> DataPrepError:
    """A failed write as a DataPrepError: the file, why (disk full, ...), and `after` (what state the output is in
    and what to do)."""
    err = os_error_of(err, out)  # an errno for a short write that gave none
    where = _TEMP_PART.sub(r"\1\2", str(err.filename or out))  # the file being written, not its temporary name
    reason = DISK_FULL.get(err.errno or 0) or err.strerror or (str(err.args[0]) if err.args else "") or "failed"
    todo = "free space (or use another --output)" if err.errno in DISK_FULL else "fix the problem"
    return DataPrepError(f"{where}: {reason}; {after.format(out=out, todo=todo)}")


INCOMPLETE = "{out} is incomplete (no manifest.json) and resumable: {todo} and rerun the same command"


@contextlib.contextmanager
def output_errors(out: str | os.PathLike, after: str = INCOMPLETE) -> Iterator[None]:
    """Turn an OSError raised while writing into `out` into a DataPrepError (input files are read through
    `data_prep.sources`, which names them itself, so an OSError reaching here is about the output)."""
    try:
        yield
    except OSError as err:
        raise write_error(err, out, after) from err
