"""Fault injection for finetune, as a user meets faults: corrupt, missing and malformed inputs to every command, a
finished or running run as --output, a kill -9 while best/ is written, out-of-range options, exits never trained.

What must hold: a bad input is `finetune: error: ...` naming the file (and line or key), exit 2, never a traceback
(`main` would raise); a finished run is never replaced without --overwrite, a running one never; after a kill there
is no best/ that looks complete, and rerunning the command starts over and finishes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from faults import flip_bytes, small_tmpfs, truncate
from requirements import GLUE, require_data

from elasticbert import CheckpointError, ElasticBertForSequenceClassification, load_pretrained, minilm_dir
from finetune.__main__ import main

ROWS = {"train": 17, "dev": 13, "test": 9}  # header + rows of a small SST-2 copy


@pytest.fixture(scope="module")
def glue(tmp_path_factory) -> Path:
    require_data(GLUE / "SST-2")
    root = tmp_path_factory.mktemp("glue")
    (root / "SST-2").mkdir()
    for split, n in ROWS.items():
        lines = (GLUE / "SST-2" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[:n]
        (root / "SST-2" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def train_argv(glue: Path, out: Path, *extra: str, model: Path | None = None) -> list[str]:
    """A run of seconds: one layer of MiniLM, one step, a few rows."""
    return [
        "train",
        "--model",
        str(model or minilm_dir()),
        "--task",
        "SST-2",
        "--data-dir",
        str(glue),
        "--output",
        str(out),
        "--layers",
        "1",
        "--train-steps",
        "1",
        "--batch-size",
        "4",
        "--max-length",
        "32",
        "--no-progress",
        *extra,
    ]


def error_of(capsys, argv: list[str]) -> str:
    """Run a command that must fail as a user error: exit 2 and a one-paragraph message (no traceback)."""
    capsys.readouterr()
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert "finetune: error: " in err and "Traceback" not in err, err
    return err[err.index("finetune: error: ") :]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, glue) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(train_argv(glue, out)) == 0
    return out


# ------------------------------------------------------------------------------------------------ the run directory


def test_a_finished_run_is_refused_unless_overwrite(tmp_path, capsys, glue, finished):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    before = (run / "best" / "model.safetensors").read_bytes()
    err = error_of(capsys, train_argv(glue, run, "--seed", "7"))
    assert f"--output {run}: holds a finished run" in err and "--overwrite" in err
    assert (run / "best" / "model.safetensors").read_bytes() == before  # untouched
    assert json.loads((run / "run_config.json").read_text())["config"]["train"]["seed"] == 42
    assert main(train_argv(glue, run, "--seed", "7", "--overwrite")) == 0
    assert "replacing the finished run" in capsys.readouterr().err
    assert json.loads((run / "run_config.json").read_text())["config"]["train"]["seed"] == 7
    assert len(list((run / "tensorboard").glob("events.*"))) == 1  # the old run's events went with it


def test_a_running_run_is_refused_and_a_killed_one_does_not_stay_locked(tmp_path, capsys, glue):
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from pathlib import Path; from common.dist import resolve_env; from common.run_dir import RunLock; "
            f"lock = RunLock.acquire(Path({str(run)!r}), resolve_env(export=False), who='`finetune train`'); "
            "print('held', flush=True); import time; time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        for extra in ([], ["--overwrite"]):  # --overwrite never replaces a running run
            err = error_of(capsys, train_argv(glue, run, *extra))
            assert f"--output {run} is being written by another process: pid {holder.pid} on host" in err
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert main(train_argv(glue, run)) == 0  # the kernel released the dead holder's lock
    assert (run / "best").is_dir()


KILL_WHILE_SAVING = textwrap.dedent(
    """
    import os, signal, sys
    from transformers import BertTokenizer

    def killed(self, *args, **kwargs):  # the model's weights are already in the temporary best/
        os.kill(os.getpid(), signal.SIGKILL)

    BertTokenizer.save_pretrained = killed
    from finetune.__main__ import main
    sys.exit(main(sys.argv[1:]))
    """
)


def test_kill_while_best_is_written_leaves_no_best_and_a_rerun_finishes(tmp_path, capsys, glue):
    run = tmp_path / "run"
    argv = train_argv(glue, run)
    killed = subprocess.run([sys.executable, "-c", KILL_WHILE_SAVING, *argv], cwd=tmp_path, capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    half = list(run.glob(".best.tmp*"))
    assert half and (half[0] / "model.safetensors").is_file()  # it was killed mid-write ...
    assert not (run / "best").exists() and not (run / "dev_scores.json").exists()  # ... and nothing looks complete
    err = error_of(
        capsys, ["evaluate", "--model", str(run / "best"), "--data-dir", str(glue), "--output", str(tmp_path / "eval")]
    )
    assert str(run / "best") in err
    assert main(argv) == 0  # an interrupted attempt is started over, with a note
    assert "interrupted before it wrote best/; starting over" in capsys.readouterr().err
    assert (run / "best" / "tokenizer.json").is_file() and not list(run.glob(".best.tmp*"))


def test_disk_full_while_best_is_written(tmp_path, capsys, glue):
    """A full disk at the end of training: exit 4 (write failed), the message names the run, no best/ or temporary
    is left, and the run is not mistaken for a finished one."""
    with small_tmpfs(tmp_path / "small", "8m") as small:  # run_config and events fit; a 50 MB model does not
        run = small / "run"
        capsys.readouterr()
        assert main(train_argv(glue, run)) == 4
        err = capsys.readouterr().err
        assert f"finetune: error: {run}: cannot write the run's results" in err and "Traceback" not in err
        assert not (run / "best").exists() and not list(run.glob(".best.tmp*"))
        assert not (run / "dev_scores.json").exists()


def test_output_that_is_a_file(tmp_path, capsys, glue):
    (tmp_path / "file").write_text("x")
    assert "is a file; finetune train writes a folder" in error_of(capsys, train_argv(glue, tmp_path / "file"))


# ---------------------------------------------------------------------------------------------------- bad options


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--lr", "0"], "--lr (optim.lr) must be > 0, got 0.0"),
        (["--epochs", "-1"], "--epochs (train.epochs) must be > 0, got -1.0"),
        (["--exit-lr=-1e-3"], "--exit-lr (optim.exit_lr) must be > 0"),
        (["--dropout", "1.5"], "--dropout (model.dropout) must be within [0, 1)"),
        (["--batch-size", "0"], "--batch-size (train.batch_size) must be >= 1, got 0"),
        (["--early-stopping-patience", "0"], "--early-stopping-patience (train.early_stopping_patience) must be >= 1"),
        (["--max-train-examples", "0"], "--max-train-examples (data.max_train_examples) must be >= 1"),
        (["--weight-decay", "-0.1"], "--weight-decay (optim.weight_decay) must be >= 0"),
        (["--lambda", "nan"], "--lambda (objective.lam) must be a number within [0, 1], got nan"),
        (["--max-length", "600"], "embeds at most 512 positions"),  # MiniLM: 512; it used to crash mid-training
        (["--recipe", "elasticbert-statc"], "did you mean 'elasticbert-static'"),
    ],
)
def test_train_options_out_of_range_are_refused_up_front(tmp_path, capsys, glue, extra, message):
    assert message in error_of(capsys, train_argv(glue, tmp_path / "run", *extra))
    assert not (tmp_path / "run").exists()  # refused before the run directory was made


def test_early_exit_options_out_of_range(tmp_path, capsys, glue, finished):
    base = [
        "early-exit",
        "--model",
        str(finished / "best"),
        "--task",
        "SST-2",
        "--data-dir",
        str(glue),
        "--output",
        str(tmp_path / "ee"),
    ]
    cases = [
        (["--strategy", "entropy", "--sweep", "-0.1"], "entropy threshold -0.1: must be an entropy in nats, >= 0"),
        (["--strategy", "maxprob", "--sweep", "0.5,1.5"], "maxprob threshold 1.5: must be a probability within"),
        (["--strategy", "patience", "--sweep", "1.5"], "patience threshold 1.5: must be a whole number"),
        (["--strategy", "pcee", "--patience", "-1"], "--patience (PCEE's consecutive confident exits) must be >= 1"),
        (["--strategy", "entropy", "--max-length", "0"], "--max-length must be >= 1"),
        (["--strategy", "entropy", "--max-length", "4096"], "embeds 1..512 positions"),
        (["--strategy", "entropy", "--batch-size", "0"], "--batch-size and --repeats must be >= 1"),
        (["--strategy", "entropy", "--sweep", "a,b"], "--sweep takes comma-separated numbers"),
        (["--strategy", "entropie"], "unknown strategy 'entropie'"),
    ]
    for extra, message in cases:
        assert message in error_of(capsys, base + extra), extra
    assert "--batch-size must be >= 1" in error_of(
        capsys, ["evaluate", "--model", str(finished / "best"), "--output", str(tmp_path / "e"), "--batch-size", "0"]
    )


# ------------------------------------------------------------------------------------------- exits never trained


def test_exits_that_were_never_trained_are_named(tmp_path, capsys, glue, finished):
    # a classifier built from MiniLM and saved without fine-tuning: random heads, no record of training
    fresh = tmp_path / "fresh"
    model, _ = load_pretrained(
        ElasticBertForSequenceClassification, minilm_dir(), num_hidden_layers=2, exit_layers=[1, 2]
    )
    model.save_pretrained(fresh)
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm_dir() / name, fresh / name)
    ee = ["--task", "SST-2", "--data-dir", str(glue), "--output", str(tmp_path / "ee"), "--strategy", "entropy"]
    err = error_of(capsys, ["early-exit", "--model", str(fresh), *ee])
    assert "exits [1, 2] were never trained" in err and "no trained_exits or finetuning_task" in err
    assert "never trained" in error_of(
        capsys, ["evaluate", "--model", str(fresh), "--task", "SST-2", "--output", str(tmp_path / "e")]
    )

    # a fine-tuned run whose checkpoint says only exit 2 was trained: evaluate scores both and says so
    partial = tmp_path / "partial"
    model, _ = load_pretrained(
        ElasticBertForSequenceClassification, minilm_dir(), num_hidden_layers=2, exit_layers=[1, 2]
    )
    model.config.trained_exits = [2]
    model.config.finetuning_task = "SST-2"
    model.save_pretrained(partial)
    shutil.copy(finished / "best" / "tokenizer.json", partial)
    shutil.copy(finished / "best" / "tokenizer_config.json", partial)
    out = tmp_path / "eval"
    capsys.readouterr()
    argv = [
        "evaluate",
        "--model",
        str(partial),
        "--data-dir",
        str(glue),
        "--output",
        str(out),
        "--no-test",
        "--max-length",
        "32",
    ]
    assert main(argv) == 0
    warning = capsys.readouterr().err
    assert "finetune: warning: " in warning and "exits [1] were never trained" in warning
    assert "records trained exits [2] only" in warning
    assert json.loads((out / "dev_scores.json").read_text())["untrained_exits"] == [1]
    assert "exits [1] were never trained" in error_of(capsys, ["early-exit", "--model", str(partial), *ee])


# ---------------------------------------------------------------------------------- corrupt and malformed inputs


def test_elue_score_validates_its_inputs(tmp_path, capsys):
    good = tmp_path / "points.json"
    good.write_text(json.dumps({"tasks": {"SST-2": [[1e9, 80.0]]}}))
    base = tmp_path / "base.json"
    base.write_text(
        json.dumps({"name": "ElasticBERT-base", "source": "my table", "tasks": {"SST-2": [[5e8, 70.0], [2e9, 85.0]]}})
    )

    def err(baseline, points=good):
        return error_of(capsys, ["elue-score", "--baseline", str(baseline), "--points", str(points)])

    assert f"{tmp_path / 'nope.json'}: no such file" in err(tmp_path / "nope.json")
    (tmp_path / "neg.json").write_text(json.dumps({"tasks": {"SST-2": [[-150, 80.0]]}}))
    assert "neg.json: tasks.SST-2[0]: FLOPs must be a finite number > 0, got -150" in err(base, tmp_path / "neg.json")
    (tmp_path / "big.json").write_text(json.dumps({"tasks": {"SST-2": [{"flops": 1e9, "score": 8400}]}}))
    big = err(base, tmp_path / "big.json")
    assert "big.json: tasks.SST-2[0]: score must be a percentage within [-100, 100]" in big and "got 8400" in big
    (tmp_path / "dup.csv").write_text("task,flops,score\nSST-2,1e9,80\nSST-2,1e9,82\n")
    assert "two scores (80 and 82) at FLOPs 1e+09" in err(tmp_path / "dup.csv")
    (tmp_path / "broken.json").write_text('{"tasks": {"SST-2": [[1e9, 80.0]\n')
    assert "broken.json:2:1: not valid JSON" in err(tmp_path / "broken.json")
    (tmp_path / "bad.csv").write_text("task,flops,score\nSST-2,1e9,80\nSST-2,lots,81\n")
    assert "bad.csv:3 flops: expected a number, got 'lots'" in err(tmp_path / "bad.csv")
    (tmp_path / "short.csv").write_text("task,flops,score\nSST-2,1e9\n")
    assert "short.csv:2: expected 3 columns" in err(tmp_path / "short.csv")
    (tmp_path / "header.csv").write_text("task,FLOPS,accuracy\nSST-2,1e9,80\n")
    assert "header.csv:1: CSV header lacks ['flops', 'score']" in err(tmp_path / "header.csv")
    (tmp_path / "row.json").write_text(json.dumps({"tasks": {"SST-2": [{"flops": 1e9}]}}))
    assert "row.json: tasks.SST-2[0]: point {'flops': 1000000000.0} lacks" in err(tmp_path / "row.json")
    (tmp_path / "ee.json").write_text(json.dumps({"format": "elasticbert-early-exit/1", "task": "SST-2"}))
    assert "ee.json: early-exit result lacks the key 'static'" in err(tmp_path / "ee.json")
    (tmp_path / "latin1.csv").write_bytes("task,flops,score\nSST-2,1e9,80\xe9\n".encode("latin-1"))
    assert "latin1.csv: not UTF-8 text" in err(tmp_path / "latin1.csv")

    # the good case names its baseline in every printed score and in the JSON
    capsys.readouterr()
    report = tmp_path / "report.json"
    assert main(["elue-score", "--baseline", str(base), "--points", str(good), "--output", str(report)]) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()  # 80 against 70 + 15 * (0.5e9 / 1.5e9) = 75 interpolated: +5
    assert lines[0] == "system points: ELUE score +5.00 vs baseline 'ElasticBERT-base' (out-of-range: clamp)"
    assert lines[1] == "  baseline: ElasticBERT-base [points file] - source: my table"
    assert lines[2].split() == [
        "SST-2",
        "+5.00",
        "vs",
        "baseline",
        "'ElasticBERT-base'",
        "(1",
        "points,",
        "0",
        "dropped)",
    ]
    assert json.loads(report.read_text())["points"]["baseline"]["source"] == "my table"


def test_corrupt_files_of_the_other_commands(tmp_path, capsys, glue, finished):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    # plot-angles on malformed diagnostics
    (run / "acl_diagnostics.json").write_text('{"records": [')
    assert "acl_diagnostics.json:1:14: not valid JSON" in error_of(capsys, ["plot-angles", str(run)])
    (run / "acl_diagnostics.json").write_text('{"threshold": 90}')
    assert "not an ACL diagnostics file" in error_of(capsys, ["plot-angles", str(run)])
    # submission on malformed / foreign results
    (tmp_path / "r.json").write_text("{oops")
    assert "r.json:1:2: not valid JSON" in error_of(
        capsys, ["submission", "--results", str(tmp_path / "r.json"), "--output", str(tmp_path / "s")]
    )
    assert "no such file" in error_of(
        capsys, ["submission", "--results", str(tmp_path / "missing.json"), "--output", str(tmp_path / "s")]
    )
    # a model whose config.json is not JSON, or whose weights are truncated / bit-flipped: the checksums of best/
    # refuse each first (test_flipped_tensor_bytes_...); past them (--no-verify-checksums) each file is named too
    unverified = "--no-verify-checksums"
    broken = tmp_path / "broken"
    shutil.copytree(run / "best", broken)
    (broken / "config.json").write_text("{not json")
    assert "config.json: 9 bytes but checksums.json records" in error_of(
        capsys, train_argv(glue, tmp_path / "o0", model=broken)
    )
    assert "config.json" in error_of(capsys, train_argv(glue, tmp_path / "o1", unverified, model=broken))
    shutil.copy(run / "best" / "config.json", broken / "config.json")
    truncate(broken / "model.safetensors", 0.5)
    assert "model.safetensors" in error_of(capsys, train_argv(glue, tmp_path / "o2", unverified, model=broken))
    # a tokenizer directory without tokenizer files; a broken tokenizer_config.json
    notok = tmp_path / "notok"
    shutil.copytree(run / "best", notok)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (notok / name).unlink(missing_ok=True)
    assert "no tokenizer files" in error_of(capsys, train_argv(glue, tmp_path / "o3", unverified, model=notok))
    shutil.copy(minilm_dir() / "vocab.txt", notok)
    (notok / "tokenizer_config.json").write_text("{")
    message = error_of(capsys, train_argv(glue, tmp_path / "o4", unverified, model=notok))
    assert "tokenizer_config.json:1:2: not valid JSON" in message
    # an early-exit LTE head that is not a safetensors file; an earlier result that is not JSON
    ee = [
        "early-exit",
        "--model",
        str(run / "best"),
        "--task",
        "SST-2",
        "--data-dir",
        str(glue),
        "--output",
        str(tmp_path / "ee"),
        "--max-length",
        "32",
    ]
    head = tmp_path / "head.safetensors"
    head.write_bytes(b"\x00" * 64)
    assert "head.safetensors: not a readable LTE head" in error_of(
        capsys, ee + ["--strategy", "lte", "--lte-head", str(head)]
    )
    (tmp_path / "ee").mkdir(exist_ok=True)
    (tmp_path / "ee" / "early_exit_SST-2_dev_bs32.json").write_text("[1,")
    assert "earlier result to merge with is not valid JSON" in error_of(
        capsys, ee + ["--strategy", "entropy", "--sweep", "0.3"]
    )
    # a DeepSpeed config that is missing or not JSON (checked before anything loads)
    assert "--ds-config" in error_of(capsys, train_argv(glue, tmp_path / "o6", "--ds-config", str(tmp_path / "x")))
    (tmp_path / "ds.json").write_text("{")
    assert "ds.json:1:2: not valid JSON" in error_of(
        capsys, train_argv(glue, tmp_path / "o7", "--ds-config", str(tmp_path / "ds.json"))
    )
    # a recipe file with a bad value
    (tmp_path / "r.yaml").write_text("optim:\n  warmup_fraction: lots\n")
    assert "r.yaml: optim.warmup_fraction: expected a number, got 'lots'" in error_of(
        capsys, train_argv(glue, tmp_path / "o5", "--recipe", str(tmp_path / "r.yaml"))
    )


def test_bit_rot_in_fine_tuned_weights_is_named(tmp_path, capsys, glue, finished):
    best = tmp_path / "best"
    shutil.copytree(finished / "best", best)
    flip_bytes(best / "model.safetensors", offset=0, count=8)  # the header length: unreadable
    err = error_of(capsys, ["evaluate", "--model", str(best), "--data-dir", str(glue), "--output", str(tmp_path / "e")])
    assert "model.safetensors" in err


def test_flipped_tensor_bytes_in_a_fine_tuned_model_are_refused_by_every_reader(tmp_path, capsys, glue, finished):
    """Bytes flipped inside the tensor data of best/model.safetensors (its header intact, so it still parses) are
    refused by name by evaluate, predict, early-exit, export and `EarlyExitClassifier`, from the checksums written
    with best/; --no-verify-checksums loads it anyway. A setting saved into the directory keeps it verifiable."""
    from elasticbert.loading import set_checksum_verification
    from finetune.serve.predict import EarlyExitClassifier

    best = tmp_path / "best"
    shutil.copytree(finished / "best", best)
    assert (best / "checksums.json").is_file()
    texts = tmp_path / "in.txt"
    texts.write_text("a fine film\n", encoding="utf-8")
    assert main(["save-early-exit", "--model", str(best), "--strategy", "entropy", "--threshold", "0.3"]) == 0
    assert main(["predict", "--model", str(best), "--input", str(texts), "--no-progress"]) == 0  # still sound
    flip_bytes(best / "model.safetensors")  # the middle of the file: tensor data
    commands = [
        ["evaluate", "--model", str(best), "--data-dir", str(glue), "--output", str(tmp_path / "e")],
        ["predict", "--model", str(best), "--input", str(texts), "--no-progress"],
        [
            "early-exit",
            "--model",
            str(best),
            "--task",
            "SST-2",
            "--data-dir",
            str(glue),
            "--output",
            str(tmp_path / "x"),
        ],
        ["export", "--model", str(best), "--output", str(tmp_path / "fnlp")],
    ]
    for argv in commands:
        err = error_of(capsys, argv)
        assert f"{best / 'model.safetensors'}: contents differ from the sha256 in checksums.json" in err, argv
        assert "--no-verify-checksums" in err
    with pytest.raises(CheckpointError, match="contents differ"):
        EarlyExitClassifier.from_pretrained(str(best))
    capsys.readouterr()
    try:
        argv = ["predict", "--model", str(best), "--input", str(texts), "--no-progress", "--no-verify-checksums"]
        assert main(argv) == 0
    finally:
        set_checksum_verification(True)  # the switch is per process: later tests load with it on


def test_early_exit_results_of_another_model_or_configuration_are_never_mixed(tmp_path, capsys, glue, finished):
    """An early-exit run into a folder holding another model's results (other weights, even at the same path) or
    another --max-examples' is refused: the JSON, its plot and samples/ stay as they were. The same model and
    configuration merges its other strategies as before; --no-merge replaces the folder's result on purpose."""
    from common.integrity import seal

    model = tmp_path / "model"
    shutil.copytree(finished / "best", model)
    out = tmp_path / "ee"
    ee = ["early-exit", "--model", str(model), "--task", "SST-2", "--data-dir", str(glue), "--output", str(out)]
    ee += ["--max-length", "32", "--max-examples", "8"]
    capsys.readouterr()
    assert main(ee + ["--strategy", "entropy", "--sweep", "0.3"]) == 0
    result = out / "early_exit_SST-2_dev_bs32.json"
    before = result.read_bytes()
    assert main(ee + ["--strategy", "maxprob", "--sweep", "0.9"]) == 0  # same model and rows: merged
    assert set(json.loads(result.read_text())["strategies"]) == {"entropy", "maxprob"}
    merged = result.read_bytes()
    samples = sorted(p.relative_to(out) for p in (out / "samples").rglob("*"))
    assert samples  # per-point sample files of both strategies

    other_rows = [*ee[:-2], "--max-examples", "12", "--strategy", "entropy", "--sweep", "0.3"]
    err = error_of(capsys, other_rows)
    assert f"{result} holds the early-exit results of another model or configuration" in err
    assert "max_examples 8 vs 12" in err and result.read_bytes() == merged

    retrained = ElasticBertForSequenceClassification.from_pretrained(model)
    with torch.no_grad():
        next(retrained.parameters()).add_(0.01)  # another model in the same directory
    retrained.save_pretrained(model)
    seal(model)
    err = error_of(capsys, ee + ["--strategy", "entropy", "--sweep", "0.3"])
    assert "weights_sha256" in err and result.read_bytes() == merged
    assert sorted(p.relative_to(out) for p in (out / "samples").rglob("*")) == samples
    assert before != merged


