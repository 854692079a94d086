"""Every command through `python -m data_prep` on real data (WikiText-2 + a Gutenberg book)."""

import json

import pytest

from data_prep import PreparedCorpus
from data_prep.stats import corpus_stats


def test_all_commands(tmp_path, dp, vocab, wikitext, gutenberg):
    out = tmp_path / "out"
    book = str(gutenberg / "1952-0.txt")
    r = dp.run_cli("train-tokenizer", "--output", str(out), "--vocab", str(vocab))
    assert r.returncode == 0, r.stderr
    assert "wordpiece tokenizer, vocab 30522" in r.stdout

    # array task 1 of 2 (as Slurm would start it), then task 0, then finalize
    common = [
        "tokenize",
        str(wikitext),
        book,
        "--output",
        str(out),
        "--unit-size",
        "256K",
        "--shard-tokens",
        "200K",
        "--workers",
        "2",
        "--no-progress",
    ]
    r = dp.run_cli(*common, env={"SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_ID": "1"})
    assert r.returncode == 0, r.stderr
    assert "task 1/2" in r.stdout and "finalize" in r.stdout
    r = dp.run_cli("finalize", str(out))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "rerun task(s) [0]" in r.stderr
    r = dp.run_cli(*common, "--num-tasks", "2", "--task-index", "0")
    assert r.returncode == 0, r.stderr
    r = dp.run_cli("finalize", str(out))
    assert r.returncode == 0, r.stderr
    assert "train:" in r.stdout and "valid:" in r.stdout

    r = dp.run_cli("verify", str(out), "--workers", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{out}: OK")

    r = dp.run_cli("stats", str(out))
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    m = dp.load_manifest(out)
    for split in ("train", "valid"):
        assert st["splits"][split]["tokens"] == m["splits"][split]["tokens"]
        png = out / "stats" / f"{split}_lengths.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "stats" / "stats.json").is_file()
    wiki = next(s for s in m["sources"] if s["key"] == "wiki.test.raw")
    assert wiki["doc_boundary"] == "line" and not wiki["gutenberg"]
    assert PreparedCorpus(out).num_docs > 2000  # WikiText paragraphs + the book's paragraphs


def test_train_tokenizer_cli_and_tokenize_with_it(tmp_path, dp, gutenberg):
    out = tmp_path / "out"
    r = dp.run_cli(
        "train-tokenizer",
        str(gutenberg / "11-0.txt"),
        "--output",
        str(out),
        "--kind",
        "unigram",
        "--vocab-size",
        "1500",
        "--threads",
        "1",
    )
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / "tokenizer" / "data_prep_tokenizer.json").read_text())
    assert meta["kind"] == "unigram" and meta["special_ids"]["pad"] == 0
    r = dp.run_cli("tokenize", str(gutenberg / "11-0.txt"), "--output", str(out), "--workers", "1", "--no-progress")
    assert r.returncode == 0, r.stderr
    c = PreparedCorpus(out)
    assert c.vocab_size == meta["vocab_size"] and int(max(c.sentence(i).max() for i in range(50))) < 1500
    assert dp.run_cli("verify", str(out)).returncode == 0
    # a second training into the same directory is refused, the tokenizer stays
    r = dp.run_cli("train-tokenizer", str(gutenberg / "11-0.txt"), "--output", str(out), "--kind", "bpe")
    assert r.returncode == 2 and "already exists" in r.stderr
    assert json.loads((out / "tokenizer" / "data_prep_tokenizer.json").read_text()) == meta


@pytest.mark.parametrize(
    "args, message",
    [
        (["tokenize", "/nonexistent/file.txt", "--output", "{tmp}/o", "--tokenizer", "{vocab}"], "input not found"),
        (["tokenize", "{book}", "--output", "{tmp}/o"], "no tokenizer"),
        (
            ["tokenize", "{book}", "--output", "{tmp}/o", "--tokenizer", "{vocab}", "--valid-fraction", "1.5"],
            "--valid-fraction must be in [0, 1)",
        ),
        (["finalize", "{tmp}/o"], "nothing to finalize"),
    ],
)
def test_user_errors_exit_2_with_one_line(tmp_path, dp, vocab, gutenberg, args, message):
    fill = {"tmp": str(tmp_path), "vocab": str(vocab), "book": str(gutenberg / "1952-0.txt")}
    r = dp.run_cli(*[a.format(**fill) for a in args])
    assert r.returncode == 2
    assert r.stderr.startswith("data_prep: error: ") and r.stderr.count("\n") == 1, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr


