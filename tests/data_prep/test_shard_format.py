import numpy as np
import pytest

from data_prep.errors import DataPrepError
from data_prep.shard_format import (
    HEADER_SIZE,
    PartWriter,
    SplitWriter,
    concat_shards,
    open_bin,
    open_idx_arrays,
    read_idx_header,
    token_dtype,
)


def _docs(rng, n_docs, vocab=30000):
    counts = rng.integers(1, 6, n_docs)
    lens = rng.integers(1, 40, int(counts.sum())).astype(np.int32)
    ids = rng.integers(0, vocab, int(lens.sum())).astype(np.uint16)
    return ids, lens, counts


def test_dtype_choice():
    assert token_dtype(30522) == np.uint16
    assert token_dtype(65535) == np.uint16
    assert token_dtype(65536) == np.uint32
    assert token_dtype(250_000) == np.uint32


@pytest.mark.parametrize("n_docs", [1, 7, 50])
def test_roundtrip(tmp_path, n_docs):
    rng = np.random.default_rng(n_docs)
    ids, lens, counts = _docs(rng, n_docs)
    w = PartWriter(tmp_path / "s", np.uint16)
    w.add(ids[:0], lens[:0], counts[:0])  # no-op
    w.add(ids, lens, counts)
    info = w.close()
    h = read_idx_header(tmp_path / "s.idx")
    assert (h.num_docs, h.num_sentences, h.num_tokens) == (n_docs, len(lens), len(ids))
    assert h.bin_sha256 == info["bin_sha256"]
    starts, lengths, bounds = open_idx_arrays(tmp_path / "s.idx", h)
    tokens = open_bin(tmp_path / "s.bin", h)
    assert isinstance(tokens, np.memmap)
    np.testing.assert_array_equal(lengths, lens)
    np.testing.assert_array_equal(starts, np.concatenate([[0], np.cumsum(lens)[:-1]]))
    np.testing.assert_array_equal(bounds, np.concatenate([[0], np.cumsum(counts)]))
    np.testing.assert_array_equal(tokens, ids)
    assert h.layout()[2] % 8 == 0


def test_split_writer_rolls_over_at_document_boundaries(tmp_path):
    rng = np.random.default_rng(0)
    ids, lens, counts = _docs(rng, 200)
    w = SplitWriter(tmp_path, "train", np.uint16, shard_tokens=1000)
    # feed in uneven batches
    d = s = t = 0
    for step in (3, 50, 1, 146):
        c = counts[d : d + step]
        ns = int(c.sum())
        nt = int(lens[s : s + ns].sum())
        w.add(ids[t : t + nt], lens[s : s + ns], c)
        d, s, t = d + step, s + ns, t + nt
    parts = w.close()
    assert len(parts) > 3
    assert all(p["tokens"] <= 1000 for p in parts)
    assert sum(p["docs"] for p in parts) == 200
    # concatenating the parts gives back exactly the input, documents intact
    got_ids, got_lens, got_counts = [], [], []
    for p in parts:
        h = read_idx_header(tmp_path / f"{p['name']}.idx")
        _, ln, b = open_idx_arrays(tmp_path / f"{p['name']}.idx", h)
        got_ids.append(np.asarray(open_bin(tmp_path / f"{p['name']}.bin", h)))
        got_lens.append(np.asarray(ln))
        got_counts.append(np.diff(b))
    np.testing.assert_array_equal(np.concatenate(got_ids), ids)
    np.testing.assert_array_equal(np.concatenate(got_lens), lens)
    np.testing.assert_array_equal(np.concatenate(got_counts), counts)


def test_a_document_bigger_than_a_shard_gets_its_own_part(tmp_path):
    w = SplitWriter(tmp_path, "train", np.uint16, shard_tokens=10)
    w.add(np.arange(3, dtype=np.uint16), np.array([3], np.int32), np.array([1]))
    w.add(np.arange(25, dtype=np.uint16), np.array([20, 5], np.int32), np.array([2]))
    w.add(np.arange(4, dtype=np.uint16), np.array([4], np.int32), np.array([1]))
    parts = w.close()
    assert [p["tokens"] for p in parts] == [3, 25, 4]


def test_concat(tmp_path):
    rng = np.random.default_rng(1)
    stems, all_ids = [], []
    for k in range(3):
        ids, lens, counts = _docs(rng, 5 + k)
        w = PartWriter(tmp_path / f"p{k}", np.uint16)
        w.add(ids, lens, counts)
        w.close()
        stems.append(tmp_path / f"p{k}")
        all_ids.append(ids)
    info = concat_shards(stems, tmp_path / "all", np.uint16)
    h = read_idx_header(tmp_path / "all.idx")
    assert info["docs"] == 5 + 6 + 7 == h.num_docs
    np.testing.assert_array_equal(open_bin(tmp_path / "all.bin", h), np.concatenate(all_ids))
    starts, lengths, bounds = open_idx_arrays(tmp_path / "all.idx", h)
    assert int(bounds[-1]) == h.num_sentences and int(starts[-1]) + int(lengths[-1]) == h.num_tokens


def test_bad_headers_name_the_file(tmp_path):
    w = PartWriter(tmp_path / "s", np.uint16)
    w.add(np.arange(10, dtype=np.uint16), np.array([4, 6], np.int32), np.array([2]))
    w.close()
    raw = (tmp_path / "s.idx").read_bytes()
    (tmp_path / "bad.idx").write_bytes(b"XXXXXXXX" + raw[8:])
    with pytest.raises(DataPrepError, match=r"bad\.idx.*magic"):
        read_idx_header(tmp_path / "bad.idx")
    (tmp_path / "short.idx").write_bytes(raw[: HEADER_SIZE - 1])
    with pytest.raises(DataPrepError, match=r"short\.idx.*truncated"):
        read_idx_header(tmp_path / "short.idx")
    (tmp_path / "cut.idx").write_bytes(raw[:-8])
    with pytest.raises(DataPrepError, match=r"cut\.idx.*bytes"):
        read_idx_header(tmp_path / "cut.idx")
    h = read_idx_header(tmp_path / "s.idx")
    (tmp_path / "s.bin").write_bytes((tmp_path / "s.bin").read_bytes()[:-2])
    with pytest.raises(DataPrepError, match=r"s\.bin.*truncated"):
        open_bin(tmp_path / "s.bin", h)
