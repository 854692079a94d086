"""Small helpers: canonical JSON (so manifests compare byte for byte; written atomically by `common.io`, the one
temp-then-rename helper, with `**CANONICAL`), hashing, and reading back a JSON record data_prep wrote."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from common.io import read_object

from .errors import DataPrepError

# data_prep's JSON files are canonical: equal content gives equal bytes (and hashes), whatever wrote it
CANONICAL = {"indent": 1, "sort_keys": True}


def canonical_json(obj: Any) -> str:
    """Deterministic JSON text (sorted keys, fixed separators): what `atomic_write_json(path, obj, **CANONICAL)`
    writes."""
    return json.dumps(obj, ensure_ascii=False, **CANONICAL) + "\n"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_json_record(path: str | os.PathLike, todo: str) -> dict[str, Any]:
    """A JSON object written by data_prep; a damaged one (not UTF-8 JSON, not an object) is a DataPrepError naming
    the file and saying what to do (`todo`)."""
    return read_object(path, DataPrepError, "a JSON object (the file is damaged)", hint=todo)
