"""Issue 39: one word per concept across the trainers. Fine-tuning's `train.max_steps` is now `train.train_steps`
(`--train-steps`) and `optim.warmup` is now `optim.warmup_fraction` (`--warmup-fraction`), beside pre-training's
`optim.warmup_steps` (`--warmup-steps`), exclusive as there. The old keys and flags are read (one deprecation line
each) until the next release; both spellings at once are refused naming both; a run preempted under the old keys
resumes under the new ones. Fast, in-process (no model is loaded)."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
import yaml

import common.config
from common.config import warmup_for
from common.errors import ConfigError
from common.integrity import seal
from finetune.config import RECIPE_DIR, FinetuneConfig, from_shortcuts, load_config_file, load_run_config
from finetune.train import cli as train_cli
from finetune.train.checkpoint import ResumeError, ResumePoint, check_resume_point
from finetune.train.methods import linear_schedule

BASE = ["--model", "m", "--task", "RTE", "--output", "out"]
STEPS_LINE = (
    "finetune: --max-steps (train.max_steps) is deprecated: use --train-steps (train.train_steps) (accepted until the "
    "next release)"
)
WARMUP_LINE = (
    "finetune: --warmup (optim.warmup) is deprecated: use --warmup-fraction (optim.warmup_fraction) (accepted until "
    "the next release)"
)
# written in a file or --set, a key is named as a key
STEPS_KEY_LINE = "finetune: train.max_steps is deprecated: use train.train_steps (accepted until the next release)"
WARMUP_KEY_LINE = "finetune: optim.warmup is deprecated: use optim.warmup_fraction (accepted until the next release)"


@pytest.fixture(autouse=True)
def fresh_deprecations(monkeypatch):
    """The deprecation line is printed once per process: start each test as a new process would."""
    monkeypatch.setattr(common.config, "_warned", set())


def parse(*argv: str) -> tuple[FinetuneConfig, dict[str, str]]:
    parser = argparse.ArgumentParser()
    train_cli.add_subparser(parser.add_subparsers())
    return train_cli.config_from_args(parser.parse_args(["train", *BASE, *argv]))


def test_old_flags_are_read_with_one_deprecation_line_each(capsys):
    cfg, sources = parse("--max-steps", "7", "--warmup", "0.2")
    assert (cfg.train.train_steps, cfg.optim.warmup_fraction, cfg.optim.warmup_steps) == (7, 0.2, 0)
    assert (sources["train.train_steps"], sources["optim.warmup_fraction"]) == ("--max-steps", "--warmup")
    assert sorted(capsys.readouterr().err.splitlines()) == sorted([STEPS_LINE, WARMUP_LINE])
    parse("--max-steps", "7", "--set", "optim.warmup=0.3")  # the same keys again, by flag and by --set: no new line
    assert capsys.readouterr().err == ""
    assert "train.max_steps" not in json.dumps(cfg.to_dict()) and 'optim.warmup"' not in json.dumps(cfg.to_dict())


def test_new_flags_and_keys(capsys):
    cfg, sources = parse("--train-steps", "5", "--warmup-fraction", "0.25")
    assert (cfg.train.train_steps, cfg.optim.warmup_fraction) == (5, 0.25) and capsys.readouterr().err == ""
    assert sources["train.train_steps"] == "--train-steps"
    # a warm-up in steps replaces the default fraction (no layer gave one) ...
    cfg, sources = parse("--warmup-steps", "3")
    assert (cfg.optim.warmup_steps, cfg.optim.warmup_fraction) == (3, None)
    # ... but not one a file gives: exclusive, as in pre-training; 'null' turns the file's off
    with pytest.raises(ConfigError, match=r"--warmup-steps \(optim.warmup_steps\) and --warmup-fraction .* exclusive"):
        parse("--recipe", "elasticbert-static", "--warmup-steps", "3")
    cfg, _ = parse("--recipe", "elasticbert-static", "--warmup-steps", "3", "--warmup-fraction", "null")
    assert (cfg.optim.warmup_steps, cfg.optim.warmup_fraction) == (3, None)
    with pytest.raises(ConfigError, match=r"--warmup-steps \(optim.warmup_steps\) 9 exceeds --train-steps"):
        parse("--warmup-steps", "9", "--train-steps", "4")


@pytest.mark.parametrize(
    "argv",
    [
        ("--max-steps", "3", "--train-steps", "3"),
        ("--set", "train.max_steps=3", "--set", "train.train_steps=3"),
    ],
)
def test_both_spellings_on_one_command_line_are_refused_naming_both(argv):
    with pytest.raises(ConfigError, match=r"train.max_steps\)? and (--train-steps \()?train.train_steps\)? are both"):
        parse(*argv)


def test_old_keys_in_a_config_file(tmp_path, capsys):
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({"optim": {"warmup": 0.2}, "by_method": {"2st": {"train": {"max_steps": 4}}}}))
    cfg, sources = parse("--config", str(path), "--method", "2st")
    assert (cfg.optim.warmup_fraction, cfg.train.train_steps) == (0.2, 4)
    assert sources["optim.warmup_fraction"] == f"config {path}"
    assert sorted(capsys.readouterr().err.splitlines()) == sorted([STEPS_KEY_LINE, WARMUP_KEY_LINE])
    path.write_text(yaml.safe_dump({"optim": {"warmup": 0.2, "warmup_fraction": 0.2}}))
    with pytest.raises(ConfigError, match=rf"optim.warmup and optim.warmup_fraction are both given in {path}"):
        load_config_file(str(path))


def test_shipped_presets_use_the_new_keys_only(capsys):
    for path in sorted(RECIPE_DIR.glob("*.yaml")):
        text = path.read_text()
        assert "max_steps" not in text and "warmup:" not in text, path
        load_config_file(path.stem)
    assert capsys.readouterr().err == ""
    assert load_config_file("elasticbert-static").values["optim"]["warmup_fraction"] == 0.06
    assert FinetuneConfig().optim.warmup_fraction == 0.1 and FinetuneConfig().optim.warmup_steps == 0


def test_run_configs_of_earlier_versions_read_back_silently(tmp_path, capsys):
    """evaluate / predict read a run's run_config.json: one written before the rename (nested, or the flat one of
    earlier versions) reads under the new keys, without a deprecation line (nobody can change it)."""
    old = from_shortcuts(model="m", task="RTE", train_steps=6).to_dict()
    old["train"]["max_steps"] = old["train"].pop("train_steps")
    old["optim"]["warmup"] = old["optim"].pop("warmup_fraction")
    del old["optim"]["warmup_steps"]
    (tmp_path / "nested.json").write_text(json.dumps({"config": old, "sources": {}, "resolved": {}}))
    (tmp_path / "flat.json").write_text(json.dumps({"model": "m", "task": "RTE", "max_steps": 6, "warmup": 0.1}))
    for name in ("nested.json", "flat.json"):
        cfg = load_run_config(tmp_path / name)
        assert (cfg.train.train_steps, cfg.optim.warmup_fraction, cfg.optim.warmup_steps) == (6, 0.1, 0)
    assert capsys.readouterr().err == ""


def test_a_run_preempted_under_the_old_keys_resumes_under_the_new_ones(tmp_path):
    """state.json of a resume checkpoint holds the config it was started with: one written before the rename is
    compared under today's keys (optim.warmup_steps, new, at the value those runs had: 0)."""
    cfg = from_shortcuts(model="m", task="RTE", train_steps=6)
    old = cfg.to_dict()
    old["train"]["max_steps"] = old["train"].pop("train_steps")
    old["optim"]["warmup"] = old["optim"].pop("warmup_fraction")
    del old["optim"]["warmup_steps"]
    point_dir = tmp_path / "run" / "resume" / "train-step000003"
    point_dir.mkdir(parents=True)
    seal(point_dir)
    state = {"config": old, "world_size": 1, "phase": "train", "step": 3, "phase_steps": 6}
    check_resume_point(ResumePoint(point_dir, state), cfg.to_dict(), 1)  # no error: the same run
    other = from_shortcuts(model="m", task="RTE", train_steps=6, warmup_fraction=0.2)
    with pytest.raises(ResumeError, match=r"optim.warmup_fraction: 0.1 -> 0.2"):
        check_resume_point(ResumePoint(point_dir, state), other.to_dict(), 1)
    steps = from_shortcuts(model="m", task="RTE", train_steps=6, warmup_steps=2)
    with pytest.raises(ResumeError, match=r"optim.warmup_steps: 0 -> 2"):
        check_resume_point(ResumePoint(point_dir, state), steps.to_dict(), 1)


def test_the_schedule_follows_warmup_steps_or_fraction():
    def lrs(warm: int, total: int = 10) -> list[float]:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = linear_schedule(opt, total, warm)
        out = []
        for _ in range(total):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    assert warmup_for(0, 0.1, 30) == 3 and warmup_for(4, None, 30) == 4 and warmup_for(50, None, 30) == 30
    assert lrs(warmup_for(0, 0.2, 10))[:3] == pytest.approx([0.5, 1.0, 1.0])
    assert lrs(warmup_for(2, None, 10)) == lrs(warmup_for(0, 0.2, 10))  # the same schedule, written either way
