"""Lay out a Hugging Face hub cache by hand (the format `huggingface_hub` reads offline), for tests of hub names."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path


def add_to_hub_cache(cache: Path, repo_id: str, source: Path | dict[str, bytes]) -> Path:
    """Put `source` (a directory, or {file name: bytes}) into `cache` as the `main` snapshot of model `repo_id`, with
    content-addressed blobs and snapshot symlinks as the hub client writes them; returns the snapshot directory."""
    files = (
        {p.name: p.read_bytes() for p in sorted(source.iterdir()) if p.is_file()}
        if isinstance(source, Path)
        else dict(source)
    )
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repr(sorted((k, hashlib.sha256(v).hexdigest()) for k, v in files.items())).encode())
    snapshot = repo / "snapshots" / commit.hexdigest()
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / name
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(Path("..") / ".." / "blobs" / blob.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit.hexdigest())
    return snapshot


def remove_from_hub_cache(cache: Path, repo_id: str) -> None:
    shutil.rmtree(cache / f"models--{repo_id.replace('/', '--')}", ignore_errors=True)
