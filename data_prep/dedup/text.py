"""What deduplication and decontamination see of a document: its normalised words, their 64-bit hashes, the exact
hash, the MinHash signature of its word shingles (rensa's R-MinHash), the LSH band keys, and its word n-grams.

Normalisation (the same for the corpus and the evaluation sets): lower-case, then words = maximal runs of Unicode
letters and digits (`[^\\W_]+`), so punctuation, underscores and whitespace only separate words ("doesn't" and the
GLUE-tokenised "doesn 't" both give `doesn t`). The exact hash is blake2b-64 of the words joined by one space: two
documents that differ only in case, punctuation or spacing are exact duplicates.

Word hashes come from rensa (`RMinHash.hash_token_sets`, 64-bit, fixed, no per-process seed), shingles and n-grams
are folds of consecutive word hashes (`fold_windows`), and the signature is rensa's batched
`digest_matrix_from_flat_token_hashes` over the shingle hashes of many documents at once (one call per batch: the
Python boundary is crossed per batch, not per shingle). Why rensa: on the same documents and shingles its MinHash
step runs at 130 MB/s of text against datasketch's 1.8-2.5 MB/s (52-72x), with the same agreement with the exact
Jaccard (mean error 0.0225 vs 0.0238-0.0245); datatrove's signature block brings its own readers and normaliser and
did not run with its declared dependencies (it asked for regex, tokenizers, then spacy)
(`bench/data/dedup_libraries.py`, `docs/dedup/libraries.md`). The LSH index is not a library's: datasketch's and rensa's
hold every band in RAM (4.6 KB and 0.7 KB per document measured: 1.8 TB and 270 GB at 400 M documents);
`data_prep.dedup.lsh` groups equal band keys by sorting them on disk, one key range at a time. A band key is the 64-bit
fold of the band's `rows` signature values: two documents are LSH candidates when some band's keys are equal (a false
key collision between two unrelated bands has probability 2^-64 per pair and band).
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import version

import numpy as np
import rensa

WORD = re.compile(r"[^\W_]+")
_MUL = np.uint64(0x100000001B3)  # FNV-1a 64-bit prime: folds a window of word hashes
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64 finaliser: spreads the folded bits
_MIX2 = np.uint64(0x94D049BB133111EB)
SIGNATURE_ALGORITHM = f"rensa-{version('rensa')}-RMinHash-v{rensa.RMinHash.ALGORITHM_VERSION}"


def normalized_words(text: str) -> list[str]:
    """The document's words as deduplication sees them (see the module docstring)."""
    return WORD.findall(text.lower())


def word_spans(text: str) -> list[tuple[int, int]] | None:
    """(start, end) character offsets in `text` of its normalised words, in order; None when lower-casing changes
    the text's length (a few Unicode letters, e.g. U+0130): offsets could not be mapped back, the caller then treats
    the whole document as one span."""
    lowered = text.lower()
    if len(lowered) != len(text):
        return None
    return [m.span() for m in WORD.finditer(lowered)]


def exact_hash(words: Sequence[str]) -> int:
    """64-bit hash of the normalised text (the words joined by one space)."""
    return int.from_bytes(hashlib.blake2b(" ".join(words).encode(), digest_size=8).digest(), "little")


def hash_words(docs_words: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
    """(flat uint64 word hashes of all documents, int64 offsets [n_docs + 1]) in one rensa call."""
    lengths = np.fromiter((len(w) for w in docs_words), dtype=np.int64, count=len(docs_words))
    offsets = np.zeros(len(docs_words) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    hashed = rensa.RMinHash.hash_token_sets(docs_words)
    flat = np.fromiter(itertools.chain.from_iterable(hashed), dtype=np.uint64, count=int(offsets[-1]))
    return flat, offsets


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _MIX1
        x = (x ^ (x >> np.uint64(27))) * _MIX2
        return x ^ (x >> np.uint64(31))


def fold_windows(values: np.ndarray, width: int) -> np.ndarray:
    """uint64 hash of every window of `width` consecutive values (len(values) - width + 1 of them; order matters)."""
    n = len(values) - width + 1
    if n <= 0:
        return np.zeros(0, dtype=np.uint64)
    with np.errstate(over="ignore"):
        acc = values[:n].copy()
        for i in range(1, width):
            acc *= _MUL
            acc ^= values[i : i + n]
    return mix64(acc)


def windows_within_docs(offsets: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """For flat arrays of documents cut at `offsets`: (start index of every window of `width` that lies inside one
    document, int64 offsets [n_docs + 1] of each document's windows in that list)."""
    lengths = np.diff(offsets)
    per_doc = np.maximum(lengths - width + 1, 0)
    win_offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(per_doc, out=win_offsets[1:])
    total = int(win_offsets[-1])
    doc_of = np.repeat(np.arange(len(lengths)), per_doc)
    starts = offsets[:-1][doc_of] + (np.arange(total) - win_offsets[:-1][doc_of])
    return starts, win_offsets


def doc_ngrams(flat: np.ndarray, offsets: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(hash of every word n-gram of `width` inside a document, offsets per document) for a batch."""
    folded = fold_windows(flat, width)
    starts, win_offsets = windows_within_docs(offsets, width)
    return folded[starts], win_offsets


@dataclass(frozen=True)
class MinHashParams:
    """Shingles of `shingle` words; `bands` x `rows` = signature length; `seed` of the hash family."""

    shingle: int = 3
    bands: int = 14
    rows: int = 8
    seed: int = 1

    @property
    def num_perm(self) -> int:
        return self.bands * self.rows


def signatures(flat: np.ndarray, offsets: np.ndarray, params: MinHashParams) -> np.ndarray:
    """uint32 [n_docs, bands * rows] MinHash signatures of the documents' word shingles (every document must have
    at least `shingle` words)."""
    shingles, sh_offsets = doc_ngrams(flat, offsets, params.shingle)
    matrix = rensa.RMinHash.digest_matrix_from_flat_token_hashes(
        shingles, sh_offsets.astype(np.uint64), params.num_perm, params.seed
    )
    rows = matrix.to_rows()
    out = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.uint32, count=len(rows) * params.num_perm)
    return out.reshape(len(rows), params.num_perm)


def band_keys(sigs: np.ndarray, params: MinHashParams) -> np.ndarray:
    """uint64 [bands, n_docs]: band b's key of each document (its `rows` signature values folded into 64 bits)."""
    n = len(sigs)
    blocks = sigs.reshape(n, params.bands, params.rows).astype(np.uint64)
    with np.errstate(over="ignore"):
        acc = np.full((n, params.bands), np.uint64(0xCBF29CE484222325))
        for r in range(params.rows):
            acc = (acc ^ blocks[:, :, r]) * _MUL
    return np.ascontiguousarray(mix64(acc).T)


def candidate_probability(similarity: float | np.ndarray, bands: int, rows: int) -> float | np.ndarray:
    """P(two documents of Jaccard `similarity` share at least one band) = 1 - (1 - s^rows)^bands."""
    return 1.0 - (1.0 - np.asarray(similarity, dtype=float) ** rows) ** bands
