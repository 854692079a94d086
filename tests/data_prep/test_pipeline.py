import json
import os
import pickle
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from data_prep import PreparedCorpus, finalize_dir, tokenize_corpus, verify_dir
from data_prep import sources as S
from data_prep.errors import DataPrepError
from data_prep.tokenizer import Encoder

SMALL = dict(unit_bytes=48 << 10, shard_tokens=30_000, valid_fraction=0.05)  # = the small_prepared fixture


def test_end_to_end_on_real_books(dp, small_prepared, small_books):
    out = small_prepared
    assert verify_dir(out) == []
    m = dp.load_manifest(out)
    assert m["totals"]["units"] >= 5  # the books were cut into several units
    assert len(m["splits"]["train"]["shards"]) >= 2  # and the train split rolled over into several shards
    assert all(s["tokens"] <= 30_000 for sp in m["splits"].values() for s in sp["shards"])
    assert [s["path"] for s in m["sources"]] == sorted(small_books)
    assert all(s["gutenberg"] for s in m["sources"])

    # gold: tokenizing every document directly gives the same token and document totals
    enc = Encoder(out / "tokenizer")
    docs = []
    for path in small_books:
        src = S.describe(S.discover([path])[0], "auto", True, "train", "text")
        docs += [
            t
            for _, t in S.DocumentReader(src, "replace", "text", 8 << 20, S.ReadStats()).documents(
                src["start"], src["end"]
            )
        ]
    ids, lens, counts = enc.encode_docs(docs)
    assert m["totals"]["tokens"] == len(ids)
    assert m["totals"]["sentences"] == len(lens)
    assert m["totals"]["docs"] == int((counts > 0).sum())
    # the held-out fraction is close to the requested 5 % of documents
    frac = m["splits"]["valid"]["docs"] / m["totals"]["docs"]
    assert 0.03 < frac < 0.07, frac


def test_reader(dp, small_prepared):
    c = PreparedCorpus(small_prepared, "train")
    m = c.manifest
    assert (c.num_docs, c.num_sentences, c.num_tokens) == tuple(
        m["splits"]["train"][k] for k in ("docs", "sentences", "tokens")
    )
    assert c.special_ids == {"pad": 0, "unk": 100, "cls": 101, "sep": 102, "mask": 103, "vocab_size": 30522}
    assert c.manifest_hash == __import__("hashlib").sha256(dp.manifest_bytes(small_prepared)).hexdigest()
    assert (c.tokenizer_dir / "vocab.txt").is_file()
    lengths, bounds = c.sentence_lengths, c.doc_boundaries
    assert lengths.dtype == np.int32 and len(lengths) == c.num_sentences and int(lengths.sum()) == c.num_tokens
    assert bounds.dtype == np.int64 and len(bounds) == c.num_docs + 1 and bounds[0] == 0
    assert bounds[-1] == c.num_sentences and (np.diff(bounds) > 0).all()
    # documents across shard boundaries: global indices work everywhere
    for d in [0, 1, c.num_docs // 2, c.num_docs - 1, *range(0, c.num_docs, 97)]:
        a, b = c.doc_sentence_range(d)
        assert (a, b) == (bounds[d], bounds[d + 1])
        sents = [c.sentence(i) for i in range(a, b)]
        assert [len(s) for s in sents] == lengths[a:b].tolist()
        np.testing.assert_array_equal(c.doc_tokens(d), np.concatenate(sents))
    s = c.sentence(c.num_sentences - 1)
    assert isinstance(s, np.memmap) and not s.flags.writeable and s.dtype == np.uint16
    with pytest.raises(IndexError):
        c.sentence(c.num_sentences)
    # picklable: no memmaps travel, they reopen lazily
    c2 = pickle.loads(pickle.dumps(c))
    assert c2._open == {} and c2.manifest_hash == c.manifest_hash
    np.testing.assert_array_equal(c2.sentence(7), c.sentence(7))
    v = PreparedCorpus(small_prepared, "valid")
    assert v.num_docs == m["splits"]["valid"]["docs"] > 0
    from transformers import BertTokenizer

    text = BertTokenizer.from_pretrained(str(c.tokenizer_dir)).decode(c.doc_tokens(0).tolist())
    assert text == "alice ’ s adventures in wonderland"


def test_one_vs_two_workers_identical(dp, tmp_path, small_prepared, small_books, vocab):
    out = tmp_path / "w2"
    tokenize_corpus(small_books, out, tokenizer=vocab, workers=2, **SMALL)
    assert dp.manifest_bytes(out) == dp.manifest_bytes(small_prepared)
    assert dp.shard_hashes(out) == dp.shard_hashes(small_prepared) and len(dp.shard_hashes(out)) >= 4


@pytest.mark.timeout(120)
def test_a_killed_worker_stops_the_run_which_then_resumes(
    dp, tmp_path, small_prepared, small_books, vocab, monkeypatch
):
    """The OOM killer's SIGKILL on one worker: an error that says so within seconds (multiprocessing.Pool waited
    for the lost unit forever), no temporary unit left behind, and the rerun gives the bytes of an uninterrupted
    run."""
    import data_prep.workers as W

    write_unit = W._write_unit

    def killed_on_unit_2(u, *args):
        if u == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return write_unit(u, *args)

    monkeypatch.setattr(W, "_write_unit", killed_on_unit_2)  # the forked workers inherit the patch
    out = tmp_path / "killed"
    start = time.monotonic()
    with pytest.raises(DataPrepError, match=r"worker process died.*out-of-memory.*rerun the same command to resume"):
        tokenize_corpus(small_books, out, tokenizer=vocab, workers=2, **SMALL)
    assert time.monotonic() - start < 60
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]
    monkeypatch.setattr(W, "_write_unit", write_unit)
    tokenize_corpus(small_books, out, tokenizer=vocab, workers=2, **SMALL)
    assert dp.manifest_bytes(out) == dp.manifest_bytes(small_prepared)
    assert dp.shard_hashes(out) == dp.shard_hashes(small_prepared)