def test_stats_api(small_prepared, tmp_path):
    st = corpus_stats(small_prepared, tmp_path / "plots")
    tr = st["splits"]["train"]
    c = PreparedCorpus(small_prepared)
    assert (tr["docs"], tr["sentences"], tr["tokens"]) == (c.num_docs, c.num_sentences, c.num_tokens)
    lengths = c.sentence_lengths
    assert tr["tokens_per_sentence"]["max"] == int(lengths.max())
    import numpy as np

    assert tr["tokens_per_sentence"]["p50"] == int(np.percentile(lengths, 50, method="inverted_cdf"))
    assert (tmp_path / "plots" / "train_lengths.png").stat().st_size > 1000


def test_parser_follows_the_cli_convention():
    """`--output`, `--x/--no-x` booleans (the old `--no-x` spellings still work), defaults and choices from the
    config dataclasses."""
    import dataclasses
    import typing

    from data_prep.__main__ import build_parser
    from data_prep.plan import PrepConfig
    from data_prep.tokenizer import KINDS, TokenizerTraining

    parser = build_parser()
    args = parser.parse_args(["tokenize", "a.txt", "--output", "o"])
    assert args.output == "o" and args.progress and args.rehash and args.finalize is None
    assert args.strip_gutenberg and not args.allow_empty
    for f in dataclasses.fields(PrepConfig):
        assert getattr(args, f.name) == f.default, f.name
    args = parser.parse_args(
        [
            "tokenize",
            "a.txt",
            "--output",
            "o",
            "--no-progress",
            "--no-rehash",
            "--no-finalize",
            "--no-strip-gutenberg",
            "--allow-empty",
            "--doc-boundary",
            "file",
            "--unit-size",
            "64K",
        ]
    )
    assert (args.progress, args.rehash, args.finalize, args.strip_gutenberg, args.allow_empty) == (
        False,
        False,
        False,
        False,
        True,
    )
    assert (args.doc_boundary, args.unit_bytes) == ("file", 64 << 10)
    assert parser.parse_args(["tokenize", "a.txt", "--output", "o", "--finalize"]).finalize is True

    actions = {a.dest: a for a in parser._subparsers._group_actions[0].choices["tokenize"]._actions}
    hints = typing.get_type_hints(PrepConfig)
    assert tuple(actions["doc_boundary"].choices) == typing.get_args(hints["doc_boundary"])
    assert tuple(actions["on_decode_error"].choices) == typing.get_args(hints["on_decode_error"])

    args = parser.parse_args(["train-tokenizer", "a.txt", "--output", "o", "--cased"])
    assert args.cased and (args.kind, args.vocab_size) == (TokenizerTraining.kind, TokenizerTraining.vocab_size)
    assert not parser.parse_args(["train-tokenizer", "--output", "o", "--no-cased"]).cased
    tt = parser._subparsers._group_actions[0].choices["train-tokenizer"]
    assert tuple(next(a for a in tt._actions if a.dest == "kind").choices) == KINDS

    assert parser.parse_args(["stats", "d"]).output is None
    assert (
        parser.parse_args(["stats", "d", "--output", "p"]).directory,
        parser.parse_args(["stats", "d", "--output", "p"]).output,
    ) == ("d", "p")
    assert parser.parse_args(["finalize", "d"]).directory == "d"


def test_stats_output_and_one_line_errors(small_prepared, tmp_path, capsys, monkeypatch):
    import data_prep.__main__ as M
    import data_prep.cli as CLI  # where the commands live (M assembles them)
    from data_prep.errors import DataPrepError

    assert M.main(["stats", str(small_prepared), "--output", str(tmp_path / "p")]) == 0
    assert json.loads((tmp_path / "p" / "stats.json").read_text())["splits"]["train"]["docs"] > 0
    capsys.readouterr()

    def multi_line(args):
        raise DataPrepError("first line\nsecond line")

    monkeypatch.setattr(CLI, "_cmd_finalize", multi_line)
    assert M.main(["finalize", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "data_prep: error: first line second line\n"

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(CLI, "_cmd_finalize", interrupted)
    assert M.main(["finalize", str(tmp_path)]) == 130


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["tokenize", "{book}", "--output", "{tmp}/o", "--tokenizer", "{vocab}", "--workers", "0"],
            "--workers must be >= 1",
        ),
        (
            ["tokenize", "{book}", "--output", "{tmp}/o", "--tokenizer", "{vocab}", "--threads-per-worker", "0"],
            "--threads-per-worker must be >= 1",
        ),
        (
            ["tokenize", "{book}", "--output", "{tmp}/o", "--tokenizer", "{vocab}", "--num-tasks", "0"],
            "--num-tasks must be >= 1",
        ),
        (
            ["tokenize", "{book}", "--output", "{tmp}/o", "--tokenizer", "{vocab}", "--max-unk-fraction", "nan"],
            "--max-unk-fraction must be in [0, 1]",
        ),
        (
            ["tokenize", "{book}", "--output", "{tmp}/o", "--tokenizer", "{vocab}", "--max-doc-bytes", "100"],
            "--max-doc-bytes must be >= 1K",
        ),
        (
            ["tokenize", "{book}", "--output", "{tmp}/o", "--tokenizer", "{vocab}", "--shard-tokens", "0"],
            "--shard-tokens must be >= 1",
        ),
        (["tokenize", "{book}", "--output", "{book}", "--tokenizer", "{vocab}"], "is the input"),
        (["finalize", "{tmp}", "--max-unk-fraction", "-1"], "--max-unk-fraction must be in [0, 1]"),
        (["train-tokenizer", "{book}", "--output", "{tmp}/o", "--vocab-size", "3"], "--vocab-size must be in 6.."),
        (["train-tokenizer", "{book}", "--output", "{tmp}/o", "--threads", "0"], "--threads must be >= 1"),
        (["train-tokenizer", "{book}", "--output", "{tmp}/o", "--max-bytes", "0"], "--max-bytes must be > 0"),
        (["verify", "{tmp}/nowhere"], "no such directory"),
        (["verify", "{tmp}", "--workers", "0"], "--workers must be >= 1"),
        (["stats", "{tmp}/nowhere"], "prepared corpus directory not found"),
    ],
)
def test_numeric_ranges_and_paths_are_checked_up_front(tmp_path, dp, vocab, gutenberg, args, message):
    fill = {"tmp": str(tmp_path), "vocab": str(vocab), "book": str(gutenberg / "1952-0.txt")}
    r = dp.run_cli(*[a.format(**fill) for a in args])
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("data_prep: error: ") and r.stderr.count("\n") == 1, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()  # nothing was written


