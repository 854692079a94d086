"""Issue 38 ("Reliability IV"), classes 3-6, as a new user meets them through the real CLI (and the Python API):

- class 3, inputs judged one by one: an input the model cannot read (nothing visible, punctuation only, mostly
  characters its vocabulary does not know) is not classified; its record says why (`flag`, `reason`), the summary
  names it (FILE:LINE), and a run with no readable input exits 2;
- class 4, another task's shape: a task whose labels (or input kind) the model's head does not have is refused by
  evaluate, early-exit, submission and predict alike (`finetune.task_check`);
- class 5, OS errors: a full disk or a read-only output is one line naming the file being written and its errno,
  whatever the writer (plain writes, torch.save, safetensors, matplotlib), and a failed command leaves nothing it
  created behind;
- class 6, degenerate settings: a threshold at which a rule sends every sample out at the same exit whatever its
  input is refused where settings are checked, and dropped from a sweep grid with one line.

Each test's docstring names its class. Models: MiniLM cut to 2 layers with an exit on each (seconds to save).
"""

from __future__ import annotations

import io
import json
import math
import shutil
import sys
from pathlib import Path

import pytest
from faults import small_tmpfs
from requirements import GLUE, require_data
from tiny_models import saved_classifier, small_glue

from finetune.__main__ import main

TASK_ROWS = {"SST-2": 13, "MRPC": 9, "RTE": 9, "STS-B": 9, "CoLA": 9}  # lines (header included) of each small copy


@pytest.fixture(scope="module")
def glue(tmp_path_factory) -> Path:
    require_data(GLUE / "SST-2")
    return small_glue(GLUE, tmp_path_factory.mktemp("glue"), TASK_ROWS)


def _model(directory: Path, task: str, layers: int = 2) -> Path:
    return saved_classifier(directory, task, layers)


@pytest.fixture(scope="module")
def sst2(tmp_path_factory) -> Path:
    return _model(tmp_path_factory.mktemp("sst2") / "best", "SST-2")


@pytest.fixture(scope="module")
def sst2_3(tmp_path_factory) -> Path:
    """Three exits: the fewest on which PABEE can exit early (k = 1: at most one agreement before the last exit)."""
    return _model(tmp_path_factory.mktemp("sst2_3") / "best", "SST-2", layers=3)


@pytest.fixture(scope="module")
def mrpc(tmp_path_factory) -> Path:
    return _model(tmp_path_factory.mktemp("mrpc") / "best", "MRPC")


@pytest.fixture(scope="module")
def mnli(tmp_path_factory) -> Path:
    return _model(tmp_path_factory.mktemp("mnli") / "best", "MNLI")


def run(capsys, argv: list[str]) -> tuple[int, str, str]:
    """`python -m finetune ARGV` in-process: (exit code, stdout, stderr); never a traceback."""
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, err


def one_error(err: str) -> str:
    """The one `finetune: error:` line of a failed command."""
    lines = [line for line in err.splitlines() if line.startswith("finetune: error: ")]
    assert len(lines) == 1, err
    return lines[0]


def records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def fill(folder: Path) -> None:
    """Fill the filesystem of `folder` to the last byte (a full disk)."""
    with open(folder / "filler", "wb", buffering=0) as handle:  # unbuffered: nothing left to fail at close
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass


# ------------------------------------------------------------------------------ class 3: each input has a verdict


def test_one_unreadable_line_in_a_normal_file_is_flagged_by_name(tmp_path, capsys, sst2):
    """Class 3 (named: one meaningless line inside a normal file; not named: punctuation only, invisible characters
    only, another script). The readable inputs are classified, each unreadable one carries its flag instead of a
    label, the stderr note names FILE:LINE of each, exit 0."""
    texts = tmp_path / "reviews.txt"
    lines = ["a gripping , funny film", "这部电影很好看", "!!! ??? ...", "\u200b\u200b", "Привет мир", "dull"]
    texts.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, out, err = run(capsys, ["predict", "--model", str(sst2), "--input", str(texts), "--no-progress"])
    assert code == 0, err
    got = records(out)
    assert len(got) == len(lines)
    assert [r.get("flag") for r in got] == [None, "unknown-text", "no-words", "empty", "unknown-text", None]
    for record in got:
        assert ("label" in record) == ("flag" not in record)  # a label only where the model could read the input
    assert "6 of its 7 characters are unreadable" in got[1]["reason"]
    note = next(line for line in err.splitlines() if line.startswith("predict: note:"))
    assert "4 of 6 inputs were not classified (empty 1, no-words 1, unknown-text 2)" in note
    assert f"{texts}:2: unknown-text" in note and f"{texts}:3: no-words" in note and f"{texts}:4: empty" in note
    assert "predict: 2 inputs in" in err  # the summary counts the classified ones


