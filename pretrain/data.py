"""Pre-training samples built at load time from data_prep's shards: SOP pairs + n-gram masking.

- `build_sample_index`: per document, consecutive sentences packed up to a target length (max_seq_len - 3, or with
  probability short_seq_prob a shorter random one). Row = (doc, first sentence, end sentence, target length).
  Deterministic given (corpus, max_seq_len, short_seq_prob, seed), cached as .npy beside the data (written
  atomically, `common.io.atomic_path`).
  Every rank that misses the cache builds it itself, in memory, deterministically: no rank waits on another.
- `PretrainingDataset[i]`: an RNG seeded by (seed, corpus, i) picks the A/B split, the swap (SOP label), the
  truncation and the masking, so sample i is the same whatever the number of workers, ranks or restarts.
- `SampleOrder`: global position p (= consumed_samples + offset) -> (corpus, sample); corpora blended by weight,
  each in its own seeded epoch permutations. `RankBatches` gives rank r its disjoint slice of every global batch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from common.io import atomic_path

INDEX_VERSION = 1
IGNORE_INDEX = -100


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


def build_sample_index(corpus: Corpus, max_seq_len: int, short_seq_prob: float, seed: int) -> np.ndarray:
    """Pack each document's sentences into samples of >= 2 sentences (SOP needs an A and a B).

    Returns int64 [N, 4]: doc, first sentence, end sentence (exclusive), target length in tokens.
    One pass over documents with a binary search per sample, so cost scales with the number of samples.
    """
    max_tokens = max_seq_len - 3
    lengths = np.asarray(corpus.sentence_lengths, dtype=np.int64)
    cum = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cum[1:])
    bounds = np.asarray(corpus.doc_boundaries, dtype=np.int64)
    rng = np.random.default_rng([seed, INDEX_VERSION, max_seq_len])
    rows: list[tuple[int, int, int, int]] = []
    for doc in range(len(bounds) - 1):
        start, end = int(bounds[doc]), int(bounds[doc + 1])
        while end - start >= 2:
            target = max_tokens
            if short_seq_prob > 0 and rng.random() < short_seq_prob:
                target = int(rng.integers(2, max_tokens + 1))
            # smallest j with cum[j] - cum[start] >= target; the sample is sentences [start, j)
            j = int(np.searchsorted(cum, cum[start] + target, side="left"))
            stop = min(max(j, start + 2), end)
            if end - stop == 1:  # a lone trailing sentence cannot form a pair: give it to this sample
                stop = end
            rows.append((doc, start, stop, target))
            start = stop
    if not rows:
        return np.zeros((0, 4), dtype=np.int64)
    return np.asarray(rows, dtype=np.int64)


def index_key(corpus: Corpus, split: str, max_seq_len: int, short_seq_prob: float, seed: int) -> str:
    blob = json.dumps([INDEX_VERSION, corpus.manifest_hash, split, max_seq_len, short_seq_prob, seed])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_or_build_index(
    corpus: Corpus,
    split: str,
    max_seq_len: int,
    short_seq_prob: float,
    seed: int,
    cache_dirs: Sequence[Path],
) -> tuple[np.ndarray, Path | None, bool]:
    """The cached index if any cache dir has it, else build it and try to write it (first writable dir).

    Returns (index, path it lives at or None, built_now). Writing is temp + rename; concurrent writers write the
    same bytes, so whichever rename lands last is still correct.
    """
    name = f"sample_index_{split}_{index_key(corpus, split, max_seq_len, short_seq_prob, seed)}.npy"
    for d in cache_dirs:
        path = Path(d) / name
        if path.is_file():
            try:
                index = np.load(path, mmap_mode="r")
                if index.ndim == 2 and index.shape[1] == 4:
                    return index, path, False
            except (ValueError, OSError):
                pass  # unreadable cache: rebuild below
    index = build_sample_index(corpus, max_seq_len, short_seq_prob, seed)
    for d in cache_dirs:
        path = Path(d) / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(path) as tmp, open(tmp, "wb") as f:
                np.save(f, index)
            return index, path, True
        except OSError:
            continue
    return index, None, True


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
    max_seq_len: int
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
        covered = np.zeros(num_words, dtype=bool)
        chosen: list[tuple[int, int]] = []
        count = 0
        for w, n in zip(order.tolist(), ns.tolist()):
            if count >= budget:
                break
            for span in range(n, 0, -1):  # fall back to shorter spans that fit the budget / the segment
                last = w + span - 1
                if last >= num_words or seg_of_word[last] != seg_of_word[w] or covered[w : last + 1].any():
                    continue
                size = int(word_end[last] - word_pos[w])
                if count + size > budget and count > 0:
                    continue
                covered[w : last + 1] = True
                chosen.append((int(word_pos[w]), int(word_end[last])))
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
        self._perm_cache: dict[tuple[int, int], np.ndarray] = {}
        self._block_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def permutation(self, corpus: int, epoch: int) -> np.ndarray:
        key = (corpus, epoch)
        perm = self._perm_cache.get(key)
        if perm is None:
            if len(self._perm_cache) >= 2 * len(self.sizes):
                self._perm_cache.pop(next(iter(self._perm_cache)))
            perm = np.random.default_rng([self.seed, 7, corpus, epoch]).permutation(self.sizes[corpus])
            self._perm_cache[key] = perm
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
            sample[sel] = self.permutation(k, e)[offs[sel]]
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


def batch_digest(order: SampleOrder, step: int, global_batch: int) -> str:
    """A short hash of the samples of global batch `step` (logged per step: runs that read the same data agree)."""
    corpus, sample = order(np.arange(step * global_batch, (step + 1) * global_batch))
    return hashlib.sha1(np.stack([corpus, sample]).tobytes()).hexdigest()[:16]


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


def collate(items: list[dict[str, np.ndarray]], pad_id: int = 0, multiple: int = 8) -> dict[str, torch.Tensor]:
    """Pad to the longest sample (rounded up to `multiple`): deterministic, and cheaper than max_seq_len."""
    longest = max(len(it["input_ids"]) for it in items)
    length = -(-longest // multiple) * multiple
    n = len(items)
    input_ids = np.full((n, length), pad_id, dtype=np.int64)
    types = np.zeros((n, length), dtype=np.int64)
    labels = np.full((n, length), IGNORE_INDEX, dtype=np.int64)
    attention = np.zeros((n, length), dtype=np.int64)
    for r, it in enumerate(items):
        t = len(it["input_ids"])
        input_ids[r, :t] = it["input_ids"]
        types[r, :t] = it["token_type_ids"]
        labels[r, :t] = it["mlm_labels"]
        attention[r, :t] = 1
    batch = {
        "input_ids": torch.from_numpy(input_ids),
        "token_type_ids": torch.from_numpy(types),
        "attention_mask": torch.from_numpy(attention),
        "mlm_labels": torch.from_numpy(labels),
        "sop_labels": torch.from_numpy(np.asarray([it["sop_label"] for it in items], dtype=np.int64)),
    }
    if "key" in items[0]:
        batch["keys"] = torch.from_numpy(np.stack([it["key"] for it in items]))
    return batch


class Collator:
    """Picklable collate with the pad id bound (DataLoader workers pickle it)."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, items: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
        return collate(items, self.pad_id)