def test_one_vs_three_array_tasks_identical(dp, tmp_path, small_prepared, small_books, vocab):
    out = tmp_path / "j3"
    recs = [tokenize_corpus(small_books, out, tokenizer=vocab, num_tasks=3, task_index=j, **SMALL) for j in (0, 2)]
    assert not (out / "manifest.json").exists()
    n = len(dp.load_manifest(small_prepared)["units"])
    assert sorted(int(u) for r in recs for u in r["units"]) == [u for u in range(n) if u % 3 != 1]
    with pytest.raises(DataPrepError, match=r"work units missing.*--num-tasks 3: rerun task\(s\) \[1\]"):
        finalize_dir(out)
    assert not (out / "manifest.json").exists() and not list((out / "train").glob("*"))
    tokenize_corpus(small_books, out, tokenizer=vocab, num_tasks=3, task_index=1, **SMALL)
    finalize_dir(out)
    assert dp.manifest_bytes(out) == dp.manifest_bytes(small_prepared)
    assert dp.shard_hashes(out) == dp.shard_hashes(small_prepared)
    assert verify_dir(out) == []


def test_task_defaults_from_slurm_array_env(tmp_path, small_books, vocab, monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "3")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "5")  # --array=4-6: ids need not start at 0
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "4")
    rec = tokenize_corpus(small_books, tmp_path / "o", tokenizer=vocab, **SMALL)
    assert (rec["task"], rec["num_tasks"]) == (1, 3)
    assert rec["units"] and all(int(u) % 3 == 1 for u in rec["units"])
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_rerun_is_a_noop_and_other_settings_are_refused(dp, tmp_path, small_books, vocab):
    out = tmp_path / "o"
    tokenize_corpus(small_books, out, tokenizer=vocab, **SMALL)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    assert tokenize_corpus(small_books, out, tokenizer=vocab, **SMALL) == dp.load_manifest(out)
    with pytest.raises(DataPrepError, match=r"manifest\.json: .*other settings \(valid_fraction"):
        tokenize_corpus(small_books, out, tokenizer=vocab, **{**SMALL, "valid_fraction": 0.2})
    with pytest.raises(DataPrepError, match="other inputs"):
        tokenize_corpus(small_books[:2], out, tokenizer=vocab, **SMALL)
    other = tmp_path / "vocab.txt"
    other.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a"]) + "\n")
    with pytest.raises(DataPrepError, match=r"tokenizer: holds a different tokenizer"):
        tokenize_corpus(small_books, out, tokenizer=other, **SMALL)
    after = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    assert after == before  # nothing that was complete was touched


def test_unfinished_run_with_other_settings_is_refused(tmp_path, small_books, vocab):
    out = tmp_path / "o"
    tokenize_corpus(small_books, out, tokenizer=vocab, num_tasks=2, task_index=0, **SMALL)
    with pytest.raises(DataPrepError, match=r"plan\.json: an unfinished run .*shard_tokens"):
        tokenize_corpus(small_books, out, tokenizer=vocab, num_tasks=2, task_index=1, **{**SMALL, "shard_tokens": 1000})


