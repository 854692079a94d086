"""Preemption of `finetune train` (issue 38, class 7): a SIGTERM ends the current optimizer step, saves a resume
checkpoint in the run directory, prints one line saying where and how to resume, and exits 75; the same command
resumes and ends bit-identical to an uninterrupted run (best/'s bytes, dev_scores.json, the weights at the end of
every phase), for JT and for both stages of 2ST. A resume under another config is refused naming the keys; a
finished run stays refused without --overwrite. Real tiny runs (tests/support/finetune_preemption.py)."""

from __future__ import annotations

import json

import pytest
from finetune_preemption import STEPS, record_phase_ends, results, signal_after_step, train_argv

from common.dist import free_port
from finetune.__main__ import main


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run of a method (computed once): its results and the weights at each phase's end."""
    runs = {}

    def get(method: str, *extra: str) -> tuple[dict, list]:
        key = (method, *extra)
        if key not in runs:
            out = tmp_path_factory.mktemp(f"reference-{method}") / "run"
            with pytest.MonkeyPatch.context() as mp:
                ends = record_phase_ends(mp)
                assert main(train_argv(out, method, *extra)) == 0
            runs[key] = (results(out), ends)
        return runs[key]

    return get


def preempt(monkeypatch, capsys, out, method: str, step: int, *extra: str) -> tuple[str, list]:
    """Run until SIGTERM arrives after optimizer step `step`: exit 75; returns stderr and the phase ends seen."""
    with monkeypatch.context() as mp:
        ends = record_phase_ends(mp)
        signal_after_step(mp, step)
        capsys.readouterr()
        assert main(train_argv(out, method, *extra)) == 75
    return capsys.readouterr().err, ends


def resume(monkeypatch, capsys, out, method: str, *extra: str) -> tuple[str, list]:
    with monkeypatch.context() as mp:
        ends = record_phase_ends(mp)
        assert main(train_argv(out, method, *extra)) == 0
    return capsys.readouterr().err, ends


@pytest.mark.parametrize(
    "method,step,tag",
    [
        ("jt", 5, "train-step000005"),  # mid-phase, between two evaluations, inside the second epoch
        ("alt", 3, "train-step000003"),  # alternating exits: an odd step, so the next batch's exit must be restored
        ("2st", 6, "stage2-step000000"),  # the last step of stage 1: saved at stage 2's start
        ("2st", STEPS + 3, "stage2-step000003"),  # inside stage 2 (stage 1's end restored from its best)
    ],
)
def test_sigterm_saves_exits_75_and_the_resumed_run_is_bit_identical(
    tmp_path, monkeypatch, capsys, reference, method, step, tag
):
    out = tmp_path / "run"
    err, ends_before = preempt(monkeypatch, capsys, out, method, step)
    phase, done = tag.split("-step")
    line = (
        f"finetune: SIGTERM at {phase} step {int(done)} of {STEPS}: saved a resume checkpoint in {out / 'resume' / tag}"
        "; rerun the same command (same --output) to resume (exit 75)"
    )
    assert line in err.splitlines() and "Traceback" not in err, err
    assert (out / "resume" / "latest").read_text().strip() == tag
    assert (out / "resume" / tag / "checksums.json").is_file()
    assert not (out / "best").exists() and not (out / "dev_scores.json").exists()  # never looks finished

    err, ends_after = resume(monkeypatch, capsys, out, method)
    assert f"resuming the preempted run from {out / 'resume' / tag}" in err
    expected, reference_ends = reference(method)
    assert results(out) == expected
    assert ends_before + ends_after == reference_ends  # the last steps of every phase too, bit for bit
    assert not (out / "resume").exists()  # nothing left to resume once best/ is committed


def test_a_deepspeed_run_resumes_bit_identical(tmp_path, monkeypatch, capsys, reference):
    """Under a DeepSpeed engine (one per phase) the optimizer and schedule are DeepSpeed's files in the checkpoint."""
    pytest.importorskip("deepspeed")
    for key, value in {"DS_ACCELERATOR": "cpu", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 0}, "steps_per_print": 10**9}))
    out = tmp_path / "run"
    _, before = preempt(monkeypatch, capsys, out, "2st", STEPS + 3, "--ds-config", str(ds))
    assert (out / "resume" / "stage2-step000003" / "ds").is_dir() and not (
        out / "resume" / "stage2-step000003" / "trainer.pt"
    ).exists()
    _, after = resume(monkeypatch, capsys, out, "2st", "--ds-config", str(ds))
    assert (results(out), before + after) == reference("2st", "--ds-config", str(ds))


def test_a_resume_under_other_settings_is_refused_naming_the_keys(tmp_path, monkeypatch, capsys, reference):
    out = tmp_path / "run"
    preempt(monkeypatch, capsys, out, "jt", 2)
    saved = (out / "resume" / "train-step000002" / "model.safetensors").read_bytes()
    assert main(train_argv(out, "jt", "--lr", "3e-4", "--seed", "7")) == 2
    err = capsys.readouterr().err
    assert f"finetune: error: {out}: holds a preempted run (phase train, step 2 of {STEPS})" in err
    assert "optim.lr: 2e-05 -> 0.0003" in err and "train.seed: 42 -> 7" in err and "--overwrite" in err
    assert "Traceback" not in err
    assert (out / "resume" / "train-step000002" / "model.safetensors").read_bytes() == saved  # untouched
    # what does not change a number may change: the progress bar
    resume(monkeypatch, capsys, out, "jt", "--progress")
    assert results(out) == reference("jt")[0]


def test_a_finished_resumed_run_is_still_refused_without_overwrite(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    preempt(monkeypatch, capsys, out, "jt", 4)
    resume(monkeypatch, capsys, out, "jt")
    assert main(train_argv(out, "jt")) == 2
    assert f"--output {out}: holds a finished run" in capsys.readouterr().err


def test_overwrite_discards_a_preempted_run_and_starts_over(tmp_path, monkeypatch, capsys, reference):
    out = tmp_path / "run"
    preempt(monkeypatch, capsys, out, "jt", 3)
    err, _ = resume(monkeypatch, capsys, out, "jt", "--overwrite")
    assert "discarding the preempted run there and its resume checkpoint (--overwrite); starting over" in err
    assert "resuming" not in err and not (out / "resume").exists()
    assert results(out) == reference("jt")[0]
    history = json.loads((out / "dev_scores.json").read_text())["history"]
    assert [h["step"] for h in history] == [2, 4, 6]
