"""The [UNK] rate: counted per unit and split, recorded in the manifest, reported by tokenize/finalize/stats, and a
corpus above `--max-unk-fraction` refused (early, resumable, the threshold in no hash)."""

import json
import shutil

import numpy as np
import pytest

from common.vocab import DEFAULT_MAX_UNK_FRACTION
from data_prep import PreparedCorpus, finalize_dir, tokenize_corpus, verify_dir
from data_prep.errors import DataPrepError
from data_prep.stats import UNK_CHECK_MIN_TOKENS, corpus_stats

SMALL = dict(unit_bytes=48 << 10, shard_tokens=30_000, valid_fraction=0.05)  # = the small_prepared fixture
PARROT = "\U0001f99c"  # not in bert-base-uncased: one [UNK] per parrot written as its own word


@pytest.fixture(scope="module")
def parrots(tmp_path_factory):
    """400 one-line documents, document i holding i % 4 parrots: 600 [UNK]s in ~4,600 tokens (~13 %)."""
    d = tmp_path_factory.mktemp("parrots")
    lines = [f"Line {i} of the parrot corpus has {i % 4} birds: " + " ".join([PARROT] * (i % 4)) for i in range(400)]
    (d / "parrots.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d / "parrots.txt", sum(i % 4 for i in range(400))


def _unk_in_shards(out, split):
    corpus = PreparedCorpus(out, split)
    return sum(int(np.count_nonzero(corpus._shard(k)[0] == 100)) for k in range(corpus.num_shards))


def test_unk_tokens_counted_per_split_and_in_the_totals(tmp_path, vocab, parrots, dp):
    path, expected = parrots
    out = tmp_path / "o"
    m = tokenize_corpus([path], out, tokenizer=vocab, unit_bytes=4096, valid_fraction=0.3, max_unk_fraction=0.5)
    assert m["totals"]["unk_tokens"] == expected == 600
    for split in ("train", "valid"):
        assert m["splits"][split]["unk_tokens"] == _unk_in_shards(out, split) > 0
    assert sum(sum(u["unk_tokens"].values()) for u in m["units"]) == expected and len(m["units"]) > 3
    assert verify_dir(out) == []
    # a manifest whose [UNK] totals do not match its shards is caught by verify
    tampered = dp.load_manifest(out)
    tampered["splits"]["valid"]["unk_tokens"] += 1
    tampered["totals"]["unk_tokens"] += 1
    (out / "manifest.json").write_text(json.dumps(tampered))
    problems = verify_dir(out)
    assert any("split 'valid' unk_tokens" in p for p in problems)
    assert any("totals.unk_tokens" in p for p in problems)


def test_stats_reports_the_rate_from_the_manifest_or_the_shards(tmp_path, vocab, parrots, caplog):
    path, expected = parrots
    out = tmp_path / "o"
    m = tokenize_corpus([path], out, tokenizer=vocab, unit_bytes=4096, valid_fraction=0.3, max_unk_fraction=0.5)
    with caplog.at_level("WARNING", logger="data_prep"):
        st = corpus_stats(out)
    assert st["unk"]["unk_tokens"] == expected and st["unk"]["tokens"] == m["totals"]["tokens"]
    assert st["unk"]["fraction"] == pytest.approx(expected / m["totals"]["tokens"]) and st["unk"]["fraction"] > 0.05
    assert st["splits"]["valid"]["unk_tokens"] == m["splits"]["valid"]["unk_tokens"]
    assert any("above the default --max-unk-fraction" in r.getMessage() for r in caplog.records)
    # a manifest written before the count existed: stats counts in the shards
    old = json.loads((out / "manifest.json").read_text())
    for split in old["splits"].values():
        del split["unk_tokens"]
    del old["totals"]["unk_tokens"]
    (out / "manifest.json").write_text(json.dumps(old))
    assert corpus_stats(out, tmp_path / "s")["unk"]["unk_tokens"] == expected
    assert verify_dir(out) == []  # nothing recorded, nothing to disagree with


def test_the_threshold_is_in_no_hash(dp, tmp_path, small_prepared, small_books, vocab):
    """Another --max-unk-fraction gives the very same bytes (so a rerun with an override resumes the same run)."""
    out = tmp_path / "o"
    tokenize_corpus(small_books, out, tokenizer=vocab, max_unk_fraction=0.5, **SMALL)
    assert dp.manifest_bytes(out) == dp.manifest_bytes(small_prepared)
    assert dp.shard_hashes(out) == dp.shard_hashes(small_prepared)
    m = dp.load_manifest(out)
    assert "max_unk_fraction" not in m["config"] and m["totals"]["unk_tokens"] == 0  # a matching vocab


def test_a_wrong_vocab_stops_after_the_first_units_and_resumes(tmp_path, medium_books, dp):
    three = tmp_path / "three.txt"
    three.write_text("the\nof\nand\n")
    settings = dict(unit_bytes=32 << 10, shard_tokens=60_000, valid_fraction=0.02)
    out = tmp_path / "o"
    with pytest.raises(DataPrepError, match=r"\d+(\.\d+)? % of the first [\d,]+ tokens are \[UNK\]") as err:
        tokenize_corpus(medium_books, out, tokenizer=three, **settings)
    msg = str(err.value)
    assert str(out / "tokenizer" / "vocab.txt") in msg and f"--tokenizer {three}" in msg
    assert "--max-unk-fraction 1" in msg and f"--max-unk-fraction {DEFAULT_MAX_UNK_FRACTION:g}" in msg
    units = [d for d in (out / ".work" / "units").iterdir() if not d.name.startswith(".")]
    n_units = len(json.loads((out / ".work" / "plan.json").read_text())["plan"]["units"])
    assert 1 <= len(units) < n_units / 2  # stopped early: most of the corpus was never tokenized
    assert not (out / "manifest.json").exists() and not (out / "train").exists()
    # accepted knowingly: the run continues from its finished units and equals a clean accepted run
    m = tokenize_corpus(medium_books, out, tokenizer=three, max_unk_fraction=1.0, **settings)
    assert m["totals"]["unk_tokens"] / m["totals"]["tokens"] > 0.8
    clean = tmp_path / "clean"
    tokenize_corpus(medium_books, clean, tokenizer=three, max_unk_fraction=1.0, **settings)
    assert dp.manifest_bytes(out) == dp.manifest_bytes(clean) and dp.shard_hashes(out) == dp.shard_hashes(clean)


def test_finalize_refuses_the_whole_corpus(tmp_path, parrots, vocab):
    """Array tasks with too few tokens for the running check; finalize checks the total before writing a shard."""
    path, _ = parrots
    out = tmp_path / "o"
    for j in (0, 1):
        tokenize_corpus([path], out, tokenizer=vocab, num_tasks=2, task_index=j, unit_bytes=4096)
    assert not (out / "manifest.json").exists()
    with pytest.raises(DataPrepError, match=r"% of all [\d,]+ tokens are \[UNK\].*above --max-unk-fraction 0\.01"):
        finalize_dir(out)
    assert not (out / "manifest.json").exists() and not (out / "train").exists()
    m = finalize_dir(out, max_unk_fraction=0.5)
    assert m["totals"]["unk_tokens"] == 600 and verify_dir(out) == []


def test_running_check_waits_for_enough_tokens(tmp_path, parrots, vocab):
    """A small corpus (fewer tokens than UNK_CHECK_MIN_TOKENS) is judged as a whole, at finalize."""
    path, _ = parrots
    with pytest.raises(DataPrepError, match="% of all"):
        tokenize_corpus([path], tmp_path / "o", tokenizer=vocab, unit_bytes=4096)
    assert UNK_CHECK_MIN_TOKENS > 7_000  # the parrot corpus is below it: no "of the first" refusal


def test_units_written_before_the_count_are_redone(dp, tmp_path, small_prepared, small_books, vocab):
    """A unit.json without unk_tokens (written by an older data_prep) is redone; the result equals a clean run."""
    out = tmp_path / "o"
    tokenize_corpus(small_books, out, tokenizer=vocab, finalize=False, **SMALL)
    units = sorted(d for d in (out / ".work" / "units").iterdir())
    record = units[2] / "unit.json"
    info = json.loads(record.read_text())
    del info["unk_tokens"]
    record.write_text(json.dumps(info))
    with pytest.raises(DataPrepError, match="1 of .* work units missing"):
        finalize_dir(out)
    tokenize_corpus(small_books, out, tokenizer=vocab, **SMALL)
    task = json.loads((out / ".work" / "tasks" / "task_00000_of_00001.json").read_text())
    assert len(task["units_done_now"]) == 1
    assert dp.manifest_bytes(out) == dp.manifest_bytes(small_prepared)
    assert dp.shard_hashes(out) == dp.shard_hashes(small_prepared)


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
def test_threshold_range(tmp_path, small_books, vocab, value):
    with pytest.raises(DataPrepError, match=r"--max-unk-fraction must be in \[0, 1\]"):
        tokenize_corpus(small_books, tmp_path / "o", tokenizer=vocab, max_unk_fraction=value)
    assert not (tmp_path / "o").exists()
    with pytest.raises(DataPrepError, match=r"--max-unk-fraction must be in \[0, 1\]"):
        finalize_dir(tmp_path / "o", max_unk_fraction=value)


def test_cli_prints_the_rate(tmp_path, dp, vocab, parrots, small_prepared):
    path, _ = parrots
    out = tmp_path / "o"
    r = dp.run_cli("tokenize", str(path), "--output", str(out), "--tokenizer", str(vocab), "--no-progress")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("data_prep: error: ") and "% of all" in r.stderr
    r = dp.run_cli("finalize", str(out), "--max-unk-fraction", "0.5")
    assert r.returncode == 0, r.stderr
    tokens = dp.load_manifest(out)["totals"]["tokens"]
    rate = f"{100 * 600 / tokens:.3g} % [UNK] (600 of {tokens:,} tokens)"
    assert rate in r.stdout
    r = dp.run_cli("stats", str(out))
    assert r.returncode == 0 and rate in r.stderr and "above the default" in r.stderr
    copy = tmp_path / "copy"
    shutil.copytree(small_prepared, copy)
    r = dp.run_cli("stats", str(copy))
    assert r.returncode == 0 and "0 % [UNK] (0 of" in r.stderr and "above" not in r.stderr
