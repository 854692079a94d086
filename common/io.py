"""Atomic writes: a reader (or a job resumed after a kill) sees the old file or the complete new one, never half.

Everything is written under a temporary name in the destination's directory (same filesystem, so the final
`os.replace` is atomic), flushed and fsynced, then renamed; the directory is fsynced so the rename survives a crash.
`atomic_path` does the same for anything a library writes by path (safetensors, `save_pretrained`, a directory).
`read_object` is the one reader of a JSON or YAML object that names the file in every failure.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import UserError


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename inside `path` durable (ignored where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temporary_sibling(path: str | os.PathLike) -> Path:
    """`.NAME.tmpPID` beside `path`: same filesystem, hidden, unique per process."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():  # nothing to remove: no call that a read-only filesystem refuses
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_siblings(path: Path) -> list[Path]:
    """Remove the temporary siblings of `path` that processes of this machine left when they died (a killed export,
    a killed save): their `.NAME.tmpPID` names a process that no longer exists. Live writers' are kept."""
    removed = []
    with contextlib.suppress(OSError):
        for sibling in path.parent.glob(f".{glob.escape(path.name)}.tmp*"):
            pid = sibling.name.rsplit(".tmp", 1)[-1]
            if pid.isdigit() and int(pid) != os.getpid() and not _process_alive(int(pid)):
                _remove(sibling)
                removed.append(sibling)
    return removed


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, replace: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success move it to `path` (a file or a directory).

    On an exception the temporary is removed and `path` is untouched. An existing directory at `path` is replaced
    only when `replace` (its removal and the rename are then two steps, like every directory swap on POSIX).
    """
    path = Path(path)
    tmp = temporary_sibling(path)
    remove_stale_siblings(path)
    _remove(tmp)
    try:
        yield tmp
        if tmp.is_file():
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        if path.is_dir() and not path.is_symlink():
            if not replace:
                raise FileExistsError(f"{path} exists")
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException as err:
        _remove(tmp)
        if isinstance(err, OSError):
            _name_the_target(err, tmp, path)
        raise
    fsync_dir(path.parent)


def _name_the_target(err: OSError, tmp: Path, path: Path) -> None:
    """An error about our temporary (or a file inside it) names the path the user asked for instead."""
    for attr in ("filename", "filename2"):
        value = getattr(err, attr, None)
        if isinstance(value, str | os.PathLike) and str(value).startswith(str(tmp)):
            setattr(err, attr, str(path) + str(value)[len(str(tmp)) :])


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically (see the module docstring). A failed write raises its OSError naming
    `path` (a failed `write()` on an open file names no file by itself)."""
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            f.write(data)
            f.flush()
    except OSError as err:
        if not err.filename:
            err.filename = str(path)  # a failed write() names no file by itself
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2, sort_keys: bool = False) -> bytes:
    """JSON text written atomically; returns the bytes written (callers may hash them)."""
    data = (json.dumps(obj, indent=indent, sort_keys=sort_keys, ensure_ascii=False) + "\n").encode("utf-8")
    atomic_write_bytes(path, data)
    return data


def read_object(
    path: str | os.PathLike,
    error: type[Exception] = UserError,
    what: str = "a JSON object",
    hint: str = "",
    yaml_text: bool | None = None,
) -> dict[str, Any]:
    """The mapping a JSON file (or a YAML one: `.yaml`/`.yml`, any suffix with `yaml_text`) holds, read back with
    every failure as one `error` naming the file (and, for JSON, the line and column): missing, unreadable, not UTF-8,
    not valid JSON/YAML, not `what` (an object; an empty YAML file is an empty one). `hint` says what to do and ends
    every message."""
    path = Path(path)
    tail = f"; {hint}" if hint else ""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{path}: no such file{tail}") from None
    except UnicodeDecodeError as err:
        raise error(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}){tail}") from None
    except OSError as err:
        raise error(f"{path}: cannot read it ({err.strerror or err}){tail}") from None
    if yaml_text or (yaml_text is None and path.suffix in (".yaml", ".yml")):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise error(f"{path}: not valid YAML ({err}){tail}") from None
        data = {} if data is None else data
        if not isinstance(data, dict):
            raise error(f"{path}: expected {what}, found {type(data).__name__}{tail}")
        return data
    return parse_object(text, str(path), error, what, hint)


def parse_object(
    text: str,
    where: str,
    error: type[Exception] = UserError,
    what: str = "a JSON object",
    hint: str = "",
    record: bool = False,
) -> dict[str, Any]:
    """The JSON object `text` holds (a file's content, or with `record` one line of a JSONL file), every failure one
    `error` at `where` — `FILE:LINE:COLUMN` for a file, `where` (which names the line) and the column for a record."""
    tail = f"; {hint}" if hint else ""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        if record:
            raise error(f"{where}: not valid JSON ({err.msg} at column {err.colno}){tail}") from None
        raise error(f"{where}:{err.lineno}:{err.colno}: not valid JSON ({err.msg}){tail}") from None
    if not isinstance(data, dict):
        raise error(f"{where}: expected {what}, found {type(data).__name__}{tail}")
    return data
