"""GPU checks (`pytest -m gpu tests/gpu`, run by bench/gpu/gpu_check.sh). They run on the CUDA device, or on the CPU
when EB_CHECK_DEVICE=cpu (the script's --cpu smoke mode, which CI runs); otherwise they skip. Excluded from the default
`make test` run by the `gpu` marker (pyproject.toml addopts). `gpu_full` marks what only `gpu_check.sh --full` runs
(`--fast` deselects it: `-m "gpu and not gpu_full"`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu_full: a GPU check only bench/gpu/gpu_check.sh --full runs (the slow ones)")


def check_device() -> str:
    return os.environ.get("EB_CHECK_DEVICE") or ("cuda" if torch.cuda.is_available() else "none")


@pytest.fixture(scope="session")
def device() -> str:
    dev = check_device()
    if dev == "none":
        pytest.skip("[needs-gpu] no CUDA device (EB_CHECK_DEVICE=cpu runs these on the CPU)")
    return dev


@pytest.fixture(scope="session")
def synthetic_corpus(tmp_path_factory) -> Path:
    """A prepared corpus made here (no ../shared, no MiniLM package on a GPU box), through data_prep itself
    (`bench.pretrain.trainer_overhead.synthetic_corpus`); EB_CHECK_CORPUS names one bench/gpu/gpu_check.sh already
    made."""
    from bench.pretrain.trainer_overhead import synthetic_corpus

    made = os.environ.get("EB_CHECK_CORPUS")
    if made and (Path(made) / "manifest.json").is_file():
        return Path(made)
    return synthetic_corpus(tmp_path_factory.mktemp("synthetic"))