def test_a_run_with_no_readable_input_exits_2(tmp_path, capsys, sst2, monkeypatch):
    """Class 3 (named: stdin of emoji, a short file of CJK text): exit 2 with one line naming the inputs; stdin's
    flagged records were already written, a --output file is not left behind."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("😀😀😀\n🎉🎉\n".encode())))
    code, out, err = run(capsys, ["predict", "--model", str(sst2), "--no-progress"])
    assert code == 2
    assert [r["flag"] for r in records(out)] == ["no-words", "no-words"]  # emoji: no letter or digit (issue 47)
    line = one_error(err)
    assert "no input could be classified: 2 of 2 inputs were not classified (no-words 2)" in line
    assert "<stdin>:1: no-words (no letter or digit of any script" in line

    cjk = tmp_path / "cjk.txt"
    cjk.write_text("这部电影很好看\n我不喜欢\n", encoding="utf-8")
    out_file = tmp_path / "out" / "p.jsonl"
    argv = ["predict", "--model", str(sst2), "--input", str(cjk), "--output", str(out_file), "--no-progress"]
    code, _, err = run(capsys, argv)
    assert code == 2 and f"{cjk}:1: unknown-text" in one_error(err)
    assert not (tmp_path / "out").exists()  # neither the file nor the folder made for it


def test_pairs_and_jsonl_are_judged_text_by_text(tmp_path, capsys, mrpc):
    """Class 3 (not named: a TSV pair whose second column is emoji; a JSONL text of invisible characters only). A
    JSONL text that is empty outright is still refused as a malformed file (FILE:LINE, exit 2)."""
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("sentence1\tsentence2\nHe left early .\tHe went home soon .\nHe left .\t😀😀😀\n")
    code, out, err = run(capsys, ["predict", "--model", str(mrpc), "--input", str(pairs), "--no-progress"])
    assert code == 0, err
    first, second = records(out)
    assert "label" in first and second["flag"] == "no-words" and "label" not in second
    assert second["reason"].startswith("the second text: no letter or digit of any script")
    jsonl = tmp_path / "in.jsonl"
    rows = [{"id": 7, "text_a": "a", "text_b": "\u2063"}, {"id": 8, "text_a": "He left .", "text_b": "He went ."}]
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    code, out, err = run(capsys, ["predict", "--model", str(mrpc), "--input", str(jsonl), "--no-progress"])
    assert code == 0, err
    flagged, fine = records(out)
    assert flagged["id"] == 7 and flagged["flag"] == "empty" and flagged["reason"].startswith("the second text")
    assert fine["id"] == 8 and "label" in fine
    jsonl.write_text(json.dumps({"text_a": "a", "text_b": ""}) + "\n", encoding="utf-8")
    code, _, err = run(capsys, ["predict", "--model", str(mrpc), "--input", str(jsonl), "--no-progress"])
    assert code == 2 and f"{jsonl}:1: field 'text_b' is an empty text" in one_error(err)


def test_the_python_api_carries_the_same_verdicts(sst2):
    """Class 3 at the other entry point: `EarlyExitClassifier.predict` returns the verdict records too (no label);
    `min_readable_share=0` classifies text the vocabulary reads in part; out-of-range values are refused."""
    from common.errors import ConfigError
    from finetune.serve.predict import EarlyExitClassifier

    classifier = EarlyExitClassifier.from_pretrained(sst2)
    got = classifier.predict(["a fine film", "😀😀", "...", "a good one", "Привет мир"])
    assert [r.get("flag") for r in got] == [None, "no-words", "no-words", None, "unknown-text"]
    assert all("label" in r for r in (got[0], got[3])) and not any("label" in r for r in (got[1], got[2], got[4]))
    lenient = EarlyExitClassifier.from_pretrained(sst2, min_readable_share=0.0)
    assert [r.get("flag") for r in lenient.predict(["我不喜欢", "😀😀"])] == [None, "no-words"]
    assert classifier.predict(["我不喜欢"])[0]["flag"] == "unknown-text"  # 2 of 4 characters read: not more than half
    with pytest.raises(ConfigError, match="--min-readable-share must be within"):
        EarlyExitClassifier.from_pretrained(sst2, min_readable_share=1.0)


# --------------------------------------------------------------------------- class 4: another task's label set


@pytest.mark.parametrize(
    "command,task,message",
    [
        ("evaluate", "RTE", "--task RTE needs 2 labels (entailment, not_entailment), but"),  # named
        ("evaluate", "STS-B", "--task STS-B needs a regression value, but"),  # not named: regression
        ("evaluate", "MRPC", "--task MRPC: "),  # not named: same labels, other input kind (another task: issue 47)
        ("early-exit", "RTE", "--task RTE needs 2 labels (entailment, not_entailment), but"),  # named
        ("early-exit", "MNLI", "--task MNLI needs 3 labels (contradiction, entailment, neutral), but"),  # not named
    ],
)
def test_a_task_the_head_does_not_fit_is_refused(tmp_path, capsys, glue, sst2, command, task, message):
    """Class 4: evaluate and early-exit refuse a task whose labels or input kind the model's head does not have
    (they used to score and write results, exit 0), before anything is written."""
    out = tmp_path / "out"
    argv = [command, "--model", str(sst2), "--task", task, "--data-dir", str(glue), "--output", str(out)]
    code, _, err = run(capsys, argv + (["--strategy", "entropy", "--sweep", "0.3"] if command == "early-exit" else []))
    line = one_error(err)
    assert code == 2 and message in line and "fine-tuned on SST-2" in line and "pass --task SST-2" in line
    assert not out.exists()


def test_a_task_of_the_same_shape_is_refused_too(tmp_path, capsys, glue, sst2):
    """Class 4, the other side, reversed by issue 47: SST-2 -> CoLA (single texts, labels 0/1) scored 0.00 per exit
    with a note; a model is scored only on its own task now (tests/faults/test_reliability_v.py has the rest)."""
    argv = ["evaluate", "--model", str(sst2), "--task", "CoLA", "--data-dir", str(glue), "--output", str(tmp_path)]
    code, _, err = run(capsys, argv + ["--no-test"])
    assert code == 2 and "was fine-tuned on SST-2; a model is scored and tuned only on its own task" in one_error(err)


def test_a_submission_of_a_result_naming_another_task_is_refused(tmp_path, capsys, glue, sst2):
    """Class 4 (not named): `submission` re-runs a result on its task; one edited to name another task's labels is
    refused before any file is written."""
    ee = tmp_path / "ee"
    argv = ["early-exit", "--model", str(sst2), "--task", "SST-2", "--data-dir", str(glue), "--output", str(ee)]
    assert run(capsys, argv + ["--strategy", "entropy", "--sweep", "0.3"])[0] == 0
    result = json.loads((ee / "early_exit_SST-2_dev_bs32.json").read_text())
    result["task"] = "RTE"
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(result))
    code, _, err = run(capsys, ["submission", "--results", str(edited), "--output", str(tmp_path / "sub")])
    assert code == 2 and "the result's task RTE needs 2 labels (entailment, not_entailment)" in one_error(err)
    assert not (tmp_path / "sub").exists()


# ----------------------------------------------------------------- class 5: OS errors name the file being written


def test_a_full_disk_names_the_file_and_leaves_nothing_behind(tmp_path, capsys, glue, sst2):
    """Class 5 (named: early-exit, predict --output, evaluate on a full disk; evaluate's empty folder; not named:
    submission, elue-score --output). One line with the file and ENOSPC, exit 74, and no folder or file the
    command created is left (an empty output folder, a 0-byte plot, a lone samples/ TSV)."""
    texts = tmp_path / "in.txt"
    texts.write_text("a fine film\n" * 50, encoding="utf-8")
    ee = tmp_path / "ee"
    data = ["--data-dir", str(glue)]
    base = ["--model", str(sst2), "--task", "SST-2", *data]
    assert run(capsys, ["early-exit", *base, "--strategy", "entropy", "--sweep", "0.3", "--output", str(ee)])[0] == 0
    result = ee / "early_exit_SST-2_dev_bs32.json"
    with small_tmpfs(tmp_path / "small", "64k") as small:
        fill(small)
        commands = {
            "a/samples/entropy_": ["early-exit", *base, "--strategy", "entropy", "--output", str(small / "a")],
            "b/layer_curve.png": ["evaluate", *base, "--output", str(small / "b")],
            "c/p.jsonl": ["predict", "--model", str(sst2), "--input", str(texts), "--output", str(small / "c/p.jsonl")],
            "d/entropy_0.3/SST-2": ["submission", "--results", str(result), "--output", str(small / "d")],
            "e/report.json": ["elue-score", "--baseline", str(result), "--points", str(result)]
            + ["--output", str(small / "e" / "report.json")],
        }
        for name, argv in commands.items():
            code, _, err = run(capsys, argv + (["--no-progress"] if argv[0] == "predict" else []))
            line = one_error(err)
            assert code == 74, (argv, err)
            assert f"{small}/{name}" in line and "No space left on device (ENOSPC" in line, (argv, line)
            assert ".tmp" not in line, line  # the user's path, not our temporary's
            assert sorted(p.name for p in small.iterdir()) == ["filler"], (argv, list(small.rglob("*")))


def test_predictions_to_stdout_on_a_full_disk_name_stdout(tmp_path, sst2):
    """Class 5 (not named: `predict > FILE` on a full disk): under PYTHONUNBUFFERED=1 (containers, Slurm jobs)
    stdout is an unbuffered file whose write() writes what fits and the text layer dropped the rest: the run ended
    with exit 0 and a file cut at 64 KiB. Now every byte is written or the failure raised: one line naming
    `<stdout>`, exit 74."""
    import os
    import subprocess

    texts = tmp_path / "in.txt"
    texts.write_text("a fine film number one\n" * 2000, encoding="utf-8")
    with small_tmpfs(tmp_path / "small", "64k") as small:
        with open(small / "out.jsonl", "wb") as stdout:
            done = subprocess.run(
                [sys.executable, "-m", "finetune", "predict", "--model", str(sst2), "--input", str(texts)],
                stdout=stdout,
                stderr=subprocess.PIPE,
                text=True,
                timeout=600,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
    errors = [line for line in done.stderr.splitlines() if line.startswith("finetune: error:")]
    assert done.returncode == 74 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert errors == ["finetune: error: <stdout>: No space left on device (ENOSPC: the disk is full)"], done.stderr


def test_an_export_onto_a_full_disk_names_the_weights_file(tmp_path, capsys, sst2):
    """Class 5 (named: `finetune export` reported a full disk as torch's "unexpected pos N vs M", a corrupt
    position). Now: the file torch.save was writing and ENOSPC, exit 4, nothing kept."""
    with small_tmpfs(tmp_path / "small", "20m") as small:
        code, _, err = run(capsys, ["export", "--model", str(sst2), "--output", str(small / "x" / "fnlp")])
        line = one_error(err)
        assert code == 4 and "unexpected pos" not in line and "RuntimeError" not in line
        assert f"{small / 'x' / 'fnlp' / 'pytorch_model.bin'}: No space left on device (ENOSPC" in line
        assert list(small.iterdir()) == []


def test_read_only_outputs_name_the_path(tmp_path, capsys, glue, sst2):
    """Class 5 (not named: a read-only output for submission, elue-score and save-early-exit)."""
    ee = tmp_path / "ee"
    argv = ["early-exit", "--model", str(sst2), "--task", "SST-2", "--data-dir", str(glue), "--output", str(ee)]
    assert run(capsys, argv + ["--strategy", "entropy", "--sweep", "0.3"])[0] == 0
    result = str(ee / "early_exit_SST-2_dev_bs32.json")
    with small_tmpfs(tmp_path / "ro", read_only=True) as ro:
        for argv in (
            ["submission", "--results", result, "--output", str(ro / "sub")],
            ["elue-score", "--baseline", result, "--points", result, "--output", str(ro / "r.json")],
        ):
            code, _, err = run(capsys, argv)
            line = one_error(err)
            assert code == 74 and str(ro) in line and "EROFS" in line and ".tmp" not in line, (argv, line)


def test_an_output_below_a_file_names_the_file(tmp_path, capsys, glue, sst2):
    """Class 5 (not named: --output below a file). `mkdir -p` said "File exists" about the folder it was asked for
    (or named that folder); now one line names the file that stands where a folder is expected, ENOTDIR, exit 74,
    before the work (a sweep is not run to be thrown away), and the file is left as it was."""
    sweep = ["early-exit", "--model", str(sst2), "--task", "SST-2", "--data-dir", str(glue), "--strategy", "entropy"]
    sweep += ["--sweep", "0.3", "--output"]
    assert run(capsys, [*sweep, str(tmp_path / "ee")])[0] == 0
    result = str(tmp_path / "ee" / "early_exit_SST-2_dev_bs32.json")
    texts = tmp_path / "in.txt"
    texts.write_text("a fine film\n", encoding="utf-8")
    blocker = tmp_path / "a_file"
    blocker.write_text("mine")
    for argv in (
        ["predict", "--model", str(sst2), "--input", str(texts), "--output", str(blocker / "p.jsonl")],
        ["evaluate", "--model", str(sst2), "--data-dir", str(glue), "--output", str(blocker)],
        [*sweep, str(blocker / "ee")],
        ["elue-score", "--baseline", result, "--points", result, "--output", str(blocker / "r.json")],
        ["submission", "--results", result, "--output", str(blocker)],
    ):
        code, out, err = run(capsys, argv)
        line = one_error(err)
        if argv[-1] == str(blocker):  # the folder itself is the file: said before the work (common.outputs)
            assert code == 2 and f"--output {blocker} is a file; " in line and "writes a folder" in line, line
        else:
            assert code == 74 and f"{blocker}: Not a directory (ENOTDIR: a file stands where a folder" in line, line
        assert blocker.read_text() == "mine"
        assert "full model: score" not in out  # early-exit: refused before the sweep ran, not after


def test_save_early_exit_on_a_full_disk_keeps_the_model_loadable(tmp_path, capsys, sst2):
    """Class 5 (not named: save-early-exit onto a full disk). One line naming config.json, and the directory still
    loads and verifies (its config and checksums unchanged)."""
    from finetune.serve.predict import EarlyExitClassifier

    with small_tmpfs(tmp_path / "small", "200m") as small:
        model = small / "best"
        shutil.copytree(sst2, model)
        before = {p.name: p.read_bytes() for p in model.iterdir() if p.suffix == ".json"}
        fill(small)
        argv = ["save-early-exit", "--model", str(model), "--strategy", "entropy", "--threshold", "0.3"]
        code, _, err = run(capsys, argv)
        assert code == 74 and f"{model / 'config.json'}: No space left on device (ENOSPC" in one_error(err)
        assert {p.name: p.read_bytes() for p in model.iterdir() if p.suffix == ".json"} == before
        assert EarlyExitClassifier.from_pretrained(model).setting.strategy == "static"


def test_save_early_exit_restores_config_when_the_checksums_cannot_be_written(tmp_path, monkeypatch, sst2):
    """Class 5 (not named): config.json was replaced but checksums.json could not follow (the disk filled between
    the two): config.json is put back, so the directory still verifies, and the error is the OSError."""
    import errno

    import elasticbert.loading as loading
    from common.integrity import verify_directory

    model = tmp_path / "best"
    shutil.copytree(sst2, model)
    before = (model / "config.json").read_bytes()

    def disk_full(directory, names):
        raise OSError(errno.ENOSPC, "No space left on device", str(directory / "checksums.json"))

    monkeypatch.setattr(loading, "reseal", disk_full)
    with pytest.raises(OSError, match="No space left"):
        loading.save_early_exit(model, "entropy", 0.3)
    assert (model / "config.json").read_bytes() == before and verify_directory(model) == []


# ------------------------------------------------------------------------- class 6: settings that decide nothing


@pytest.mark.parametrize(
    "model,argv,message",
    [
        ("sst2", ["--strategy", "maxprob", "--threshold", "0.5"], "top probability over 2 labels is at least 1/2"),
        ("mnli", ["--strategy", "maxprob", "--threshold", "0.3333"], "top probability over 3 labels is at least 1/3"),
        ("sst2", ["--strategy", "entropy", "--threshold", "0.6931"], "an entropy over 2 labels is at most ln 2"),
        ("sst2", ["--strategy", "patience", "--threshold", "0"], "0 needs none, so every sample leaves at the first"),
        ("sst2", ["--strategy", "pcee", "--threshold", "1"], "every exit counts as confident"),
    ],
)
def test_predict_refuses_a_rule_that_decides_without_the_input(tmp_path, capsys, request, model, argv, message):
    """Class 6 (named: patience 0, entropy >= ln K; not named: max-prob of exactly 1/K, PCEE τ = 1)."""
    texts = tmp_path / "in.txt"
    texts.write_text("a fine film\n", encoding="utf-8")
    directory = request.getfixturevalue(model)
    code, _, err = run(capsys, ["predict", "--model", str(directory), "--input", str(texts), *argv])
    assert code == 2 and message in one_error(err)


def test_sweep_grids_drop_degenerate_points_in_one_line(tmp_path, capsys, glue, sst2, sst2_3):
    """Class 6 (named: PABEE patience 0 in a sweep; not named: a PCEE grid with τ = 1, an entropy grid past ln 2).
    The degenerate points are dropped with one line naming them; a grid of nothing else is refused, nothing
    written."""
    out = tmp_path / "ee"
    base = ["early-exit", "--model", str(sst2_3), "--task", "SST-2", "--data-dir", str(glue), "--output", str(out)]
    for strategy, grid, kept, dropped in [("patience", "0,1", [1.0], "0"), ("pcee", "0.3,1", [0.3], "1")]:
        code, stdout, err = run(capsys, base + ["--strategy", strategy, "--sweep", grid])
        assert code == 0, err
        notes = [line for line in stdout.splitlines() if "dropped" in line]
        assert len(notes) == 1 and notes[0].startswith(f"{strategy}: dropped τ={dropped} from the sweep: "), stdout
        points = json.loads((out / "early_exit_SST-2_dev_bs32.json").read_text())["strategies"][strategy]["points"]
        assert [p["threshold"] for p in points] == kept
        assert not (out / "samples" / f"{strategy}_{dropped}.tsv").exists()
    code, _, err = run(capsys, [*base[:-1], str(tmp_path / "none"), "--strategy", "entropy", "--sweep", "0.7,2"])
    assert code == 2 and "entropy threshold 0.7: an entropy over 2 labels is at most ln 2" in one_error(err)
    assert not (tmp_path / "none").exists()


def test_save_early_exit_and_operating_points_skip_degenerate_settings(tmp_path, capsys, glue, sst2, sst2_3):
    """Class 6 (not named): save-early-exit refuses an entropy threshold of ln 2 (the config unchanged); a result of
    an earlier version whose sweep holds a patience-0 point (the fastest, within the margin) never has it chosen by
    `fastest-within`, and `submission` skips it with one line."""
    from finetune.serve.early_exit import choose_operating_point

    model = tmp_path / "best"
    shutil.copytree(sst2, model)
    before = (model / "config.json").read_bytes()
    argv = ["save-early-exit", "--model", str(model), "--strategy", "entropy", "--threshold", str(math.log(2))]
    code, _, err = run(capsys, argv)
    assert code == 2 and "at most ln 2" in one_error(err) and (model / "config.json").read_bytes() == before

    ee = tmp_path / "ee"
    argv = ["early-exit", "--model", str(sst2_3), "--task", "SST-2", "--data-dir", str(glue), "--output", str(ee)]
    assert run(capsys, argv + ["--strategy", "patience", "--sweep", "1"])[0] == 0
    path = ee / "early_exit_SST-2_dev_bs32.json"
    result = json.loads(path.read_text())
    points = result["strategies"]["patience"]["points"]
    old = {**points[0], "threshold": 0.0, "score": result["full_model"]["score"], "mean_flops": 1.0}
    points.insert(0, old)  # what `--sweep 0,1` wrote before patience 0 was refused
    path.write_text(json.dumps(result))
    point = choose_operating_point(f"{path}:fastest-within=1.0")
    assert point.setting.strategy != "patience" or point.setting.threshold == 1.0
    assert (point.setting.strategy, point.setting.threshold) != ("patience", 0.0)
    code, _, err = run(capsys, ["submission", "--results", str(path), "--output", str(tmp_path / "sub")])
    assert code == 0, err
    assert "submission: skipped 1 point(s): patience threshold 0: " in err
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["patience_1"]
