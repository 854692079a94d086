"""Issue 59 ("Reliability VI"), part 4 and its POOR cases of pre-training and data_prep: the data a run trains on is
the data it names.

- a corpus folder rebuilt in place (the same path and vocabulary, other text) between a checkpoint and its resume: the
  resume is refused in one line naming the corpus and both fingerprints; `--resume-on-new-data` continues, the sample
  order starting over on the new data, and the events and checkpoints say so; a later resume on it goes on as usual;
- `pretrain export` of a verified checkpoint prints no "not verified" note;
- a full disk during a checkpoint save is said as a full disk, with the path, in one line (exit 4);
- `data_prep train-tokenizer` refuses UTF-16 input as `tokenize` does; a line of letter soup is flagged per file.

Real runs of the tiny config on two small real corpora (60 KB of two Gutenberg books, MiniLM's vocabulary).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from faults import small_tmpfs
from requirements import GUTENBERG, REPO, require_data

from data_prep.reader import PreparedCorpus
from elasticbert import minilm_dir
from pretrain.data import SampleOrder, batch_digests, index_key

TINY = REPO / "configs" / "tiny_cpu.yaml"
BOOKS = {"alice": "11-0.txt", "treasure": "120-0.txt"}
SEED, GLOBAL_BATCH, MAX_LENGTH, SHORT_SEQ_PROB = 1234, 16, 128, 0.1  # configs/tiny_cpu.yaml


def _book(tmp_path: Path, name: str) -> Path:
    source = GUTENBERG / BOOKS[name]
    require_data(source)
    path = tmp_path / f"{name}.txt"
    path.write_text(source.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    return path


def _tokenize(book: Path, out: Path) -> Path:
    """`book` prepared into `out` in place (the folder removed first, as a user rebuilding it would)."""
    from data_prep.pipeline import tokenize_corpus

    shutil.rmtree(out, ignore_errors=True)
    tokenize_corpus([str(book)], out, tokenizer=minilm_dir() / "vocab.txt", valid_fraction=0.0)
    return out


def _run(*argv: str, module: str = "pretrain") -> subprocess.CompletedProcess:
    """`python -m MODULE ARGV` in its own process (a trainer's process group is one per process); never a traceback."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", module, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


def _train(run: Path, corpus: Path, *extra: str, steps: int = 4) -> subprocess.CompletedProcess:
    sets = [f"data.corpora.0.path={corpus}", f"train.train_steps={steps}", "logging.tensorboard=false"]
    sets += [s for s in extra if "=" in s]
    flags = [s for s in extra if s.startswith("--")]
    return _run("train", "--config", str(TINY), "--output", str(run), *[a for s in sets for a in ("--set", s)], *flags)


def _error(done: subprocess.CompletedProcess, prog: str = "pretrain") -> str:
    lines = [line for line in done.stderr.splitlines() if line.startswith(f"{prog}: error: ")]
    assert len(lines) == 1 and lines[0] == done.stderr.strip().splitlines()[-1], done.stderr[-3000:]
    return lines[0]


def _state(run: Path, tag: str) -> dict:
    return json.loads((run / "checkpoints" / tag / "client_state.json").read_text())


def _events(run: Path, name: str) -> list[dict]:
    lines = (run / "events.jsonl").read_text().splitlines()
    return [e for line in lines if (e := json.loads(line))["event"] == name]


def _digests(run: Path) -> dict[int, str]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["samples_digest"] for line in lines if (r := json.loads(line))}


def _predicted_digests(corpus: Path, steps: range) -> list[str]:
    """The samples of global batches `steps` of the tiny config's order over `corpus` from its start."""
    key = index_key(PreparedCorpus(corpus), "train", MAX_LENGTH, SHORT_SEQ_PROB, SEED)
    size = len(np.load(corpus / "index_cache" / f"sample_index_train_{key}.npy"))
    return batch_digests(SampleOrder([size], [1.0], SEED), steps, GLOBAL_BATCH)


