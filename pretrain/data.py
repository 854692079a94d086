"""Pre-training samples built at load time from data_prep's shards: SOP pairs + n-gram masking.

- `build_sample_index`: per document, consecutive sentences packed up to a target length (max_length - 3, or with
  probability short_seq_prob a shorter random one). Row = (doc, first sentence, end sentence, target length).
  Deterministic given (corpus, max_length, short_seq_prob, seed). Built once per job by rank 0 — shard by shard,
  vectorised over documents, streamed to a .npy beside the data (temp + rename, then a sidecar with its crc32) —
  and memmapped by every rank; the other ranks wait for it (`load_or_build_index`).
- `PretrainingDataset[i]`: an RNG seeded by (seed, corpus, i) picks the A/B split, the swap (SOP label), the
  truncation and the masking, so sample i is the same whatever the number of workers, ranks or restarts.
- `SampleOrder`: global position p (= consumed_samples + offset) -> (corpus, sample); corpora blended by weight,
  each in its own seeded epoch permutations. `RankBatches` gives rank r its disjoint slice of every global batch.
- `train_loader`: this rank's micro-batches through a DataLoader, collated by `collation.Collator` (one sample per
  padded row, or packed several to a row: `data.packing`).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import os
import struct
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from common.dist import resolve_env
from common.errors import UserError
from common.io import atomic_path, atomic_write_json

from .collation import IGNORE_INDEX, Collator, collate  # noqa: F401 (collate: callers import it from here)
from .stateless_random import Permutation, mix, splitmix64, uniform

# 2: targets are a pure function of (seed, doc, sample number) — counter-based, not a sequential RNG stream — so the
# index is built shard by shard, vectorised over documents; epoch shuffles are `Permutation`s, not stored tables.
INDEX_VERSION = 2


class Corpus(Protocol):
    """What we need of `data_prep.reader.PreparedCorpus` (a fake with these attributes works in unit tests)."""

    num_docs: int
    num_sentences: int
    sentence_lengths: np.ndarray
    doc_boundaries: np.ndarray
    special_ids: dict
    manifest_hash: str
    tokenizer_dir: Any

    def sentence(self, i: int) -> np.ndarray: ...


# ---------------------------------------------------------------------------------------------------- sample index


def corpus_shards(corpus: Corpus) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """(first global doc, first global sentence, sentence lengths, local doc boundaries) per shard.

    A `PreparedCorpus` yields its shards' memmaps one at a time, so the index builder never holds more than one
    shard's arrays; any other corpus (a fake in the tests) is one shard made of its global arrays.
    """
    if hasattr(corpus, "shard_arrays"):
        yield from corpus.shard_arrays()
        return
    yield 0, 0, np.asarray(corpus.sentence_lengths), np.asarray(corpus.doc_boundaries)


@functools.lru_cache(maxsize=16)
def _target_prefix(seed: int, max_length: int) -> np.ndarray:
    return mix(seed, INDEX_VERSION, max_length)


def sample_targets(
    seed: int, max_length: int, short_seq_prob: float, docs: np.ndarray, k: np.ndarray | int
) -> np.ndarray:
    """Target length of the k-th sample of each document: max_length - 3, or with probability short_seq_prob a
    uniform length in [2, max_length - 3]. A pure function of (seed, doc, k) — one splitmix64 of (doc << 32 | k)
    under a seeded prefix; documents < 2^32 — so any builder order gives the same index."""
    max_tokens = max_length - 3
    target = np.full(len(docs), max_tokens, dtype=np.int64)
    if short_seq_prob <= 0:
        return target
    with np.errstate(over="ignore"):
        key = (
            (np.asarray(docs).astype(np.uint64) << np.uint64(32)) | np.uint64(k)
            if np.ndim(k) == 0
            else ((np.asarray(docs).astype(np.uint64) << np.uint64(32)) | np.asarray(k).astype(np.uint64))
        )
        h = splitmix64(_target_prefix(seed, max_length) ^ key)
        short = uniform(h) < short_seq_prob
        if short.any():
            target[short] = 2 + (splitmix64(h[short]) % np.uint64(max_tokens - 1)).astype(np.int64)
    return target


TAIL_DOCS = 64  # below this many documents still packing, a round's numpy overhead outweighs its work


def shard_samples(
    doc0: int, sent0: int, lengths: np.ndarray, bounds: np.ndarray, max_length: int, short_seq_prob: float, seed: int
) -> np.ndarray:
    """The samples of one shard's documents. Vectorised over documents: round k packs every document's k-th sample
    at once (documents are independent), so the Python loop runs once per round, not once per sample. The last
    few long documents (books: thousands of samples each) are finished one by one with `bisect` on plain ints,
    where a numpy round per sample would cost more than the sample. Rows are then scattered into document order
    (a document's k-th sample lands at its offset + k)."""
    cum = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cum[1:])
    start = np.asarray(bounds[:-1], dtype=np.int64).copy()
    end = np.asarray(bounds[1:], dtype=np.int64)
    active = np.flatnonzero(end - start >= 2)
    rounds: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # docs, k, first, stop, tgt
    k = 0
    while active.size and active.size >= TAIL_DOCS:
        s, e = start[active], end[active]
        target = sample_targets(seed, max_length, short_seq_prob, active + doc0, k)
        # smallest j with cum[j] - cum[s] >= target; the sample is sentences [s, j), at least 2, within the doc
        stop = np.minimum(np.maximum(np.searchsorted(cum, cum[s] + target, side="left"), s + 2), e)
        stop = np.where(e - stop == 1, e, stop)  # a lone trailing sentence cannot form a pair: give it to this one
        rounds.append((active, np.full(active.size, k), s, stop, target))
        start[active] = stop
        active = active[e - stop >= 2]
        k += 1
    for doc in active.tolist():
        rounds.append(_pack_one(doc, k, int(start[doc]), int(end[doc]), cum, doc0, max_length, short_seq_prob, seed))
    if not rounds:
        return np.zeros((0, 4), dtype=np.int64)
    docs = np.concatenate([r[0] for r in rounds])
    per_doc = np.bincount(docs, minlength=len(end))
    offset = np.concatenate([[0], np.cumsum(per_doc)[:-1]])
    rows = np.empty((len(docs), 4), dtype=np.int64)
    where = offset[docs] + np.concatenate([r[1] for r in rounds])
    rows[where, 0] = docs + doc0
    rows[where, 1] = np.concatenate([r[2] for r in rounds]) + sent0
    rows[where, 2] = np.concatenate([r[3] for r in rounds]) + sent0
    rows[where, 3] = np.concatenate([r[4] for r in rounds])
    return rows


