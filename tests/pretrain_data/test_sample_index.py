"""The sample index at scale: the vectorised, shard-streaming builder equals a plain reference construction; it is
built once per job (rank 0) while the other ranks wait; a half-written or corrupt index is rebuilt, never used."""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

import pretrain.data as data_module
from pretrain.data import (
    IndexWaitTimeout,
    SampleOrder,
    build_sample_index,
    load_or_build_index,
    read_published_index,
    sample_targets,
)


def reference_index(lengths: np.ndarray, bounds: np.ndarray, seq: int, short: float, seed: int) -> np.ndarray:
    """The packing rule written the obvious way: one sample at a time, document after document."""
    rows = []
    for doc in range(len(bounds) - 1):
        start, end, k = int(bounds[doc]), int(bounds[doc + 1]), 0
        while end - start >= 2:
            target = int(sample_targets(seed, seq, short, np.array([doc]), np.array([k]))[0])
            total, stop = 0, start
            while stop < end and total < target:
                total += int(lengths[stop])
                stop += 1
            stop = min(max(stop, start + 2), end)
            if end - stop == 1:
                stop = end
            rows.append((doc, start, stop, target))
            start, k = stop, k + 1
    return np.asarray(rows, dtype=np.int64).reshape(-1, 4)


@dataclass
class FakeCorpus:
    """Shards of random documents, as data_prep lays them out (documents never cross shards)."""

    shards: list[tuple[np.ndarray, np.ndarray]]  # (sentence lengths, local doc boundaries) per shard
    manifest_hash: str = "fake"
    special_ids: dict = field(default_factory=dict)
    tokenizer_dir: object = None

    def shard_arrays(self):
        doc0 = sent0 = 0
        for lengths, bounds in self.shards:
            yield doc0, sent0, lengths, bounds
            doc0 += len(bounds) - 1
            sent0 += len(lengths)

    @property
    def sentence_lengths(self) -> np.ndarray:
        return np.concatenate([lengths for lengths, _ in self.shards])

    @property
    def doc_boundaries(self) -> np.ndarray:
        out, base = [0], 0
        for lengths, bounds in self.shards:
            out.extend((np.asarray(bounds[1:]) + base).tolist())
            base += len(lengths)
        return np.asarray(out, dtype=np.int64)


def random_corpus(rng: np.random.Generator, max_doc_sentences: int = 40) -> FakeCorpus:
    shards = []
    for _ in range(int(rng.integers(1, 5))):
        # 0: an empty shard; up to 300 documents: both the vectorised rounds and the one-by-one tail run
        n_docs = int(rng.integers(0, 300 if rng.random() < 0.6 else 30))
        sizes = rng.integers(1, max_doc_sentences, size=n_docs)  # 1-sentence documents included
        bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        lengths = rng.integers(1, 120, size=int(bounds[-1])).astype(np.int32)
        if n_docs and rng.random() < 0.3:
            lengths[rng.integers(0, len(lengths))] = 5000  # a sentence longer than max_seq_len
        shards.append((lengths, bounds))
    return FakeCorpus(shards)


@pytest.mark.parametrize("seed", range(40))
def test_vectorised_index_equals_the_reference(seed):
    rng = np.random.default_rng(seed)
    corpus = random_corpus(rng)
    seq, short = int(rng.choice([16, 64, 128, 512])), float(rng.choice([0.0, 0.1, 0.5, 1.0]))
    got = build_sample_index(corpus, seq, short, seed)
    want = reference_index(corpus.sentence_lengths, corpus.doc_boundaries, seq, short, seed)
    np.testing.assert_array_equal(got, want)


def test_the_rounds_and_the_tail_agree(monkeypatch):
    """The same corpus packed all by rounds, all one by one, and mixed gives one index."""
    corpus = random_corpus(np.random.default_rng(99), max_doc_sentences=200)
    results = []
    for tail in (0, 10**9, 64):
        monkeypatch.setattr(data_module, "TAIL_DOCS", tail)
        results.append(build_sample_index(corpus, 128, 0.2, 4))
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])


