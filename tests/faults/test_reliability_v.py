"""Issue 47 ("Reliability V"), each case as a new user meets it through the real commands (and the Python API), with
the cases of the same classes the audit did not name (marked "not named"):

- class 1, no command deletes what it did not write (`common.outputs`): an `--output` that is a folder, a model
  directory, an input or inside one is refused in one line saying what it is, and `--overwrite` replaces only the
  command's own output, never a folder;
- class 2, a model is scored and tuned only on its own task (`finetune.task_check`, `EarlyExitSetting.task`);
- class 3, inputs that are not text are judged at every entry point (no letter or digit: `no-words`; a binary or
  Latin-1 corpus file counted and, when mostly not text, refused);
- class 4, an unsealed export of an always-sealed format is refused; an unsealed model directory loads with one line;
- class 5, a rule that can never exit early is refused like one that always does;
- class 6, streams and disks: a blank stdin line is an empty input; numpy's errno-less full disk names the file.

Models: MiniLM cut to 2 layers with an exit on each (`tiny_models.saved_classifier`).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from faults import small_tmpfs
from requirements import GLUE, GUTENBERG, REPO, require_data
from tiny_models import saved_classifier, small_glue, tiny_config

from common.integrity import CHECKSUMS, SEALED_FIELD, hash_files, list_files, seal, verify_directory, write_checksums
from common.io import atomic_path
from elasticbert import EarlyExitSetting, ElasticBertForPreTraining, minilm_dir
from finetune.__main__ import main

ROWS = {"SST-2": 13, "MRPC": 9, "CoLA": 9}
SYMBOLS = "!@#$%^&*()_+{}|:<>?"


@pytest.fixture(scope="module")
def glue(tmp_path_factory) -> Path:
    require_data(GLUE / "SST-2")
    return small_glue(GLUE, tmp_path_factory.mktemp("glue"), ROWS)


@pytest.fixture(scope="module")
def sst2(tmp_path_factory) -> Path:
    return saved_classifier(tmp_path_factory.mktemp("sst2") / "best", "SST-2")


@pytest.fixture(scope="module")
def mrpc(tmp_path_factory) -> Path:
    return saved_classifier(tmp_path_factory.mktemp("mrpc") / "best", "MRPC")


@pytest.fixture(scope="module")
def mrpc_sweep(tmp_path_factory, glue, mrpc) -> Path:
    """An early-exit result of the MRPC model (entropy, two thresholds)."""
    out = tmp_path_factory.mktemp("mrpc_ee")
    argv = ["early-exit", "--model", str(mrpc), "--task", "MRPC", "--data-dir", str(glue), "--output", str(out)]
    assert main([*argv, "--strategy", "entropy", "--sweep", "0.3,0.5"]) == 0
    return out / "early_exit_MRPC_dev_bs32.json"


def run(capsys, argv: list[str]) -> tuple[int, str, str]:
    """`python -m finetune ARGV` in-process: (exit code, stdout, stderr); never a traceback."""
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, err


def one_error(err: str, prog: str = "finetune") -> str:
    lines = [line for line in err.splitlines() if line.startswith(f"{prog}: error: ")]
    assert len(lines) == 1, err
    return lines[0]


def records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def texts(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "in.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def copy_model(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def edit_config(model: Path, reseal: bool = True, **fields: object) -> None:
    """Change config.json fields (None removes one) and seal the directory again (a consistent, sealed model)."""
    config = json.loads((model / "config.json").read_text())
    for key, value in fields.items():
        config.pop(key, None) if value is None else config.__setitem__(key, value)
    (model / "config.json").write_text(json.dumps(config))
    if reseal:
        seal(model)


# ------------------------------------------------------------------------- class 1: nothing deleted, nothing mixed


def test_predict_never_deletes_a_folder_or_the_model(tmp_path, capsys, sst2):
    """Class 1 (named): `predict --output DIR --overwrite` deleted DIR and what it held; with the arguments slipped
    (`--model DIR --output DIR --overwrite`) the model itself. Both refused in one line saying what the path is."""
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "mine.txt").write_text("keep")
    model = copy_model(sst2, tmp_path / "best")
    before = tree(model)
    inputs = texts(tmp_path, "a fine film")
    base = ["predict", "--input", str(inputs), "--no-progress", "--overwrite"]
    code, _, err = run(capsys, [*base, "--model", str(model), "--output", str(folder)])
    line = one_error(err)
    assert code == 2 and f"--output {folder} is a folder; predict writes one file" in line and "never replaces" in line
    assert (folder / "mine.txt").read_text() == "keep"
    code, _, err = run(capsys, [*base, "--model", str(model), "--output", str(model)])
    assert code == 2 and f"--output {model} is the input --model {model} (a model directory [" in one_error(err)
    assert tree(model) == before and verify_directory(model) == []


def test_overwrite_replaces_only_the_commands_own_output(tmp_path, capsys, sst2, mrpc_sweep):
    """Class 1 (named: `--overwrite` replaces a file this command wrote, recognised by its format; not named:
    `elue-score --output` replaced any file silently, a zero-byte file)."""
    inputs = texts(tmp_path, "a fine film")
    base = ["predict", "--model", str(sst2), "--input", str(inputs), "--no-progress"]
    notes = tmp_path / "notes.jsonl"
    notes.write_text('{"my": "notes"}\n')
    code, _, err = run(capsys, [*base, "--output", str(notes), "--overwrite"])
    assert code == 2 and "is not a JSONL file of predictions that predict wrote" in one_error(err)
    assert notes.read_text() == '{"my": "notes"}\n'
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert "exists (an empty file); pass --overwrite" in one_error(run(capsys, [*base, "--output", str(empty)])[2])
    assert run(capsys, [*base, "--output", str(empty), "--overwrite"])[0] == 0  # nothing to lose
    assert "label" in records(empty.read_text())[0]
    assert run(capsys, [*base, "--output", str(empty), "--overwrite"])[0] == 0  # its own predictions: replaced

    score = ["elue-score", "--baseline", str(mrpc_sweep), "--points", str(mrpc_sweep), "--output"]
    mine = tmp_path / "mine.json"
    mine.write_text('{"mine": 1}\n')
    for extra in ([], ["--overwrite"]):
        code, _, err = run(capsys, [*score, str(mine), *extra])
        assert code == 2 and "is not an ELUE score report (JSON) that elue-score wrote" in one_error(err)
    assert mine.read_text() == '{"mine": 1}\n'
    report = tmp_path / "report.json"
    assert run(capsys, [*score, str(report)])[0] == 0
    assert "pass --overwrite to replace it" in one_error(run(capsys, [*score, str(report)])[2])
    assert run(capsys, [*score, str(report), "--overwrite"])[0] == 0
    code, _, err = run(capsys, [*score, str(mrpc_sweep), "--overwrite"])  # the input itself
    assert code == 2 and "is the input --baseline" in one_error(err)


def test_an_output_in_a_model_directory_or_inside_an_input_is_refused(tmp_path, capsys, glue, sst2, mrpc):
    """Class 1 (not named: evaluate writing into a model directory, the model's own folder, a symbolic link to it,
    early-exit and `export --format onnx` inside the model, an export over another model with --overwrite)."""
    model = copy_model(sst2, tmp_path / "best")
    other = copy_model(mrpc, tmp_path / "other")
    before, other_before = tree(model), tree(other)
    link = tmp_path / "link"
    link.symlink_to(model, target_is_directory=True)
    inputs = texts(tmp_path, "a fine film")
    data = ["--data-dir", str(glue)]
    cases = [
        (["evaluate", "--model", str(model), *data, "--output", str(other)], "is a model directory [config.json"),
        (["evaluate", "--model", str(model), *data, "--output", str(model)], "is the input --model"),
        (["evaluate", "--model", str(model), *data, "--output", str(model / "eval")], "is inside the input --model"),
        (["evaluate", "--model", str(link), *data, "--output", str(model / "eval")], "is inside the input --model"),
        (["predict", "--model", str(model), "--input", str(inputs), "--output", str(link / "p.jsonl")], "inside"),
        (["predict", "--model", str(model), "--input", str(inputs), "--output", str(link), "--overwrite"], "is the"),
        (["early-exit", "--model", str(model), "--task", "SST-2", *data, "--output", str(model / "ee")], "inside"),
        (["export", "--model", str(model), "--output", str(model / "onnx"), "--format", "onnx"], "inside the input"),
        (["export", "--model", str(model), "--output", str(other), "--overwrite"], "that is not a model in the"),
    ]
    for argv, message in cases:
        code, _, err = run(capsys, argv)
        assert code == 2 and message in one_error(err), (argv, err)
    assert tree(model) == before and tree(other) == other_before


def test_pretrain_export_never_replaces_the_checkpoints(tmp_path, capsys):
    """Class 1 (not named: `pretrain export --output` equal to the checkpoint folder, or the run holding it, with
    --overwrite: both were deleted and replaced by the export)."""
    from pretrain.__main__ import main as pretrain_main

    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    tag = checkpoints / "global_step1"
    (tag / "export" / "tokenizer").mkdir(parents=True)
    config = tiny_config(num_hidden_layers=2)
    torch.save({"module": ElasticBertForPreTraining(config).state_dict()}, tag / "mp_rank_00_model_states.pt")
    config.to_json_file(tag / "export" / "config.json")
    (tag / "export" / "tokenizer" / "vocab.txt").write_text("\n".join(f"w{i}" for i in range(100)) + "\n")
    write_checksums(tag, hash_files(tag, list_files(tag)))
    (checkpoints / "latest").write_text(tag.name)
    before = tree(run_dir)
    for output, message in [(checkpoints, "is the input --checkpoint"), (run_dir, "holds the input --checkpoint")]:
        capsys.readouterr()
        argv = ["export", "--checkpoint", str(checkpoints), "--output", str(output), "--overwrite"]
        assert pretrain_main(argv) == 2
        assert message in one_error(capsys.readouterr().err, "pretrain")
    assert tree(run_dir) == before
    assert pretrain_main(["export", "--checkpoint", str(checkpoints), "--output", str(tmp_path / "hf")]) == 0
    assert pretrain_main(["export", "--checkpoint", str(checkpoints), "--output", str(tmp_path / "hf")]) == 2
    assert (
        pretrain_main(["export", "--checkpoint", str(checkpoints), "--output", str(tmp_path / "hf"), "--overwrite"])
        == 0
    )


def test_finetune_train_into_its_own_model_is_refused(tmp_path, capsys, glue, sst2):
    """Class 1 (not named: `finetune train --output` equal to --model; a run's files, best/ among them, would be
    written into the model's folder and replaced by the next run with --overwrite)."""
    model = copy_model(sst2, tmp_path / "best")
    before = tree(model)
    argv = ["train", "--model", str(model), "--task", "SST-2", "--data-dir", str(glue), "--output", str(model)]
    code, _, err = run(capsys, [*argv, "--train-steps", "1"])
    assert code == 2 and f"--output {model} is the input --model" in one_error(err)
    assert tree(model) == before


def test_a_file_never_replaces_a_folder_below_every_writer(tmp_path):
    """Class 1, the last guard (`common.io.atomic_path`): whatever a caller was told, a file is never renamed over a
    folder (it used to remove the folder first)."""
    folder = tmp_path / "out"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "kept.txt").write_text("kept")
    with pytest.raises(IsADirectoryError) as raised, atomic_path(folder) as tmp:
        tmp.write_text("a file")
    assert raised.value.filename == str(folder) and (folder / "sub" / "kept.txt").read_text() == "kept"
    assert not any(p.name.startswith(".out.tmp") for p in tmp_path.iterdir())


