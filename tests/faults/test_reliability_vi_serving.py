"""Issue 59 ("Reliability VI"), part 5: the serving cases an outside audit rated POOR, each as a new user meets it
through the real commands and the Python API (docs/reliability_vi_serving.md has the fault-table rows):

- the keyword every checksum refusal advises is accepted where it names it: `verify_checksums=False` by
  `EarlyExitClassifier.from_pretrained`, a pipeline's `model_kwargs`, `--no-verify-checksums` by `predict`;
- SIGTERM (or Ctrl-C) while `predict` answers: one line saying how many read lines were not answered, every answered
  line whole on stdout, an `--output` file not left behind;
- numbers that mean nothing (`--max-wait nan`, `stream(max_wait=-1)`, `export --max-length 0`, a batch size or
  `max_length` of 0 in the Python API) refused in one line, never taken for the default;
- `save-early-exit` notes an operating point swept on another model, as `predict` does.

The ONNX exports' damaged files are `tests/finetune_early_exit/test_serving_faults.py` (they reuse its exports).
Models: MiniLM cut to 2 layers with an exit on each (`tiny_models.saved_classifier`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from faults import flip_bytes
from requirements import REPO
from tiny_models import saved_classifier
from transformers import pipeline

from common.errors import ConfigError
from elasticbert.verification import CheckpointError, checksum_verification, set_checksum_verification
from finetune.__main__ import main
from finetune.serve import cli as serve_cli
from finetune.serve.early_exit import RESULT_FORMAT
from finetune.serve.inputs import TextInput
from finetune.serve.predict import EarlyExitClassifier


@pytest.fixture(scope="module")
def sst2(tmp_path_factory) -> Path:
    return saved_classifier(tmp_path_factory.mktemp("sst2") / "best", "SST-2")


@pytest.fixture(scope="module")
def damaged(sst2, tmp_path_factory) -> Path:
    """A copy of the model with flipped bytes in its weights: refused by its checksums."""
    model = tmp_path_factory.mktemp("damaged") / "best"
    shutil.copytree(sst2, model)
    flip_bytes(model / "model.safetensors")
    return model


@pytest.fixture(autouse=True)
def verification_restored():
    """In-process `--no-verify-checksums` sets the process's verification: each test starts and ends with it on."""
    set_checksum_verification(True)
    yield
    set_checksum_verification(True)


def run(capsys, argv: list[str]) -> tuple[int, str, str]:
    """`python -m finetune ARGV` in-process: (exit code, stdout, stderr); never a traceback."""
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, err


def one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("finetune: error: ")]
    assert len(lines) == 1, err
    return lines[0]


def texts(tmp_path: Path, count: int, name: str = "in.txt") -> Path:
    path = tmp_path / name
    path.write_text("".join(f"review {i}: a fine and moving film .\n" for i in range(count)), encoding="utf-8")
    return path


# ------------------------------------------------------------------ the keyword the checksum refusals advise


def test_every_spelling_a_checksum_refusal_advises_loads_the_model(capsys, tmp_path, sst2, damaged):
    """Named: the refusal says `verify_checksums=False`, and `EarlyExitClassifier.from_pretrained` had no such
    keyword (TypeError). Not named: a pipeline needs `model_kwargs={"verify_checksums": False}` (the refusal now says
    so); the keyword's effect stays inside the call; `predict --no-verify-checksums` (the commands' spelling)."""
    with pytest.raises(CheckpointError) as refused:
        EarlyExitClassifier.from_pretrained(damaged)
    advice = str(refused.value)
    assert "verify_checksums=False (from_pretrained, load_pretrained, EarlyExitClassifier.from_pretrained;" in advice
    assert "pipeline(..., model_kwargs={'verify_checksums': False})" in advice and "--no-verify-checksums" in advice

    classifier = EarlyExitClassifier.from_pretrained(damaged, verify_checksums=False)
    assert classifier.predict(["a fine film"])[0]["label"] in ("0", "1")
    assert checksum_verification()  # the process's setting is untouched
    with pytest.raises(CheckpointError):
        EarlyExitClassifier.from_pretrained(damaged)  # still refused without the keyword
    set_checksum_verification(False)
    with pytest.raises(CheckpointError):  # an explicit True verifies whatever the process says
        EarlyExitClassifier.from_pretrained(damaged, verify_checksums=True)
    set_checksum_verification(True)

    # (the package's classes are registered by its import: a pipeline with no remote code)
    answer = pipeline("text-classification", model=str(damaged), model_kwargs={"verify_checksums": False})("a film")
    assert answer[0]["label"] in ("0", "1", "LABEL_0", "LABEL_1")

    inputs = texts(tmp_path, 2)
    argv = ["predict", "--model", str(damaged), "--input", str(inputs), "--no-progress"]
    code, _, err = run(capsys, argv)
    assert code == 2 and "contents differ from the sha256" in one_error(err)
    code, out, _ = run(capsys, [*argv, "--no-verify-checksums"])
    assert code == 0 and len(out.splitlines()) == 2


