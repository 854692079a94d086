"""Fault injection for data_prep, as an operator meets faults: corrupt inputs, damaged outputs, kill -9 at chosen
points of tokenize and finalize, a full disk, a vocabulary that does not fit the text.

What must hold: a bad input is one line on stderr naming the file (exit 2, no traceback, nothing looks finished); a
damaged output is named by `verify` (exit 1) and, where it can be seen cheaply, by the reader; after a kill or a
full disk there is no manifest.json, and rerunning the same command gives the bytes of an uninterrupted run.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from faults import flip_bytes, small_tmpfs, truncate
from requirements import GUTENBERG, REPO, require_data

from data_prep import PreparedCorpus, finalize_dir, minilm_vocab, tokenize_corpus, verify_dir
from data_prep.errors import DataPrepError
from data_prep.shard_format import HEADER_SIZE, read_idx_header

BOOKS = ["11-0.txt", "1952-0.txt", "pg1080.txt"]  # ~50-180 KB each: several units and shards, seconds per run
SETTINGS = dict(unit_bytes=48 << 10, shard_tokens=30_000, valid_fraction=0.05)
FLAGS = ["--unit-size", "48K", "--shard-tokens", "30000", "--valid-fraction", "0.05", "--no-progress"]


@pytest.fixture(scope="module")
def books() -> list[str]:
    require_data(*(GUTENBERG / b for b in BOOKS))
    return [str(GUTENBERG / b) for b in BOOKS]


@pytest.fixture(scope="module")
def vocab() -> Path:
    return minilm_vocab()


@pytest.fixture(scope="module")
def clean(tmp_path_factory, books, vocab) -> Path:
    """An uninterrupted run: what every interrupted one must equal byte for byte."""
    out = tmp_path_factory.mktemp("clean") / "out"
    tokenize_corpus(books, out, tokenizer=vocab, **SETTINGS)
    return out


@pytest.fixture(scope="module")
def unfinalized(tmp_path_factory, books, vocab) -> Path:
    """All units done, not finalized (copied by the finalize tests)."""
    out = tmp_path_factory.mktemp("units") / "out"
    tokenize_corpus(books, out, tokenizer=vocab, finalize=False, **SETTINGS)
    return out


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "data_prep", *args], capture_output=True, text=True, env=full, cwd=REPO, timeout=120
    )


def output_bytes(out: Path) -> dict[str, str]:
    """sha256 of manifest.json and of every shard file."""
    files = [out / "manifest.json", *sorted((out / "train").glob("*")), *sorted((out / "valid").glob("*"))]
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def assert_one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("data_prep: error: ")]
    assert len(errors) == 1 and r.stderr.rstrip().endswith(errors[0]), r.stderr
    assert "Traceback" not in r.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


# ------------------------------------------------------------------------------------------------ corrupt inputs


def _zst(text: bytes) -> bytes:
    import zstandard

    c = zstandard.ZstdCompressor()
    return c.compress(text[: len(text) // 2]) + c.compress(text[len(text) // 2 :])  # two frames


def _gz_flipped(text: bytes) -> bytes:
    data = bytearray(gzip.compress(text))
    for i in range(len(data) // 2, len(data) // 2 + 16):
        data[i] ^= 0xFF
    return bytes(data)


TEXT = b"".join(b"Paragraph %d says something %x.\n\n" % (i, i * 7919) for i in range(5000))
CORRUPT_INPUTS = {
    "invalid UTF-8, --on-decode-error fail": (
        "bad.txt",
        b"Fine first paragraph.\n\nThen \xff\xfe here.\n",
        ["--on-decode-error", "fail"],
        "bad.txt: line 3: invalid UTF-8 at byte 28",
    ),
    "truncated .gz": ("cut.txt.gz", gzip.compress(TEXT)[:-200], [], "cut.txt.gz: corrupt or truncated gz stream"),
    "flipped bytes in a .gz": ("flip.txt.gz", _gz_flipped(TEXT), [], "flip.txt.gz: corrupt or truncated gz stream"),
    # zstandard's stream reader returns the first frame and then b"" without an error: silent data loss before
    "truncated .zst (inside its last frame)": (
        "cut.txt.zst",
        _zst(TEXT)[:-300],
        [],
        "cut.txt.zst: corrupt or truncated zst stream (the file ends inside a zstd frame)",
    ),
    "not zstd at all": ("junk.txt.zst", b"this is not zstd\n" * 100, [], "junk.txt.zst: corrupt or truncated zst"),
    "empty file": ("empty.txt", b"", [], "empty.txt: empty input file; pass --allow-empty"),
    "a .gz of nothing": ("nothing.txt.gz", gzip.compress(b""), [], "the inputs produced no documents"),
    "invalid UTF-8 in JSONL, fail": (
        "d.jsonl",
        b'{"text": "ok"}\n{"text": "bad \xc3("}\n',
        ["--on-decode-error", "fail"],
        "d.jsonl: line 2: invalid UTF-8",
    ),
}


@pytest.mark.parametrize("case", list(CORRUPT_INPUTS))
def test_corrupt_input_is_one_line_naming_the_file(tmp_path, vocab, case):
    name, data, flags, message = CORRUPT_INPUTS[case]
    (tmp_path / name).write_bytes(data)
    out = tmp_path / "out"
    r = cli("tokenize", str(tmp_path / name), "--output", str(out), "--tokenizer", str(vocab), *flags, *FLAGS)
    assert_one_line_error(r, message)
    assert not (out / "manifest.json").exists()
    assert not list(out.glob(".work/units/*")) or case == "a .gz of nothing"  # no unit of a bad file is kept


# ---------------------------------------------------------------------------------------------- damaged outputs


def _first_shard(out: Path) -> Path:
    return out / "train" / "shard_00000"


def _flip_idx_offsets(out: Path) -> None:
    idx = _first_shard(out).with_suffix(".idx")
    flip_bytes(idx, offset=HEADER_SIZE + 8 * (read_idx_header(idx).num_sentences // 2), count=16)


def _edit_manifest(out: Path, edit) -> None:
    m = json.loads((out / "manifest.json").read_text())
    edit(m)
    (out / "manifest.json").write_text(json.dumps(m))


DAMAGE = {  # what is done, what verify names, what the reader says (None: the reader cannot see it cheaply)
    "truncated .bin": (lambda o: truncate(_first_shard(o).with_suffix(".bin")), "shard_00000.bin", "truncated"),
    "truncated .idx": (lambda o: truncate(_first_shard(o).with_suffix(".idx")), "shard_00000.idx", "index file is"),
    "flipped .idx magic": (
        lambda o: flip_bytes(_first_shard(o).with_suffix(".idx"), offset=0, count=4),
        "shard_00000.idx",
        "bad magic",
    ),
    "flipped .idx offsets": (_flip_idx_offsets, "shard_00000.idx", "corrupt index"),
    "flipped .bin tokens": (lambda o: flip_bytes(_first_shard(o).with_suffix(".bin")), "shard_00000.bin", None),
    "manifest not JSON": (lambda o: truncate(o / "manifest.json"), "manifest.json: not valid JSON", "not valid JSON"),
    "manifest without its tokenizer": (
        lambda o: _edit_manifest(o, lambda m: m.pop("tokenizer")),
        "manifest.json: damaged manifest",
        "damaged manifest",
    ),
    "manifest [UNK] total changed": (
        lambda o: _edit_manifest(o, lambda m: m["totals"].update(unk_tokens=5)),
        "totals.unk_tokens = 5",
        None,
    ),
    "tokenizer file changed": (
        lambda o: (o / "tokenizer" / "vocab.txt").write_text("the\n"),
        "vocab.txt: sha256 differs",
        None,
    ),
}


def _read_everything(out: Path) -> None:
    for split in ("train", "valid"):
        corpus = PreparedCorpus(out, split)
        for i in range(corpus.num_sentences):
            corpus.sentence(i)
        for d in range(corpus.num_docs):
            corpus.doc_tokens(d)


@pytest.mark.parametrize("case", list(DAMAGE))
def test_damaged_output_is_named_by_verify_and_the_reader(tmp_path, clean, case):
    damage, verify_names, reader_says = DAMAGE[case]
    out = tmp_path / "out"
    shutil.copytree(clean, out)
    damage(out)
    problems = verify_dir(out)
    assert problems and any(verify_names in p for p in problems), problems
    if reader_says is None:
        _read_everything(out)  # sizes and headers are right: only the re-hash sees it
    else:
        with pytest.raises(DataPrepError, match=reader_says):
            _read_everything(out)
    if case == "truncated .bin":  # and the CLI: exit 1, every problem listed, no traceback
        r = cli("verify", str(out))
        assert r.returncode == 1 and "verification FAILED" in r.stderr and "Traceback" not in r.stderr
        assert all(p in r.stderr for p in problems)


# ------------------------------------------------------------------------------------------------------ kill -9

KILL_AFTER = """
import os, signal, sys
{patch}
from data_prep.__main__ import main
main({argv!r})
"""
PATCHES = {  # kill points: (module, attribute, the call after which the process SIGKILLs itself)
    "tokenize: inside a unit": ("data_prep.shard_format", "PartWriter.add", 5),
    "tokenize: between two units": ("data_prep.workers", "process_unit", 3),
    "finalize: after the first shard": ("data_prep.pipeline", "_write_shard", 1),
    "finalize: inside a concatenated shard": ("data_prep.shard_format", "PartWriter.write_tokens", 1),
}


def _patch(module: str, attribute: str, calls: int) -> str:
    owner, _, name = attribute.rpartition(".")
    target = f"M.{owner}" if owner else "M"
    return f"""
