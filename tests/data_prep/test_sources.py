import gzip
import json
import tracemalloc

import pytest

from data_prep import sources as S
from data_prep.errors import DataPrepError


def _describe(path, boundary="auto", strip=True):
    spec = S.discover([str(path)])[0]
    return S.describe(spec, boundary, strip, "train", "text")


def _all_docs(src, unit_bytes=1 << 30, max_doc=8 << 20):
    units = S.plan_units([src], unit_bytes, max_doc)
    out = []
    for unit in units:
        for _, a, b in unit:
            r = S.DocumentReader(src, "replace", "text", max_doc, S.ReadStats())
            out += list(r.documents(a, b))
    return out, units


def test_gutenberg_header_and_footer_are_stripped(gutenberg):
    src = _describe(gutenberg / "11-0.txt")
    assert src["gutenberg"] and src["doc_boundary"] == "blank"
    raw = (gutenberg / "11-0.txt").read_bytes()
    body = raw[src["start"] : src["end"]]
    assert b"START OF THIS PROJECT GUTENBERG" in raw[: src["start"]]
    assert b"*** END OF THIS PROJECT GUTENBERG" in raw[src["end"] :]
    assert b"End of Project Gutenberg" in raw[src["end"] :]
    assert b"Project Gutenberg" not in body
    docs, _ = _all_docs(src)
    assert docs[0][1] == "ALICE’S ADVENTURES IN WONDERLAND"
    assert docs[-1][1] == "THE END"
    # no stripping when asked not to (only the UTF-8 byte-order mark is skipped)
    src2 = _describe(gutenberg / "11-0.txt", strip=False)
    assert raw.startswith(b"\xef\xbb\xbf") and (src2["start"], src2["end"]) == (3, len(raw))


@pytest.mark.parametrize("book", ["Anne-of-Green-Gables.txt", "pg1080.txt", "2600-0.txt", "pg128.txt"])
def test_gutenberg_variants(gutenberg, book):
    """Variants of the markers (THE/THIS, extra trailing material, BOM) all found."""
    src = _describe(gutenberg / book)
    raw = (gutenberg / book).read_bytes()
    assert src["gutenberg"] and 0 < src["start"] < 20_000 and src["end"] > len(raw) - 60_000
    assert b"Project Gutenberg" not in raw[src["start"] : src["end"]][:2000]
    assert b"*** END OF" not in raw[src["start"] : src["end"]]


def test_wikitext_is_one_document_per_line(wikitext):
    src = _describe(wikitext)
    assert src["doc_boundary"] == "line" and not src["gutenberg"]
    docs, _ = _all_docs(src)
    lines = [ln.strip() for ln in wikitext.read_text(encoding="utf-8").splitlines() if ln.strip()]
    assert [d for _, d in docs] == lines


@pytest.mark.parametrize("unit_bytes", [4096, 20_000, 100_000])
def test_units_partition_the_content_and_do_not_change_documents(gutenberg, unit_bytes):
    src = _describe(gutenberg / "11-0.txt")
    whole, _ = _all_docs(src)
    cut, units = _all_docs(src, unit_bytes=unit_bytes)
    assert cut == whole  # same documents, same stable offsets
    segs = [seg for u in units for seg in u]
    assert segs[0][1] == src["start"] and segs[-1][2] == src["end"]
    assert all(a[2] == b[1] for a, b in zip(segs, segs[1:]))
    sizes = [b - a for _, a, b in segs]
    assert all(unit_bytes <= n < unit_bytes + 8192 for n in sizes[:-1]) and sizes[-1] <= unit_bytes + 8192
    raw = (gutenberg / "11-0.txt").read_bytes()
    for _, _, b in segs[:-1]:
        assert raw[b - 1 : b] == b"\n" and raw[b - 4 : b].count(b"\n") == 2  # cut right after a blank line


def test_block_size_does_not_change_documents(gutenberg, monkeypatch):
    src = _describe(gutenberg / "1952-0.txt")
    big, _ = _all_docs(src)
    monkeypatch.setattr(S, "BLOCK", 997)
    small, _ = _all_docs(src)
    assert small == big and len(big) > 100


def test_small_files_are_packed_into_one_unit(small_books):
    srcs = [S.describe(s, "auto", True, "train", "text") for s in S.discover(small_books)]
    units = S.plan_units(srcs, 1 << 20, 8 << 20)
    assert units == [
        [
            [0, srcs[0]["start"], srcs[0]["end"]],
            [1, srcs[1]["start"], srcs[1]["end"]],
            [2, srcs[2]["start"], srcs[2]["end"]],
        ]
    ]


