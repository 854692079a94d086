"""Checksums are checked where weights are loaded, whichever entry point loads them: `load_pretrained` and every
command (through `loading.read_config`), and `from_pretrained` of our model and config classes - so
`AutoModel*.from_pretrained`, `pipeline(...)` and the `trust_remote_code=True` copies (which import these classes)
verify too.

A directory this project wrote carries checksums.json and says so in its config.json (`common.integrity.seal`): one
whose files changed since (flipped bytes inside a tensor pass every format check; an edited config.json changes the
model), or that lost its checksums.json (a partial copy), is refused by name. Directories that never were sealed (a hub
BERT, the MiniLM package, another tool's export) load as they are, with one line saying so (once per directory and
process: `note_unverified`). `--no-verify-checksums` (commands), `verify_checksums=False` (`from_pretrained`,
`load_pretrained`, `EarlyExitClassifier.from_pretrained`; a pipeline's `model_kwargs`),
`checksum_verification_as(False)` (a block) or `set_checksum_verification(False)` (a process) load a refused directory
anyway.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from common.errors import UserError
from common.integrity import CHECKSUMS, IntegrityError, verify_directory

OVERRIDE = (
    "--no-verify-checksums (commands) or verify_checksums=False (from_pretrained, load_pretrained, "
    "EarlyExitClassifier.from_pretrained; pipeline(..., model_kwargs={'verify_checksums': False}))"
)


class CheckpointError(UserError):
    """A checkpoint that cannot be loaded: missing files, corrupt weights, wrong shapes, a layout we do not
    understand, or one that would leave encoder weights random. Names the file or the keys."""


_VERIFY_CHECKSUMS = {"enabled": True}
_INSIDE_A_VERIFIED_LOAD: ContextVar[bool] = ContextVar("inside_a_verified_load", default=False)
_VERIFY_IN_BLOCK: ContextVar[bool | None] = ContextVar("verify_checksums_in_block", default=None)
_VERIFIED: set[tuple] = set()  # directories hashed by this process, with the size and mtime of each file then
_NOTED: set[str] = set()  # unsealed directories this process said it loads unverified


def set_checksum_verification(enabled: bool) -> None:
    """Whether loading a model checks its checksums.json (`--no-verify-checksums` turns it off for one command)."""
    _VERIFY_CHECKSUMS["enabled"] = bool(enabled)


def checksum_verification() -> bool:
    """Whether the model directories loaded here are verified: `checksum_verification_as` inside its block, else the
    process's `set_checksum_verification`."""
    in_block = _VERIFY_IN_BLOCK.get()
    return _VERIFY_CHECKSUMS["enabled"] if in_block is None else in_block


@contextmanager
def checksum_verification_as(verify: bool | None) -> Iterator[None]:
    """Within the block (this thread or task), loads verify their directories (`verify` True) or not (False),
    whatever the process's setting; None leaves it. For an entry point that reads several files of one directory
    through several loaders (`EarlyExitClassifier.from_pretrained(..., verify_checksums=False)`)."""
    token = _VERIFY_IN_BLOCK.set(None if verify is None else bool(verify))
    try:
        yield
    finally:
        _VERIFY_IN_BLOCK.reset(token)


def verify_model_directory(directory: str | os.PathLike, verify: bool | None = None) -> None:
    """Refuse (CheckpointError) a sealed directory whose files changed after it was written, or that says it was
    sealed but has no checksums.json; `verify`: None follows `set_checksum_verification`, False skips the check. A
    directory is hashed once per process while its files keep their size and mtime."""
    directory = Path(directory)
    if _INSIDE_A_VERIFIED_LOAD.get() or not (checksum_verification() if verify is None else verify):
        return
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    key = (str(directory.resolve()), *((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files))
    if key in _VERIFIED:
        return
    try:
        problems = verify_directory(directory)
    except IntegrityError as err:
        problems = [str(err)]
    if not problems and not (directory / CHECKSUMS).is_file():
        note_unverified(directory)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CheckpointError(
            f"{problems[0]}{more}; the model in {directory} is refused: re-train or re-export it, or load it anyway "
            f"with {OVERRIDE}"
        )
    _VERIFIED.add(key)


def note_unverified(directory: Path) -> None:
    """Say once per process that a model directory loads unverified: it carries no checksums.json and does not say
    it was sealed (a hub download, another tool's directory - or one of ours whose seal was removed with its
    checksums, which nothing can tell apart)."""
    key = str(directory.resolve())
    if key not in _NOTED:
        _NOTED.add(key)
        print(
            f"elasticbert: note: {directory}: not verified (no {CHECKSUMS}: a directory this project did not seal, "
            "or one whose seal was removed); its files load as they are",
            file=sys.stderr,
            flush=True,
        )


def verify_pretrained_path(name_or_path: str | os.PathLike, subfolder: object = "", verify: object = None) -> None:
    """`from_pretrained`'s check: a local directory (`subfolder` inside it) is verified; a hub name is left to the
    hub (its files are fetched one by one, without the directory's checksums.json)."""
    directory = Path(os.path.expanduser(str(name_or_path))) / str(subfolder or "")
    if directory.is_dir():
        verify_model_directory(directory, None if verify is None else bool(verify))


@contextmanager
def verified_load() -> Iterator[None]:
    """A model's `from_pretrained` verified its directory (or was told not to): the config it loads inside is not
    verified again (with `verify_checksums=False` it would otherwise be refused there)."""
    token = _INSIDE_A_VERIFIED_LOAD.set(True)
    try:
        yield
    finally:
        _INSIDE_A_VERIFIED_LOAD.reset(token)