def test_data_prep_refuses_an_output_inside_an_input_folder(tmp_path):
    """Class 1 and 6 (named: a dedup output folder inside the input folder was accepted, and the next run failed on
    its checksums.json without saying why; not named: tokenize, an output that is the input folder)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("A plain paragraph about films and books, long enough to be a document.\n\n" * 20)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    vocab = str(minilm_dir() / "vocab.txt")
    for argv, needle in [
        (["dedup", str(corpus), "--output", str(corpus / "out"), "--no-eval-sets"], "is inside the input"),
        (["tokenize", str(corpus), "--output", str(corpus / "tok"), "--tokenizer", vocab], "is inside the input"),
        (["tokenize", str(corpus), "--output", str(corpus), "--tokenizer", vocab], "is the input"),
    ]:
        r = subprocess.run([sys.executable, "-m", "data_prep", *argv], capture_output=True, text=True, env=env)
        assert r.returncode == 2 and needle in one_error(r.stderr, "data_prep"), r.stderr
    assert sorted(p.name for p in corpus.iterdir()) == ["a.txt"]


# ------------------------------------------------------------------------------------ class 2: its own task only


def test_evaluate_and_early_exit_score_a_model_only_on_its_own_task(tmp_path, capsys, glue, sst2):
    """Class 2 (named): an SST-2 model scored on CoLA (single sentences, labels 0/1) wrote 0.00 per exit and a CoLA
    sweep, exit 0. Refused, naming both tasks, nothing written; not named: `plot-embeddings --task CoLA`."""
    for command, extra in [("evaluate", ["--no-test"]), ("early-exit", ["--strategy", "entropy", "--sweep", "0.3"])]:
        out = tmp_path / command
        argv = [command, "--model", str(sst2), "--task", "CoLA", "--data-dir", str(glue), "--output", str(out)]
        code, _, err = run(capsys, argv + extra)
        line = one_error(err)
        assert (
            code == 2 and "--task CoLA: " in line and "was fine-tuned on SST-2" in line and "pass --task SST-2" in line
        )
        assert not out.exists()
    argv = ["plot-embeddings", "--model", str(sst2), "--task", "CoLA", "--data-dir", str(glue)]
    code, _, err = run(capsys, [*argv, "--method", "pca", "--output", str(tmp_path / "e.png")])
    assert code == 2 and "was fine-tuned on SST-2" in one_error(err) and not (tmp_path / "e.png").exists()


def test_save_early_exit_refuses_another_tasks_operating_point(tmp_path, capsys, sst2, mrpc_sweep):
    """Class 2 (named): save-early-exit stored an MRPC sweep's point into an SST-2 model's config and resealed it,
    so the pipeline and every later user ran another model's threshold. Refused; the config is unchanged."""
    model = copy_model(sst2, tmp_path / "best")
    before = tree(model)
    point = f"{mrpc_sweep}:entropy=0.3"  # a threshold tuned on MRPC's rows and head
    code, _, err = run(capsys, ["save-early-exit", "--model", str(model), "--operating-point", point])
    line = one_error(err)
    assert code == 2 and "measured on MRPC" in line and "fine-tuned on SST-2" in line
    assert tree(model) == before


