"""Fault-injection helpers shared by tests/faults: a small filesystem that fills up, and byte flips."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "2m", read_only: bool = False) -> Iterator[Path]:
    """Mount a tmpfs of `size` at `path` for the block (root only; the test is skipped with the reason otherwise), so
    that writes fail with ENOSPC exactly as on a full disk — or, `read_only`, with EROFS as on a read-only mount
    (which root cannot write through, unlike a chmod-555 folder)."""
    if os.geteuid() != 0:
        pytest.skip("[needs-root] a disk-full or read-only test mounts a tmpfs")
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"[needs-root] cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def flip_bytes(path: Path, offset: int | None = None, count: int = 16) -> None:
    """XOR `count` bytes of `path` with 0xFF (in the middle of the file unless `offset`): a silent bit-rot."""
    data = bytearray(path.read_bytes())
    start = len(data) // 2 if offset is None else offset
    for i in range(start, min(start + count, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path: Path, keep: float = 0.5) -> None:
    """Cut `path` to `keep` of its size: a write interrupted by a crash or a full disk."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(int(size * keep))


@contextlib.contextmanager
def bind_mount(source: Path, target: Path) -> Iterator[Path]:
    """`mount --bind source target` for the block: one folder at two paths, as a container's bind mount or a file
    system mounted twice (`/scratch` and `/gpfs/...`) shows it. Root only (CI runs as root): skipped otherwise with an
    enforced tag, so CI never passes without it."""
    if os.geteuid() != 0:
        pytest.skip("[needs-tool] a bind-mount test runs `mount --bind` (root): run it as root, as CI does")
    target.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"[needs-tool] cannot bind-mount here: {mounted.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)
