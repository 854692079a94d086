"""Fixtures: real GLUE from ../shared/data/glue (never copied into the repo) and the MiniLM weights."""

import os
from pathlib import Path

import pytest

from elasticbert import minilm_dir

GLUE = Path(os.environ.get("ELASTICBERT_GLUE", Path(__file__).resolve().parents[3] / "shared" / "data" / "glue"))


def pytest_collection_modifyitems(config, items):
    if not GLUE.is_dir():  # pragma: no cover - the data is part of the environment
        skip = pytest.mark.skip(reason=f"GLUE data not found at {GLUE}")
        for item in items:
            if "tests/finetune/" in str(item.fspath).replace(os.sep, "/"):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def glue_dir():
    return GLUE


@pytest.fixture(scope="session")
def minilm():
    return minilm_dir()


@pytest.fixture(scope="session")
def tokenizer(minilm):
    from finetune.data import load_tokenizer

    return load_tokenizer(minilm)
