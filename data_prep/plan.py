"""What a `tokenize` run will produce, decided before any work is done: the settings (`PrepConfig`), the plan (sources
+ work units), each unit's key, and where a finished unit lives and how to tell it is intact.

Nothing here depends on the number of workers or array tasks: every task of a run computes the same plan and keys.
The output layout and the resume rules are described in `data_prep.pipeline`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from common.config import literal_problems
from common.integrity import sha256_bytes, sha256_file
from common.io import peek_object

from . import sources as S
from .errors import DataPrepError
from .sources import DecodeErrorPolicy, DocBoundary
from .util import canonical_json

log = logging.getLogger("data_prep")

FORMAT_VERSION = 1
SPLITTER = "rules-1"
SPLITS = ("train", "valid")
BYTES_PER_TOKEN = 4  # English WordPiece: ~4.2 bytes of text per token; sizes units so a unit fills ~one shard


@dataclass
class PrepConfig:
    """Settings that change the output (all recorded in the plan and the manifest); the CLI's defaults and choices.

    `doc_boundary`: where a plain-text document ends (see `data_prep.sources`); `on_decode_error`: invalid UTF-8 is
    replaced by U+FFFD and counted, or stops the run naming the file and line.
    """

    shard_tokens: int = 1 << 24
    unit_bytes: int = 0  # 0: shard_tokens * BYTES_PER_TOKEN
    valid_fraction: float = 0.01
    split_seed: int = 0
    doc_boundary: DocBoundary = "auto"
    strip_gutenberg: bool = True
    on_decode_error: DecodeErrorPolicy = "replace"
    text_field: str = "text"
    hf_split: str = "train"
    max_doc_bytes: int = 8 << 20
    max_sentence_tokens: int = 0  # 0: keep sentences whole

    def resolved(self) -> dict[str, Any]:
        """Validated settings as a dict (unit_bytes filled in); every problem named by its command-line flag."""
        problems = literal_problems(self, key=lambda name: "--" + name.replace("_", "-"))
        if self.shard_tokens < 1:
            problems.append(f"--shard-tokens must be >= 1 (got {self.shard_tokens})")
        if not 0.0 <= self.valid_fraction < 1.0:
            problems.append(f"--valid-fraction must be in [0, 1) (got {self.valid_fraction})")
        if self.max_sentence_tokens < 0:
            problems.append(f"--max-sentence-tokens must be >= 0 (got {self.max_sentence_tokens})")
        if self.max_doc_bytes < 1024:
            problems.append(f"--max-doc-bytes must be >= 1K (got {self.max_doc_bytes} bytes)")
        unit_bytes = int(self.unit_bytes or self.shard_tokens * BYTES_PER_TOKEN)
        if unit_bytes < 1024 and not problems:
            problems.append(f"unit size must be >= 1 KiB (got {unit_bytes} bytes)")
        if problems:
            raise DataPrepError("; ".join(problems))
        return {**asdict(self), "unit_bytes": unit_bytes}


def make_config(config: PrepConfig | None = None, **overrides: Any) -> PrepConfig:
    """`config` (or the defaults) with `overrides` applied; an unknown name is a programming error (TypeError)."""
    cfg = config or PrepConfig()
    names = {f.name for f in fields(PrepConfig)}
    for k, v in overrides.items():
        if k not in names:
            raise TypeError(f"unknown setting {k!r}")
        setattr(cfg, k, v)
    return cfg


# ------------------------------------------------------------------------------------------------ planning


def build_plan(
    inputs: Sequence[str], cfg: dict[str, Any], tokenizer_sha256: str, out_dir: Path | None, allow_empty: bool = False
) -> dict[str, Any]:
    """Sources (described, sorted) + units. Depends on the inputs and settings only."""
    specs = S.discover(inputs, exclude=out_dir)
    described = []
    for spec in specs:
        rec = S.describe(spec, cfg["doc_boundary"], cfg["strip_gutenberg"], cfg["hf_split"], cfg["text_field"])
        if rec["size"] == 0 or (rec["kind"] in ("hf", "hub") and rec["end"] == 0):
            if allow_empty:
                log.warning("%s: empty input, skipped", rec["path"])
                continue
            raise DataPrepError(f"{rec['path']}: empty input file; pass --allow-empty to skip empty inputs")
        described.append(rec)
    units = S.plan_units(described, cfg["unit_bytes"], cfg["max_doc_bytes"])
    if not units:
        raise DataPrepError(f"no input data in {', '.join(map(str, inputs))}")
    return {
        "format_version": FORMAT_VERSION,
        "tokenizer_sha256": tokenizer_sha256,
        "config": cfg,
        "splitter": SPLITTER,
        "sources": described,
        "units": units,
    }


def plan_hash(plan: dict[str, Any]) -> str:
    return sha256_bytes(canonical_json(plan).encode())


def settings_hash(plan: dict[str, Any]) -> str:
    """Everything but the inputs: format, tokenizer, settings, splitter."""
    keys = ("format_version", "tokenizer_sha256", "config", "splitter")
    return sha256_bytes(canonical_json({k: plan[k] for k in keys}).encode())


def unit_keys(plan: dict[str, Any]) -> list[str]:
    """A unit's identity: the settings plus exactly the bytes it covers (source identity + range).

    Unit directories are named by it, so after an input file is fixed or added, a rerun redoes only the units
    whose key changed and keeps every other finished unit."""
    base = settings_hash(plan)
    keys = []
    for unit in plan["units"]:
        segs = [[plan["sources"][si], a, b] for si, a, b in unit]
        keys.append(sha256_bytes(canonical_json([base, segs]).encode()))
    return keys


def plan_difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    """A short human description of why two plans differ."""
    if old.get("tokenizer_sha256") != new.get("tokenizer_sha256"):
        return "another tokenizer/vocab"
    oc, nc = old.get("config", {}), new.get("config", {})
    changed = sorted(k for k in set(oc) | set(nc) if oc.get(k) != nc.get(k))
    if changed:
        return "other settings (" + ", ".join(f"{k}: {oc.get(k)!r} -> {nc.get(k)!r}" for k in changed[:4]) + ")"
    op = {s["path"]: s for s in old.get("sources", [])}
    np_ = {s["path"]: s for s in new.get("sources", [])}
    added, removed = sorted(set(np_) - set(op)), sorted(set(op) - set(np_))
    if added or removed:
        return f"other inputs (added: {added[:3]}, removed: {removed[:3]})"
    for p in sorted(op):
        if op[p] != np_[p]:
            return f"changed input {p} (size/mtime differ)"
    return "a different plan"


def manifest_as_plan(manifest: dict[str, Any]) -> dict[str, Any]:
    """The parts of a manifest that `plan_difference` compares."""
    return {
        "tokenizer_sha256": manifest.get("tokenizer", {}).get("sha256"),
        "config": manifest.get("config", {}),
        "sources": manifest.get("sources", []),
    }


# ------------------------------------------------------------------------------------------------ unit store


def units_dir(out: Path) -> Path:
    return out / ".work" / "units"


def unit_dir(out: Path, key: str) -> Path:
    return units_dir(out) / key[:32]


def unit_temp_dirs(out: Path, key: str) -> list[Path]:
    """Temporary directories of a unit left by killed runs (`common.io.atomic_path` names them `.NAME.tmpPID`)."""
    return sorted(units_dir(out).glob(f".{key[:32]}.tmp*"))


def load_unit(out: Path, key: str, rehash: bool) -> dict[str, Any] | None:
    """A finished unit's record if it is complete and intact (hashes re-checked when `rehash`), else None.

    A unit written before [UNK]s were counted (no `unk_tokens`) counts as unfinished: it is redone, with the same
    bytes, so that the manifest's [UNK] totals cover every unit."""
    d = unit_dir(out, key)
    info = peek_object(d / "unit.json")
    if info is None or info.get("unit_key") != key or not isinstance(info.get("unk_tokens"), dict):
        return None
    for split in SPLITS:
        for part in info["parts"].get(split, []):
            for ext in ("bin", "idx"):
                if not _part_file_intact(d / f"{part['name']}.{ext}", part, ext, rehash):
                    return None
    return info


def _part_file_intact(path: Path, part: dict[str, Any], ext: str, rehash: bool) -> bool:
    try:
        if path.stat().st_size != part[f"{ext}_bytes"]:
            return False
    except OSError:
        return False
    if rehash and sha256_file(path) != part[f"{ext}_sha256"]:
        log.warning("%s: sha256 differs from unit.json: the unit will be redone", path)
        return False
    return True


def task_record_path(out: Path, task: int, num_tasks: int) -> Path:
    return out / ".work" / "tasks" / f"task_{task:05d}_of_{num_tasks:05d}.json"


def recorded_task_counts(out: Path) -> list[int]:
    """The array sizes J of the task records in `out` (to name the tasks to rerun)."""
    return sorted({int(p.name.split("_of_")[1].split(".")[0]) for p in (out / ".work" / "tasks").glob("task_*")})
