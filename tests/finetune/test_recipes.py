"""Recipes by name (finetune/presets/*.yaml): the papers' numbers, flags overriding them, what run_config.json
records; early stopping; gradient equilibrium on by default for multi-exit training."""

import json

import pytest

from common.errors import ConfigError
from finetune.__main__ import build_parser, main
from finetune.config import DEFAULT_EXIT_LR, TrainConfig
from finetune.recipes import load_recipe, recipe_names
from finetune.train_cli import config_from_args

BASE = ["train", "--model", "M", "--task", "RTE", "--output", "O"]


def resolved(*flags):
    argv = [*BASE, *flags]
    return config_from_args(build_parser().parse_args(argv), argv[1:])


def test_the_three_recipes_carry_the_papers_numbers():
    assert recipe_names() == ["acl", "elasticbert-dynamic", "elasticbert-static"]
    static = resolved("--recipe", "elasticbert-static")
    assert (static.lr, static.batch_size, static.warmup, static.epochs) == (2e-5, 32, 0.06, 10.0)
    assert (static.early_stopping_patience, static.eval_every, static.exit_lr) == (10, 50, None)
    assert (static.exits, static.weight_decay, static.max_length) == (None, 0.1, 128)

    jt = resolved("--recipe", "elasticbert-dynamic")
    assert (jt.exits, jt.method, jt.epochs, jt.gradient_equilibrium) == ("all", "jt", 5.0, True)
    assert (jt.lr, jt.batch_size, jt.warmup, jt.exit_lr) == (2e-5, 32, 0.06, None)
    alt = resolved("--recipe", "elasticbert-dynamic", "--method", "alt")
    assert alt.epochs == 5.0
    two_stage = resolved("--recipe", "elasticbert-dynamic", "--method", "2st")
    assert (two_stage.epochs, two_stage.stage2_epochs) == (3.0, 3.0)  # 3 epochs per stage

    acl = resolved("--recipe", "acl")
    assert (acl.lr, acl.warmup, acl.epochs, acl.tau, acl.lam) == (2e-5, 0.1, 15.0, 0.5, 0.02)
    assert (acl.objective, acl.acl_grad, acl.acl_grad_threshold, acl.exit_lr) == ("acl", True, 90.0, None)


def test_explicit_flags_override_the_recipe_even_when_equal_to_the_default():
    cfg = resolved("--recipe", "elasticbert-static", "--lr", "3e-5", "--weight-decay", "0.01", "--exit-lr", "1e-3")
    assert (cfg.lr, cfg.weight_decay, cfg.exit_lr) == (3e-5, 0.01, 1e-3)  # 0.01 is TrainConfig's default too
    assert cfg.epochs == 10.0 and cfg.warmup == 0.06  # the rest from the recipe
    assert cfg.recipe == "elasticbert-static"
    assert cfg.provenance["overridden_by_flags"] == {
        "lr": {"recipe": 2e-5, "flag": 3e-5},
        "weight_decay": {"recipe": 0.1, "flag": 0.01},
        "exit_lr": {"recipe": None, "flag": 1e-3},
    }
    assert cfg.provenance["recipe_file"].endswith("finetune/presets/elasticbert-static.yaml")
    two_stage = resolved("--recipe", "elasticbert-dynamic", "--method", "2st", "--epochs", "2")
    assert (two_stage.epochs, two_stage.stage2_epochs) == (2.0, 3.0)


def test_defaults_without_a_recipe():
    cfg = resolved()
    assert cfg == TrainConfig(model="M", task="RTE", output="O") and cfg.recipe is None
    assert cfg.gradient_equilibrium is True and cfg.exit_lr == DEFAULT_EXIT_LR
    assert resolved("--no-gradient-equilibrium").gradient_equilibrium is False
    assert resolved("--exit-lr", "same").exit_lr is None
    assert resolved("--exit-lr", "2e-3").exit_lr == 2e-3
    with pytest.raises(SystemExit):
        resolved("--exit-lr", "fast")


def test_bad_recipes_name_the_file_and_key(tmp_path, capsys):
    with pytest.raises(ConfigError, match="did you mean 'acl'"):
        load_recipe("alc")
    bad = tmp_path / "bad.yaml"
    bad.write_text("values:\n  lr: fast\n  learning_rate: 1e-5\n  output: x\n  epochs: 3\n")
    with pytest.raises(ConfigError) as err:
        load_recipe(str(bad))
    message = str(err.value)
    assert f"{bad}: values.lr: expected a number, got 'fast'" in message
    assert "values.learning_rate: not a recipe setting" in message
    assert "values.output: not a recipe setting" in message and "pass it as a flag" in message
    (tmp_path / "broken.yaml").write_text("values: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_recipe(str(tmp_path / "broken.yaml"))
    (tmp_path / "method.yaml").write_text("values: {}\nby_method:\n  3st: {epochs: 1}\n")
    with pytest.raises(ConfigError, match=r"by_method\.3st: not a method"):
        load_recipe(str(tmp_path / "method.yaml"))
    assert main([*BASE, "--recipe", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: no such file" in capsys.readouterr().err


def test_recipe_run_records_its_provenance_and_stops_early(tmp_path, minilm, glue_dir, capsys):
    """A real (tiny) run from the static recipe: run_config.json holds the resolved values, the recipe and the flags
    that overrode it; early stopping (patience 1, an evaluation every step) ends the phase before its 6 steps."""
    out = tmp_path / "run"
    argv = [
        "train",
        "--model",
        str(minilm),
        "--task",
        "RTE",
        "--data-dir",
        str(glue_dir),
        "--output",
        str(out),
        "--recipe",
        "elasticbert-static",
        "--layers",
        "1",
        "--max-steps",
        "6",
        "--eval-every",
        "1",
        "--early-stopping-patience",
        "1",
        "--lr",
        "1e-7",  # too small to improve twice in a row: early stopping fires
        "--batch-size",
        "4",
        "--max-length",
        "32",
        "--max-train-examples",
        "24",
        "--max-dev-examples",
        "24",
        "--no-progress",
    ]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "recipe elasticbert-static" in err and "stopped early" in err
    saved = json.loads((out / "run_config.json").read_text())
    assert saved["recipe"] == "elasticbert-static" and saved["warmup"] == 0.06 and saved["weight_decay"] == 0.1
    assert saved["lr"] == 1e-7 and saved["eval_every"] == 1 and saved["early_stopping_patience"] == 1
    assert saved["provenance"]["overridden_by_flags"]["lr"] == {"recipe": 2e-5, "flag": 1e-7}
    assert set(saved["provenance"]["overridden_by_flags"]) == {
        "lr",
        "eval_every",
        "early_stopping_patience",
        "batch_size",
        "max_length",
    }
    assert saved["provenance"]["model_path"] == str(minilm)
    scores = json.loads((out / "dev_scores.json").read_text())
    stop = scores["stopped_early"][0]
    assert stop["step"] < 6 and stop["patience"] == 1 and len(scores["history"]) == stop["step"]
    assert scores["trained_exits"] == [1]
