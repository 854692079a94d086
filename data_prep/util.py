"""Canonical JSON, so that manifests compare byte for byte (written atomically by `common.io`, the one
temp-then-rename helper, with `**CANONICAL`). Hashing is `common.integrity` (`sha256_bytes`, `sha256_file`); reading
a JSON record back is `common.io` (`read_object`: every failure names the file; `peek_object`: None when it cannot be
read, for a unit that is redone then)."""

from __future__ import annotations

import json
from typing import Any

# data_prep's JSON files are canonical: equal content gives equal bytes (and hashes), whatever wrote it
CANONICAL = {"indent": 1, "sort_keys": True}


def canonical_json(obj: Any) -> str:
    """Deterministic JSON text (sorted keys, fixed separators): what `atomic_write_json(path, obj, **CANONICAL)`
    writes."""
    return json.dumps(obj, ensure_ascii=False, **CANONICAL) + "\n"
