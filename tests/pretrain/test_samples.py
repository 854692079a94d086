"""Samples from real prepared Gutenberg shards: index, SOP pairs, n-gram masking, order across ranks, blending."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest

from data_prep.reader import PreparedCorpus
from pretrain.data import (
    IGNORE_INDEX,
    BlendedDataset,
    MaskingConfig,
    PretrainingDataset,
    RankBatches,
    SampleOrder,
    build_sample_index,
    collate,
    load_or_build_index,
)

SEQ = 128


@pytest.fixture(scope="module")
def corpus(prepared_gutenberg):
    return PreparedCorpus(prepared_gutenberg, "train")


@pytest.fixture(scope="module")
def dataset(corpus, tmp_path_factory):
    index, _, _ = load_or_build_index(corpus, "train", SEQ, 0.1, 7, [tmp_path_factory.mktemp("idx")])
    return PretrainingDataset(corpus, index, MaskingConfig(SEQ, 0.15, 3, 7))


def test_index_packs_whole_documents_in_order(corpus):
    index = build_sample_index(corpus, SEQ, 0.0, 1)
    bounds = corpus.doc_boundaries
    lengths = corpus.sentence_lengths
    assert len(index) > 1000
    for doc, first, end, target in index:
        assert bounds[doc] <= first and end <= bounds[doc + 1] and end - first >= 2  # an A and a B
        assert target == SEQ - 3
        # packing stops at the first sentence that reaches the target (or takes a lone trailing one)
        assert lengths[first : end - 1].sum() < target or end - first == 2 or end == bounds[doc + 1]
    # consecutive samples of a document tile it without gaps or overlaps
    same_doc = index[1:, 0] == index[:-1, 0]
    assert (index[1:, 1][same_doc] == index[:-1, 2][same_doc]).all()


def test_index_cache_is_reused_and_atomic(corpus, tmp_path):
    a, path, built = load_or_build_index(corpus, "train", SEQ, 0.1, 3, [tmp_path / "ro", tmp_path / "rw"])
    assert built and path is not None and path.is_file()
    assert not list(path.parent.glob(".*tmp*")), "no temporary files left behind"
    b, path2, built2 = load_or_build_index(corpus, "train", SEQ, 0.1, 3, [tmp_path / "ro", tmp_path / "rw"])
    assert not built2 and path2 == path and np.array_equal(a, b)
    _, path3, _ = load_or_build_index(corpus, "train", SEQ, 0.1, 4, [tmp_path / "rw"])  # another seed: another key
    assert path3 != path


def test_sample_layout_and_sop(dataset):
    cls, sep = dataset.cls_id, dataset.sep_id
    labels = []
    for i in range(300):
        s = dataset[i]
        ids, types, mlm = s["input_ids"], s["token_type_ids"], s["mlm_labels"]
        assert len(ids) <= SEQ and len(ids) == len(types) == len(mlm)
        seps = np.flatnonzero((ids == sep) & (mlm == IGNORE_INDEX))
        assert ids[0] == cls and ids[-1] == sep and len(seps) >= 2
        first_sep = seps[0]
        assert (types[: first_sep + 1] == 0).all() and (types[first_sep + 1 :] == 1).all()
        assert first_sep >= 2 and len(ids) - first_sep >= 3  # both segments non-empty
        assert mlm[0] == IGNORE_INDEX and mlm[first_sep] == IGNORE_INDEX and mlm[-1] == IGNORE_INDEX
        labels.append(int(s["sop_label"]))
    assert 0.4 < np.mean(labels) < 0.6


def test_sop_label_matches_segment_order(dataset, corpus):
    """Label 0: A precedes B in the document; label 1: swapped. Check against the raw sentences."""
    for i in range(100):
        doc, first, end, _ = dataset.index[i]
        s = dataset[i]
        ids, mlm = s["input_ids"].copy(), s["mlm_labels"]
        ids[mlm != IGNORE_INDEX] = mlm[mlm != IGNORE_INDEX]  # undo the masking
        first_sep = int(np.flatnonzero(s["token_type_ids"])[0]) - 1
        seg_a = ids[1:first_sep]
        text = np.concatenate([corpus.sentence(j) for j in range(first, end)]).astype(np.int64)
        pos = next(p for p in range(len(text) - len(seg_a) + 1) if np.array_equal(text[p : p + len(seg_a)], seg_a))
        seg_b = ids[first_sep + 1 : -1]
        pos_b = next(p for p in range(len(text) - len(seg_b) + 1) if np.array_equal(text[p : p + len(seg_b)], seg_b))
        assert (pos > pos_b) == bool(s["sop_label"])


def test_ngram_masking_statistics(dataset):
    masked = total = 0
    replaced = {"mask": 0, "random": 0, "kept": 0}
    span_lengths = []
    for i in range(600):
        s = dataset[i]
        ids, mlm = s["input_ids"], s["mlm_labels"]
        sel = mlm != IGNORE_INDEX
        body = len(ids) - 3
        masked += sel.sum()
        total += body
        replaced["mask"] += (ids[sel] == dataset.mask_id).sum()
        replaced["kept"] += (ids[sel] == mlm[sel]).sum()
        replaced["random"] += ((ids[sel] != dataset.mask_id) & (ids[sel] != mlm[sel])).sum()
        # whole words: a masked continuation piece ('##x') always has its word start masked too, unless it opens a
        # segment (truncation from the front can cut a word: the segment's first token then counts as a word start)
        pos = np.flatnonzero(sel)
        segment_starts = {1, int(np.flatnonzero(s["token_type_ids"])[0])}
        for p in pos:
            if not dataset.word_start[mlm[p]] and p not in segment_starts:
                assert sel[p - 1], f"sample {i}: continuation at {p} masked without its word start"
        runs = np.split(pos, np.flatnonzero(np.diff(pos) != 1) + 1) if len(pos) else []
        for run in runs:
            span_lengths.append(int(dataset.word_start[mlm[run]].sum()))  # words in the contiguous run
    assert 0.12 < masked / total < 0.18
    frac = {k: v / masked for k, v in replaced.items()}
    assert 0.75 < frac["mask"] < 0.85 and 0.07 < frac["random"] < 0.14 and 0.06 < frac["kept"] < 0.14
    # n-grams: runs of 2+ words exist and are rarer than single words (P(n) ∝ 1/n; adjacent spans can merge)
    counts = np.bincount(span_lengths)
    assert counts[1] > counts[2] > 0 and counts[3] > 0


def test_samples_are_deterministic_across_objects_and_processes(dataset, corpus):
    again = PretrainingDataset(corpus, np.array(dataset.index), dataset.masking)
    for i in (0, 5, 17, len(dataset) - 1):
        a, b = dataset[i], again[i]
        assert all(np.array_equal(a[k], b[k]) for k in a)
    # and in a fresh process (as in a DataLoader worker or on another rank)
    blob = pickle.dumps(again)
    code = (
        "import pickle,sys,numpy as np; d=pickle.loads(sys.stdin.buffer.read()); "
        "s=d[17]; sys.stdout.write(','.join(map(str, s['input_ids'].tolist())) + '|' + str(int(s['sop_label'])))"
    )
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, check=True).stdout.decode()
    ref = dataset[17]
    assert out == ",".join(map(str, ref["input_ids"].tolist())) + "|" + str(int(ref["sop_label"]))
    other_seed = PretrainingDataset(corpus, np.array(dataset.index), MaskingConfig(SEQ, 0.15, 3, 8))
    assert any(not np.array_equal(dataset[i]["input_ids"], other_seed[i]["input_ids"]) for i in range(5))


def test_collate_pads_and_masks(dataset):
    batch = collate([dataset[i] for i in range(4)], pad_id=0)
    lengths = [len(dataset[i]["input_ids"]) for i in range(4)]
    assert batch["input_ids"].shape[1] % 8 == 0 and batch["input_ids"].shape[1] >= max(lengths)
    assert batch["attention_mask"].sum(1).tolist() == lengths
    assert (batch["mlm_labels"][batch["attention_mask"] == 0] == IGNORE_INDEX).all()


# ------------------------------------------------------------------------------------------------------- order


def test_ranks_read_disjoint_samples_and_an_epoch_covers_everything(dataset):
    n = len(dataset)
    order = SampleOrder([n], [1.0], seed=5)
    gb, micro, world = 16, 2, 2
    accum = gb // (micro * world)
    by_rank: dict[int, dict[int, int]] = {}  # rank -> {global position: sample}
    for rank in range(world):
        batches = RankBatches(order, 0, gb, micro, rank, world)
        it = iter(batches)
        got = {}
        for step in range(-(-n // gb)):
            for m in range(accum):
                keys = next(it)
                got.update(zip(batches.micro_positions(step, m).tolist(), [i for _, i in keys]))
        by_rank[rank] = {p: i for p, i in got.items() if p < n}  # the first epoch
    samples = [set(by_rank[r].values()) for r in range(world)]
    assert not samples[0] & samples[1], "ranks overlap within the epoch"
    assert sum(len(by_rank[r]) for r in range(world)) == n
    assert samples[0] | samples[1] == set(range(n)), "one epoch = every sample exactly once"
    first_epoch = [({**by_rank[0], **by_rank[1]})[p] for p in range(n)]
    assert first_epoch != list(range(n)), "shuffled"
    second = order(np.arange(n, 2 * n))[1].tolist()
    assert sorted(second) == list(range(n)) and second != first_epoch  # a new permutation per epoch


def test_same_micro_batches_at_any_world_size():
    """Global micro-batch j holds the same samples whether 1, 2 or 4 ranks split the global batch: what makes a
    resume at another world size see the same data (and dropout seeds) for a fixed micro-batch size."""
    order = SampleOrder([500], [1.0], seed=1)
    gb, micro = 16, 2

    def global_micro_batches(world, start):
        per_rank = [iter(RankBatches(order, start, gb, micro, r, world)) for r in range(world)]
        accum = gb // (micro * world)
        out = []
        for _ in range(3):  # three optimizer steps
            for it in per_rank:
                out += [next(it) for _ in range(accum)]
        return out

    ref = global_micro_batches(1, 32)
    assert global_micro_batches(2, 32) == ref == global_micro_batches(4, 32)
    with pytest.raises(ValueError):
        RankBatches(order, 33, gb, micro, 0, 1)  # consumed_samples must sit on a global-batch boundary


def test_blending_follows_weights_and_each_corpus_walks_its_epochs():
    order = SampleOrder([50, 300, 120], [0.2, 0.5, 0.3], seed=3, block=100)
    corpus, sample = order(np.arange(1000))
    assert np.bincount(corpus).tolist() == [200, 500, 300]  # exact per block of 100
    assert np.bincount(order(np.arange(100))[0]).tolist() == [20, 50, 30]
    first_50 = sample[corpus == 0][:50]
    assert sorted(first_50.tolist()) == list(range(50))  # corpus 0's first epoch: each sample once
    assert np.array_equal(order(np.arange(500, 520))[1], sample[500:520]), "random access = sequential"


def test_blended_dataset_keys(dataset):
    blend = BlendedDataset([dataset, dataset])
    item = blend[(1, 3)]
    assert item["key"].tolist() == [1, 3] and np.array_equal(item["input_ids"], dataset[3]["input_ids"])


def test_dataloader_workers_give_the_same_batches(dataset):
    """Samples built in worker processes (as on GPUs, data.num_workers > 0) equal the in-process ones, in order."""
    import torch

    from pretrain.data import Collator

    order = SampleOrder([len(dataset)], [1.0], seed=2)

    def batches(workers):
        loader = torch.utils.data.DataLoader(
            BlendedDataset([dataset]),
            batch_sampler=RankBatches(order, 32, 16, 4, 1, 2),
            collate_fn=Collator(0),
            num_workers=workers,
            prefetch_factor=2 if workers else None,
        )
        it = iter(loader)
        return [next(it) for _ in range(6)]

    for a, b in zip(batches(0), batches(2)):
        assert all(torch.equal(a[k], b[k]) for k in a)