def test_fixing_a_bad_input_redoes_only_its_units(tmp_path, small_books, vocab):
    """A bad record stops the run; after the file is fixed, finished units of other files are reused."""
    out = tmp_path / "o"
    data = tmp_path / "data"
    data.mkdir()
    for b in small_books:
        os.symlink(b, data / os.path.basename(b))
    bad = data / "zz.jsonl"
    bad.write_text('{"text": "One record."}\n{"text": "Two" \n')
    with pytest.raises(DataPrepError, match=r"zz\.jsonl: line 2: not valid JSON"):
        tokenize_corpus([data], out, tokenizer=vocab, **SMALL)
    units = out / ".work" / "units"
    finished = {d.name: d.stat().st_mtime_ns for d in units.iterdir()}
    assert finished and not any(".tmp" in n for n in finished)
    bad.write_text('{"text": "One record."}\n{"text": "Two records."}\n')
    m = tokenize_corpus([data], out, tokenizer=vocab, **SMALL)
    assert verify_dir(out) == []
    kept = {d.name: d.stat().st_mtime_ns for d in units.iterdir() if d.name in finished}
    assert kept == finished  # every unit finished before the error was reused untouched
    assert m["totals"]["units"] == len(finished) + 1


def _complete_units(units_dir):
    return {d.name for d in units_dir.glob("*") if ".tmp" not in d.name and (d / "unit.json").is_file()}