def test_compressed_inputs_give_the_same_documents(tmp_path, gutenberg):
    zstandard = pytest.importorskip("zstandard")
    raw = (gutenberg / "1952-0.txt").read_bytes()
    (tmp_path / "book.txt").write_bytes(raw)
    (tmp_path / "book.txt.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "book.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    plain, _ = _all_docs(_describe(tmp_path / "book.txt"))
    for name in ("book.txt.gz", "book.txt.zst"):
        src = _describe(tmp_path / name)
        assert src["compression"] and src["gutenberg"]
        docs, units = _all_docs(src, unit_bytes=4096)
        assert len(units) == 1  # not seekable: one segment
        assert docs == plain


def test_jsonl_and_hf_dataset_dir(tmp_path):
    recs = [{"text": f"Document {i}. It has two sentences.", "id": i} for i in range(50)]
    recs.insert(3, {"text": "   "})
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n\n")
    src = _describe(tmp_path / "d.jsonl")
    assert src["kind"] == "jsonl" and src["doc_boundary"] == "record"
    docs, units = _all_docs(src, unit_bytes=1024)
    assert len(units) > 1
    assert [t for _, t in docs] == [r["text"] for r in recs if r["text"].strip()]
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": [r["text"] for r in recs]}).save_to_disk(str(tmp_path / "hf"))
    spec = S.discover([str(tmp_path / "hf")])
    assert [s.kind for s in spec] == ["hf"]
    hsrc = S.describe(spec[0], "auto", True, "train", "text")
    hdocs, hunits = _all_docs(hsrc, unit_bytes=256)
    assert len(hunits) > 1
    assert [t for _, t in hdocs] == [r["text"] for r in recs if r["text"].strip()]
    assert [o for o, _ in hdocs][:4] == [0, 1, 2, 4]  # row index is the stable id


def test_discovery_sorts_recurses_and_skips_hidden(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.txt").write_text("z")
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(b'{"text": "x"}\n'))
    (tmp_path / ".hidden.txt").write_text("h")
    (tmp_path / "b" / "y.txt").write_text("y")
    specs = S.discover([str(tmp_path)])
    name = tmp_path.name
    assert [s.key for s in specs] == [f"{name}/a.jsonl.gz", f"{name}/b/y.txt", f"{name}/b/z.txt"]
    assert [(s.kind, s.compression) for s in specs] == [("jsonl", "gz"), ("text", ""), ("text", "")]
    assert [s.key for s in S.discover([str(tmp_path / "b" / "*.txt")])] == ["y.txt", "z.txt"]
    with pytest.raises(DataPrepError, match="no files match"):
        S.discover([str(tmp_path / "*.nothing")])
    with pytest.raises(DataPrepError, match="input not found"):
        S.discover([str(tmp_path / "missing.txt")])


def test_streaming_memory_is_bounded(tmp_path):
    """Reading a 40 MB file keeps Python allocations at a few blocks, not the file size."""
    para = ("All work and no play makes Jack a dull boy. " * 12 + "\n") * 3 + "\n"
    path = tmp_path / "big.txt"
    with open(path, "w") as f:
        for _ in range(40_000_000 // len(para)):
            f.write(para)
    src = _describe(path)
    units = S.plan_units([src], 1 << 40, 8 << 20)
    ((_, a, b),) = units[0]
    reader = S.DocumentReader(src, "replace", "text", 8 << 20, S.ReadStats())
    tracemalloc.start()
    n = 0
    for _ in reader.documents(a, b):
        n += 1
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert n == 40_000_000 // len(para)
    assert peak < 6 * S.BLOCK, f"peak {peak / 1e6:.1f} MB"


def test_huge_document_without_blank_lines_is_cut(tmp_path, monkeypatch):
    path = tmp_path / "one.txt"
    path.write_bytes(b"word " * 50_000 + b"\n\n" + "w\u00f6rd ".encode() * 20_000 + b"\nsecond line\n\nlast doc")
    src = _describe(path, boundary="blank")
    docs, _ = _all_docs(src, max_doc=64 << 10)
    assert len(docs) == 4 + 2 + 1 and docs[-1][1] == "last doc"
    assert "".join(t for _, t in docs[4:6]).replace(" ", "") == ("w\u00f6rd" * 20_000 + "\nsecondline")
    assert all(len(t.encode()) <= 64 << 10 for _, t in docs)
    assert "\ufffd" not in "".join(t for _, t in docs)  # never cut inside a UTF-8 character
    monkeypatch.setattr(S, "BLOCK", 1000)  # read in small blocks: the same cuts
    assert _all_docs(src, max_doc=64 << 10)[0] == docs
