"""data_prep dedup: exact and near duplicates of real text found across corpora with the documented keeper, the
same output for any number of workers or array tasks, resume after kill -9, decontamination against the real GLUE
dev sets, and one clear line for bad input.

The corpus is built from real books (read in place from ../shared/data): corpus `books` holds documents of 5
consecutive paragraphs of one book; corpus `web` holds distinct documents of another book plus injected copies of
`books` documents — exact (re-cased, re-spaced, re-punctuated) and near (2 % of the words replaced) — and one
document with an RTE dev sentence pasted in its middle.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zstandard
from requirements import GUTENBERG

from data_prep.dedup import DedupConfig, DedupRun, dedup_corpus
from data_prep.dedup.manifest import dedup_manifest_entry
from data_prep.errors import DataPrepError

BOOK_A, BOOK_B = "120-0.txt", "1155-0.txt"
COPIES = 6  # exact copies and near copies each
RTE_DEV_ROW = 2  # a row of RTE/dev.tsv whose sentence1 is pasted into a web document
COLA_DEV_ROW = 13  # a 12-word CoLA/dev sentence: only n-grams shorter than 13 (the set's n is 8) can find it


def _paragraphs(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    body = text.split("*** START OF", 1)[-1].split("*** END OF", 1)[0]
    return [" ".join(p.split()) for p in body.split("\n\n") if len(p.split()) >= 12]


def _docs(paragraphs: list[str], per_doc: int = 5) -> list[str]:
    return ["\n\n".join(paragraphs[i : i + per_doc]) for i in range(0, len(paragraphs) - per_doc + 1, per_doc)]


def _near(text: str, rng: random.Random, fraction: float) -> str:
    words = text.split(" ")
    for i in rng.sample(range(len(words)), max(1, int(len(words) * fraction))):
        words[i] = rng.choice(["quietly", "seven", "harbour", "lantern", "velvet"])
    return " ".join(words)


def _rte_sentence(glue: Path) -> str:
    rows = (glue / "RTE" / "dev.tsv").read_text(encoding="utf-8").splitlines()
    return rows[RTE_DEV_ROW].split("\t")[1]


def _cola_sentence(glue: Path) -> str:
    return (glue / "CoLA" / "dev.tsv").read_text(encoding="utf-8").splitlines()[COLA_DEV_ROW - 1].split("\t")[3]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, gutenberg):
    """(folder, facts): books.jsonl, web.jsonl and what was injected where."""
    from requirements import GLUE, require_data

    require_data(GLUE)
    rng = random.Random(7)
    root = tmp_path_factory.mktemp("dedup_corpus")
    books = [d for d in _docs(_paragraphs(gutenberg / BOOK_A)) if len(d.split()) >= 200][:30]
    web = [d for d in _docs(_paragraphs(gutenberg / BOOK_B)) if len(d.split()) >= 200][:30]
    exact_src = rng.sample(range(len(books)), COPIES)
    near_src = rng.sample(sorted(set(range(len(books))) - set(exact_src)), COPIES)
    exact = [books[i].upper().replace(", ", " ,  ").replace(".", " !") for i in exact_src]
    near = [_near(books[i], rng, 0.02) for i in near_src]
    sentence = _rte_sentence(GLUE)
    host = web[3].split("\n\n")
    web[3] = "\n\n".join([*host[:2], sentence, *host[2:]])
    host = web[5].split("\n\n")
    web[5] = "\n\n".join([*host[:1], _cola_sentence(GLUE), *host[1:]])
    web_docs = web + exact + near
    (root / "books.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in books))
    (root / "web.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in web_docs))
    facts = {
        "books": len(books),
        "web": len(web),
        "web_texts": web,
        "exact": len(exact),
        "near": len(near),
        "sentence": sentence,
        "host_offset": None,
        "glue": GLUE,
    }
    return root, facts


def _read_output(out: Path) -> dict[str, list[dict]]:
    got = {}
    for path in sorted((out / "text").rglob("*.jsonl.zst")):
        data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(path.read_bytes())).read()
        got[path.relative_to(out).as_posix()] = [json.loads(line) for line in data.decode().splitlines()]
    return got


def _hashes(out: Path) -> dict[str, str]:
    files = [*sorted((out / "text").rglob("*")), out / "dedup_report.json", out / "checksums.json"]
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files if p.is_file()}


SMALL_UNITS = DedupConfig(unit_bytes=64 << 10)


def _run(corpus, out, order=("books", "web"), eval_sets=(), run=None, cfg=SMALL_UNITS, **kw):
    root, _ = corpus
    return dedup_corpus([f"{n}={root / n}.jsonl" for n in order], out, eval_sets, cfg, run or DedupRun(), **kw)


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "out"
    return out, _run(corpus, out, run=DedupRun(workers=1))


def test_exact_and_near_copies_are_removed_and_nothing_else(corpus, reference):
    _, facts = corpus
    out, report = reference
    web, books = report["per_corpus"]["web"], report["per_corpus"]["books"]
    assert (web["exact_docs"], web["near_docs"]) == (facts["exact"], facts["near"])
    assert books["docs_kept"] == books["docs_in"] == facts["books"]  # the originals stay (higher priority)
    assert web["docs_kept"] == facts["web"]  # every distinct web document stays: no false positive
    assert report["cross_corpus"]["web"]["books"]["docs"] == facts["exact"] + facts["near"]
    kept = _read_output(out)
    web_kept = [r["text"] for name, recs in kept.items() if name.startswith("text/web/") for r in recs]
    assert web_kept == facts["web_texts"]  # exactly the distinct documents, in input order
    assert report["clusters"]["clusters"] == facts["exact"] + facts["near"]


def test_keeper_follows_corpus_priority(corpus, tmp_path, reference):
    _, facts = corpus
    report = _run(corpus, tmp_path / "swapped", order=("web", "books"))
    # now the web copies are kept and the book originals removed, as exact or near duplicates of them
    books = report["per_corpus"]["books"]
    assert (books["exact_docs"], books["near_docs"]) == (facts["exact"], facts["near"])
    assert report["per_corpus"]["web"]["docs_kept"] == facts["web"] + facts["exact"] + facts["near"]
    assert report["cross_corpus"]["books"]["web"]["docs"] == facts["exact"] + facts["near"]


def test_workers_and_array_tasks_give_identical_output(corpus, reference, tmp_path):
    ref_out, _ = reference
    _run(corpus, tmp_path / "w2", run=DedupRun(workers=2))
    assert _hashes(tmp_path / "w2") == _hashes(ref_out)
    arr = tmp_path / "array"
    for stage, tasks in (("signatures", 3), ("clusters", 1), ("write", 2), ("report", 1)):
        for j in range(tasks):
            _run(corpus, arr, run=DedupRun(workers=1, num_tasks=tasks, task_index=j, stage=stage))
    assert _hashes(arr) == _hashes(ref_out)
    assert not (arr / ".work").exists()


def test_decontamination_cuts_the_injected_glue_sentence(corpus, tmp_path):
    _, facts = corpus
    report = _run(
        corpus, tmp_path / "dc", eval_sets=[facts["glue"]], cfg=DedupConfig(unit_bytes=64 << 10, eval_splits="dev")
    )
    cell = report["contamination_by_set"]["RTE/dev"]
    assert cell["docs"] == 1 and cell["grams"] >= 1
    n_of = {s["name"]: s["n"] for s in report["eval_sets"]}
    assert n_of["RTE/dev"] == n_of["CoLA/dev"] == 8 and n_of["MRPC/dev"] == 11  # GPT-3's 5th-percentile rule
    assert report["contamination_by_set"]["CoLA/dev"]["docs"] == 1  # a 12-word sentence, found by 8-grams
    assert report["per_corpus"]["web"]["decontam_cut_docs"] == 2
    assert report["examples"]["contamination"][0]["eval_set"] == "RTE/dev"
    texts = [r["text"] for recs in _read_output(tmp_path / "dc").values() for r in recs]
    assert not any(facts["sentence"][:60] in t for t in texts)
    assert report["per_corpus"]["web"]["docs_kept"] == facts["web"]  # cut, not dropped: its other text stays
    # drop mode removes the document instead
    report = _run(
        corpus,
        tmp_path / "drop",
        eval_sets=[facts["glue"]],
        cfg=DedupConfig(unit_bytes=64 << 10, eval_splits="dev", decontaminate="drop"),
    )
    assert report["per_corpus"]["web"]["docs_kept"] == facts["web"] - 2


def test_resume_after_kill_gives_the_same_output(corpus, reference, tmp_path, dp):
    root, _ = corpus
    ref_out, _ = reference
    out = tmp_path / "killed"
    args = [
        "dedup",
        f"books={root}/books.jsonl",
        f"web={root}/web.jsonl",
        "--output",
        str(out),
        "--unit-size",
        "16K",
        "--workers",
        "2",
        "--no-eval-sets",
    ]
    env = dict(os.environ, PYTHONPATH=str(dp.REPO))
    for marker in ("sig", "write"):  # kill -9 in stage 1, then (resumed) in stage 3
        proc = subprocess.Popen(
            [sys.executable, "-m", "data_prep", *args],
            cwd=dp.REPO,
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None:
            folder = out / ".work" / marker
            if folder.is_dir() and len([p for p in folder.iterdir() if not p.name.startswith(".")]) >= 2:
                break
            time.sleep(0.005)
        assert proc.poll() is None, "the run finished before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert not (out / "checksums.json").exists()
    # a different unit size than the reference would change nothing but the unit layout: compare with its own ref
    done = dp.run_cli(*args)
    assert done.returncode == 0, done.stderr
    clean = dp.run_cli(*[a if a != str(out) else str(tmp_path / "clean") for a in args])
    assert clean.returncode == 0, clean.stderr
    assert _hashes(out) == _hashes(tmp_path / "clean")
    assert json.loads((out / "dedup_report.json").read_text())["totals"]["near_docs"] == COPIES


def test_finished_output_is_returned_and_a_changed_one_refused(corpus, reference, tmp_path):
    out, report = reference
    assert _run(corpus, out) == report  # idempotent
    with pytest.raises(DataPrepError, match="already holds a finished dedup output of other inputs or settings"):
        _run(corpus, out, cfg=DedupConfig(unit_bytes=64 << 10, bands=10))


def test_manifest_entry_names_the_report_and_checks_the_files(reference, tmp_path):
    import shutil

    out, report = reference
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    parts = sorted((copy / "text").rglob("*.zst"))
    entry = dedup_manifest_entry([str(p) for p in parts])
    assert entry is not None and len(entry) == 1
    assert entry[0]["report_sha256"] == hashlib.sha256((copy / "dedup_report.json").read_bytes()).hexdigest()
    assert entry[0]["params"] == report["params"] and entry[0]["plan_hash"] == report["plan_hash"]
    assert dedup_manifest_entry([str(tmp_path / "elsewhere.txt")]) is None
    with open(parts[0], "ab") as f:
        f.write(b"x")
    with pytest.raises(DataPrepError, match=r"part_00000\.jsonl\.zst: missing or of another size"):
        dedup_manifest_entry([str(p) for p in parts])


# ------------------------------------------------------------------------------------------ bad input


def _one_error_line(res) -> bool:
    """Exit 2, exactly one `error:` line and no traceback on stderr (info lines of the stages before may precede)."""
    errors = [line for line in res.stderr.splitlines() if "error:" in line]
    return res.returncode == 2 and len(errors) == 1 and "Traceback" not in res.stderr


def test_bad_input_gets_one_clear_line(corpus, tmp_path, dp):
    root, _ = corpus
    cases = [
        (["--eval-sets", str(tmp_path / "nope")], "--eval-sets", "no such folder"),
        (["--no-eval-sets", "--bands", "0"], "--bands must be >= 1", None),
    ]
    for extra, *needles in cases:
        res = dp.run_cli("dedup", f"books={root}/books.jsonl", "--output", str(tmp_path / "o"), *extra)
        assert _one_error_line(res) and len(res.stderr.strip().splitlines()) == 1, res.stderr  # checked up front
        assert all(n in res.stderr for n in needles if n), res.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    res = dp.run_cli("dedup", str(empty), "--output", str(tmp_path / "o2"), "--no-eval-sets")
    assert _one_error_line(res) and "empty.txt: empty input file" in res.stderr, res.stderr
    bad = tmp_path / "bad.jsonl.zst"
    whole = zstandard.ZstdCompressor().compress(b"".join(b'{"text": "record %d"}\n' % i for i in range(5000)))
    bad.write_bytes(whole[: len(whole) // 2])  # cut inside the frame
    res = dp.run_cli("dedup", str(bad), "--output", str(tmp_path / "o3"), "--no-eval-sets")
    assert _one_error_line(res) and "bad.jsonl.zst: corrupt or truncated zst stream" in res.stderr, res.stderr
    res = dp.run_cli(
        "dedup",
        "a=" + str(root / "books.jsonl"),
        "a=" + str(root / "web.jsonl"),
        "--output",
        str(tmp_path / "o4"),
        "--no-eval-sets",
    )
    assert _one_error_line(res) and "both be corpus 'a'" in res.stderr, res.stderr


def test_disk_full_is_one_line_and_leaves_no_complete_looking_output(corpus, tmp_path, dp):
    from faults import small_tmpfs

    root, _ = corpus
    with small_tmpfs(tmp_path / "disk", "96k") as disk:
        res = dp.run_cli(
            "dedup",
            f"books={root}/books.jsonl",
            f"web={root}/web.jsonl",
            "--output",
            str(disk / "o"),
            "--no-eval-sets",
            "--compress",
            "none",
            "--workers",
            "1",
        )
        assert _one_error_line(res) and "disk full" in res.stderr, res.stderr
        assert not (disk / "o" / "checksums.json").exists()


# ------------------------------------------------------------------------------------------ the parts


def test_union_find_gives_each_component_its_smallest_id():
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    from data_prep.dedup.lsh import union_edges

    rng = np.random.default_rng(0)
    n = 5000
    a, b = rng.integers(0, n, 3000), rng.integers(0, n, 3000)
    edges = np.stack([np.maximum(a, b), np.minimum(a, b)])
    parent = np.arange(n, dtype=np.int64)
    for chunk in np.array_split(np.arange(edges.shape[1]), 4):  # several "bands"
        parent = union_edges(parent, edges[:, chunk])
    _, labels = connected_components(coo_matrix((np.ones(len(a)), (a, b)), shape=(n, n)), directed=False)
    smallest = {}
    for i, lab in enumerate(labels):
        smallest.setdefault(lab, i)
    assert parent.tolist() == [smallest[lab] for lab in labels]


def test_banding_finds_the_same_candidates_as_rensas_lsh(corpus):
    import rensa

    from data_prep.dedup import text as T
    from data_prep.dedup.lsh import group_edges

    root, _ = corpus
    texts = [json.loads(line)["text"] for line in (root / "web.jsonl").read_text().splitlines()]
    texts += [json.loads(line)["text"] for line in (root / "books.jsonl").read_text().splitlines()]
    params = T.MinHashParams(1, 16, 2, 3)  # single words, 2 values a band: many candidates besides the copies
    shingles = [T.normalized_words(t) for t in texts]
    hashes = rensa.RMinHash.from_token_sets(shingles, params.num_perm, params.seed)
    sigs = np.array([h.digest() for h in hashes], dtype=np.uint32)
    ours, star = set(), set()
    for band in T.band_keys(sigs, params):
        for key in np.unique(band):
            members = np.flatnonzero(band == key).tolist()
            ours |= {(a, b) for i, a in enumerate(members) for b in members[i + 1 :]}
        star |= {tuple(sorted(e)) for e in group_edges(band, np.arange(len(texts))).T.tolist()}
    lsh = rensa.RMinHashLSH(0.5, params.num_perm, params.bands)
    for i, h in enumerate(hashes):
        lsh.insert(i, h)
    theirs = {tuple(sorted((i, j))) for i, h in enumerate(hashes) for j in lsh.query(h) if j != i}
    assert ours == theirs and len(theirs) > 20 * COPIES  # the same candidate pairs as rensa's LSH index
    assert _components(star, len(texts)) == _components(theirs, len(texts))  # star edges: the same clusters


def _components(pairs, n):
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for a, b in pairs:
        ra, rb = find(a), find(b)
        parent[max(ra, rb)] = min(ra, rb)
    return [find(i) for i in range(n)]


def test_eval_sets_text_columns_short_texts_and_bad_lines(tmp_path):
    from data_prep.dedup import text as T
    from data_prep.dedup.evalsets import CutRule, EvalTable, cut_document, load_eval_table

    d = tmp_path / "evals"
    (d / "task").mkdir(parents=True)
    long = "the quick brown fox jumps over the lazy dog near the old river bank today"
    (d / "task" / "dev.tsv").write_text(f"index\tsentence\tlabel\n0\t{long}\tentailment\n1\tshort one here\t0\n")
    (d / "task" / "train.tsv").write_text(f"0\t{long}\n")  # not an evaluation split
    table = load_eval_table([d], ["dev", "test"], 13, 8)
    assert [s.name for s in table.sets] == ["task/dev"] and table.sets[0].examples == 2
    words = T.normalized_words("Once upon a time, " + long.upper() + "! and so on.")
    flat, offsets = T.hash_words([words])
    assert table.doc_hits(flat, offsets).tolist() == [15 - table.sets[0].n + 1]
    text = "x" * 300 + " " + long + " " + "y" * 300
    hits = table.matches(T.hash_words([T.normalized_words(text)])[0])
    pieces = cut_document(text, hits, T.word_spans(text), CutRule(margin=10, min_piece=50, max_pieces=10))
    assert pieces == ["x" * 291, "y" * 291]  # the match and 10 characters each side are gone
    (d / "task" / "test.jsonl").write_text('{"q": "fine"}\n{"q": broken\n')
    with pytest.raises(DataPrepError, match=r"test\.jsonl:2: not valid JSON"):
        load_eval_table([d], ["dev", "test"], 13, 8)
    assert isinstance(table, EvalTable)


def test_tokenize_reads_the_dedup_output(reference, tmp_path, vocab):
    from data_prep import tokenize_corpus

    out, report = reference
    manifest = tokenize_corpus([out / "text"], tmp_path / "tok", tokenizer=vocab, valid_fraction=0.0)
    assert manifest["totals"]["docs"] == report["totals"]["pieces_kept"]  # one JSONL record per kept document
    assert {s["key"].split("/")[1] for s in manifest["sources"]} == {"books", "web"}
    # the manifest names exactly which data it saw: the dedup parameters and the report's hash
    (entry,) = manifest["dedup"]
    assert entry["report_sha256"] == hashlib.sha256((out / "dedup_report.json").read_bytes()).hexdigest()
    assert entry["params"] == report["params"]
    plain = tokenize_corpus([GUTENBERG / "11-0.txt"], tmp_path / "plain", tokenizer=vocab, valid_fraction=0.0)
    assert plain["dedup"] is None


def test_lsh_key_ranges_find_the_same_clusters(corpus, reference, tmp_path, monkeypatch):
    """At 160 GB stage 2 cuts every band into key ranges (--lsh-memory); 8 ranges here must change nothing."""
    from data_prep.dedup import lsh as dedup_lsh

    ref_out, ref = reference
    monkeypatch.setattr(dedup_lsh, "partition_bits", lambda entries, memory: 3)
    report = _run(corpus, tmp_path / "ranges")
    assert report["clusters"]["key_range_bits"] == 3
    text = {k: v for k, v in _hashes(tmp_path / "ranges").items() if k.startswith("text/")}
    assert text == {k: v for k, v in _hashes(ref_out).items() if k.startswith("text/")} and text
    assert {k: v for k, v in report["clusters"].items() if k != "key_range_bits"} == {
        k: v for k, v in ref["clusters"].items() if k != "key_range_bits"
    }


def test_an_array_task_leaves_the_other_tasks_work_in_progress_alone(corpus, tmp_path):
    """Array tasks run at once on several nodes: a task clears the temporaries of its own units only (a task that
    cleared everyone's deleted a live unit of the other task: found by a run on the local Slurm cluster)."""
    from data_prep.dedup.plan import make_dedup_plan, signature_settings, unit_keys

    root, _ = corpus
    out = tmp_path / "arr"
    inputs = [f"books={root}/books.jsonl", f"web={root}/web.jsonl"]
    plan = make_dedup_plan(inputs, SMALL_UNITS, {}, out, False)
    assert len(plan["units"]) >= 2
    other = out / ".work" / "sig" / f".{unit_keys(plan, signature_settings(plan))[1][:32]}.tmp4242"
    other.mkdir(parents=True)  # unit 1 is task 1's, being written right now
    other_part = out / "text" / "web" / ".part_00001.jsonl.zst.tmp4242"
    other_part.parent.mkdir(parents=True)
    other_part.write_bytes(b"half")

    def task(stage, j):
        dedup_corpus(inputs, out, (), SMALL_UNITS, DedupRun(num_tasks=2, task_index=j, stage=stage))

    task("signatures", 0)
    assert other.is_dir()
    task("signatures", 1)  # unit 1's own task clears it (a leftover of its killed run) and signs the unit
    assert not other.exists()
    dedup_corpus(inputs, out, (), SMALL_UNITS, DedupRun(stage="clusters"))
    task("write", 0)
    assert other_part.is_file()
    task("write", 1)
    assert not other_part.exists()