# ------------------------------------------------------------------------------ a stop signal while answering


class UnhandledSignal(BaseException):
    """The test's own SIGTERM handler: a signal `predict` did not handle ends the test, not the test process."""


@pytest.fixture
def sigterm_caught():
    def handler(signum, frame):
        raise UnhandledSignal(signum)

    before = signal.signal(signal.SIGTERM, handler)
    yield handler
    signal.signal(signal.SIGTERM, before)


def _signal_after_first_write(monkeypatch, signum: int) -> None:
    """The first write of answers raises `signum` in this process while it writes (the worst moment: mid-line)."""
    writes = []

    def write_all(handle, data, name=None):
        if not writes:
            half = len(data) // 2
            handle.write(data[:half])
            os.kill(os.getpid(), signum)  # Python runs the handler at its next instruction: right here
            handle.write(data[half:])
            handle.flush()
        else:
            handle.write(data)
            handle.flush()
        writes.append(len(data))

    monkeypatch.setattr(serve_cli, "write_all", write_all)
    monkeypatch.setattr(serve_cli, "CHUNK", 4)  # a file's inputs submitted 4 at a time: 4 answers first


@pytest.mark.parametrize(("signum", "code", "name"), [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")])
def test_a_stop_signal_says_how_many_read_lines_were_not_answered(
    capsys, monkeypatch, tmp_path, sst2, sigterm_caught, signum, code, name
):
    """Named: SIGTERM while `predict` answered a file killed it with no word (and could cut a line on stdout). Now it
    stops after the line being written, exits 128+signal, and says how many read lines were not answered and where
    to resume; every answered line is whole. Not named: Ctrl-C the same (exit 130)."""
    _signal_after_first_write(monkeypatch, signum)
    inputs = texts(tmp_path, 10)
    argv = ["predict", "--model", str(sst2), "--input", str(inputs), "--batch-size", "4", "--no-progress"]
    got, out, err = run(capsys, argv)
    lines = out.splitlines(keepends=True)
    assert got == code and len(lines) == 4 and all(json.loads(line)["label"] for line in lines)
    stopped = [line for line in err.splitlines() if line.startswith("predict: stopped")]
    assert stopped == [
        f"predict: stopped by {name}: 6 of the 10 lines read were not answered (from {inputs}:5 on; the 4 answers "
        "before are on stdout, each a whole line)"
    ]
    assert signal.getsignal(signal.SIGTERM) is sigterm_caught  # the handler before is back


def test_a_stopped_predict_leaves_no_output_file(capsys, monkeypatch, tmp_path, sst2, sigterm_caught):
    """An `--output` file is written whole or not at all: a stopped run leaves nothing there, not even a temporary,
    and its line says the file was not written."""
    _signal_after_first_write(monkeypatch, signal.SIGTERM)
    inputs, folder = texts(tmp_path, 10), tmp_path / "out"
    folder.mkdir()
    argv = ["predict", "--model", str(sst2), "--input", str(inputs), "--batch-size", "4", "--no-progress"]
    got, _, err = run(capsys, [*argv, "--output", str(folder / "answers.jsonl")])
    assert got == 143 and list(folder.iterdir()) == []
    assert (
        f"predict: stopped by SIGTERM: 6 of the 10 lines read were not answered; {folder / 'answers.jsonl'} was not "
        "written (it is written whole or not at all): rerun the command"
    ) in err.splitlines()


def test_sigterm_while_waiting_on_stdin(sst2):
    """The real thing: `predict` streaming stdin, three lines answered, then SIGTERM from outside while it waits for
    the next line: exit 143 at once, one line, the three answers whole on stdout."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "finetune", "predict", "--model", str(sst2), "--no-progress"]
    process = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        answers = []
        for i in range(3):
            process.stdin.write(f"review {i}: a fine film .\n".encode())
            process.stdin.flush()
            answers.append(process.stdout.readline())
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 143
        rest, err = process.stdout.read(), process.stderr.read().decode()
    finally:
        process.kill()
    assert rest == b"" and all(json.loads(line)["label"] for line in answers)
    assert "Traceback" not in err and err.splitlines()[-1] == (
        "predict: stopped by SIGTERM: every line read (3) was answered (the 3 answers are on stdout, each a whole line)"
    )


# ---------------------------------------------------------------------------------- numbers that mean nothing


@pytest.fixture(scope="module")
def classifier(sst2) -> EarlyExitClassifier:
    return EarlyExitClassifier.from_pretrained(sst2)


def test_meaningless_numbers_are_refused_in_one_line(capsys, tmp_path, sst2, classifier):
    """Named: `--max-wait nan` served (a bound that never fires), `stream(max_wait=-1)` was taken, `export --max-length
    0` exported at the default length. Not named: `stream(max_wait=nan)`, `stream(batch_size=0)` and
    `predict(batch_size=0)` (the default instead), `from_pretrained(max_length=0)` (128 instead), `threads=0`."""
    inputs = texts(tmp_path, 1)
    argv = ["predict", "--model", str(sst2), "--input", str(inputs), "--no-progress"]
    for value in ("nan", "-1"):
        code, out, err = run(capsys, [*argv, "--max-wait", value])
        assert code == 2 and out == "" and f"--max-wait must be >= 0 (inf: no bound), got {float(value)}" in err
    code, out, _ = run(capsys, [*argv, "--max-wait", "inf"])  # no bound: what the option's absence means
    assert code == 0 and len(out.splitlines()) == 1

    refusals = {
        "max_wait must be >= 0 (inf: no bound), got -1": lambda: classifier.stream(max_wait=-1),
        "max_wait must be >= 0 (inf: no bound), got nan": lambda: classifier.stream(max_wait=math.nan),
        "batch_size must be >= 1, got 0": lambda: classifier.stream(batch_size=0),
        "batch_size must be >= 1 and a whole number, got 2.5": lambda: classifier.predict(["a film"], batch_size=2.5),
        "max_length must be >= 1, got 0": lambda: EarlyExitClassifier.from_pretrained(sst2, max_length=0),
        "threads must be >= 1, got 0": lambda: EarlyExitClassifier.from_pretrained(sst2, threads=0),
    }
    for message, call in refusals.items():
        with pytest.raises(ConfigError) as refused:
            call()
        assert str(refused.value) == message
    stream = classifier.stream(max_wait=math.inf)  # no bound, as None
    stream.submit([TextInput("a fine and moving film")])
    stream.flush()
    assert [record["label"] in ("0", "1") for _, record in stream.ready()] == [True]

    export = tmp_path / "export"
    code, _, err = run(
        capsys, ["export", "--model", str(sst2), "--output", str(export), "--layout", "onnx", "--max-length", "0"]
    )
    assert code == 2 and "--max-length 0: " in one_error(err) and "embeds 1..512 positions" in err
    assert not export.exists()


# ----------------------------------------------------------------- another model's operating point, noted


@pytest.fixture(scope="module")
def sweep_of_sst2(sst2, tmp_path_factory) -> Path:
    """An early-exit result of the `sst2` model, hand-made as `early-exit` writes one (the note is under test, not
    the sweep): two entropy points, the model as given and its resolved folder in the identity."""
    path = tmp_path_factory.mktemp("ee") / "early_exit_SST-2_dev_bs32.json"
    points = [{"threshold": t, "score": 50.0, "mean_flops": f} for t, f in ((0.3, 3e7), (0.5, 2e7))]
    result = {
        "format": RESULT_FORMAT,
        "task": "SST-2",
        "model": str(sst2),
        "identity": {"model_dir": str(sst2.resolve())},
        "max_length": 128,
        "full_model": {"layer": 2, "score": 50.0, "mean_flops": 4e7},
        "strategies": {"entropy": {"params": {"patience": 2, "delta": 0.1}, "points": points}},
    }
    path.write_text(json.dumps(result))
    return path


def test_save_early_exit_notes_another_models_operating_point(capsys, tmp_path, sst2, sweep_of_sst2):
    """Named: `predict` notes an operating point swept on another model, `save-early-exit` wrote it into the model's
    config without a word. Both now say it in the same words; the same model under another spelling (a symbolic
    link) is no other model."""
    other = tmp_path / "other" / "best"
    shutil.copytree(sst2, other)
    point = f"{sweep_of_sst2}:entropy=0.3"
    note = f"finetune: note: the operating point was measured on {sst2}, "
    code, _, err = run(capsys, ["save-early-exit", "--model", str(other), "--operating-point", point])
    assert code == 0 and f"{note}it is saved into {other}" in err.splitlines()
    inputs = texts(tmp_path, 1)
    argv = ["predict", "--input", str(inputs), "--no-progress", "--operating-point", point]
    code, _, err = run(capsys, [*argv, "--model", str(other)])
    assert code == 0 and f"{note}predictions use {other}" in err.splitlines()

    same = tmp_path / "same"
    same.symlink_to(sst2, target_is_directory=True)
    code, _, err = run(capsys, [*argv, "--model", str(same)])
    assert code == 0 and "was measured on" not in err