def test_the_pipeline_and_the_api_refuse_another_tasks_threshold(tmp_path, sst2, mrpc_sweep):
    """Class 2 (named: the pipeline; the Python API): a threshold records the task it was measured on, and a model
    fine-tuned on another refuses it wherever they meet: its config as it loads (every forward, `pipeline`),
    `EarlyExitClassifier(model, tokenizer, setting)`, `from_pretrained(operating_point=...)`."""
    from transformers import AutoModelForSequenceClassification

    from finetune.data import load_tokenizer
    from finetune.serve.early_exit import choose_operating_point
    from finetune.serve.predict import EarlyExitClassifier

    model_dir = copy_model(sst2, tmp_path / "best")
    edit_config(model_dir, early_exit={"strategy": "entropy", "threshold": 0.3, "task": "MRPC"})
    with pytest.raises(ValueError, match="measured on MRPC, but the model was fine-tuned on SST-2"):
        AutoModelForSequenceClassification.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(sst2).eval()
    tokenizer = load_tokenizer(sst2)
    with pytest.raises(ValueError, match="measured on MRPC: .* was fine-tuned on SST-2"):
        EarlyExitClassifier(model, tokenizer, EarlyExitSetting("entropy", 0.3, task="MRPC"))
    point = choose_operating_point(str(mrpc_sweep))
    assert point.setting.task == "MRPC"
    with pytest.raises(ValueError, match="measured on MRPC: .* was fine-tuned on SST-2"):
        EarlyExitClassifier.from_pretrained(sst2, operating_point=point)
    own = EarlyExitClassifier(model, tokenizer, EarlyExitSetting("entropy", 0.3, task="SST-2"))
    assert "label" in own.predict(["a fine film"])[0]