import {module} as M
_orig = {target}.{name}
_calls = [0]
def _hook(*a, **k):
    result = _orig(*a, **k)
    _calls[0] += 1
    if _calls[0] == {calls}:
        os.kill(os.getpid(), signal.SIGKILL)
    return result
{target}.{name} = _hook
"""


def _killed(argv: list[str], patch: str) -> None:
    code = KILL_AFTER.format(patch=patch, argv=argv)
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.returncode


def _kill_before_manifest_rename() -> str:
    return """
import common.io as IO
_orig = IO.os.replace
def _replace(src, dst):
    if str(dst).endswith("manifest.json"):
        os.kill(os.getpid(), signal.SIGKILL)
    return _orig(src, dst)
IO.os.replace = _replace
"""


@pytest.mark.parametrize("point", [*PATCHES, "finalize: manifest written, not renamed"])
def test_kill_9_then_rerun_gives_the_bytes_of_a_clean_run(tmp_path, books, vocab, clean, unfinalized, point):
    out = tmp_path / "out"
    tokenize = ["tokenize", *books, "--output", str(out), "--tokenizer", str(vocab), "--workers", "1", *FLAGS]
    patch = _patch(*PATCHES[point]) if point in PATCHES else _kill_before_manifest_rename()
    if point.startswith("tokenize"):
        _killed(tokenize, patch)
        units = out / ".work" / "units"
        finished = [d for d in units.iterdir() if not d.name.startswith(".")]
        assert len(finished) < len(json.loads((out / ".work" / "plan.json").read_text())["plan"]["units"])
        if "inside" in point:
            assert list(units.glob(".*.tmp*"))  # the half-written unit, in its temporary directory
        assert not (out / "manifest.json").exists()
        rerun = cli(*tokenize)
    else:
        shutil.copytree(unfinalized, out)
        _killed(["finalize", str(out)], patch)
        leftovers = [*out.glob(".manifest.json.tmp*"), *out.glob("train/.shard_*.tmp*")]
        assert leftovers or point == "finalize: after the first shard"
        assert not (out / "manifest.json").exists()
        assert list((out / "train").glob("shard_*")) or "inside" in point  # half-finalized: some shards written
        rerun = cli("finalize", str(out))
    assert rerun.returncode == 0, rerun.stderr
    assert output_bytes(out) == output_bytes(clean)
    assert not [*out.glob(".manifest.json.tmp*"), *out.glob("*/.shard_*.tmp*"), *out.glob(".work/units/.*")]
    assert verify_dir(out) == []


# ---------------------------------------------------------------------------------------------------- disk full


def _fill(mount: Path, leave: int) -> Path:
    """A ballast file that leaves about `leave` bytes free on `mount`."""
    st = os.statvfs(mount)
    ballast = mount / "ballast"
    with open(ballast, "wb") as f:
        f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
    return ballast


def _used(path: Path) -> int:
    """Bytes `path` holds on a tmpfs (whole 4 KiB pages)."""
    return sum(-(-p.stat().st_size // 4096) * 4096 for p in path.rglob("*") if p.is_file())


def test_disk_full_is_a_clear_error_and_the_output_resumes(tmp_path, books, vocab, clean, unfinalized):
    """ENOSPC while installing the tokenizer, while writing units, while finalizing: one line naming the file and
    saying the output is incomplete and resumable; no manifest.json; after space is freed the same command finishes
    with the bytes of a clean run."""
    with small_tmpfs(tmp_path / "disk", "6m") as disk:
        out = disk / "out"
        tokenize = ["tokenize", *books, "--output", str(out), "--tokenizer", str(vocab), "--workers", "1", *FLAGS]
        # 1. the tokenizer (~1 MB) does not fit
        ballast = _fill(disk, 300 << 10)
        r = cli(*tokenize)
        assert_one_line_error(r, f"{out}/tokenizer/", "disk full", f"{out} is incomplete (no manifest.json)")
        assert "resumable" in r.stderr and not (out / "tokenizer").exists() and not list(out.glob(".tokenizer.tmp*"))
        # 2. the tokenizer fits, half of the units do not
        ballast.unlink()
        ballast = _fill(disk, _used(clean / "tokenizer") + _used(unfinalized / ".work" / "units") // 2)
        with pytest.raises(DataPrepError, match=rf"{out}/\.work/units/\w+/\w+\.(bin|idx|json): disk full") as err:
            tokenize_corpus(books, out, tokenizer=vocab, **SETTINGS)
        assert "is incomplete (no manifest.json) and resumable" in str(err.value)
        assert not (out / "manifest.json").exists()
        ballast.unlink()
        r = cli(*tokenize)
        assert r.returncode == 0, r.stderr
        task = json.loads((out / ".work" / "tasks" / "task_00000_of_00001.json").read_text())
        assert 0 < len(task["units_done_now"]) < len(task["units"])  # the units finished before ENOSPC were kept
        assert output_bytes(out) == output_bytes(clean)
        # 3. finalize runs out of space while concatenating shards
        out2 = disk / "out2"
        shutil.copytree(unfinalized, out2)
        ballast = _fill(disk, 16 << 10)
        with pytest.raises(DataPrepError, match=rf"{out2}/(train|valid)/shard_\d+\.(bin|idx): disk full"):
            finalize_dir(out2)
        assert not (out2 / "manifest.json").exists() and not list(out2.glob("*/.shard_*.tmp*"))
        ballast.unlink()
        finalize_dir(out2)
        assert output_bytes(out2) == output_bytes(clean) and verify_dir(out2) == []


# ----------------------------------------------------------------------------------------------- a wrong vocab


def test_a_three_word_vocab_is_refused_after_the_first_units(tmp_path):
    """The issue's case: exit 0 and 95 % [UNK] before. Now: a loud warning about the special tokens, then a refusal
    after the first ~100k tokens (not at the end of the corpus), no manifest, and an explicit override continues."""
    medium = ["11-0.txt", "1155-0.txt", "120-0.txt", "16-0.txt", "1952-0.txt"]
    require_data(*(GUTENBERG / b for b in medium))
    three = tmp_path / "vocab.txt"
    three.write_text("the\nof\nand\n")
    out = tmp_path / "out"
    args = ["tokenize", *(str(GUTENBERG / b) for b in medium), "--output", str(out), "--tokenizer", str(three)]
    args += ["--unit-size", "32K", "--workers", "1", "--no-progress"]
    r = cli(*args)
    assert f"{three}: WARNING: the vocab has no [PAD] [UNK] [CLS] [SEP] [MASK]" in r.stderr
    assert_one_line_error(r, "% of the first", "are [UNK] with the tokenizer", "--max-unk-fraction 1")
    plan = json.loads((out / ".work" / "plan.json").read_text())["plan"]
    done = [d for d in (out / ".work" / "units").iterdir() if not d.name.startswith(".")]
    assert 0 < len(done) < len(plan["units"]) // 2 and not (out / "manifest.json").exists()
    r = cli(*args, "--max-unk-fraction", "1")
    assert r.returncode == 0, r.stderr
    totals = json.loads((out / "manifest.json").read_text())["totals"]
    assert totals["unk_tokens"] / totals["tokens"] > 0.8
    assert f"% [UNK] ({totals['unk_tokens']:,} of {totals['tokens']:,} tokens)" in r.stdout
