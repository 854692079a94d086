"""Issue 59 ("Reliability VI"), parts 1-3 and four POOR cases of part 5, each as a user meets it through the real
commands:

- part 1, every output claimed before it is written (`common.claims`): two `predict` into one `--output`, two
  `evaluate` into one `--output` - the second is refused in one line naming the output and the holder (pid, host,
  command) instead of both exiting 0 with one result lost;
- part 2, paths compared by what they are: `finetune train --model /mnt/alias/run/best --output /data/run
  --overwrite`, where the alias is a bind mount of /data, is refused instead of deleting its own model;
- part 3, declared inputs are never written and a run directory never takes over a file it did not create: `pretrain
  train --ds-config RUN/ds_config.json --output RUN`, a user's own `events.jsonl` in RUN;
- part 5: Ctrl-C while a command starts exits 130 in one line; SIGTERM leaves no temporary file behind; a folder
  where a file is expected (and the reverse) is said as such; `python -m finetune.predict_cli` names its new home.

Each case failed on the commit before this work (exit 0 with data lost or replaced, a traceback, an odd message).
Models: MiniLM cut to 2 layers (`tiny_models.saved_classifier`); a 60 kB slice of one Gutenberg book for pretrain.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from faults import bind_mount
from requirements import GLUE, GUTENBERG, REPO, require_data
from tiny_models import saved_classifier, small_glue

from common.integrity import verify_directory
from finetune.__main__ import main

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def glue(tmp_path_factory) -> Path:
    require_data(GLUE / "SST-2")
    return small_glue(GLUE, tmp_path_factory.mktemp("glue"), {"SST-2": 9, "MRPC": 9})


@pytest.fixture(scope="module")
def sst2(tmp_path_factory) -> Path:
    return saved_classifier(tmp_path_factory.mktemp("sst2") / "best", "SST-2")


@pytest.fixture(scope="module")
def mrpc(tmp_path_factory) -> Path:
    return saved_classifier(tmp_path_factory.mktemp("mrpc") / "best", "MRPC")


def run(capsys, argv: list[str], entry=main) -> tuple[int, str]:
    """A command in-process: (exit code, stderr); never a traceback."""
    capsys.readouterr()
    code = entry(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err


def one_error(err: str, prog: str = "finetune") -> str:
    lines = [line for line in err.splitlines() if line.startswith(f"{prog}: error: ")]
    assert len(lines) == 1, err
    return lines[0]


def started(proc: subprocess.Popen, marker: str, timeout: float = 120) -> str:
    """Read the process's stderr until a line holds `marker` (the process is past that point); what it said."""
    said, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        said.append(line)
        if marker in line:
            return "".join(said)
        assert line, f"the process ended before {marker!r}:\n{''.join(said)}"
    raise AssertionError(f"no {marker!r} within {timeout} s:\n{''.join(said)}")


# ----------------------------------------------------------------------------- part 1: one writer per output