def test_a_test_file_evaluate_cannot_read_is_an_error_not_a_skip(tmp_path, capsys, glue, finished):
    """A test split whose text column is missing used to be 'skipped' inside dev_scores.json with exit 0 and no
    predictions; only a missing test file is skipped (and says so)."""
    data = tmp_path / "glue"
    shutil.copytree(glue, data)
    (data / "SST-2" / "test.tsv").write_text("index\tcomment\n0\ta fine film\n", encoding="utf-8")
    argv = ["evaluate", "--model", str(finished / "best"), "--data-dir", str(data), "--output", str(tmp_path / "e")]
    err = error_of(capsys, argv)
    assert "test.tsv" in err and "sentence" in err
    assert not (tmp_path / "e" / "dev_scores.json").exists()
    (data / "SST-2" / "test.tsv").unlink()
    assert main(argv) == 0
    skipped = json.loads((tmp_path / "e" / "dev_scores.json").read_text())["tasks"]["SST-2"]["test"]
    assert skipped.startswith("skipped:") and "no 'test' split" in skipped


def _small_vocab_tokenizer(directory: Path, size: int = 2000) -> Path:
    """MiniLM's vocabulary cut to its first `size` entries: every id valid for the model, most words [UNK]."""
    from transformers import BertTokenizer

    directory.mkdir(parents=True)
    words = (minilm_dir() / "vocab.txt").read_text(encoding="utf-8").splitlines()[:size]
    (directory / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    BertTokenizer(str(directory / "vocab.txt")).save_pretrained(directory)
    return directory


def test_a_tokenizer_that_does_not_fit_the_model_is_refused(tmp_path, capsys, glue, finished):
    """`train --tokenizer` with a 2,000-entry vocabulary for a 30,522-entry model used to train to the end on 72 %
    [UNK]: it is not the model's tokenizer (`common.vocab` identities), refused before any data is read, naming both
    sides; a tokenizer larger than the embeddings is refused by its size. A model directory whose tokenizer files were
    swapped for that vocabulary is refused by `predict` too. The [UNK] guard stands for the model's own tokenizer on
    text it does not fit: a Tifinagh word in every line is refused, naming the rate and the way out."""
    from common.integrity import seal

    small = _small_vocab_tokenizer(tmp_path / "small")
    err = error_of(capsys, train_argv(glue, tmp_path / "r1", "--tokenizer", str(small)))
    assert f"the tokenizer {small}" in err and "2,000 vs 30,522 tokens" in err and "drop --tokenizer" in err
    assert not (tmp_path / "r1" / "best").exists()

    big = tmp_path / "big"
    big.mkdir()
    words = (minilm_dir() / "vocab.txt").read_text(encoding="utf-8").splitlines()
    (big / "vocab.txt").write_text("\n".join(words + [f"extra{i}" for i in range(100)]) + "\n", encoding="utf-8")
    err = error_of(capsys, train_argv(glue, tmp_path / "r3", "--tokenizer", str(big)))
    assert "has 30,622 entries but the model embeds 30,522 tokens" in err

    model = tmp_path / "model"
    shutil.copytree(finished / "best", model)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (model / name).unlink(missing_ok=True)
    for item in small.iterdir():
        shutil.copy2(item, model / item.name)
    seal(model)
    texts = tmp_path / "reviews.txt"
    rows = (GLUE / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:200]
    texts.write_text("\n".join(r.split("\t")[0] for r in rows) + "\n", encoding="utf-8")
    err = error_of(capsys, ["predict", "--model", str(model), "--input", str(texts), "--no-progress"])
    assert "the tokenizer saved in" in err and "is not the tokenizer the model" in err
    assert "2,000 vs 30,522 tokens" in err and "Restore the tokenizer files" in err

    texts = tmp_path / "tifinagh.txt"
    texts.write_text("\n".join(["a fine and moving film about ⴰⵣⵓⵍ"] * 700) + "\n", encoding="utf-8")
    best = str(finished / "best")
    err = error_of(capsys, ["predict", "--model", best, "--input", str(texts), "--no-progress"])
    assert "% [UNK]" in err and "of the inputs so far" in err and "--max-unk-fraction 1" in err
    argv = ["predict", "--model", best, "--input", str(texts), "--no-progress", "--max-unk-fraction", "1"]
    assert main(argv) == 0


def test_os_errors_of_every_command_are_one_line_with_the_path_and_errno(tmp_path, capsys, glue, finished):
    """A read-only output used to be a Python traceback in evaluate / predict / early-exit / elue-score / export; the
    shared entry turns any OSError a command did not handle into one line naming the path and errno (exit 74), and
    the commands that write results keep theirs (exit 4 or 2) — never a traceback, never exit 0."""
    texts = tmp_path / "in.txt"
    texts.write_text("a fine film\n", encoding="utf-8")
    best = str(finished / "best")
    with small_tmpfs(tmp_path / "ro", read_only=True) as ro:
        commands = [
            ["evaluate", "--model", best, "--data-dir", str(glue), "--output", str(ro / "e")],
            ["predict", "--model", best, "--input", str(texts), "--output", str(ro / "p.jsonl"), "--no-progress"],
            ["early-exit", "--model", best, "--task", "SST-2", "--data-dir", str(glue), "--output", str(ro / "x")],
            ["export", "--model", best, "--output", str(ro / "fnlp")],
        ]
        for argv in commands:
            capsys.readouterr()
            code = main(argv)
            err = capsys.readouterr().err
            errors = [line for line in err.splitlines() if line.startswith("finetune: error:")]
            assert code not in (0, 1) and len(errors) == 1 and "Traceback" not in err, (argv, code, err)
            assert str(ro) in errors[0] and ".tmp" not in errors[0], (argv, err)  # the user's path, not ours
            assert "Read-only file system" in errors[0] or "EROFS" in errors[0], (argv, err)


def test_an_evaluation_of_another_model_is_not_overwritten(tmp_path, capsys, glue, finished):
    """`evaluate` into a folder holding another model's evaluation is refused (its dev_scores.json, curve and
    prediction files would be replaced or mixed); re-evaluating the same model is fine; --overwrite replaces it."""
    from common.integrity import seal

    other = tmp_path / "other"
    shutil.copytree(finished / "best", other)
    retrained = ElasticBertForSequenceClassification.from_pretrained(other)
    with torch.no_grad():
        next(retrained.parameters()).add_(0.01)
    retrained.save_pretrained(other)
    seal(other)
    out = tmp_path / "eval"
    base = ["evaluate", "--data-dir", str(glue), "--output", str(out), "--max-examples", "8"]
    capsys.readouterr()
    assert main([*base, "--model", str(finished / "best")]) == 0
    first = (out / "dev_scores.json").read_bytes()
    assert main([*base, "--model", str(finished / "best")]) == 0  # the same model and rows: fine
    err = error_of(capsys, [*base, "--model", str(other)])
    assert f"{out / 'dev_scores.json'} holds the evaluation of another model" in err and "weights_sha256" in err
    assert "--overwrite" in err and (out / "dev_scores.json").read_bytes() == first
    assert main([*base, "--model", str(other), "--overwrite"]) == 0
    assert json.loads((out / "dev_scores.json").read_text())["identity"]["model_dir"] == str(other.resolve())


def test_interrupt_is_exit_130_without_traceback(tmp_path, glue):
    """Ctrl-C (SIGINT) during training: exit 130, one line, no best/. The child starts with SIGINT at its default,
    as under a terminal: a suite launched in the background (`cmd &` without job control) inherits SIGINT ignored,
    and Python then installs no KeyboardInterrupt handler: the trainer ran on (the hang of the background CI runs)."""
    run = tmp_path / "run"
    argv = train_argv(glue, run, "--train-steps", "100000", "--max-train-examples", "16")
    proc = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-m", "finetune", *argv],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 120
    while not (run / "run_config.json").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # fail with every thread's stack
        proc.send_signal(signal.SIGABRT)  # faulthandler prints the stacks
        _, err = proc.communicate(timeout=60)
        pytest.fail(f"still running 120 s after SIGINT; its threads:\n{err[-6000:]}")
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "finetune: interrupted" in err
    assert not (run / "best").exists()


# ------------------------------------------------------------------------------------- predict and save-early-exit


def test_malformed_predict_inputs_name_the_file_and_line(tmp_path, capsys, finished):
    out = tmp_path / "out.jsonl"
    base = ["predict", "--model", str(finished / "best"), "--no-progress", "--output", str(out)]

    def err(name, content, *extra):
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        message = error_of(capsys, [*base, "--input", str(path), *extra])
        assert not out.exists() and not list(tmp_path.glob(".out.jsonl.tmp*"))  # nothing half-written
        return message, path

    cases = [
        ("a.jsonl", '{"text": "fine"}\n{"text": "ok"\n', ":2: not valid JSON (Expecting ',' delimiter at column 14)"),
        ("b.jsonl", '{"text": "fine"}\n[1, 2]\n', ":2: expected a JSON object with a text field, found list"),
        ("c.jsonl", '{"txt": "x"}\n', ":1: no text field; expected one of text, sentence, text_a, sentence1"),
        ("d.jsonl", '{"text_b": "x"}\n', ":1: no text field ('text_b' needs its first text)"),
        ("e.jsonl", '{"text": 5}\n', ":1: field 'text' must be a string, got int"),
        ("f.jsonl", '{"text": "a", "sentence": "b"}\n', ":1: fields ['text', 'sentence'] each name a text"),
        ("g.jsonl", '{"text": "  "}\n', ":1: field 'text' is an empty text"),
        ("h.jsonl", '{"text_a": "a", "text_b": "b"}\n', ":1: a text pair, but the model was fine-tuned on SST-2"),
        ("i.txt", "good\n\nbad\n", ":2: blank line (one text per line; a blank line is not a text)"),
        ("j.txt", "\n\n", ": no texts to classify"),
        ("k.tsv", "label\tcomment\n1\tx\n", ":1: header ['label', 'comment'] names no text column"),
        ("l.tsv", "sentence\tlabel\nfine\t1\nno tab here\n", ":3: expected 2 tab-separated columns (as the header)"),
        ("m.tsv", "sentence\tlabel\n\t1\n", ":2: field 'column 1' is an empty text"),
    ]
    for name, content, message in cases:
        got, path = err(name, content)
        assert f"{path}{message}" in got, (name, got)
    got, path = err("in.csv", "a,b\n")
    assert f"{path}: cannot tell its format from the suffix '.csv'; pass --format txt, jsonl or tsv" in got
    assert "in.csv:1: header ['a,b'] names no text column" in err("in.csv", "a,b\n", "--format", "tsv")[0]
    # bit rot in a text file; a JSONL file cut short by a crash
    text = tmp_path / "rot.txt"
    text.write_text("a fine film\n" * 3 + "a dull one\n" * 3, encoding="utf-8")
    flip_bytes(text, offset=40, count=2)  # inside line 4
    assert f"{text}:4: not UTF-8 text" in error_of(capsys, [*base, "--input", str(text)])
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(json.dumps({"id": i, "text": "a fine film"}) + "\n" for i in range(4)), encoding="utf-8")
    truncate(cut, 0.6)
    lines = cut.read_text(encoding="utf-8").splitlines()
    assert f"{cut}:{len(lines)}: not valid JSON" in error_of(capsys, [*base, "--input", str(cut)])
    assert not out.exists()


