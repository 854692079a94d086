"""Fixtures for the pretrain tests: real Gutenberg shards prepared once per session (data_prep, MiniLM vocab)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for pretrain_testlib (tests run with --import-mode=importlib)

from pretrain_testlib import prepare_gutenberg  # noqa: E402


@pytest.fixture(scope="session")
def prepared_gutenberg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four Project Gutenberg books through data_prep (bert-base-uncased WordPiece vocab of the MiniLM package)."""
    return prepare_gutenberg(tmp_path_factory.mktemp("data") / "gutenberg")


@pytest.fixture
def clean_env():
    """In-process `main(["train", ...])` writes RANK/WORLD_SIZE/MASTER_* into os.environ: put it back."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
