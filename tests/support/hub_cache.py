"""Lay out a Hugging Face hub cache by hand (the format `huggingface_hub` reads offline), for tests of hub names."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path


def add_to_hub_cache(cache: Path, repo_id: str, source: Path | dict[str, bytes], repo_type: str = "model") -> Path:
    """Put `source` (a directory, or {relative file path: bytes}) into `cache` as the `main` snapshot of `repo_id`,
    with content-addressed blobs and snapshot symlinks as the hub client writes them; returns the snapshot dir."""
    if isinstance(source, Path):
        files = {str(p.relative_to(source)): p.read_bytes() for p in sorted(source.rglob("*")) if p.is_file()}
    else:
        files = dict(source)
    repo = cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repr(sorted((k, hashlib.sha256(v).hexdigest()) for k, v in files.items())).encode())
    snapshot = repo / "snapshots" / commit.hexdigest()
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit.hexdigest())
    return snapshot


def remove_from_hub_cache(cache: Path, repo_id: str, repo_type: str = "model") -> None:
    shutil.rmtree(cache / f"{repo_type}s--{repo_id.replace('/', '--')}", ignore_errors=True)