def test_sigkill_and_resume_equals_a_clean_run(dp, tmp_path, medium_books, vocab):
    """SIGKILL the CLI (and so its workers) part-way; a rerun produces only what is missing, and the final
    manifest and every shard hash equal those of an uninterrupted run."""
    psutil = pytest.importorskip("psutil")
    settings = dict(unit_bytes=32 << 10, shard_tokens=60_000, valid_fraction=0.02)
    clean = tmp_path / "clean"
    tokenize_corpus(medium_books, clean, tokenizer=vocab, **settings)
    n_units = len(dp.load_manifest(clean)["units"])
    assert n_units >= 30

    out = tmp_path / "killed"
    args = [
        sys.executable,
        "-m",
        "data_prep",
        "tokenize",
        *medium_books,
        "--output",
        str(out),
        "--tokenizer",
        str(vocab),
        "--unit-size",
        "32K",
        "--shard-tokens",
        "60000",
        "--valid-fraction",
        "0.02",
        "--workers",
        "2",
        "--no-progress",
    ]
    env = {**os.environ, "PYTHONPATH": str(dp.REPO)}
    proc = subprocess.Popen(args, env=env, cwd=str(dp.REPO), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    units_dir = out / ".work" / "units"
    deadline = time.monotonic() + 60
    done: set[str] = set()
    children = []
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            children = children or psutil.Process(proc.pid).children()
        except psutil.NoSuchProcess:
            pass
        done = _complete_units(units_dir) if units_dir.is_dir() else set()
        if len(done) >= 3:
            break
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    done = _complete_units(units_dir)
    assert 3 <= len(done) < n_units, f"kill came too late to test anything: {len(done)}/{n_units} units"
    assert not (out / "manifest.json").exists()
    # the workers die with their parent (no orphan keeps writing)
    t_end = time.monotonic() + 10
    while time.monotonic() < t_end and any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children):
        time.sleep(0.05)
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)
    snapshot = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for name in done for p in (units_dir / name).iterdir()}

    res = subprocess.run(args, env=env, cwd=str(dp.REPO), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    for p, ident in snapshot.items():  # finished units were not rewritten
        assert (p.stat().st_ino, p.stat().st_mtime_ns) == ident, p
    task = json.loads((out / ".work" / "tasks" / "task_00000_of_00001.json").read_text())
    assert len(task["units_done_now"]) == n_units - len(done)
    assert not list(units_dir.glob("*.tmp*"))
    assert dp.manifest_bytes(out) == dp.manifest_bytes(clean)
    assert dp.shard_hashes(out) == dp.shard_hashes(clean)
    assert verify_dir(out) == []


def test_changed_and_added_inputs_reuse_other_units(dp, tmp_path, small_books, vocab):
    """A file that changes, or a new one sorted first (all unit indices shift), costs only its own units; the
    result equals a clean run on the new inputs."""
    import shutil

    data = tmp_path / "data"
    data.mkdir()
    for b in small_books:
        shutil.copyfile(b, data / os.path.basename(b))
    settings = dict(unit_bytes=16 << 10, shard_tokens=50_000, valid_fraction=0.05)
    out = tmp_path / "o"
    tokenize_corpus([data], out, tokenizer=vocab, finalize=False, **settings)
    units = out / ".work" / "units"
    before = {d.name: d.stat().st_mtime_ns for d in units.iterdir()}
    # change the middle book, add a book that sorts first
    with open(data / "1952-0.txt", "ab") as f:
        f.write(b"\n\nA new closing paragraph. It has two sentences.\n")
    shutil.copyfile(small_books[0], data / "0000.txt")
    m = tokenize_corpus([data], out, tokenizer=vocab, **settings)
    task = json.loads((out / ".work" / "tasks" / "task_00000_of_00001.json").read_text())
    redone = {m["units"][u]["unit_key"][:32] for u in task["units_done_now"]}
    kept = {d.name for d in units.iterdir()} - redone
    assert kept <= set(before)  # every other unit is one of the first run's ...
    assert all(units.joinpath(k).stat().st_mtime_ns == before[k] for k in kept)  # ... untouched
    srcs = [s["key"] for s in m["sources"]]
    n_first = sum(1 for u in m["units"] if srcs[u["segments"][0][0]] == "data/0000.txt")
    n_mid = sum(1 for u in m["units"] if srcs[u["segments"][0][0]] == "data/1952-0.txt")
    assert len(task["units_done_now"]) == n_first + n_mid  # exactly the new and the changed book's units
    assert len(kept) == len(m["units"]) - n_first - n_mid > 5
    clean = tmp_path / "clean"
    tokenize_corpus([data], clean, tokenizer=vocab, **settings)
    assert dp.manifest_bytes(out) == dp.manifest_bytes(clean)
    assert dp.shard_hashes(out) == dp.shard_hashes(clean)
    assert sorted(d.name for d in units.iterdir()) == sorted(u["unit_key"][:32] for u in m["units"])  # pruned


def test_file_mode_documents_are_whole_books(dp, tmp_path, small_books, vocab, monkeypatch):
    """--doc-boundary file: one document per book (read paragraph by paragraph), the same sentences and tokens as
    paragraph documents; identical whatever the batch size (documents carried across batches)."""
    import data_prep.workers as W

    settings = dict(unit_bytes=1 << 20, shard_tokens=1 << 20, valid_fraction=0.0)
    para = tokenize_corpus(small_books, tmp_path / "para", tokenizer=vocab, doc_boundary="blank", **settings)
    whole = tokenize_corpus(small_books, tmp_path / "file", tokenizer=vocab, doc_boundary="file", **settings)
    assert whole["totals"]["docs"] == 3 and para["totals"]["docs"] > 1000
    assert whole["totals"]["sentences"] == para["totals"]["sentences"]
    a, b = PreparedCorpus(tmp_path / "para"), PreparedCorpus(tmp_path / "file")
    np.testing.assert_array_equal(a.sentence_lengths, b.sentence_lengths)
    np.testing.assert_array_equal(a.doc_tokens(0), b.sentence(0))
    assert b.doc_sentence_range(2)[1] == b.num_sentences
    monkeypatch.setattr(W, "BATCH_CHARS", 3000)  # many batches: every book spans dozens of them
    small = tokenize_corpus(
        small_books, tmp_path / "file_small_batches", tokenizer=vocab, doc_boundary="file", **settings
    )
    assert small == whole
    assert dp.shard_hashes(tmp_path / "file_small_batches") == dp.shard_hashes(tmp_path / "file")
    # long files become several documents of at most max_doc_bytes, cut at paragraph breaks
    cut = tokenize_corpus(
        small_books, tmp_path / "cut", tokenizer=vocab, doc_boundary="file", max_doc_bytes=20_000, **settings
    )
    assert cut["totals"]["sentences"] == para["totals"]["sentences"] and 10 <= cut["totals"]["docs"] <= 14


def test_a_unit_finished_meanwhile_is_kept_and_a_broken_one_is_redone(tmp_path, small_books, vocab):
    """The rename of a finished unit meets a unit dir already there: a complete one (a concurrent run of the same
    task) is kept untouched, a broken one is replaced; no temporary directory is left either way."""
    from data_prep.plan import load_unit, unit_dir, unit_keys
    from data_prep.workers import UnitContext, process_unit

    out = tmp_path / "o"
    tokenize_corpus(small_books[:1], out, tokenizer=vocab, finalize=False, **SMALL)
    plan = json.loads((out / ".work" / "plan.json").read_text())["plan"]
    keys = unit_keys(plan)
    ctx = UnitContext(out, plan, keys, out / "tokenizer")
    enc = Encoder(out / "tokenizer")
    d = unit_dir(out, keys[0])
    before = {p.name: p.stat().st_ino for p in d.iterdir()}
    assert process_unit(0, ctx, enc)["unit_key"] == keys[0]
    assert {p.name: p.stat().st_ino for p in d.iterdir()} == before
    (d / "train_000.bin").write_bytes(b"")
    assert load_unit(out, keys[0], rehash=False) is None
    process_unit(0, ctx, enc)
    assert load_unit(out, keys[0], rehash=True) is not None
    assert not list(d.parent.glob("*.tmp*"))
