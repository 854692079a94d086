"""Small helpers: canonical JSON (so manifests compare byte for byte), hashing, and canonical JSON written atomically
(through `common.io`, the one temp-then-rename helper)."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from common.io import atomic_write_bytes

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
    atomic_write_bytes(path, data)
    return data


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)
