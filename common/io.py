"""Atomic writes: a reader (or a job resumed after a kill) sees the old file or the complete new one, never half.

Everything is written under a temporary name in the destination's directory (same filesystem, so the final
`os.replace` is atomic), flushed and fsynced, then renamed; the directory is fsynced so the rename survives a crash.
`atomic_path` does the same for anything a library writes by path (safetensors, `save_pretrained`, a directory).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, replace: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success move it to `path` (a file or a directory).

    On an exception the temporary is removed and `path` is untouched. An existing directory at `path` is replaced
    only when `replace` (its removal and the rename are then two steps, like every directory swap on POSIX).
    """
    path = Path(path)
    tmp = temporary_sibling(path)
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
    except BaseException:
        _remove(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically (see the module docstring)."""
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
