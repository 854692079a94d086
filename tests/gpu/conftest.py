"""GPU checks (`pytest -m gpu tests/gpu`, run by bench/gpu_check.sh). They run on the CUDA device, or on the CPU when
EB_CHECK_DEVICE=cpu (the script's --cpu smoke mode, which CI runs); otherwise they skip. Excluded from the default
`make test` run by the `gpu` marker (pyproject.toml addopts)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
WORDS = 3000  # the synthetic corpus's vocabulary (+ special tokens)


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
    """A prepared corpus made here (no ../shared, no MiniLM package on a GPU box): a WordPiece vocab of generated
    words and documents of sentences drawn from it, through data_prep itself."""
    from data_prep import tokenize_corpus

    root = tmp_path_factory.mktemp("synthetic")
    rng = torch.Generator().manual_seed(0)
    words = [f"w{i}" for i in range(WORDS)]
    specials = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (root / "vocab.txt").write_text("\n".join(specials + [".", ","] + words) + "\n", encoding="utf-8")
    docs = []
    for _ in range(400):
        sentences = []
        for _ in range(int(torch.randint(2, 12, (1,), generator=rng))):
            n = int(torch.randint(4, 30, (1,), generator=rng))
            ids = torch.randint(0, WORDS, (n,), generator=rng).tolist()
            sentences.append(" ".join(words[i] for i in ids).capitalize() + ".")
        docs.append(" ".join(sentences))
    (root / "text.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    out = root / "prepared"
    tokenize_corpus(
        [str(root / "text.txt")], out, tokenizer=str(root / "vocab.txt"), workers=1, progress=False, valid_fraction=0.05
    )
    return out