def test_a_model_that_records_no_task_keeps_working_with_a_note(tmp_path, capsys, glue, sst2):
    """Class 2, the other side (a released checkpoint names no task): scored on the task asked for when its head
    fits, with one note."""
    model = copy_model(sst2, tmp_path / "best")
    edit_config(model, finetuning_task=None)
    argv = [
        "evaluate",
        "--model",
        str(model),
        "--task",
        "SST-2",
        "--data-dir",
        str(glue),
        "--output",
        str(tmp_path / "e"),
    ]
    code, _, err = run(capsys, [*argv, "--no-test"])
    assert code == 0, err
    assert [line for line in err.splitlines() if "records no task" in line] != []


# --------------------------------------------------------------------------------- class 3: inputs that are not text


def test_a_line_of_symbols_is_flagged_at_every_entry_point(tmp_path, capsys, sst2, monkeypatch):
    """Class 3 (named: a line of symbols got a label, exit 0: symbols counted as word characters). No letter or digit
    of any script: `no-words`, in a file, on stdin and through the API (not named: the stream, a pair's text)."""
    from finetune.serve.predict import EarlyExitClassifier

    path = texts(tmp_path, "a fine film", SYMBOLS, "$$$ +++ === ^^^")
    code, out, err = run(capsys, ["predict", "--model", str(sst2), "--input", str(path), "--no-progress"])
    assert code == 0, err
    assert [r.get("flag") for r in records(out)] == [None, "no-words", "no-words"]
    assert "no letter or digit of any script" in records(out)[1]["reason"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(f"{SYMBOLS}\nfine\n".encode())))
    code, out, _ = run(capsys, ["predict", "--model", str(sst2), "--no-progress"])
    assert code == 0 and [r.get("flag") for r in records(out)] == ["no-words", None]
    got = EarlyExitClassifier.from_pretrained(sst2).predict([SYMBOLS, "a fine film", "①②③ and 42"])
    assert [r.get("flag") for r in got] == ["no-words", None, None]  # digits of any script are text