@pytest.mark.slow
def test_a_corpus_rebuilt_in_place_is_resumed_only_when_told_and_then_from_its_start(tmp_path):
    """Issue 59, named: a run checkpoints at step 2 of 4; its corpus folder is rebuilt with another book (the same
    vocabulary); the resume, which trained on it without a word, is refused naming the corpus and both fingerprints,
    and nothing is written. `--resume-on-new-data` goes on: steps 3-4 read the new corpus from the first batch of its
    own order, and the start event and every later checkpoint record the change; a preempted run on the new data
    resumes again without the flag. `pretrain export` of the result prints no "not verified" note."""
    corpus, run = _tokenize(_book(tmp_path, "alice"), tmp_path / "corpus"), tmp_path / "run"
    assert _train(run, corpus, "train.stop_after_steps=2").returncode == 0
    before = PreparedCorpus(corpus).manifest_hash

    _tokenize(_book(tmp_path, "treasure"), corpus)  # the same folder, the same vocabulary, another book
    metrics_before = (run / "metrics.jsonl").read_text()
    refused = _train(run, corpus)
    assert refused.returncode == 2, "the resume trained on the other corpus"
    line = _error(refused)
    assert f"data.corpora[0] ({corpus})" in line and "global_step2" in line and "--resume-on-new-data" in line
    first = _state(run, "global_step2")["corpora"]
    assert [c["corpus"] for c in first] == [0] and first[0]["manifest_sha256"] == before
    now = PreparedCorpus(corpus).manifest_hash
    assert first[0]["fingerprint"] in line and before[:16] in line and now[:16] in line
    assert (run / "checkpoints" / "latest").read_text() == "global_step2"
    assert (run / "metrics.jsonl").read_text() == metrics_before

    assert _train(run, corpus, "--resume-on-new-data", "train.stop_after_steps=3").returncode == 0
    start = _events(run, "start")[-1]
    assert start["data_start_samples"] == 2 * GLOBAL_BATCH and len(start["new_data"]) == 1
    change = start["new_data"][0]
    assert change["before"]["fingerprint"] == first[0]["fingerprint"] != change["now"]["fingerprint"]
    state = _state(run, "global_step3")
    assert state["data_start_samples"] == 2 * GLOBAL_BATCH and state["corpora"] == [change["now"]]
    assert [c["step"] for c in state["data_changes"]] == [2]

    resumed = _train(run, corpus)  # the same new data: no flag needed, the order goes on where it was
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _state(run, "global_step4")["data_start_samples"] == 2 * GLOBAL_BATCH
    digests = _digests(run)
    assert [digests[3], digests[4]] == _predicted_digests(corpus, range(0, 2))  # the new corpus from its start
    assert digests[3] != _predicted_digests(corpus, range(2, 3))[0]

    exported = _run("export", "--checkpoint", str(run / "checkpoints"), "--output", str(tmp_path / "export"))
    assert exported.returncode == 0 and "not verified" not in exported.stderr, exported.stderr


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_save_is_said_as_a_full_disk_with_the_path(tmp_path):
    """Issue 59, POOR case: DeepSpeed's files written with torch.save on a full disk raised "unexpected pos N vs M"
    (torch's zip writer names neither the errno nor the file). Now: one line naming the checkpoint's path and the full
    disk, exit 4, `latest` not moved, the partial checkpoint removed."""
    corpus = _tokenize(_book(tmp_path, "alice"), tmp_path / "corpus")
    with small_tmpfs(tmp_path / "disk", "6m") as disk:  # room for the run's logs, not for a checkpoint (~27 MB)
        run = disk / "run"
        done = _train(run, corpus, "optim.warmup_steps=0", "checkpoint.interval=1", steps=2)
        line = _error(done)
        assert done.returncode == 4, done.stderr[-3000:]
        tag = run / "checkpoints" / "global_step1"
        assert f"checkpoint {tag} could not be written" in line and "the disk is full" in line
        assert f"{tag}: No space left on device (ENOSPC" in line, line
        assert not tag.exists() and not (run / "checkpoints" / "latest").exists()
