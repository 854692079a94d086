"""Bad input and damaged output: clear errors naming the file (and line), nothing finished overwritten."""

import gzip
import json
import os
import shutil

import pytest

from data_prep import PreparedCorpus, tokenize_corpus, verify_dir
from data_prep import sources as S
from data_prep.errors import DataPrepError

TINY = dict(unit_bytes=1024, shard_tokens=10_000, valid_fraction=0.0)


def _jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_error_type_is_a_user_error():
    from common.errors import EXIT_USER_ERROR, UserError

    assert issubclass(DataPrepError, UserError) and issubclass(DataPrepError, ValueError)
    assert DataPrepError("x").exit_code == EXIT_USER_ERROR


def test_fixed_choices_are_checked_with_a_hint(tmp_path, vocab, small_books):
    with pytest.raises(DataPrepError, match=r"--doc-boundary='lines' \(did you mean 'line'\?\)"):
        tokenize_corpus(small_books[:1], tmp_path / "o", tokenizer=vocab, doc_boundary="lines", **TINY)
    with pytest.raises(DataPrepError, match=r"--on-decode-error='ignore'.*expected one of 'replace', 'fail'"):
        tokenize_corpus(small_books[:1], tmp_path / "o", tokenizer=vocab, on_decode_error="ignore", **TINY)


def test_undecodable_bytes_replace_and_count(tmp_path, vocab):
    f = tmp_path / "bad.txt"
    f.write_bytes(b"A fine first paragraph.\n\nSecond line has \xff\xfe bad bytes.\nAnd \xc3 one more.\n\nEnd.\n")
    m = tokenize_corpus([f], tmp_path / "o", tokenizer=vocab, **TINY)
    assert m["totals"]["decode_errors"] == 3
    assert m["totals"]["docs"] == 3
    assert verify_dir(tmp_path / "o") == []


def test_undecodable_bytes_fail_names_file_and_line(tmp_path, vocab):
    f = tmp_path / "bad.txt"
    f.write_bytes(b"A fine first paragraph.\n\nSecond line.\nThird has \xff here.\n")
    with pytest.raises(DataPrepError, match=r"bad\.txt: line 4: invalid UTF-8 at byte 48"):
        tokenize_corpus([f], tmp_path / "o", tokenizer=vocab, on_decode_error="fail", **TINY)
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_malformed_jsonl_names_file_and_line_even_in_a_later_unit(tmp_path, vocab):
    recs = [{"text": f"Record number {i} is fine."} for i in range(200)]
    recs[150] = '{"text": "broken'
    f = _jsonl(tmp_path / "d.jsonl", recs)
    with pytest.raises(DataPrepError, match=r"d\.jsonl: line 151: not valid JSON"):
        tokenize_corpus([f], tmp_path / "o", tokenizer=vocab, **TINY)
    # units before the bad one are complete and stay; nothing looks finished
    assert not (tmp_path / "o" / "manifest.json").exists()
    assert len([d for d in (tmp_path / "o" / ".work" / "units").iterdir() if ".tmp" not in d.name]) >= 3
    assert not list((tmp_path / "o" / ".work" / "units").glob("*.tmp*"))


@pytest.mark.parametrize(
    "record, message",
    [
        ({"body": "no text here"}, r"d\.jsonl: line 3: record has no 'text' field \(keys: body\)"),
        ({"text": 42}, r"d\.jsonl: line 3: field 'text' is int, not a string"),
        ([1, 2], r"d\.jsonl: line 3: expected a JSON object per line, found list"),
    ],
)
def test_bad_records(tmp_path, vocab, record, message):
    f = _jsonl(tmp_path / "d.jsonl", [{"text": "Fine."}, {"text": "Also fine."}, record])
    with pytest.raises(DataPrepError, match=message):
        tokenize_corpus([f], tmp_path / "o", tokenizer=vocab, **TINY)


def test_text_field_option(tmp_path, vocab):
    f = _jsonl(tmp_path / "d.jsonl", [{"body": "First doc. Two sentences."}, {"body": "Second."}])
    m = tokenize_corpus([f], tmp_path / "o", tokenizer=vocab, text_field="body", **TINY)
    assert (m["totals"]["docs"], m["totals"]["sentences"]) == (2, 3)


def test_empty_inputs(tmp_path, vocab, small_books):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(DataPrepError, match=r"empty\.txt: empty input file"):
        tokenize_corpus([empty, small_books[1]], tmp_path / "o", tokenizer=vocab, **TINY)
    m = tokenize_corpus([empty, small_books[1]], tmp_path / "o2", tokenizer=vocab, allow_empty=True, **TINY)
    assert [s["key"] for s in m["sources"]] == ["1952-0.txt"]
    with pytest.raises(DataPrepError, match="no input data"):
        tokenize_corpus([empty], tmp_path / "o3", tokenizer=vocab, allow_empty=True, **TINY)
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n\t\n")
    with pytest.raises(DataPrepError, match="produced no documents"):
        tokenize_corpus([blank], tmp_path / "o4", tokenizer=vocab, **TINY)
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(DataPrepError, match=r"emptydir: folder contains no input files"):
        tokenize_corpus([tmp_path / "emptydir"], tmp_path / "o5", tokenizer=vocab, **TINY)


