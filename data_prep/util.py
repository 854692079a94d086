"""Small filesystem helpers: atomic writes, hashing, canonical JSON (so manifests compare byte for byte)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

HASH_BLOCK = 8 << 20


def canonical_json(obj: Any) -> str:
    """Deterministic JSON text (sorted keys, fixed separators) so equal content gives equal bytes and hashes."""
    return json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    """Stream the file through sha256 in 8 MiB blocks (never loads it whole)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(HASH_BLOCK)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


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


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write to a temp name in the same directory, fsync, rename: readers see the old file or the new, never half."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> bytes:
    """Canonical JSON written atomically; returns the bytes written (callers hash them)."""
    data = canonical_json(obj).encode("utf-8")
    atomic_write_bytes(path, data)
    return data


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)
