"""Issue 39, end to end: a run preempted under the old keys (its resume checkpoint's state.json holds
`train.max_steps` and `optim.warmup`, as the release before the rename wrote it) resumes under the new flags
(`--train-steps`), and ends as the run preempted under the new keys does. Real tiny runs
(tests/support/finetune_preemption.py)."""

from __future__ import annotations

import json

from finetune_preemption import STEPS, results, signal_after_step, train_argv

from common.integrity import seal
from finetune.__main__ import main

TAG = "train-step000003"


def new_flags(argv: list[str]) -> list[str]:
    return ["--train-steps" if a == "--max-steps" else a for a in argv]


def preempted(out, monkeypatch, capsys) -> None:
    with monkeypatch.context() as mp:
        signal_after_step(mp, 3)
        assert main(new_flags(train_argv(out, "jt"))) == 75
    capsys.readouterr()


def test_a_run_preempted_under_the_old_keys_resumes_under_the_new_ones(tmp_path, monkeypatch, capsys):
    old, new = tmp_path / "old", tmp_path / "new"
    for out in (old, new):
        preempted(out, monkeypatch, capsys)
    # rewrite old's checkpoint as the release before the rename saved it: the old keys, no optim.warmup_steps
    point = old / "resume" / TAG
    state = json.loads((point / "state.json").read_text())
    config = state["config"]
    config["train"]["max_steps"] = config["train"].pop("train_steps")
    config["optim"]["warmup"] = config["optim"].pop("warmup_fraction")
    del config["optim"]["warmup_steps"]
    (point / "state.json").write_text(json.dumps(state))
    (point / "checksums.json").unlink()
    seal(point)

    assert main(new_flags(train_argv(old, "jt"))) == 0
    err = capsys.readouterr().err
    assert f"resuming the preempted run from {point}" in err and "deprecated" not in err
    assert main(new_flags(train_argv(new, "jt"))) == 0
    assert results(old) == results(new) and STEPS == 6
