"""`stats DIR`: documents, sentences, tokens, the [UNK] rate and length histograms (PNG), computed shard by shard
(bounded memory); and the [UNK]-rate guard of `tokenize`/`finalize` (`UnkGuard`, `DEFAULT_MAX_UNK_FRACTION`).

Why a guard on the [UNK] rate: a vocabulary that does not fit the text (a 3-word vocab, an uncased vocab with
lower-casing off, another script) still tokenizes "successfully", and pre-training then spends its compute on a
corpus of [UNK]s. The default threshold is measured (bench/unk_rates.py; figures beside
`DEFAULT_MAX_UNK_FRACTION`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.io import atomic_path, atomic_write_json
from common.outputs import CORPUS_STATS, Output, check_output
from common.vocab import DEFAULT_MAX_UNK_FRACTION, describe_unk, unk_fraction

from .errors import DataPrepError, output_errors
from .reader import PreparedCorpus
from .util import CANONICAL

log = logging.getLogger("data_prep")

CLIP = 4096  # lengths above this land in the last histogram bin

# the running rate is checked once this many tokens are in (~400 KB of text: one tokenizer batch of one worker), so
# a wrong vocab stops a 160 GB run after its first megabytes; the whole corpus is checked at the end either way
UNK_CHECK_MIN_TOKENS = 100_000


def unk_fraction_problem(value: float) -> str | None:
    """Why `value` is not a valid --max-unk-fraction (None when it is)."""
    if not 0.0 <= value <= 1.0:  # also False for NaN
        return f"--max-unk-fraction must be in [0, 1] (got {value})"
    return None


@dataclass
class UnkGuard:
    """Counts tokens and [UNK]s as units are tokenized and refuses (DataPrepError) once the running rate is above
    `max_fraction`: after `UNK_CHECK_MIN_TOKENS` while running, on any count when `complete`."""

    max_fraction: float
    tokenizer: str  # the tokenizer file named in the refusal
    out: Path
    tokens: int = 0
    unk: int = 0

    def add(self, tokens: int, unk: int) -> None:
        self.tokens += tokens
        self.unk += unk

    def check(self, complete: bool = False) -> None:
        if self.tokens == 0 or (not complete and self.tokens < UNK_CHECK_MIN_TOKENS):
            return
        if unk_fraction(self.unk, self.tokens) <= self.max_fraction:
            return
        which = "all" if complete else "the first"
        raise DataPrepError(
            f"{self.out}: {100 * unk_fraction(self.unk, self.tokens):.3g} % of {which} {self.tokens:,} tokens are "
            f"[UNK] with the tokenizer {self.tokenizer}, above --max-unk-fraction {self.max_fraction:g}: the "
            "vocabulary does not fit this text (another vocab, uncased vs cased, another language?); nothing is "
            "finalized. Use a matching --tokenizer and a new --output, or accept it with --max-unk-fraction 1 "
            "(finished units are kept)"
        )


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
    unk = split_unk_tokens(corpus)
    return {
        "docs": corpus.num_docs,
        "sentences": corpus.num_sentences,
        "tokens": corpus.num_tokens,
        "unk_tokens": unk,
        "unk_fraction": unk_fraction(unk, corpus.num_tokens),
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


def split_unk_tokens(corpus: PreparedCorpus) -> int:
    """[UNK] tokens of a split: from the manifest (tokenize counts them), else counted in the shards (a corpus
    prepared before the count was recorded)."""
    recorded = corpus.manifest["splits"][corpus.split].get("unk_tokens")
    if recorded is not None:
        return int(recorded)
    unk_id = corpus.special_ids["unk"]
    total = 0
    for k in range(corpus.num_shards):
        ids = corpus._shard(k)[0]
        for a in range(0, len(ids), 1 << 24):
            total += int(np.count_nonzero(np.asarray(ids[a : a + (1 << 24)]) == unk_id))
    return total


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


STATS_OUTPUT = Output("stats", "corpus statistics (stats.json, PNGs)", folder=True, accepts=(CORPUS_STATS,))


def corpus_stats(out_dir: str | os.PathLike, output_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Stats of every split and the [UNK] rate of the whole corpus (a warning when it is above
    `DEFAULT_MAX_UNK_FRACTION`); writes `stats.json` and `<split>_lengths.png` into output_dir (default OUT/stats)."""
    out = Path(out_dir)
    pdir = Path(output_dir) if output_dir is not None else out / "stats"
    corpus = [("DIR", out / name) for name in ("manifest.json", "train", "valid", "tokenizer", ".work")]
    first = PreparedCorpus(out, "train")  # a missing corpus said as such, before its DIR/stats is claimed
    check_output(pdir, STATS_OUTPUT, corpus)  # beside the corpus's files (DIR/stats), never among them
    result: dict[str, Any] = {"manifest_sha256": first.manifest_hash, "splits": {}}
    with output_errors(pdir, after="no stats were written: {todo} and rerun"):
        pdir.mkdir(parents=True, exist_ok=True)
        for split in first.manifest["splits"]:
            corpus = first if split == "train" else PreparedCorpus(out, split)
            st = split_stats(corpus)
            if corpus.num_docs:
                png = pdir / f"{split}_lengths.png"
                _plot(st, split, png)
                st["plot"] = str(png)
            st.pop("_hist")
            result["splits"][split] = st
        tokens = sum(s["tokens"] for s in result["splits"].values())
        unk = sum(s["unk_tokens"] for s in result["splits"].values())
        result["unk"] = {
            "unk_tokens": unk,
            "tokens": tokens,
            "fraction": unk_fraction(unk, tokens),
            "max_unk_fraction": DEFAULT_MAX_UNK_FRACTION,
        }
        if unk_fraction(unk, tokens) > DEFAULT_MAX_UNK_FRACTION:
            log.warning(
                "%s: %s, above the default --max-unk-fraction %g: the vocabulary does not fit this text",
                out,
                describe_unk(unk, tokens),
                DEFAULT_MAX_UNK_FRACTION,
            )
        atomic_write_json(pdir / "stats.json", result, **CANONICAL)
    return result
