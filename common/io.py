"""Atomic writes: a reader (or a job resumed after a kill) sees the old file or the complete new one, never half.

Everything is written under a temporary name in the destination's directory (same filesystem, so the final
`os.replace` is atomic), flushed and fsynced, then renamed; the directory is fsynced so the rename survives a crash.
`atomic_path` does the same for anything a library writes by path (safetensors, `save_pretrained`, a directory).
`read_object` is the one reader of a JSON or YAML object that names the file in every failure.

Every write path knows the file it writes: a failure inside `atomic_path` (a `write()` or `close()` that names no
file, a library's own exception for a full disk: `common.errors.os_error_of`) comes out as an OSError naming the
path the caller asked for, never the temporary, so that the one-line report (`common.cli.run_command`: the path and
the errno, exit 74) says which file could not be written. `removed_on_failure` takes back what a command created
under its output (the folder itself, when the command made it) when the command fails, so that a failed run leaves
no empty folder or lone file behind that looks like a result.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from .errors import UserError, os_error_of


def make_dirs(path: str | os.PathLike) -> Path:
    """`mkdir -p` for an output folder that names the culprit: a file where a folder is expected is ENOTDIR naming
    that file (`Path.mkdir` says "File exists", or names the folder it was asked for)."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(blocker)) from None
    return path


def path_problem(path: str | os.PathLike) -> str | None:
    """Why `path` is not the file a command expects to read, as the phrase of a one-line error `PATH: PHRASE`, or
    None when it is one: "no such file", "is a folder, not a file", "no such file: PARENT is a file, not a folder"."""
    path = Path(path)
    try:
        is_dir = stat.S_ISDIR(path.stat().st_mode)
    except NotADirectoryError:
        blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), path)
        return f"no such file: {blocker} is a file, not a folder"
    except FileNotFoundError:
        return "no such file"
    except OSError as err:
        return f"cannot read it ({err.strerror or err})"
    return "is a folder, not a file" if is_dir else None


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


def temporary_sibling(path: str | os.PathLike, keep_suffix: bool = False) -> Path:
    """`.NAME.tmpPID` beside `path`: same filesystem, hidden, unique per process (`keep_suffix`: `.NAME.tmpPID.png`,
    for writers that choose the format by the suffix, as matplotlib does)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp{os.getpid()}{path.suffix if keep_suffix else ''}")


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
            tail = sibling.name.rsplit(".tmp", 1)[-1]
            pid = tail.removesuffix(path.suffix) if path.suffix and not tail.isdigit() else tail  # (keep_suffix)
            if pid.isdigit() and int(pid) != os.getpid() and not _process_alive(int(pid)):
                _remove(sibling)
                removed.append(sibling)
    return removed


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, replace: bool = True, keep_suffix: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success move it to `path` (a file or a directory).

    On an exception the temporary is removed and `path` is untouched. An existing directory at `path` is replaced
    only by a directory and only when `replace` (never by a file: EISDIR naming `path`; the removal and the rename
    are then two steps, like every directory swap on POSIX). The block writes `path`: an OSError it raises that
    names no file names `path`, one about the temporary names `path` (or the file inside it), and a library's
    exception that stands for an OSError (a full disk under torch.save or safetensors) is raised as that OSError (see
    the module docstring). `keep_suffix`: see `temporary_sibling`.
    """
    path = Path(path)
    tmp = temporary_sibling(path, keep_suffix)
    remove_stale_siblings(path)
    _remove(tmp)
    try:
        yield tmp
        if tmp.is_file():
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        if path.is_dir() and not path.is_symlink():
            if not tmp.is_dir():  # a file never replaces a folder (whatever the caller was told: see common.outputs)
                raise IsADirectoryError(errno.EISDIR, "a folder is there; a file never replaces one", str(path))
            if not replace:
                raise FileExistsError(f"{path} exists")
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException as err:
        mapped = os_error_of(err, _being_written(tmp)) if isinstance(err, Exception) else None
        _remove(tmp)
        if mapped is None:
            raise
        _name_the_target(mapped, tmp, path)
        if mapped is err:
            raise
        raise mapped from err
    fsync_dir(path.parent)


@contextlib.contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """The block writes the file `path` (a library call: torch.save, safetensors' save_file): its failure comes out
    as an OSError naming `path` (`common.errors.os_error_of`: a full disk in a library's words included)."""
    try:
        yield
    except Exception as err:
        mapped = os_error_of(err, path)
        if mapped is None or mapped is err:
            raise
        raise mapped from err


def _being_written(tmp: Path) -> Path:
    """The file a failed write inside `tmp` was most likely writing: the newest file of a temporary directory (a
    library that writes a folder, such as `save_pretrained`, does not say which of its files failed), else `tmp`."""
    if not tmp.is_dir():
        return tmp
    with contextlib.suppress(OSError):
        files = [(f.stat().st_mtime_ns, f) for f in tmp.rglob("*") if f.is_file()]
        if files:
            return max(files)[1]
    return tmp