def test_damaged_work_files_are_named(tmp_path, dp, small_books, vocab):
    from data_prep import tokenize_corpus

    out = tmp_path / "o"
    settings = dict(unit_bytes=48 << 10, shard_tokens=30_000, valid_fraction=0.05)
    tokenize_corpus(small_books, out, tokenizer=vocab, finalize=False, **settings)
    plan = out / ".work" / "plan.json"
    plan.write_bytes(plan.read_bytes()[:100])
    base = ["tokenize", *small_books, "--output", str(out), "--tokenizer", str(vocab), "--unit-size", "48K"]
    base += ["--shard-tokens", "30000", "--valid-fraction", "0.05", "--no-progress"]
    for args in (base, ["finalize", str(out)]):
        r = dp.run_cli(*args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
        assert f"{plan}:" in r.stderr and "not valid JSON" in r.stderr and "delete it and rerun tokenize" in r.stderr
    plan.unlink()  # what the message says to do: the finished units are reused
    r = dp.run_cli(*base)
    assert r.returncode == 0, r.stderr
    task = json.loads((out / ".work" / "tasks" / "task_00000_of_00001.json").read_text())
    assert task["units_done_now"] == []
    manifest = out / "manifest.json"
    manifest.write_text("{")
    r = dp.run_cli(*base)
    assert r.returncode == 2 and f"{manifest}:1:2: not valid JSON" in r.stderr and "new --output" in r.stderr


def test_submit_passes_the_unk_threshold_to_finalize(tmp_path, dp):
    """`prep_data.sh submit -- ... --max-unk-fraction F`: the finalize job gets F too (it would refuse otherwise)."""
    import os
    import subprocess

    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "sbatch.log"
    (fake / "sbatch").write_text(f'#!/bin/bash\necho "$*" >> {log}\necho $((RANDOM + 100))\n')
    (fake / "sbatch").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "PREP_TASKS": "2"}
    for flag in (["--max-unk-fraction", "0.3"], ["--max-unk-fraction=0.3"]):
        log.unlink(missing_ok=True)
        args = ["bash", "slurm/prep_data.sh", "submit", "-p", "cpu", "--", "a.txt", "--output", "OUT", *flag]
        r = subprocess.run(args, cwd=dp.REPO, env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        array_call, finalize_call = log.read_text().splitlines()
        assert array_call.endswith("slurm/prep_data.sh a.txt --output OUT " + " ".join(flag))
        assert finalize_call.endswith("slurm/prep_data.sh finalize OUT " + " ".join(flag))


def test_cased_applies_to_an_adopted_vocab(tmp_path, dp, vocab):
    """--vocab with --cased keeps case (it was ignored before); without, the vocab's own tokenizer_config decides."""
    for flag, lowercase in (([], True), (["--cased"], False), (["--no-cased"], True)):
        out = tmp_path / f"o{len(flag)}{lowercase}"
        r = dp.run_cli("train-tokenizer", "--output", str(out), "--vocab", str(vocab), *flag)
        assert r.returncode == 0, r.stderr
        assert json.loads((out / "tokenizer" / "data_prep_tokenizer.json").read_text())["lowercase"] is lowercase