def test_predict_options_are_checked_before_anything_runs(tmp_path, capsys, finished):
    texts = tmp_path / "in.txt"
    texts.write_text("a fine film\n", encoding="utf-8")
    base = ["predict", "--model", str(finished / "best"), "--input", str(texts), "--no-progress"]
    cases = [
        (["--strategy", "entropy"], "strategy 'entropy' needs --threshold"),
        (["--threshold", "0.3"], "--threshold needs --strategy"),
        (["--strategy", "entropy", "--threshold", "-1"], "entropy threshold -1: must be an entropy in nats, >= 0"),
        (["--strategy", "static", "--threshold", "0.2"], "strategy 'static' (the full model) takes no threshold"),
        (["--strategy", "lte", "--threshold", "0.2"], "strategy 'lte' needs a trained LearnedExitHead"),
        (["--strategy", "lte", "--threshold", "0.2", "--lte-head", str(tmp_path / "h.st")], "no LTE head file"),
        (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        (["--strategy", "pcee", "--threshold", "0.3", "--patience", "0"], "--patience (PCEE's consecutive confident"),
        (["--max-length", "4096"], "embeds 1..512 positions"),
        (["--input", str(tmp_path / "missing.txt")], "--input " + str(tmp_path / "missing.txt") + ": no such file"),
        (["--operating-point", str(tmp_path / "r.json")], "r.json: no such file"),
    ]
    for extra, message in cases:
        assert message in error_of(capsys, base + extra), extra
    result = tmp_path / "result.json"
    result.write_text(
        json.dumps(
            {
                "format": "elasticbert-early-exit/1",
                "task": "MRPC",
                "full_model": {"score": 80.0, "mean_flops": 10.0},
                "strategies": {"entropy": {"points": [{"threshold": 0.2, "score": 79.5, "mean_flops": 5.0}]}},
            }
        )
    )
    assert "expected fastest-within=D, best" in error_of(capsys, base + ["--operating-point", f"{result}:quick"])
    assert "--threshold, not both" in error_of(capsys, base + ["--operating-point", str(result), "--threshold", "1"])
    message = error_of(capsys, base + ["--operating-point", f"{result}:entropy=0.2"])
    assert "the operating point was measured on MRPC" in message and "fine-tuned on SST-2" in message, message
    # an existing --output is kept unless --overwrite, and --overwrite replaces only predictions (issue 47)
    out = tmp_path / "out.jsonl"
    out.write_text("keep me\n")
    for extra in ([], ["--overwrite"]):
        assert "is not a JSONL file of predictions" in error_of(capsys, base + ["--output", str(out), *extra])
    assert out.read_text() == "keep me\n"
    out.write_text('{"label": "1", "exit_layer": 2}\n')  # an earlier run's predictions
    assert "exists (a JSONL file of predictions" in error_of(capsys, base + ["--output", str(out)])
    assert main(base + ["--output", str(out), "--overwrite"]) == 0
    assert json.loads(out.read_text())["exit_layer"] == 1  # this model's one exit


def test_save_early_exit_command(tmp_path, capsys, finished):
    model = tmp_path / "best"
    shutil.copytree(finished / "best", model)
    base = ["save-early-exit", "--model", str(model)]
    assert main(base + ["--strategy", "maxprob", "--threshold", "0.9"]) == 0
    assert json.loads((model / "config.json").read_text())["early_exit"] == {"strategy": "maxprob", "threshold": 0.9}
    assert "maxprob" in capsys.readouterr().out
    texts = tmp_path / "in.txt"
    texts.write_text("a fine film\n", encoding="utf-8")
    assert main(["predict", "--model", str(model), "--input", str(texts), "--no-progress"]) == 0
    assert "the model's saved setting" in capsys.readouterr().err
    before = (model / "config.json").read_bytes()
    for extra, message in [
        (["--strategy", "lte", "--threshold", "0.1"], "LTE needs its head file"),
        (["--strategy", "maxprob", "--threshold", "2"], "maxprob threshold 2: must be a probability within [0, 1]"),
        ([], "pass --strategy (with --threshold), --operating-point RESULT.json[:RULE], or --clear"),
        (["--clear", "--strategy", "entropy"], "--clear removes the setting: pass it alone"),
        (["--strategy", "patience", "--threshold", "1", "--delta", "-1"], "--delta must be >= 0"),
    ]:
        assert message in error_of(capsys, base + extra), extra
    assert (model / "config.json").read_bytes() == before
    assert "not a local model directory" in error_of(
        capsys, ["save-early-exit", "--model", "fnlp/elasticbert-base", "--strategy", "static"]
    )
    assert main(base + ["--clear"]) == 0
    assert "early_exit" not in json.loads((model / "config.json").read_text())
    # a setting broken by hand is refused by the checksums, and named where the model loads past them
    raw = json.loads(before)
    raw["early_exit"] = {"strategy": "entropy", "threshold": "low"}
    (model / "config.json").write_text(json.dumps(raw))
    message = error_of(capsys, ["predict", "--model", str(model), "--input", str(texts)])
    assert f"{model / 'config.json'}: " in message and "checksums.json" in message
    message = error_of(capsys, ["predict", "--model", str(model), "--input", str(texts), "--no-verify-checksums"])
    assert f"{model / 'config.json'}: early_exit: threshold must be a number, got 'low'" in message


# ---------------------------------------------------------------------------------------------------- --device

DEVICE_MODULES = (
    "finetune.train.trainer",
    "finetune.score.evaluation",
    "finetune.score.diagnostics",
    "finetune.serve.early_exit.cli",
    "finetune.serve.cli",
    "finetune.score.submission",
)


def _device_commands(glue: Path, finished: Path, tmp_path: Path) -> dict[str, list[str]]:
    """One small run of every command that runs a model."""
    best = str(finished / "best")
    texts = tmp_path / "in.txt"
    texts.write_text("a fine film\n", encoding="utf-8")
    result = tmp_path / "result.json"
    recorded = {"format": "elasticbert-early-exit/1", "task": "SST-2", "model": best, "data_dir": str(glue)}
    full = {"score": 50.0, "mean_flops": 1e7}
    point = {"threshold": 0.3, "score": 50.0, "mean_flops": 1e7}  # a submission with nothing to write is refused
    strategies = {"entropy": {"params": {"patience": 2, "delta": 0.1}, "points": [point]}}
    result.write_text(json.dumps({**recorded, "full_model": full, "strategies": strategies, "max_length": 32}))
    data = ["--data-dir", str(glue)]
    return {
        "train": train_argv(glue, tmp_path / "run"),
        "evaluate": ["evaluate", "--model", best, *data, "--output", str(tmp_path / "eval"), "--no-test"],
        "plot-embeddings": [
            "plot-embeddings",
            "--model",
            best,
            *data,
            "--method",
            "pca",
            "--output",
            str(tmp_path / "e.png"),
        ],
        "early-exit": [
            "early-exit",
            "--model",
            best,
            "--task",
            "SST-2",
            *data,
            "--strategy",
            "entropy",
            "--sweep",
            "0.3",
            "--output",
            str(tmp_path / "ee"),
            "--max-length",
            "32",
        ],
        "predict": ["predict", "--model", best, "--input", str(texts), "--no-progress"],
        "submission": ["submission", "--results", str(result), "--output", str(tmp_path / "sub")],
    }


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_device_cuda_without_cuda_is_refused_by_every_command(tmp_path, capsys, glue, finished):
    for name, argv in _device_commands(glue, finished, tmp_path).items():
        message = error_of(capsys, [*argv, "--device", "cuda"])
        assert "--device cuda: no CUDA device is available" in message and "--device cpu" in message, name
    assert not (tmp_path / "run").exists()  # train refused it before making the run directory


def test_the_device_option_reaches_every_command(tmp_path, capsys, glue, finished, monkeypatch):
    """Each command resolves the device it is given and runs there (a stand-in resolver maps `cuda` to the CPU, so
    that the path a GPU takes - model moved, batches to the model's device, outputs back - runs on any machine)."""
    import importlib

    import torch

    asked = []

    def resolver(name, local_rank=0):
        asked.append(name)
        return torch.device("cpu")

    for module in DEVICE_MODULES + ("finetune.serve.predict",):
        monkeypatch.setattr(importlib.import_module(module), "resolve_device", resolver)
    for name, argv in _device_commands(glue, finished, tmp_path).items():
        asked.clear()
        code = main([*argv, "--device", "cuda"])
        assert code == 0, (name, capsys.readouterr().err[-2000:])
        assert asked and asked[0] == "cuda", name
