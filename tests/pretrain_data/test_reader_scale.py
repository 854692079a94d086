"""The reader at scale: what it holds per shard are memmaps (never copies), at most `max_open_shards` shards stay
open (two file descriptors each), and a pass over every shard (the index builder's) leaves none open."""

from __future__ import annotations

import os

import numpy as np
import pytest
from requirements import SHARED_DATA, require_data

from data_prep import minilm_vocab, tokenize_corpus
from data_prep.reader import PreparedCorpus
from pretrain.data import build_sample_index, corpus_shards

WIKITEXT = SHARED_DATA / "corpus" / "wikitext-2-raw"


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory):
    require_data(WIKITEXT)
    out = tmp_path_factory.mktemp("many_shards")
    tokenize_corpus(
        [str(WIKITEXT)], out, tokenizer=minilm_vocab(), workers=1, shard_tokens=8192, valid_fraction=0.0, progress=False
    )
    corpus = PreparedCorpus(out, "train")
    assert corpus.num_shards >= 20
    return out


def is_memmap(a: np.ndarray) -> bool:
    while a is not None and not isinstance(a, np.memmap):
        a = a.base
    return a is not None


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_shards_are_memmaps_and_open_ones_are_capped(many_shards):
    corpus = PreparedCorpus(many_shards, "train")
    corpus.max_open_shards = 4
    before = open_fds()
    step = max(1, corpus.num_sentences // 200)
    for i in range(0, corpus.num_sentences, step):  # touches every shard
        assert is_memmap(corpus.sentence(i))
    assert len(corpus._open) <= 4
    assert all(is_memmap(a) for arrays in corpus._open.values() for a in arrays)
    assert open_fds() - before <= 2 * 4  # two descriptors per open shard, whatever the number of shards


def test_a_pass_over_every_shard_leaves_none_open_and_builds_the_same_index(many_shards):
    corpus = PreparedCorpus(many_shards, "train")
    for _, _, lengths, bounds in corpus_shards(corpus):
        assert is_memmap(lengths) and is_memmap(bounds)
    assert len(corpus._open) == 0
    streamed = build_sample_index(corpus, 128, 0.1, 5)

    class WholeArrays:  # the same corpus seen as one shard of concatenated arrays
        sentence_lengths, doc_boundaries = corpus.sentence_lengths, corpus.doc_boundaries

    np.testing.assert_array_equal(streamed, build_sample_index(WholeArrays(), 128, 0.1, 5))