def test_two_predicts_into_one_output_the_second_is_refused_naming_the_first(tmp_path, capsys, sst2):
    """Named: `predict --input big.txt --output conc.jsonl` and a second later `predict --input small.txt --output
    conc.jsonl` both exited 0 and the second run's answers were gone. The first (a stream on stdin here: it holds its
    output as long as its input flows) claims the output; the second stops at once in one line naming the output and
    the first's pid, host and command; the first's answers are all there at its end."""
    out = tmp_path / "conc.jsonl"
    small = tmp_path / "small.txt"
    small.write_text("a dull film\n")
    argv = ["predict", "--model", str(sst2), "--no-progress", "--output", str(out)]
    first = subprocess.Popen(
        [sys.executable, "-m", "finetune", *argv, "--input", "-"],
        cwd=REPO,
        env=ENV,
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        started(first, "; rule:")  # past its output check, model loaded, reading its stream
        code, err = run(capsys, [*argv, "--input", str(small)])
        first.stdin.write("".join(f"a fine film, part {i}\n" for i in range(5)))
        first.stdin.close()
        rest = first.stderr.read()
        assert first.wait(timeout=120) == 0, rest
    finally:
        first.kill()
    line = one_error(err)
    assert code == 2 and f"--output {out} is being written by another process: pid {first.pid} on host" in line
    assert f"host {socket.gethostname()} (python -m finetune predict --model {sst2}" in line
    assert f"whose claim is {tmp_path / '.conc.jsonl.claim' / '0'}" in line and "choose another --output" in line
    answers = [json.loads(row) for row in out.read_text().splitlines()]
    assert len(answers) == 5 and all("label" in a for a in answers)
    assert sorted(os.listdir(tmp_path)) == ["conc.jsonl", "small.txt"]  # no claim, no temporary left


# the first evaluation stops just before it writes its result (its checks passed, its scores computed), until a line
# arrives on its stdin: where a second command used to slip in
PAUSED_EVALUATE = textwrap.dedent(
    """
    import sys
    import finetune.score.evaluation as evaluation
    write = evaluation.atomic_write_json

    def paused(path, obj, *args, **kwargs):
        if path.name == "dev_scores.json":
            print("about to write", file=sys.stderr, flush=True)
            sys.stdin.readline()
        return write(path, obj, *args, **kwargs)

    evaluation.atomic_write_json = paused
    from finetune.__main__ import main
    sys.exit(main(sys.argv[1:]))
    """
)


def test_two_evaluations_into_one_output_never_lose_one(tmp_path, capsys, glue, sst2, mrpc):
    """Named: `evaluate` of an SST-2 and of an MRPC model into one `--output`, at the same time: both exited 0 and one
    evaluation was lost (each had found no earlier result before either wrote). The second is refused while the
    first runs, naming it; the first's evaluation is complete."""
    out = tmp_path / "eval"
    common = ["--data-dir", str(glue), "--no-test", "--output", str(out)]
    first = subprocess.Popen(
        [sys.executable, "-c", PAUSED_EVALUATE, "evaluate", "--model", str(sst2), *common],
        cwd=REPO,
        env=ENV,
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        started(first, "about to write")
        code, err = run(capsys, ["evaluate", "--model", str(mrpc), *common])
        first.stdin.write("go\n")
        first.stdin.close()
        rest = first.stderr.read()
        assert first.wait(timeout=120) == 0, rest
    finally:
        first.kill()
    line = one_error(err)
    assert code == 2 and f"--output {out} is being written by another process: pid {first.pid}" in line
    assert f"(finetune evaluate --model {sst2}" in line
    scores = json.loads((out / "dev_scores.json").read_text())
    assert list(scores["tasks"]) == ["SST-2"] and scores["model"] == str(sst2)
    code, err = run(capsys, ["evaluate", "--model", str(mrpc), *common])  # afterwards: the earlier-result rule
    assert code == 2 and "evaluation" in one_error(err)


# ----------------------------------------------------------------------------- part 2: paths by identity


def test_finetune_train_never_deletes_its_model_through_a_bind_mount(tmp_path, capsys, glue, sst2):
    """Named: `finetune train --model /mnt/alias/run/best --output /data/run --overwrite`, where /mnt/alias is a bind
    mount of /data: exit 0, the input model deleted and replaced. Refused before anything loads, as the same
    command by one path is; the model is untouched."""
    data = tmp_path / "data"
    run_dir = data / "run"
    saved_classifier(run_dir / "best", "SST-2")
    (run_dir / "run_config.json").write_text("{}")  # a finished fine-tuning run: best/ and its config
    (run_dir / "dev_scores.json").write_text("{}")
    with bind_mount(data, tmp_path / "mnt" / "alias") as alias:
        model = alias / "run" / "best"
        argv = ["train", "--model", str(model), "--task", "SST-2", "--data-dir", str(glue), "--output", str(run_dir)]
        argv += ["--max-train-examples", "4", "--train-steps", "1", "--batch-size", "2", "--overwrite"]
        code, err = run(capsys, argv)
        assert code == 2 and f"--output {run_dir} holds the input --model {model}" in one_error(err)
        assert "model" not in err.split("error:")[0]  # nothing was loaded before the refusal
        assert verify_directory(run_dir / "best") == []


# ----------------------------------------------------------------------------- part 3: inputs never written


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A 60 kB slice of Alice in Wonderland, tokenised with MiniLM's vocabulary."""
    from data_prep.pipeline import tokenize_corpus
    from elasticbert import minilm_dir

    require_data(GUTENBERG / "11-0.txt")
    work = tmp_path_factory.mktemp("corpus")
    (work / "alice.txt").write_text((GUTENBERG / "11-0.txt").read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    tokenize_corpus([str(work / "alice.txt")], work / "prepared", tokenizer=minilm_dir() / "vocab.txt")
    return work / "prepared"


def pretrain_argv(corpus: Path, run_dir: Path, *extra: str) -> list[str]:
    sets = [f"data.corpora.0.path={corpus}", "train.train_steps=4", "logging.tensorboard=false"]
    argv = ["train", "--config", str(REPO / "configs" / "tiny_cpu.yaml"), "--output", str(run_dir), *extra]
    return argv + [a for s in sets for a in ("--set", s)]


def test_a_pretraining_run_never_writes_a_users_file_in_its_directory(tmp_path, capsys, corpus):
    """Named: `pretrain train --ds-config RUN/ds_config.json --output RUN` overwrote the user's JSON (every "auto"
    replaced by a number); a user's own `events.jsonl` in RUN was appended to. The DeepSpeed JSON is one of the
    command's inputs, which a run directory may not hold; a file of a run's name that no run wrote is refused."""
    from pretrain.__main__ import main as pretrain

    ds_json = (REPO / "ds_configs" / "cpu_fp32.json").read_text()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "ds_config.json").write_text(ds_json)
    code, err = run(capsys, pretrain_argv(corpus, run_dir, "--ds-config", str(run_dir / "ds_config.json")), pretrain)
    line = one_error(err, "pretrain")
    assert code == 2 and f"--output {run_dir} holds the input --ds-config {run_dir / 'ds_config.json'}" in line
    assert (run_dir / "ds_config.json").read_text() == ds_json and sorted(os.listdir(run_dir)) == ["ds_config.json"]

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "events.jsonl").write_text('{"my": "notes"}\n')
    code, err = run(capsys, pretrain_argv(corpus, mine), pretrain)
    line = one_error(err, "pretrain")
    assert code == 2 and f"--output {mine} holds events.jsonl, which no run of pretrain wrote there" in line
    assert (mine / "events.jsonl").read_text() == '{"my": "notes"}\n' and os.listdir(mine) == ["events.jsonl"]


# ----------------------------------------------------------------------------- part 5: POOR cases


def _interrupt_while_starting(argv: list[str], library: str) -> subprocess.CompletedProcess:
    """Start `python ARGV`, and send SIGINT once `library` is mapped into it (it is importing its libraries)."""
    proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, env=ENV, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if library in Path(f"/proc/{proc.pid}/maps").read_text():
                break
        time.sleep(0.002)
    proc.send_signal(signal.SIGINT)
    err = proc.stderr.read()
    return subprocess.CompletedProcess(argv, proc.wait(timeout=60), "", err)


def test_ctrl_c_while_a_command_starts_exits_130_in_one_line(tmp_path, sst2, corpus):
    """Part 5: Ctrl-C while a command imports torch (finetune: before its body runs; pretrain: in its start-up
    phases) or numpy and the tokenizers (data_prep) printed a KeyboardInterrupt traceback from the middle of an
    import; now the line every interrupted command prints, and 130."""
    from elasticbert import minilm_dir

    config = ["--config", str(REPO / "configs" / "tiny_cpu.yaml"), "--set", f"data.corpora.0.path={corpus}"]
    text = corpus.parent / "alice.txt"
    cases = [
        (["-m", "finetune", "predict", "--model", str(sst2), "--input", "-"], "libtorch", "finetune"),
        (["-m", "pretrain", "train", *config, "--output", str(tmp_path / "run")], "libtorch", "pretrain"),
        (
            ["-m", "data_prep", "tokenize", str(text), "--tokenizer", str(minilm_dir() / "vocab.txt"), "--output"]
            + [str(tmp_path / "corpus")],
            "_multiarray_umath",
            "data_prep",
        ),
    ]
    for argv, library, prog in cases:
        result = _interrupt_while_starting(argv, library)
        assert result.returncode == 130 and "Traceback" not in result.stderr, (argv, result.stderr)
        assert result.stderr.strip().splitlines()[-1] == f"{prog}: interrupted", result.stderr
    assert sorted(os.listdir(tmp_path)) == []  # nothing written, no claim left


def test_sigterm_leaves_no_temporary_and_no_claim(tmp_path, sst2):
    """Part 5: `predict --output` stopped by SIGTERM (`timeout`, `kill`, a job's end) left `.out.jsonl.tmpPID` (empty
    before the first answer) and its claim. Now it stops as on Ctrl-C: one line, exit 143, nothing left."""
    out = tmp_path / "sub" / "out.jsonl"
    argv = ["-m", "finetune", "predict", "--model", str(sst2), "--input", "-", "--output", str(out), "--no-progress"]
    proc = subprocess.Popen(
        [sys.executable, *argv], cwd=REPO, env=ENV, stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        started(proc, "; rule:")
        assert [p.name for p in (tmp_path / "sub").iterdir()] and not out.exists()
        proc.send_signal(signal.SIGTERM)
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == 143 and "Traceback" not in err, err
        assert err.strip().splitlines()[-1] == f"predict: stopped by SIGTERM before any input was read; {out} was not written"
    finally:
        proc.kill()
    assert not (tmp_path / "sub").exists()  # made for this output: nothing of it is left


def test_a_folder_for_a_file_and_a_file_for_a_folder_are_said_as_such(tmp_path, capsys, sst2):
    """Part 5: a folder where a file is expected said "no such file", "cannot tell its format from the suffix", "unknown
    recipe", "cannot read it (Is a directory)", and a file where a folder is expected "does not exist" or "not found".
    Each is now one line that says which it is."""
    from data_prep.__main__ import main as data_prep
    from pretrain.__main__ import main as pretrain

    folder, file = tmp_path / "folder", tmp_path / "file.txt"
    folder.mkdir()
    file.write_text("a fine film\n")
    predict = ["predict", "--model", str(sst2), "--input", str(file)]
    train = ["train", "--model", str(sst2), "--task", "SST-2", "--output", str(tmp_path / "run")]
    cases = [
        (main, ["predict", "--model", str(sst2), "--input", str(folder)], f"--input {folder}: is a folder, not a file"),
        (main, [*predict, "--operating-point", str(folder)], f"{folder}: is a folder, not a file"),
        (main, ["train", "--config", str(folder), "--output", str(tmp_path / "r")], f"{folder}: is a folder, not a"),
        (main, [*train, "--data-dir", str(folder), "--ds-config", str(folder)], f"{folder} is a folder, not a file"),
        (main, [*train, "--data-dir", str(file)], f"data directory {file} is a file, not a folder"),
        (main, ["elue-score", "--baseline", str(folder), "--points", str(folder)], f"{folder}: is a folder, not a"),
        (main, ["evaluate", "--model", str(file), "--output", str(tmp_path / "e")], f"{file}: is a file, not a folder"),
        (pretrain, ["train", "--config", str(folder), "--output", str(tmp_path / "p")], f"{folder}: is a folder, not"),
        (data_prep, ["verify", str(file)], f"{file}: is a file, not a folder"),
    ]
    for entry, argv, said in cases:
        code, err = run(capsys, argv, entry)
        prog = {main: "finetune", pretrain: "pretrain", data_prep: "data_prep"}[entry]
        assert code == 2 and said in one_error(err, prog), (argv, err)


def test_a_moved_module_run_as_a_program_names_its_new_home():
    """Part 5: `python -m finetune.predict_cli` (moved to finetune/serve/cli.py) ended in an AttributeError traceback
    from runpy; now one line with the new module and how the commands run, exit 2."""
    result = subprocess.run(
        [sys.executable, "-m", "finetune.predict_cli", "--help"], cwd=REPO, env=ENV, capture_output=True, text=True
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        "python -m finetune.predict_cli: finetune.predict_cli moved to finetune.serve.cli in this version; commands "
        "run as `python -m finetune COMMAND` (`python -m finetune --help` lists them)"
    )
