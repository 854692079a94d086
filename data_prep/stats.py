"""`stats DIR`: documents, sentences, tokens and length histograms (PNG), computed shard by shard (bounded memory)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from common.io import atomic_path

from .reader import PreparedCorpus
from .util import atomic_write_json

CLIP = 4096  # lengths above this land in the last histogram bin


def _percentiles(counts: np.ndarray, qs: tuple[float, ...]) -> list[int]:
    cum = np.cumsum(counts)
    total = int(cum[-1]) if len(cum) else 0
    if total == 0:
        return [0 for _ in qs]
    return [int(np.searchsorted(cum, q * total, side="left")) for q in qs]


def split_stats(corpus: PreparedCorpus) -> dict[str, Any]:
    """Counts and histograms of one split (bincounts up to CLIP; percentiles from them)."""
    sent_hist = np.zeros(CLIP + 1, dtype=np.int64)
    doc_tok_hist = np.zeros(CLIP + 1, dtype=np.int64)
    doc_sent_hist = np.zeros(CLIP + 1, dtype=np.int64)
    max_sent = max_doc = 0
    for k in range(corpus.num_shards):
        _, _, lengths, bounds = corpus._shard(k)
        lengths = np.asarray(lengths, dtype=np.int64)
        bounds = np.asarray(bounds)
        if len(lengths) == 0:
            continue
        sent_hist += np.bincount(np.minimum(lengths, CLIP), minlength=CLIP + 1)
        doc_tokens = np.add.reduceat(lengths, bounds[:-1]) if len(bounds) > 1 else np.zeros(0, np.int64)
        doc_tok_hist += np.bincount(np.minimum(doc_tokens, CLIP), minlength=CLIP + 1)
        doc_sent_hist += np.bincount(np.minimum(np.diff(bounds), CLIP), minlength=CLIP + 1)
        max_sent = max(max_sent, int(lengths.max()))
        max_doc = max(max_doc, int(doc_tokens.max()) if len(doc_tokens) else 0)
    qs = (0.5, 0.9, 0.99)
    return {
        "docs": corpus.num_docs,
        "sentences": corpus.num_sentences,
        "tokens": corpus.num_tokens,
        "shards": corpus.num_shards,
        "tokens_per_sentence": {
            "mean": corpus.num_tokens / max(1, corpus.num_sentences),
            "max": max_sent,
            **dict(zip(("p50", "p90", "p99"), _percentiles(sent_hist, qs))),
        },
        "tokens_per_doc": {
            "mean": corpus.num_tokens / max(1, corpus.num_docs),
            "max": max_doc,
            **dict(zip(("p50", "p90", "p99"), _percentiles(doc_tok_hist, qs))),
        },
        "sentences_per_doc": {
            "mean": corpus.num_sentences / max(1, corpus.num_docs),
            **dict(zip(("p50", "p90", "p99"), _percentiles(doc_sent_hist, qs))),
        },
        "_hist": {"sentence_tokens": sent_hist, "doc_tokens": doc_tok_hist, "doc_sentences": doc_sent_hist},
    }


def _plot(stats: dict[str, Any], split: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = stats["_hist"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, key, title in zip(
        axes,
        ("sentence_tokens", "doc_tokens", "doc_sentences"),
        ("tokens per sentence", "tokens per document", "sentences per document"),
    ):
        counts = h[key]
        nz = np.nonzero(counts)[0]
        top = int(nz[-1]) + 1 if len(nz) else 1
        edges = np.unique(np.geomspace(1, max(2, top), 60).astype(int))
        binned = np.add.reduceat(counts[: edges[-1] + 1], edges[:-1]) if len(edges) > 1 else counts[:1]
        ax.bar(edges[:-1], binned[: len(edges) - 1], width=np.diff(edges), align="edge")
        ax.set_xscale("log")
        ax.set_title(f"{split}: {title}" + (f" (>= {CLIP} in last bin)" if top > CLIP else ""))
        ax.set_xlabel(title.split(" per ")[0])
        ax.set_ylabel("count")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=80, format="png")
    plt.close(fig)


def corpus_stats(out_dir: str | os.PathLike, output_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Stats of every split; writes `stats.json` and `<split>_lengths.png` into output_dir (default OUT/stats)."""
    out = Path(out_dir)
    pdir = Path(output_dir) if output_dir is not None else out / "stats"
    pdir.mkdir(parents=True, exist_ok=True)
    first = PreparedCorpus(out, "train")
    result: dict[str, Any] = {"manifest_sha256": first.manifest_hash, "splits": {}}
    for split in first.manifest["splits"]:
        corpus = first if split == "train" else PreparedCorpus(out, split)
        st = split_stats(corpus)
        if corpus.num_docs:
            png = pdir / f"{split}_lengths.png"
            _plot(st, split, png)
            st["plot"] = str(png)
        st.pop("_hist")
        result["splits"][split] = st
    atomic_write_json(pdir / "stats.json", result)
    return result
