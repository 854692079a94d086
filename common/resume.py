"""What both trainers need to refuse a resume under another config: the keys whose values changed, readably."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def config_differences(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    """`key: old -> new` for each dotted key whose value differs between two nested config dicts (sorted)."""
    diffs: list[str] = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            diffs.extend(config_differences(a, b, name))
        elif a != b:
            diffs.append(f"{name}: {a!r} -> {b!r}")
    return diffs


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any], ignored: Iterable[str] = ()) -> list[str]:
    """`config_differences` without the keys in `ignored` (settings that do not change the numbers)."""
    skip = set(ignored)
    return [d for d in config_differences(old, new) if d.split(":", 1)[0] not in skip]