def _name_the_target(err: OSError, tmp: Path, path: Path) -> None:
    """An error about our temporary (or a file inside it) names the path the user asked for instead."""
    for attr in ("filename", "filename2"):
        value = getattr(err, attr, None)
        if isinstance(value, str | os.PathLike) and str(value).startswith(str(tmp)):
            setattr(err, attr, str(path) + str(value)[len(str(tmp)) :])


@contextlib.contextmanager
def removed_on_failure(directory: str | os.PathLike) -> Iterator[Path]:
    """Run a block that writes under `directory`; if it fails, remove what it created there — every file and folder
    that was not there before, and `directory` itself (with the parents it needed) when the block created it — so a
    failed command leaves no empty output folder or partial result behind. What existed before is kept (files the
    block replaced through `atomic_path` hold their new, complete contents). Yields `directory` as a Path; the
    block creates it when it first writes."""
    directory = Path(directory)
    created_top = None  # the highest folder of `directory`'s path that does not exist yet
    for folder in (directory, *directory.parents):
        if folder.exists() or folder.is_symlink():
            break
        created_top = folder
    before = set(_tree(directory)) if created_top is None else set()
    try:
        yield directory
    except BaseException:
        created = [created_top] if created_top is not None else set(_tree(directory)) - before
        for path in sorted(created, key=lambda p: len(p.parts), reverse=True):  # deepest first
            with contextlib.suppress(OSError):  # a failed clean-up must not hide why the block failed
                _remove(path)
        raise


def _tree(directory: Path) -> list[Path]:
    """Every path under `directory` (nothing when it cannot be listed)."""
    try:
        return list(directory.rglob("*"))
    except OSError:
        return []


def write_all(handle: BinaryIO, data: bytes, name: str | os.PathLike | None = None) -> None:
    """Write every byte of `data` to `handle` and flush it. An unbuffered file's write() (stdout under
    PYTHONUNBUFFERED=1) may write only part of `data` when the disk fills, and a text wrapper over it drops the rest
    without a word; here the rest is written or the failure (ENOSPC) raised, naming `name` (the file being written,
    e.g. `<stdout>`) when the OSError names none."""
    view = memoryview(data)
    try:
        while view:
            written = handle.write(view)  # None: a non-blocking file that takes nothing now (tried again)
            view = view[written or 0 :]
        handle.flush()
    except OSError as err:
        if name is not None and not err.filename:
            err.filename = str(name)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically (see the module docstring). A failed write raises its OSError naming
    `path` (a failed `write()` on an open file names no file by itself)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()


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
    missing_ok: bool = False,
) -> dict[str, Any]:
    """The mapping a JSON file (or a YAML one: `.yaml`/`.yml`, any suffix with `yaml_text`) holds, read back with
    every failure as one `error` naming the file (and, for JSON, the line and column): missing, unreadable, not UTF-8,
    not valid JSON/YAML, not `what` (an object; an empty YAML file is an empty one). `hint` says what to do and ends
    every message. `missing_ok`: no file at `path` reads as {} (an optional file of a model directory)."""
    path = Path(path)
    if missing_ok and not path.is_file():
        return {}
    tail = f"; {hint}" if hint else ""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise error(f"{path}: {path_problem(path) or 'no such file'}{tail}") from None
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


class _Unreadable(Exception):
    pass


def peek_object(path: str | os.PathLike) -> dict[str, Any] | None:
    """The JSON object at `path`, or None when there is none to be had (absent, unreadable, not JSON, not an object):
    for a best-effort look (a resumable unit's record, which is redone when it cannot be read back)."""
    try:
        return read_object(path, _Unreadable)
    except _Unreadable:
        return None


def parse_object(
    text: str | bytes,
    where: str,
    error: type[Exception] = UserError,
    what: str = "a JSON object",
    hint: str = "",
    record: bool = False,
) -> dict[str, Any]:
    """The JSON object `text` holds (a file's content - bytes are UTF-8 -, or with `record` one line of a JSONL
    file), every failure one `error` at `where` — `FILE:LINE:COLUMN` for a file, `where` (which names the line) and
    the column for a record."""
    tail = f"; {hint}" if hint else ""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise error(f"{where}: not UTF-8 text ({err.reason} at byte {err.start}){tail}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        if record:
            raise error(f"{where}: not valid JSON ({err.msg} at column {err.colno}){tail}") from None
        raise error(f"{where}:{err.lineno}:{err.colno}: not valid JSON ({err.msg}){tail}") from None
    if not isinstance(data, dict):
        raise error(f"{where}: expected {what}, found {type(data).__name__}{tail}")
    return data