def test_one_long_document_and_targets_in_range():
    corpus = FakeCorpus([(np.full(5000, 30, dtype=np.int32), np.array([0, 5000]))])
    index = build_sample_index(corpus, 128, 0.3, 1)
    assert (index[:, 3] >= 2).all() and (index[:, 3] <= 125).all()
    short = (index[:, 3] < 125).mean()
    assert 0.2 < short < 0.4, short  # the short-sequence probability shows up in the draws
    assert (index[1:, 1] == index[:-1, 2]).all() and index[0, 1] == 0 and index[-1, 2] == 5000


def _build_in_process(corpus, cache: str, builder: bool, out: mp.Queue) -> None:
    import pretrain.data as data

    calls = []
    original = data.write_sample_index
    data.write_sample_index = lambda *a, **k: calls.append(1) or original(*a, **k)
    index, path, built = data.load_or_build_index(
        corpus, "train", 64, 0.1, 3, [Path(cache)], builder=builder, wait_timeout_s=60, log=lambda _: None
    )
    out.put((builder, len(calls), built, int(np.asarray(index).sum()), str(path)))


def test_only_rank_0_builds_and_the_other_rank_waits_for_it(tmp_path):
    corpus = random_corpus(np.random.default_rng(5), max_doc_sentences=400)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    waiter = ctx.Process(target=_build_in_process, args=(corpus, str(tmp_path), False, out))
    waiter.start()
    time.sleep(1.0)  # the waiter is polling before the builder starts
    builder = ctx.Process(target=_build_in_process, args=(corpus, str(tmp_path), True, out))
    builder.start()
    results = {r[0]: r for r in (out.get(timeout=60), out.get(timeout=60))}
    waiter.join(10), builder.join(10)
    assert results[True][1] == 1 and results[True][2] is True  # the builder built once
    assert results[False][1] == 0 and results[False][2] is False  # the waiter never called the builder
    assert results[True][3] == results[False][3] and results[True][4] == results[False][4]


def test_a_waiting_rank_times_out_with_a_clear_message(tmp_path):
    corpus = random_corpus(np.random.default_rng(1))
    with pytest.raises(IndexWaitTimeout, match="did not appear within 1 s.*Rank 0 builds it.*build-index"):
        load_or_build_index(
            corpus, "train", 64, 0.1, 3, [tmp_path], builder=False, wait_timeout_s=1, log=lambda _: None
        )


def test_half_written_or_corrupt_index_is_rebuilt_never_used(tmp_path):
    corpus = random_corpus(np.random.default_rng(2), max_doc_sentences=200)
    index, path, built = load_or_build_index(corpus, "train", 64, 0.1, 3, [tmp_path], builder=True)
    good = np.array(index)
    assert built and read_published_index(path) is not None
    sidecar = path.with_name(path.name + ".json")
    assert json.loads(sidecar.read_text())["rows"] == len(good)

    data = bytearray(path.read_bytes())  # a bit flip inside the rows
    data[200] ^= 0xFF
    path.write_bytes(bytes(data))
    assert read_published_index(path) is None
    again, _, rebuilt = load_or_build_index(corpus, "train", 64, 0.1, 3, [tmp_path], builder=True)
    assert rebuilt and np.array_equal(again, good)

    path.write_bytes(path.read_bytes()[: len(data) // 2])  # truncated
    assert read_published_index(path) is None
    sidecar.unlink()  # a builder killed before publishing: the .npy alone is never trusted
    _, _, rebuilt = load_or_build_index(corpus, "train", 64, 0.1, 3, [tmp_path], builder=True)
    assert rebuilt and np.array_equal(np.load(path), good)


def test_the_index_is_a_memmap_and_order_needs_no_table(tmp_path):
    corpus = random_corpus(np.random.default_rng(3), max_doc_sentences=200)
    index, _, _ = load_or_build_index(corpus, "train", 64, 0.1, 3, [tmp_path], builder=True)
    assert isinstance(index, np.memmap)
    order = SampleOrder([10**9, 3 * 10**8], [0.7, 0.3], seed=1)
    corpus_ids, samples = order(np.arange(4096 * 10))  # a billion-sample corpus: no per-rank table
    assert len(np.unique(np.stack([corpus_ids, samples]), axis=1).T) == 4096 * 10
    assert all(len(p.keys) == 4 for p in order._perm_cache.values())  # permutations are keys, not arrays