def test_dedup_and_tokenize_refuse_a_binary_file_and_count_latin1(tmp_path):
    """Class 3 (named: dedup turned an executable into corpus documents, exit 0; Latin-1 was replaced silently). A
    file mostly not text is refused with its counts (--max-nontext-fraction 1 reads it, counted); what is not text
    is counted per file (U+FFFD after decoding, control characters) in the report and the manifest, and said."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    shutil.copy("/bin/ls", inputs / "program.txt")  # an executable named like text
    (inputs / "french.txt").write_bytes(("Le café était très bon. Déjà vu, à la française.\n\n" * 50).encode("latin-1"))
    (inputs / "plain.txt").write_text("A plain English paragraph about films and books.\n\n" * 50)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    vocab = str(minilm_dir() / "vocab.txt")

    def data_prep(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "data_prep", *argv], capture_output=True, text=True, env=env)

    program, french, plain = (str(inputs / n) for n in ("program.txt", "french.txt", "plain.txt"))
    r = data_prep("dedup", plain, program, "--output", str(tmp_path / "d1"), "--no-eval-sets")
    line = one_error(r.stderr, "data_prep")
    assert r.returncode == 2 and f"{program}: not text: " in line and "control characters (" in line
    assert "--max-nontext-fraction 1" in line and not (tmp_path / "d1" / "text").exists()
    r = data_prep("tokenize", plain, program, "--output", str(tmp_path / "t1"), "--tokenizer", vocab)
    assert r.returncode == 2 and f"{program}: not text: " in one_error(r.stderr, "data_prep")
    r = data_prep(
        "dedup", plain, program, "--output", str(tmp_path / "d2"), "--no-eval-sets", "--max-nontext-fraction", "1"
    )
    assert r.returncode == 0, r.stderr
    assert f"note: {program}: " in r.stdout and "control characters" in r.stdout

    r = data_prep("dedup", plain, french, "--output", str(tmp_path / "d3"), "--no-eval-sets")
    assert r.returncode == 0, r.stderr
    assert f"note: {french}: 350 characters U+FFFD after decoding" in r.stdout
    report = json.loads((tmp_path / "d3" / "dedup_report.json").read_text())
    assert report["text_faults"] == {french: [350, 0, 0]}
    r = data_prep("tokenize", plain, french, "--output", str(tmp_path / "t3"), "--tokenizer", vocab, "--no-progress")
    assert r.returncode == 0 and f"note: {french}: 350 characters U+FFFD" in r.stdout, r.stderr
    assert json.loads((tmp_path / "t3" / "manifest.json").read_text())["text_faults"] == {french: [350, 0, 0]}


# ------------------------------------------------------------------------------------------ class 4: unsealed


def test_an_unsealed_onnx_export_is_refused(tmp_path, capsys, sst2):
    """Class 4 (named): an ONNX early-exit export whose checksums.json and seal marker were both removed was served,
    a bit-rotted layer and all. The exporter always seals, so such an export is refused (--no-verify-checksums loads
    it anyway)."""
    pytest.importorskip("onnxruntime")
    export = tmp_path / "onnx"
    assert run(capsys, ["export", "--model", str(sst2), "--output", str(export), "--format", "onnx"])[0] == 0
    (export / CHECKSUMS).unlink()
    edit_config(export, reseal=False, **{SEALED_FIELD: None})
    inputs = texts(tmp_path, "a fine film")
    argv = ["predict", "--model", str(export), "--runtime", "onnxruntime", "--input", str(inputs), "--no-progress"]
    code, out, err = run(capsys, argv)
    assert code == 2 and f"{export / CHECKSUMS} is missing: `finetune export --layout onnx` seals" in one_error(err)
    assert out == ""
    code, out, _ = run(capsys, [*argv, "--no-verify-checksums"])
    assert code == 0 and "label" in records(out)[0]


def test_an_unsealed_model_directory_loads_with_one_not_verified_line(tmp_path, capsys, sst2):
    """Class 4 (named): a model directory with no checksums.json and no seal marker loaded without a word."""
    model = copy_model(sst2, tmp_path / "best")
    (model / CHECKSUMS).unlink()
    edit_config(model, reseal=False, **{SEALED_FIELD: None})
    code, _, err = run(
        capsys, ["predict", "--model", str(model), "--input", str(texts(tmp_path, "fine")), "--no-progress"]
    )
    assert code == 0, err
    lines = [line for line in err.splitlines() if "not verified" in line]
    assert len(lines) == 1 and str(model) in lines[0] and f"no {CHECKSUMS}" in lines[0]


# ---------------------------------------------------------------------------------- class 5: rules that never exit


@pytest.mark.parametrize(
    "strategy,threshold,extra,why",
    [
        ("entropy", "0", [], "an entropy is never below 0"),
        ("maxprob", "1.0", [], "the top probability reaches 1 only where float rounding"),
        ("pcee", "0", ["--patience", "1"], "the normalised entropy is never below 0"),
        ("patience", "1", [], "with 2 exits it can count at most 0 before the last one"),  # 2 exits
        ("pcee", "0.3", ["--patience", "2"], "PCEE's patience 2 counts confident exits: with 2 exits"),
    ],
)
def test_a_rule_that_never_exits_early_is_refused(tmp_path, capsys, glue, sst2, strategy, threshold, extra, why):
    """Class 5 (named: entropy 0, patience >= the exits, max-prob 1.0, PCEE patience 100 were accepted silently in
    early-exit, predict and save-early-exit, answering as the full model). Refused with the rule and why, in each,
    and through the API; the model's config unchanged."""
    from finetune.serve.predict import EarlyExitClassifier

    rule = ["--strategy", strategy, "--threshold", threshold, *extra]
    model = copy_model(sst2, tmp_path / "best")
    before = tree(model)
    for argv in (
        ["predict", "--model", str(model), "--input", str(texts(tmp_path, "a fine film")), *rule],
        ["save-early-exit", "--model", str(model), *rule],
    ):
        code, out, err = run(capsys, argv)
        line = one_error(err)
        assert code == 2 and f"{strategy} threshold {float(threshold):g}: " in line and why in line, line
        assert "no sample leaves before the last exit" in line and out == ""
    assert tree(model) == before
    sweep = ["early-exit", "--model", str(model), "--task", "SST-2", "--data-dir", str(glue)]
    sweep += ["--output", str(tmp_path / "ee"), "--strategy", strategy, "--sweep", threshold, *extra]
    code, _, err = run(capsys, sweep)
    assert code == 2 and why in one_error(err) and not (tmp_path / "ee").exists()
    patience = int(extra[1]) if extra else None
    with pytest.raises(ValueError, match="no sample leaves before the last exit"):
        EarlyExitClassifier.from_pretrained(sst2, strategy, float(threshold), patience=patience)