def _pack_one(
    doc: int,
    k: int,
    start: int,
    end: int,
    cum: np.ndarray,
    doc0: int,
    max_length: int,
    short_seq_prob: float,
    seed: int,
) -> tuple[np.ndarray, ...]:
    """The remaining samples of one document from its k-th on (the same rule as a round, one sample at a time)."""
    ks = np.arange(k, k + (end - start) // 2 + 1)  # at most this many samples are left (each takes >= 2 sentences)
    targets = sample_targets(seed, max_length, short_seq_prob, np.full(len(ks), doc + doc0), ks).tolist()
    prefix = cum[start : end + 1].tolist()  # prefix[i] = cum[start + i]
    firsts, stops = [], []
    s, i = start, 0
    while end - s >= 2:
        j = bisect.bisect_left(prefix, prefix[s - start] + targets[i]) + start
        stop = min(max(j, s + 2), end)
        if end - stop == 1:
            stop = end
        firsts.append(s)
        stops.append(stop)
        s, i = stop, i + 1
    n = len(firsts)
    return np.full(n, doc), ks[:n], np.asarray(firsts), np.asarray(stops), np.asarray(targets[:n], dtype=np.int64)


def build_sample_index(corpus: Corpus, max_length: int, short_seq_prob: float, seed: int) -> np.ndarray:
    """Pack each document's sentences into samples of >= 2 sentences (SOP needs an A and a B).

    Returns int64 [N, 4]: doc, first sentence, end sentence (exclusive), target length in tokens, in document
    order. Each sample takes consecutive sentences until their tokens reach its target (`sample_targets`).
    """
    parts = [shard_samples(*shard, max_length, short_seq_prob, seed) for shard in corpus_shards(corpus)]
    return np.concatenate(parts) if parts else np.zeros((0, 4), dtype=np.int64)


def index_key(corpus: Corpus, split: str, max_length: int, short_seq_prob: float, seed: int) -> str:
    blob = json.dumps([INDEX_VERSION, corpus.manifest_hash, split, max_length, short_seq_prob, seed])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class IndexWaitTimeout(UserError):
    """Rank 0 did not publish the sample index in time (it failed, or the cache is not on a shared filesystem)."""


NPY_HEADER_BYTES = 128  # fixed, so the row count can be written after the rows are (streaming write)


def _npy_header(rows: int) -> bytes:
    """A .npy v1.0 header for int64 [rows, 4], padded to NPY_HEADER_BYTES (np.load reads it as usual)."""
    text = f"{{'descr': '<i8', 'fortran_order': False, 'shape': ({rows}, 4), }}"
    body_len = NPY_HEADER_BYTES - 10
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", body_len) + text.ljust(body_len - 1).encode("latin1") + b"\n"


def write_sample_index(corpus: Corpus, path: Path, max_length: int, short_seq_prob: float, seed: int) -> dict[str, Any]:
    """Build the index shard by shard, streaming rows to `path` (temp + rename): memory is one shard's arrays and
    samples, whatever the corpus size. Returns the sidecar record (rows, crc32) that `publish` writes."""
    crc, rows = 0, 0
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(_npy_header(0))
        for shard in corpus_shards(corpus):
            part = np.ascontiguousarray(shard_samples(*shard, max_length, short_seq_prob, seed), dtype="<i8")
            crc = zlib.crc32(part.data, crc)
            rows += len(part)
            f.write(part.data)
        f.seek(0)
        f.write(_npy_header(rows))
    return {"version": INDEX_VERSION, "rows": rows, "crc32": crc, "file": path.name}


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def read_published_index(path: Path, verify: bool = True) -> np.ndarray | None:
    """The index at `path` as a read-only memmap if its sidecar says it is complete and (with `verify`) its crc32
    matches; None when absent, half-written or corrupt (the caller rebuilds or waits)."""
    try:
        meta = json.loads(_sidecar(path).read_text(encoding="utf-8"))
        index = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return None
    if index.ndim != 2 or index.shape[1] != 4 or len(index) != meta.get("rows") or meta.get("version") != INDEX_VERSION:
        return None
    if verify and zlib.crc32(np.ascontiguousarray(index).data) != meta.get("crc32"):
        return None
    return index


def _wait_for_index(path: Path, timeout_s: float, log: Callable[[str], None]) -> np.ndarray:
    """Poll for the index rank 0 publishes; a clear error instead of rebuilding when it never comes."""
    start = time.monotonic()
    next_note = start + 30
    while True:
        index = read_published_index(path)
        if index is not None:
            return index
        now = time.monotonic()
        if now - start > timeout_s:
            raise IndexWaitTimeout(
                f"{path}: the sample index did not appear within {timeout_s:.0f} s. Rank 0 builds it; it may have "
                "failed (see its log), or this cache directory is not on a filesystem every node shares (set "
                "data.index_cache_dir to one). `python -m pretrain build-index --config ...` builds it ahead of time."
            )
        if now >= next_note:
            log(f"waiting for rank 0 to build the sample index {path} ({now - start:.0f} s)")
            next_note = now + 60
        time.sleep(0.5)


def load_or_build_index(
    corpus: Corpus,
    split: str,
    max_length: int,
    short_seq_prob: float,
    seed: int,
    cache_dirs: Sequence[Path],
    builder: bool | None = None,
    wait_timeout_s: float = 3600.0,
    log: Callable[[str], None] = print,
) -> tuple[np.ndarray, Path | None, bool]:
    """The sample index, built once per job and memmapped by every rank.

    A published index (.npy + .json sidecar with its row count and crc32) in any cache dir is used as it is (a
    half-written or corrupt one is rebuilt, never used). Otherwise the builder — global rank 0 unless `builder`
    says otherwise — writes it to the first writable cache dir (temp + rename, then the sidecar), while the other
    ranks wait for it (up to `wait_timeout_s`, with a progress line and then a clear error) instead of rebuilding.
    With no writable cache dir the builder keeps the index in memory. Returns (index, path or None, built_now).
    """
    if builder is None:
        builder = resolve_env(export=False).rank == 0
    name = f"sample_index_{split}_{index_key(corpus, split, max_length, short_seq_prob, seed)}.npy"
    for d in cache_dirs:
        index = read_published_index(Path(d) / name)
        if index is not None:
            return index, Path(d) / name, False
    if not builder:
        return (
            _wait_for_index(_first_writable(cache_dirs, name) or Path(cache_dirs[0]) / name, wait_timeout_s, log),
            _first_writable(cache_dirs, name),
            False,
        )
    path = _first_writable(cache_dirs, name)
    if path is None:
        return build_sample_index(corpus, max_length, short_seq_prob, seed), None, True
    _sidecar(path).unlink(missing_ok=True)  # an old, corrupt publication must not be read while we rebuild
    meta = write_sample_index(corpus, path, max_length, short_seq_prob, seed)
    atomic_write_json(_sidecar(path), meta)
    return np.load(path, mmap_mode="r"), path, True


def _first_writable(cache_dirs: Sequence[Path], name: str) -> Path | None:
    """`dir/name` in the first cache dir that exists or can be created and is writable."""
    for d in cache_dirs:
        d = Path(d)
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(d, os.W_OK):
            return d / name
    return None


# ------------------------------------------------------------------------------------------------- tokenizer facts


def _vocab_tokens(tokenizer_dir: Path) -> list[str] | None:
    vocab_txt = tokenizer_dir / "vocab.txt"
    if vocab_txt.is_file():
        return vocab_txt.read_text(encoding="utf-8").split("\n")
    tok_json = tokenizer_dir / "tokenizer.json"
    if tok_json.is_file():
        model = json.loads(tok_json.read_text(encoding="utf-8")).get("model", {})
        vocab = model.get("vocab")
        if isinstance(vocab, dict):
            tokens = [""] * (max(vocab.values()) + 1)
            for tok, i in vocab.items():
                tokens[i] = tok
            return tokens
        if isinstance(vocab, list):  # unigram: [[piece, score], ...]
            return [v[0] if isinstance(v, list) else str(v) for v in vocab]
    for spm in sorted(tokenizer_dir.glob("*.model")):
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor(model_file=str(spm))
        return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    return None


def word_start_table(tokenizer_dir: Path | str | None, vocab_size: int) -> np.ndarray:
    """bool[vocab]: True where a token begins a word (WordPiece: no '##'; SentencePiece: leading '▁').

    Whole-word n-gram masking needs it; with no readable tokenizer every token counts as a word (token n-grams).
    """
    table = np.ones(vocab_size, dtype=bool)
    tokens = _vocab_tokens(Path(tokenizer_dir)) if tokenizer_dir else None
    if not tokens:
        return table
    tokens = tokens[:vocab_size]
    spm_style = sum(t.startswith("\u2581") for t in tokens) > len(tokens) // 10
    for i, t in enumerate(tokens):
        if spm_style:
            table[i] = t.startswith("\u2581") or (t.startswith("<") and t.endswith(">")) or t.startswith("[")
        else:
            table[i] = not t.startswith("##")
    return table


def replacement_ids(special_ids: dict, vocab_size: int, tokenizer_dir: Path | str | None) -> np.ndarray:
    """Token ids that the 10 % random replacement may draw: everything but special and [unusedN] tokens."""
    excluded = {int(v) for k, v in special_ids.items() if k != "vocab_size" and v is not None and int(v) >= 0}
    tokens = _vocab_tokens(Path(tokenizer_dir)) if tokenizer_dir else None
    ids = []
    for i in range(vocab_size):
        if i in excluded:
            continue
        if tokens and i < len(tokens) and tokens[i].startswith("[unused"):
            continue
        ids.append(i)
    return np.asarray(ids, dtype=np.int64)


# --------------------------------------------------------------------------------------------------------- samples


@dataclass(frozen=True)
class MaskingConfig:
    max_length: int
    masked_lm_prob: float = 0.15
    max_ngram: int = 3
    seed: int = 1234


class PretrainingDataset:
    """Samples of one prepared corpus. `dataset[i]` -> dict of int64 numpy arrays (unpadded)."""

    def __init__(
        self,
        corpus: Corpus,
        index: np.ndarray,
        masking: MaskingConfig,
        corpus_id: int = 0,
    ) -> None:
        self.corpus = corpus
        self.index = index
        self.masking = masking
        self.corpus_id = corpus_id
        special = corpus.special_ids
        self.vocab_size = int(special["vocab_size"])
        self.cls_id, self.sep_id, self.mask_id = int(special["cls"]), int(special["sep"]), int(special["mask"])
        self.pad_id = int(special["pad"])
        self.word_start = word_start_table(corpus.tokenizer_dir, self.vocab_size)
        self.random_ids = replacement_ids(special, self.vocab_size, corpus.tokenizer_dir)
        n = masking.max_ngram
        p = 1.0 / np.arange(1, n + 1)
        self.ngram_p = p / p.sum()

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        doc, first, end, target = (int(v) for v in self.index[i])
        rng = np.random.default_rng([self.masking.seed, self.corpus_id, int(i)])
        sentences = [np.asarray(self.corpus.sentence(s), dtype=np.int64) for s in range(first, end)]
        split = int(rng.integers(1, len(sentences)))  # sentences [0, split) -> A, the rest -> B
        a = np.concatenate(sentences[:split])
        b = np.concatenate(sentences[split:])
        swapped = bool(rng.random() < 0.5)
        if swapped:
            a, b = b, a
        a, b = _truncate_pair(a, b, max(target, 2), rng)
        tokens = np.concatenate([[self.cls_id], a, [self.sep_id], b, [self.sep_id]]).astype(np.int64)
        types = np.zeros(len(tokens), dtype=np.int64)
        types[len(a) + 2 :] = 1
        input_ids, labels = self._mask(tokens, len(a), rng)
        return {
            "input_ids": input_ids,
            "token_type_ids": types,
            "mlm_labels": labels,
            "sop_label": np.int64(1 if swapped else 0),
        }

    def _mask(self, tokens: np.ndarray, len_a: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """n-gram masking over whole words: spans of n words (P(n) ∝ 1/n), ~masked_lm_prob of the tokens;
        of the chosen tokens 80 % -> [MASK], 10 % -> random token, 10 % unchanged. Spans never cross [SEP]."""
        n_tok = len(tokens)
        body = np.ones(n_tok, dtype=bool)
        body[[0, len_a + 1, n_tok - 1]] = False  # [CLS] and the two [SEP]
        starts = body & (self.word_start[tokens] | ~np.roll(body, 1))  # a segment's first token starts a word
        word_pos = np.flatnonzero(starts)  # token position of each word start
        num_words = len(word_pos)
        labels = np.full(n_tok, IGNORE_INDEX, dtype=np.int64)
        if num_words == 0:
            return tokens, labels
        word_end = np.empty(num_words, dtype=np.int64)  # exclusive end of each word (next start or segment end)
        word_end[:-1] = word_pos[1:]
        word_end[-1] = n_tok - 1
        seg_of_word = (word_pos > len_a + 1).astype(np.int64)
        sep_a = len_a + 1
        crosses = (word_pos < sep_a) & (word_end > sep_a)
        word_end[crosses] = sep_a  # the last word of A ends at the first [SEP]
        budget = max(1, int(round((n_tok - 3) * self.masking.masked_lm_prob)))
        order = rng.permutation(num_words)
        ns = rng.choice(len(self.ngram_p), size=num_words, p=self.ngram_p) + 1
        # the span search on plain Python lists: numpy's per-element indexing was half of a sample's build time
        seg, first, stop = seg_of_word.tolist(), word_pos.tolist(), word_end.tolist()
        covered = [False] * num_words
        chosen: list[tuple[int, int]] = []
        count = 0
        for w, n in zip(order.tolist(), ns.tolist()):
            if count >= budget:
                break
            for span in range(n, 0, -1):  # fall back to shorter spans that fit the budget / the segment
                last = w + span - 1
                if last >= num_words or seg[last] != seg[w] or any(covered[w : last + 1]):
                    continue
                size = stop[last] - first[w]
                if count + size > budget and count > 0:
                    continue
                covered[w : last + 1] = [True] * span
                chosen.append((first[w], stop[last]))
                count += size
                break
        positions = np.concatenate([np.arange(s, e) for s, e in chosen]) if chosen else np.zeros(0, np.int64)
        labels[positions] = tokens[positions]
        out = tokens.copy()
        r = rng.random(len(positions))
        out[positions[r < 0.8]] = self.mask_id
        rand_pos = positions[(r >= 0.8) & (r < 0.9)]
        out[rand_pos] = self.random_ids[rng.integers(0, len(self.random_ids), size=len(rand_pos))]
        return out, labels


def _truncate_pair(
    a: np.ndarray, b: np.ndarray, max_tokens: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Trim the longer segment first (then both evenly) down to max_tokens, each from a random end; >= 1 each."""
    la, lb = len(a), len(b)
    excess = la + lb - max_tokens
    if excess <= 0:
        return a, b
    cut_a = min(excess, max(la - lb, 0))
    cut_b = min(excess - cut_a, max(lb - la, 0))
    rest = excess - cut_a - cut_b
    cut_a += (rest + 1) // 2
    cut_b += rest // 2
    cut_a, cut_b = min(cut_a, la - 1), min(cut_b, lb - 1)
    front_a, front_b = rng.random(2) < 0.5
    a = a[cut_a:] if front_a else a[: la - cut_a]
    b = b[cut_b:] if front_b else b[: lb - cut_b]
    return a, b


# ---------------------------------------------------------------------------------------------------------- order


class SampleOrder:
    """Global position -> (corpus, sample). Deterministic in (sizes, weights, seed); random access, no state.

    Blending: positions come in blocks of `block`; corpus k owns round(w_k * block) slots of each block (largest
    remainder), shuffled per block. The j-th draw of corpus k is sample perm_{k, j // N_k}[j % N_k]: every corpus
    walks through its own seeded epoch permutations, so within corpus k an epoch covers each sample exactly once.
    """

    def __init__(self, sizes: Sequence[int], weights: Sequence[float], seed: int, block: int = 1000) -> None:
        if any(n <= 0 for n in sizes):
            raise ValueError(f"every corpus needs at least one sample; sizes {list(sizes)}")
        self.sizes = [int(n) for n in sizes]
        self.seed = seed
        if len(sizes) == 1:
            self.block = 1
            self.counts = np.array([1], dtype=np.int64)
        else:
            self.block = block
            w = np.asarray(weights, dtype=np.float64)
            exact = w / w.sum() * block
            counts = np.floor(exact).astype(np.int64)
            remainder = exact - counts
            for k in np.argsort(-remainder, kind="stable")[: block - counts.sum()]:
                counts[k] += 1
            self.counts = counts
        self._perm_cache: dict[tuple[int, int], Permutation] = {}
        self._block_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def permutation(self, corpus: int, epoch: int) -> Permutation:
        """Epoch `epoch`'s shuffle of corpus `corpus`: a seeded bijection computed per position, never a table."""
        key = (corpus, epoch)
        perm = self._perm_cache.get(key)
        if perm is None:
            if len(self._perm_cache) >= 4 * len(self.sizes):
                self._perm_cache.pop(next(iter(self._perm_cache)))
            perm = self._perm_cache[key] = Permutation(self.sizes[corpus], mix(self.seed, 7, corpus, epoch))
        return perm

    def _blend_block(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """(corpus of each slot, rank of the slot among its corpus' slots in this block)."""
        cached = self._block_cache.get(b)
        if cached is None:
            slots = np.repeat(np.arange(len(self.sizes)), self.counts)
            slots = np.random.default_rng([self.seed, 11, b]).permutation(slots)
            ranks = np.zeros(len(slots), dtype=np.int64)
            for k in range(len(self.sizes)):
                where = slots == k
                ranks[where] = np.arange(where.sum())
            if len(self._block_cache) > 64:
                self._block_cache.clear()
            cached = self._block_cache[b] = (slots, ranks)
        return cached

    def __call__(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(corpus ids, sample ids) for the given global positions."""
        pos = np.asarray(positions, dtype=np.int64)
        corpus = np.empty(len(pos), dtype=np.int64)
        draw = np.empty(len(pos), dtype=np.int64)
        if len(self.sizes) == 1:
            corpus[:] = 0
            draw[:] = pos
        else:
            blocks, offsets = np.divmod(pos, self.block)
            for b in np.unique(blocks).tolist():
                sel = blocks == b
                slots, ranks = self._blend_block(b)
                k = slots[offsets[sel]]
                corpus[sel] = k
                draw[sel] = b * self.counts[k] + ranks[offsets[sel]]
        sample = np.empty(len(pos), dtype=np.int64)
        sizes = np.asarray(self.sizes, dtype=np.int64)
        epochs, offs = np.divmod(draw, sizes[corpus])
        for k, e in {(int(k), int(e)) for k, e in zip(corpus.tolist(), epochs.tolist())}:
            sel = (corpus == k) & (epochs == e)
            sample[sel] = self.permutation(k, e)(offs[sel])
        return corpus, sample


class RankBatches:
    """This rank's micro-batches, from `consumed_samples` on: global batch t covers positions
    [t*GB, (t+1)*GB); rank r takes [t*GB + r*GB/R, t*GB + (r+1)*GB/R) in micro-batches of `micro`.

    Global micro-batch j = r * accum + m holds the same samples whatever R is (for a fixed micro size), which is
    what lets a resume at another world size see identical micro-batches. Iterating yields lists of
    (corpus, sample) keys for `BlendedDataset`.
    """

    def __init__(
        self, order: SampleOrder, consumed_samples: int, global_batch: int, micro: int, rank: int, world: int
    ) -> None:
        if consumed_samples % global_batch:
            raise ValueError(f"consumed_samples={consumed_samples} is not a multiple of global batch {global_batch}")
        if global_batch % (micro * world):
            raise ValueError(f"global batch {global_batch} is not divisible by micro {micro} × world {world}")
        self.order, self.consumed = order, consumed_samples
        self.gb, self.micro, self.rank, self.world = global_batch, micro, rank, world
        self.accum = global_batch // (micro * world)

    def micro_positions(self, step: int, m: int) -> np.ndarray:
        """Global positions of micro-batch m of this rank for the global batch that starts at step*GB."""
        start = step * self.gb + self.rank * (self.gb // self.world) + m * self.micro
        return np.arange(start, start + self.micro, dtype=np.int64)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        step = self.consumed // self.gb
        while True:
            for m in range(self.accum):
                corpus, sample = self.order(self.micro_positions(step, m))
                yield list(zip(corpus.tolist(), sample.tolist()))
            step += 1


def batch_digests(order: SampleOrder, steps: range, global_batch: int) -> list[str]:
    """A short hash of the samples of each global batch in `steps` (logged per step: runs that read the same data
    agree), from one call of the order (at batch 4,096, 10 steps at once cost 1.5 ms a step instead of 4.9)."""
    corpus, sample = order(np.arange(steps.start * global_batch, steps.stop * global_batch))
    pairs = np.stack([corpus, sample]).reshape(2, len(steps), global_batch)
    return [hashlib.sha1(np.ascontiguousarray(pairs[:, i]).tobytes()).hexdigest()[:16] for i in range(len(steps))]


class BlendedDataset(torch.utils.data.Dataset):
    """Map-style dataset keyed by (corpus, sample), so a DataLoader can build samples in worker processes."""

    def __init__(self, datasets: Sequence[PretrainingDataset]) -> None:
        self.datasets = list(datasets)

    def __len__(self) -> int:
        return sum(len(d) for d in self.datasets)

    def __getitem__(self, key: tuple[int, int]) -> dict[str, np.ndarray]:
        k, i = key
        item = self.datasets[k][i]
        item["key"] = np.asarray([k, i], dtype=np.int64)
        return item


def train_loader(
    datasets: Sequence[Any],
    batches: RankBatches,
    collator: Collator,
    num_workers: int,
    worker_init: Callable[[int], None] | None = None,
) -> torch.utils.data.DataLoader:
    """This rank's micro-batches (`batches`), built in `num_workers` worker processes when > 0."""
    return torch.utils.data.DataLoader(
        BlendedDataset(datasets),
        batch_sampler=batches,
        collate_fn=collator,
        num_workers=num_workers,
        worker_init_fn=worker_init if num_workers else None,
        prefetch_factor=4 if num_workers else None,
        persistent_workers=False,
        pin_memory=torch.cuda.is_available(),  # page-locked batches: the trainer's non_blocking copy never waits
    )
