"""Integrity of a directory we wrote: a checksum per file (`checksums.json`), written last when the directory is
complete and checked before it is used, so that bit rot, a truncated file or a half-copied directory is refused by
name instead of being loaded silently (flipped bytes inside a tensor pass every format check).

Used for pre-training checkpoints (`pretrain/checkpointer.py`: written after DeepSpeed's files, before `latest` names
the tag; hashing spread over the ranks, file i by rank i mod world size, so a 64-rank job reads each byte once) and
for every model directory the project writes (fine-tuned `best/`, exports, `save-early-exit`): `seal` after the last
file, `verify_directory` when a model is loaded, whichever way (`elasticbert.verification`: `load_pretrained`, every
command, `from_pretrained` / `AutoModel*` / `pipeline`). `seal` also marks a model directory's config.json
(`"checksums": "checksums.json"`), so a copy that lost checksums.json says it was sealed and is refused.

    {"format": 1, "algorithm": "sha256",
     "files": {"model.safetensors": {"size": 90866412, "sha256": "9f2c..."}, "config.json": {...}}}

It lists every regular file below the directory except itself and hidden temporaries. sha256 runs at ~1-2 GB/s per
core with SHA extensions: about a second for a BERT-large directory. Independently of the checksums, every `.pt`
file gets a structural check (PyTorch's zip container must have its central directory).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .errors import UserError
from .io import atomic_write_json, peek_object, read_object

CHECKSUMS = "checksums.json"
SEALED_FIELD = "checksums"  # the config.json field of a sealed model directory (its value: CHECKSUMS)
FORMAT = 1
ALGORITHM = "sha256"
HASH_BLOCK = 8 << 20


def sha256_bytes(data: bytes) -> str:
    """The sha256 of bytes already in memory (a canonical JSON text, a manifest read once): `sha256_file`'s twin."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    """Stream the file through sha256 in 8 MiB blocks (never loads it whole): the repository's one file hash."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


class IntegrityError(UserError):
    """A checkpoint or model directory whose files do not match its checksums, are truncated, or hold non-finite
    weights."""


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


def entry_problem(path: Path, expected: dict[str, Any]) -> str | None:
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
            problem = entry_problem(path, recorded[name])
        elif recorded is not None and name.endswith(".pt"):
            problem = f"{path}: not listed in {CHECKSUMS} (added after the checkpoint was saved?)"
        else:
            problem = None
        if problem is None and name.endswith(".pt") and path.is_file():
            problem = structural_problem(path)
        if problem:
            problems.append(problem)
    return problems


def seal(directory: Path) -> None:
    """Record the checksums of every file of a complete directory (call it after its last file is written). A model
    directory's config.json first gets `"checksums": "checksums.json"` (`SEALED_FIELD`): the directory then says it
    was sealed, so a copy that lost checksums.json is refused instead of loading unverified (`verify_directory`)."""
    directory = Path(directory)
    config = directory / "config.json"
    if config.is_file():
        fields = read_object(config, IntegrityError, "a JSON object of config fields")
        if fields.get(SEALED_FIELD) != CHECKSUMS:
            atomic_write_json(config, {**fields, SEALED_FIELD: CHECKSUMS}, sort_keys=True)
    write_checksums(directory, hash_files(directory, list_files(directory)))


def says_sealed(directory: Path) -> bool:
    """Whether the directory's config.json says it was sealed (`seal`); False when it has no readable one."""
    fields = peek_object(Path(directory) / "config.json")
    return fields is not None and SEALED_FIELD in fields


def discard_seal(directory: Path) -> None:
    """Remove the checksums.json of a directory whose files are being written again (a stale seal would refuse the
    new files); the writer seals it again when it is complete."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        (Path(directory) / CHECKSUMS).unlink()


def reseal(directory: Path, names: Iterable[str]) -> None:
    """Update the checksums of `names` after they were rewritten (a sealed directory stays sealed; an unsealed one is
    left as it is)."""
    directory = Path(directory)
    recorded = read_checksums(directory)
    if recorded is not None:
        write_checksums(directory, {**recorded, **hash_files(directory, names)})


def verify_directory(directory: Path) -> list[str]:
    """Problems of a sealed directory (every listed file present with its size and hash, no unlisted weights); []
    for one that neither carries checksums.json nor says it was sealed (a hub download, a directory of other tools).
    One whose config.json says it was sealed but that has no checksums.json (a partial copy) is a problem."""
    directory = Path(directory)
    if not (directory / CHECKSUMS).is_file():
        if says_sealed(directory):
            return [
                f"{directory / CHECKSUMS} is missing, but {directory / 'config.json'} says the directory was sealed "
                f'("{SEALED_FIELD}": "{CHECKSUMS}"): a partial copy, or the file was deleted, so its files cannot be '
                "verified"
            ]
        return []
    return verify_share(directory, 0, 1)
