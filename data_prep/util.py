"""Small helpers: canonical JSON (so manifests compare byte for byte), hashing, and canonical JSON written atomically
(through `common.io`, the one temp-then-rename helper)."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from common.io import atomic_write_bytes

from .errors import DataPrepError, with_path

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


def atomic_write_json(path: str | os.PathLike, obj: Any) -> bytes:
    """Canonical JSON written atomically (`common.io.atomic_write_bytes`); returns the bytes written (callers hash
    them)."""
    data = canonical_json(obj).encode("utf-8")
    try:
        atomic_write_bytes(path, data)
    except OSError as err:  # a failed write() names no file
        raise with_path(err, path) from None
    return data


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_json_record(path: str | os.PathLike, todo: str) -> dict[str, Any]:
    """A JSON object written by data_prep; a damaged one (not UTF-8 JSON, not an object) is a DataPrepError naming
    the file and saying what to do (`todo`)."""
    try:
        obj = read_json(path)
    except OSError as err:
        raise DataPrepError(f"{path}: cannot read ({err.strerror or err}); {todo}") from None
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
        raise DataPrepError(f"{path}: damaged, not valid UTF-8 JSON ({err}); {todo}") from None
    if not isinstance(obj, dict):
        raise DataPrepError(f"{path}: damaged, a JSON {type(obj).__name__} instead of an object; {todo}")
    return obj
