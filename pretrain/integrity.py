"""Checkpoint integrity: a checksum per file, written when a checkpoint is saved and checked before it is resumed
from, exported or converted, so that bit rot, a truncated file or a half-copied directory is refused by name. Without
it DeepSpeed loads flipped bytes silently (the run continues from NaN weights) and a truncated file fails deep inside
`torch.load`.

`RUN/checkpoints/global_stepN/checksums.json` (format 1, written temp + rename through `common.io`):

    {"format": 1, "algorithm": "sha256",
     "files": {"mp_rank_00_model_states.pt": {"size": 8937509, "sha256": "9f2c..."}, "export/config.json": {...}}}

It lists every regular file of the tag directory (DeepSpeed's model and optimizer states, `client_state.json`,
`export/...`) except itself, and is written after all of them and before `latest` names the tag: its presence marks a
committed checkpoint. Hashing is spread over the ranks (file i by rank i mod world size) at save and at resume, so a
64-rank job reads each byte once. sha256 (`data_prep.util.sha256_file`, the repository's one file hash) runs at
~1-2 GB/s per core with SHA extensions: about a second per rank for an ElasticBERT-large checkpoint.

Independently of the checksums, every `.pt` file gets a structural check (PyTorch's zip container must have its
central directory): a truncated file is named even when checksums are skipped (`--no-verify-checksums`).
"""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from common.errors import UserError
from common.io import atomic_write_json, read_object
from data_prep.util import sha256_file

CHECKSUMS = "checksums.json"
FORMAT = 1
ALGORITHM = "sha256"
# What DeepSpeed / torch raise on a checkpoint that passed verification but still cannot be read (another DeepSpeed
# version, a hand-edited file): caught where checkpoints are loaded and reported with the directory's name.
LOAD_ERRORS = (RuntimeError, OSError, EOFError, KeyError, ValueError, AssertionError, pickle.UnpicklingError)
LOAD_ERRORS += (zipfile.BadZipFile,)


class IntegrityError(UserError):
    """A checkpoint whose files do not match its checksums, are truncated, or hold non-finite weights."""


def list_files(tag_dir: Path) -> list[str]:
    """Every regular file below `tag_dir` (relative, '/'-separated, sorted), without checksums.json and without
    the hidden temporaries of an interrupted atomic write."""
    tag_dir = Path(tag_dir)
    names = []
    for p in tag_dir.rglob("*"):
        rel = p.relative_to(tag_dir)
        if p.is_file() and not p.is_symlink() and rel.as_posix() != CHECKSUMS and not rel.name.startswith("."):
            names.append(rel.as_posix())
    return sorted(names)


def share_of(names: list[str], rank: int, world_size: int) -> list[str]:
    """The files rank `rank` hashes: every `world_size`-th, so the work (and the reading) is spread evenly."""
    return names[rank::world_size]


def hash_files(tag_dir: Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """{name: {"size", "sha256"}} of the given files of `tag_dir`."""
    out = {}
    for name in names:
        path = Path(tag_dir) / name
        out[name] = {"size": path.stat().st_size, ALGORITHM: sha256_file(path)}
    return out


def write_checksums(tag_dir: Path, entries: Mapping[str, dict[str, Any]]) -> None:
    """checksums.json for `tag_dir` (temp + rename): the last file of a checkpoint before `latest` moves."""
    atomic_write_json(
        Path(tag_dir) / CHECKSUMS,
        {"format": FORMAT, "algorithm": ALGORITHM, "files": dict(sorted(entries.items()))},
        sort_keys=False,
    )


def read_checksums(tag_dir: Path) -> dict[str, dict[str, Any]] | None:
    """The recorded {name: entry}, or None when checksums.json is missing; IntegrityError when it is unreadable."""
    path = Path(tag_dir) / CHECKSUMS
    if not path.is_file():
        return None
    data = read_object(path, IntegrityError, "a checksums object", hint="the checkpoint cannot be verified")
    files = data.get("files")
    if not isinstance(files, dict) or data.get("format") != FORMAT or data.get("algorithm") != ALGORITHM:
        raise IntegrityError(f"{path}: not a checksums file of format {FORMAT} ({ALGORITHM})")
    return files


def structural_problem(path: Path) -> str | None:
    """A `.pt` file must be a complete PyTorch zip container (its central directory sits at the end, so a
    truncated file fails here without reading the data)."""
    try:
        with zipfile.ZipFile(path) as z:
            z.namelist()
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        return f"{path}: not a complete PyTorch file ({e}): truncated or corrupt"
    return None


def _entry_problem(path: Path, expected: dict[str, Any]) -> str | None:
    if not path.is_file():
        return f"{path}: missing (listed in {CHECKSUMS})"
    size = path.stat().st_size
    if size != expected.get("size"):
        kind = "truncated: an interrupted write or a full disk?" if size < expected.get("size", 0) else "grown"
        return f"{path}: {size} bytes but {CHECKSUMS} records {expected.get('size')} ({kind})"
    if sha256_file(path) != expected.get(ALGORITHM):
        return (
            f"{path}: contents differ from the {ALGORITHM} in {CHECKSUMS} (changed after it was saved: bit rot, "
            "a partial copy, or an edit)"
        )
    return None


def verify_share(tag_dir: Path, rank: int, world_size: int, use_checksums: bool = True) -> list[str]:
    """Problems with this rank's share of the files of a checkpoint (empty when sound).

    With checksums: every listed file present with its size and hash. Always: `.pt` files structurally complete.
    """
    tag_dir = Path(tag_dir)
    problems: list[str] = []
    try:
        recorded = read_checksums(tag_dir) if use_checksums else None
    except IntegrityError as e:
        return [str(e)]
    if use_checksums and recorded is None:
        return [
            f"{tag_dir / CHECKSUMS} is missing: the checkpoint was written by an older trainer or its save was "
            "interrupted, so its files cannot be verified"
        ]
    names = sorted(set(list_files(tag_dir)) | set(recorded or {}))
    for name in share_of(names, rank, world_size):
        path = tag_dir / name
        if recorded is not None and name in recorded:
            problem = _entry_problem(path, recorded[name])
        elif recorded is not None and name.endswith(".pt"):
            problem = f"{path}: not listed in {CHECKSUMS} (added after the checkpoint was saved?)"
        else:
            problem = None
        if problem is None and name.endswith(".pt") and path.is_file():
            problem = structural_problem(path)
        if problem:
            problems.append(problem)
    return problems


def nonfinite_tensors(state: Mapping[str, Any], limit: int = 5) -> tuple[int, list[str]]:
    """(number of tensors with a NaN/inf, the first `limit` names) of a state dict."""
    import torch

    bad = [k for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point() and not _finite(v)]
    return len(bad), bad[:limit]


def _finite(t: Any) -> bool:
    import torch

    return bool(torch.isfinite(t).all()) if t.numel() else True
