"""Shared fixtures: the real corpus in ../shared/data/corpus (never copied into the repo) and the MiniLM vocab.

The suite runs with --import-mode=importlib, so test modules cannot import this file: helpers are handed out
through the `dp` fixture."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from requirements import require_data

REPO = Path(__file__).resolve().parents[2]
CORPUS = Path(os.environ.get("ELASTICBERT_CORPUS", REPO.parent / "shared" / "data" / "corpus"))
GUTENBERG = CORPUS / "gutenberg"
WIKITEXT = CORPUS / "wikitext-2-raw" / "wiki.test.raw"

# small real books (~50-180 KB each) keep every test fast; MEDIUM adds ~1.3 MB for the kill/resume test
SMALL_BOOKS = ["11-0.txt", "1952-0.txt", "pg1080.txt"]
MEDIUM_BOOKS = ["11-0.txt", "1155-0.txt", "120-0.txt", "16-0.txt", "1952-0.txt"]


def _need(path: Path) -> Path:
    require_data(path)  # a [needs-data] skip outside CI, a failure under CI=true
    return path


@pytest.fixture(scope="session")
def gutenberg() -> Path:
    return _need(GUTENBERG)


@pytest.fixture(scope="session")
def small_books(gutenberg: Path) -> list[str]:
    return [str(_need(gutenberg / b)) for b in SMALL_BOOKS]


@pytest.fixture(scope="session")
def medium_books(gutenberg: Path) -> list[str]:
    return [str(_need(gutenberg / b)) for b in MEDIUM_BOOKS]


@pytest.fixture(scope="session")
def wikitext() -> Path:
    return _need(WIKITEXT)


@pytest.fixture(scope="session")
def vocab() -> Path:
    from data_prep import minilm_vocab

    return minilm_vocab()


@pytest.fixture(scope="session")
def small_prepared(tmp_path_factory: pytest.TempPathFactory, small_books: list[str], vocab: Path) -> Path:
    """One clean run over the small books, shared by read-only tests (several units, rollover into 2+ shards)."""
    from data_prep import tokenize_corpus

    out = tmp_path_factory.mktemp("small") / "out"
    tokenize_corpus(small_books, out, tokenizer=vocab, unit_bytes=48 << 10, shard_tokens=30_000, valid_fraction=0.05)
    return out


def shard_hashes(out: Path) -> dict[str, str]:
    """sha256 of every shard file, by relative path."""
    res = {}
    for split in ("train", "valid"):
        for p in sorted((out / split).glob("shard_*")):
            res[f"{split}/{p.name}"] = hashlib.sha256(p.read_bytes()).hexdigest()
    return res


def manifest_bytes(out: Path) -> bytes:
    return (out / "manifest.json").read_bytes()


def load_manifest(out: Path) -> dict:
    return json.loads(manifest_bytes(out))


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m data_prep ARGS` in a subprocess (the repo root on sys.path)."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "data_prep", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=str(REPO),
    )


@pytest.fixture(scope="session")
def dp() -> SimpleNamespace:
    """Test helpers: dp.REPO, dp.shard_hashes(out), dp.manifest_bytes(out), dp.load_manifest(out), dp.run_cli(...)."""
    return SimpleNamespace(
        REPO=REPO,
        shard_hashes=shard_hashes,
        manifest_bytes=manifest_bytes,
        load_manifest=load_manifest,
        run_cli=run_cli,
    )
