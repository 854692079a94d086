"""What `tokenize` records in its manifest about inputs that come from a `data_prep dedup` output: the output's
directory, the sha256 of its `dedup_report.json` (so a pre-training run names exactly which data it saw), the dedup
parameters and evaluation sets, and the kept totals — after checking the output against its `checksums.json` (the
size of every file, the hash of the report, no file added). Light on purpose (no rensa, no numpy): tokenize imports
it whether or not dedup was used.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common.integrity import CHECKSUMS, read_checksums, sha256_file
from common.io import read_object

from ..errors import DataPrepError

REPORT = "dedup_report.json"
TEXT_DIR = "text"


def _dedup_root(path: Path) -> Path | None:
    """The dedup output a tokenize input path lies in (OUT, OUT/text, OUT/text/<corpus>/part...), or None."""
    for p in [path, *path.parents]:
        if (p / REPORT).is_file() and (p / CHECKSUMS).is_file():
            return p
        if p.name == TEXT_DIR and (p.parent / REPORT).is_file():
            return p.parent
    return None


def _verified_entry(root: Path) -> dict[str, Any]:
    recorded = read_checksums(root)
    if recorded is None:
        raise DataPrepError(f"{root}: dedup output without {CHECKSUMS} (unfinished?): rerun its dedup command")
    problems = []
    if sha256_file(root / REPORT) != recorded.get(REPORT, {}).get("sha256"):
        problems.append(f"{root / REPORT}: differs from {CHECKSUMS}")
    for name, rec in recorded.items():
        path = root / name
        if not path.is_file() or path.stat().st_size != rec["size"]:
            problems.append(f"{path}: missing or of another size than {CHECKSUMS} records")
    extra = [p for p in (root / TEXT_DIR).rglob("*") if p.is_file() and p.relative_to(root).as_posix() not in recorded]
    problems += [f"{p}: not part of the dedup output (added after it was sealed)" for p in extra]
    if problems:
        raise DataPrepError(f"{problems[0]}; the dedup output was changed after it was written: rerun dedup")
    report = read_object(root / REPORT, DataPrepError, hint="rerun dedup")
    return {
        "dir": str(root),
        "report_sha256": recorded[REPORT]["sha256"],
        "plan_hash": report["plan_hash"],
        "params": report["params"],
        "params_sha256": report["params_sha256"],
        "eval_sets": [{k: s[k] for k in ("name", "sha256", "n")} for s in report["eval_sets"]],
        "docs_kept": report["totals"]["docs_kept"],
        "bytes_kept": report["totals"]["bytes_kept"],
    }


def dedup_manifest_entry(paths: Sequence[str | os.PathLike]) -> list[dict[str, Any]] | None:
    """For tokenize's manifest: one entry per dedup output the source `paths` come from (None when none do), each
    checked against its checksums (a DataPrepError naming the file when it was changed)."""
    roots: dict[str, Path] = {}
    seen: dict[str, Path | None] = {}
    for item in paths:
        parent = str(Path(item).parent)
        if parent not in seen:
            seen[parent] = _dedup_root(Path(item))
        if seen[parent] is not None:
            roots[str(seen[parent])] = seen[parent]  # type: ignore[assignment]
    return [_verified_entry(roots[k]) for k in sorted(roots)] or None