# -------------------------------------------------------------------------------------- class 6: streams and disks


def test_a_blank_line_in_streamed_stdin_is_an_empty_input(capsys, sst2, monkeypatch):
    """Class 6 (named): one empty line ended a live stdin stream (exit 2) and the later lines were never answered.
    Every line gets its answer, the blank one its verdict (not named: JSONL on stdin, a blank line last)."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a fine film\n\nnot a good one\n\n")))
    code, out, err = run(capsys, ["predict", "--model", str(sst2), "--no-progress"])
    assert code == 0, err
    assert [r.get("flag") for r in records(out)] == [None, "empty", None, "empty"]
    assert "<stdin>:2: empty" in err
    jsonl = b'{"text": "a fine film"}\n\n{"text": "dull"}\n'
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(jsonl)))
    code, out, _ = run(capsys, ["predict", "--model", str(sst2), "--format", "jsonl", "--no-progress"])
    assert code == 0 and [r.get("flag") for r in records(out)] == [None, "empty", None]


def test_the_api_answers_an_empty_text_with_its_verdict(sst2):
    """Class 3/6 (not named: `EarlyExitClassifier.predict([""])` raised for the whole batch where "\\u200b" got a
    verdict): an empty text is an input with nothing in it, flagged like the blank stdin line."""
    from finetune.serve.predict import EarlyExitClassifier

    got = EarlyExitClassifier.from_pretrained(sst2).predict(["a fine film", "", ("", "")])
    assert [r.get("flag") for r in got] == [None, "empty", "empty"]


def test_dedup_on_a_full_disk_says_no_space_left_naming_the_file(tmp_path):
    """Class 6 (named): a full disk during dedup read `[Errno None] None` (numpy's short write carries no errno).
    Now the file and "no space left on device", exit 2, nothing that looks finished."""
    require_data(GUTENBERG / "120-0.txt", GUTENBERG / "1155-0.txt")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with small_tmpfs(tmp_path / "disk", "96k") as disk:
        argv = ["dedup", f"a={GUTENBERG / '120-0.txt'}", f"b={GUTENBERG / '1155-0.txt'}", "--output", str(disk / "o")]
        r = subprocess.run(
            [sys.executable, "-m", "data_prep", *argv, "--no-eval-sets", "--workers", "1"],
            capture_output=True,
            text=True,
            env=env,
        )
        line = one_error(r.stderr, "data_prep")
        assert r.returncode == 2 and "[Errno None]" not in line and "no space left on device" in line.lower()
        assert f"{disk / 'o'}/" in line.split(": ")[2]  # the file being written, under the output
        assert not (disk / "o" / CHECKSUMS).exists()