def test_unreadable_file(tmp_path, vocab, monkeypatch):
    locked = tmp_path / "locked.txt"
    locked.write_text("Some text.\n")
    real_open = open

    def fake_open(path, *args, **kwargs):
        if str(path) == str(locked):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(S, "open", fake_open, raising=False)
    with pytest.raises(DataPrepError, match=r"locked\.txt: cannot read input file \(Permission denied\)"):
        tokenize_corpus([locked], tmp_path / "o", tokenizer=vocab, **TINY)
    monkeypatch.undo()
    dangling = tmp_path / "dangling.txt"
    os.symlink(tmp_path / "gone.txt", dangling)
    with pytest.raises(DataPrepError, match=r"dangling\.txt: cannot read input \(broken symbolic link\)"):
        tokenize_corpus([dangling], tmp_path / "o", tokenizer=vocab, **TINY)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads chmod-000 files")
def test_unreadable_file_permissions(tmp_path, vocab):
    locked = tmp_path / "locked.txt"
    locked.write_text("Some text.\n")
    locked.chmod(0)
    with pytest.raises(DataPrepError, match=r"locked\.txt: cannot read input file"):
        tokenize_corpus([locked], tmp_path / "o", tokenizer=vocab, **TINY)


def test_truncated_gzip(tmp_path, vocab):
    data = gzip.compress(b"First paragraph here.\n\n" * 2000)
    f = tmp_path / "cut.txt.gz"
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataPrepError, match=r"cut\.txt\.gz: corrupt or truncated gz stream"):
        tokenize_corpus([f], tmp_path / "o", tokenizer=vocab, **TINY)


@pytest.fixture
def damaged(tmp_path, small_prepared):
    out = tmp_path / "copy"
    shutil.copytree(small_prepared, out)
    return out


def test_truncated_bin(damaged, dp):
    b = damaged / "train" / "shard_00001.bin"
    b.write_bytes(b.read_bytes()[:-100])
    with pytest.raises(DataPrepError, match=r"train/shard_00001\.bin: .*truncated"):
        PreparedCorpus(damaged)
    problems = verify_dir(damaged)
    assert any("shard_00001.bin" in p and "truncated" in p for p in problems)
    res = dp.run_cli("verify", str(damaged))
    assert res.returncode == 1 and "shard_00001.bin" in res.stderr and "Traceback" not in res.stderr


def test_flipped_byte_is_caught_by_verify(damaged):
    b = damaged / "train" / "shard_00000.bin"
    raw = bytearray(b.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    b.write_bytes(bytes(raw))
    PreparedCorpus(damaged)  # cheap checks cannot see it (sizes are right) ...
    problems = verify_dir(damaged)  # ... the re-hash does
    assert len(problems) == 2, problems  # sha256 vs manifest, and vs the hash recorded in the .idx
    assert all("shard_00000" in p for p in problems)
    assert any("sha256 differs" in p for p in problems)


def test_idx_from_another_shard(damaged):
    shutil.copyfile(damaged / "train" / "shard_00001.idx", damaged / "train" / "shard_00000.idx")
    with pytest.raises(DataPrepError, match=r"train/shard_00000\.idx"):
        PreparedCorpus(damaged)
    problems = verify_dir(damaged)
    assert any("shard_00000.idx" in p and "another .bin" in p for p in problems)


def test_out_of_vocab_id_and_stray_file(damaged):
    from data_prep.shard_format import read_idx_header

    stem = damaged / "valid" / "shard_00000"
    h = read_idx_header(stem.with_suffix(".idx"))
    raw = bytearray(stem.with_suffix(".bin").read_bytes())
    raw[0:2] = (65000).to_bytes(2, "little")
    stem.with_suffix(".bin").write_bytes(bytes(raw))
    (damaged / "train" / "shard_00099.bin").write_bytes(b"")
    problems = verify_dir(damaged)
    assert any("token id 65000 >= vocab size 30522" in p for p in problems)
    assert any("shard_00099.bin: stray" in p for p in problems)
    assert h.num_tokens > 0


def test_missing_manifest_or_dir(tmp_path, damaged, small_prepared):
    with pytest.raises(DataPrepError, match="prepared corpus directory not found"):
        PreparedCorpus(tmp_path / "nope")
    with pytest.raises(DataPrepError, match=r"manifest\.json: no split 'test' \(has train, valid\)"):
        PreparedCorpus(small_prepared, "test")
    (damaged / "manifest.json").unlink()
    with pytest.raises(DataPrepError, match=r"manifest\.json: missing"):
        PreparedCorpus(damaged)
    assert verify_dir(damaged) == [f"{damaged / 'manifest.json'}: missing (tokenize/finalize has not finished)"]


def test_a_stage_that_needs_every_unit_names_the_missing_ones():
    from pathlib import Path
    from types import SimpleNamespace

    from data_prep.dedup.stages import every_unit, stage_result, task_units

    ctx = SimpleNamespace(out=Path("/out"), plan={"units": list(range(25))})
    assert every_unit(ctx, [{"u": 0}, {"u": 1}], "are not written yet", "run it") == [{"u": 0}, {"u": 1}]
    with pytest.raises(DataPrepError) as err:
        every_unit(ctx, [None] * 22 + [{}], "are not written yet", "run --stage write for them first")
    assert str(err.value) == (
        "/out: 22 of 23 units are not written yet (units 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, "
        "17, 18, 19 ...): run --stage write for them first"
    )
    run = SimpleNamespace(task_index=1, num_tasks=10)
    assert task_units(ctx, run) == [1, 11, 21]
    assert stage_result("write", run, [1, 11, 21], [21]) == {
        "stage": "write",
        "task": 1,
        "num_tasks": 10,
        "units": 3,
        "units_done_now": [21],
    }
