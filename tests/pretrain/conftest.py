"""Fixtures for the pretrain tests: real Gutenberg shards prepared once per session (data_prep, MiniLM vocab)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for pretrain_testlib (tests run with --import-mode=importlib)

from pretrain_testlib import BOOKS, GUTENBERG  # noqa: E402


@pytest.fixture(scope="session")
def prepared_gutenberg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four Project Gutenberg books through data_prep (bert-base-uncased WordPiece vocab of the MiniLM package)."""
    from data_prep.pipeline import tokenize_corpus
    from elasticbert import minilm_dir

    missing = [b for b in BOOKS if not (GUTENBERG / b).is_file()]
    if missing:
        pytest.skip(f"Gutenberg books {missing} not found under {GUTENBERG}")
    out = tmp_path_factory.mktemp("data") / "gutenberg"
    tokenize_corpus([str(GUTENBERG / b) for b in BOOKS], out, tokenizer=minilm_dir() / "vocab.txt", valid_fraction=0.05)
    return out


@pytest.fixture
def clean_env():
    """In-process `main(["train", ...])` writes RANK/WORLD_SIZE/MASTER_* into os.environ: put it back."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
