"""Recipes by name (finetune/presets/*.yaml): the papers' numbers, flags overriding them, what run_config.json
records; early stopping; gradient equilibrium on by default for multi-exit training."""

import json

import pytest

from common.errors import ConfigError
from finetune.__main__ import build_parser, main
from finetune.config import DEFAULT_EXIT_LR, FinetuneConfig, load_config_file, load_run_config, recipe_names
from finetune.train.cli import config_from_args

BASE = ["train", "--model", "M", "--task", "RTE", "--output", "O"]


def resolved_with_sources(*flags):
    return config_from_args(build_parser().parse_args([*BASE, *flags]))


def resolved(*flags):
    return resolved_with_sources(*flags)[0]


def test_the_three_recipes_carry_the_papers_numbers():
    assert recipe_names() == ["acl", "elasticbert-dynamic", "elasticbert-static", "hashee"]
    static = resolved("--recipe", "elasticbert-static")
    o, t = static.optim, static.train
    assert (o.lr, t.batch_size, o.warmup_fraction, t.epochs) == (2e-5, 32, 0.06, 10.0)
    assert (t.early_stopping_patience, t.eval_every, o.exit_lr) == (10, 50, None)
    assert (static.model.exits, o.weight_decay, static.data.max_length) == (None, 0.1, 128)

    jt = resolved("--recipe", "elasticbert-dynamic")
    assert (jt.model.exits, jt.method.name, jt.train.epochs, jt.method.gradient_equilibrium) == ("all", "jt", 5.0, True)
    assert (jt.optim.lr, jt.train.batch_size, jt.optim.warmup_fraction, jt.optim.exit_lr) == (2e-5, 32, 0.06, None)
    alt = resolved("--recipe", "elasticbert-dynamic", "--method", "alt")
    assert alt.train.epochs == 5.0
    two_stage = resolved("--recipe", "elasticbert-dynamic", "--method", "2st")
    assert (two_stage.train.epochs, two_stage.method.stage2_epochs) == (3.0, 3.0)  # 3 epochs per stage
    assert resolved("--recipe", "elasticbert-dynamic", "--set", "method.name=2st").train.epochs == 3.0

    acl = resolved("--recipe", "acl")
    obj = acl.objective
    assert (acl.optim.lr, acl.optim.warmup_fraction, acl.train.epochs, obj.tau) == (2e-5, 0.1, 15.0, 0.5)
    # the two departures issue 29 measured (the preset's comments give the evidence): λ 0.01, mean over the anchors
    assert (obj.lam, obj.contrastive_reduction) == (0.01, "mean")
    assert (obj.name, obj.acl_grad, obj.acl_grad_threshold, acl.optim.exit_lr) == ("acl", True, 90.0, None)


def test_explicit_flags_override_the_recipe_even_when_equal_to_the_default():
    cfg, sources = resolved_with_sources(
        "--recipe", "elasticbert-static", "--lr", "3e-5", "--weight-decay", "0.01", "--exit-lr", "1e-3"
    )
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.exit_lr) == (3e-5, 0.01, 1e-3)  # 0.01: the default too
    assert cfg.train.epochs == 10.0 and cfg.optim.warmup_fraction == 0.06  # the rest from the recipe
    given = {key: source for key, source in sources.items() if source.startswith("--")}
    assert given == {
        "model.path": "--model",
        "data.task": "--task",
        "optim.lr": "--lr",
        "optim.weight_decay": "--weight-decay",
        "optim.exit_lr": "--exit-lr",
    }
    assert sources["train.epochs"] == sources["optim.warmup_fraction"] == "recipe elasticbert-static"
    assert sources["train.seed"] == "default"
    two_stage = resolved("--recipe", "elasticbert-dynamic", "--method", "2st", "--epochs", "2")
    assert (two_stage.train.epochs, two_stage.method.stage2_epochs) == (2.0, 3.0)
    # --set beats a flag and the file; --config is --recipe's long form and takes a file of the presets' shape
    cfg, sources = resolved_with_sources("--config", "elasticbert-static", "--lr", "3e-5", "--set", "optim.lr=4e-5")
    assert cfg.optim.lr == 4e-5 and sources["optim.lr"] == "--set"


def test_a_config_file_of_the_presets_shape(tmp_path):
    """A user's file sets any key (the model and task too); flags override it; its by_method applies to the
    resolved method."""
    mine = tmp_path / "mine.yaml"
    mine.write_text(
        "description: my run\nmodel: {path: /models/m, exits: 1-3, exit_type: mha}\ndata: {task: SST-2}\n"
        "optim: {lr: 3e-5}\nby_method:\n  2st: {method: {stage2_epochs: 1}}\n"
    )
    cfg, sources = config_from_args(build_parser().parse_args(["train", "--config", str(mine), "--output", "O"]))
    assert (cfg.model.path, cfg.model.exits, cfg.model.exit_type, cfg.data.task) == (
        "/models/m",
        [1, 2, 3],
        "mha",
        "SST-2",
    )
    assert cfg.optim.lr == 3e-5 and cfg.method.stage2_epochs is None
    assert sources["model.exits"] == f"config {mine}"
    cfg, _ = config_from_args(
        build_parser().parse_args(["train", "--config", str(mine), "--output", "O", "--method", "2st", "--task", "RTE"])
    )
    assert (cfg.method.stage2_epochs, cfg.data.task) == (1.0, "RTE")


def test_defaults_without_a_recipe():
    cfg, sources = resolved_with_sources()
    expected = FinetuneConfig()
    expected.model.path, expected.data.task = "M", "RTE"
    assert cfg == expected and not any(source.startswith("recipe") for source in sources.values())
    assert cfg.method.gradient_equilibrium is True and cfg.optim.exit_lr == DEFAULT_EXIT_LR
    assert resolved("--no-gradient-equilibrium").method.gradient_equilibrium is False
    assert resolved("--exit-lr", "same").optim.exit_lr is None
    assert resolved("--set", "optim.exit_lr=same").optim.exit_lr is None
    assert resolved("--exit-lr", "2e-3").optim.exit_lr == 2e-3
    with pytest.raises(SystemExit):
        resolved("--exit-lr", "fast")


def test_bad_recipes_name_the_file_and_key(tmp_path, capsys):
    with pytest.raises(ConfigError, match="did you mean 'acl'"):
        load_config_file("alc")
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  lr: fast\n  learning_rate: 1e-5\noutput: x\ntrain: {epochs: 3}\n")
    with pytest.raises(ConfigError) as err:
        load_config_file(str(bad))
    message = str(err.value)
    assert f"{bad}: optim.lr: expected a number, got 'fast'" in message
    assert "unknown key 'optim.learning_rate'; known: lr, exit_lr" in message
    assert f"{bad}: unknown key 'output'" in message  # the run directory is --output, not a setting
    (tmp_path / "broken.yaml").write_text("optim: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config_file(str(tmp_path / "broken.yaml"))
    (tmp_path / "method.yaml").write_text("by_method:\n  3st: {train: {epochs: 1}}\n")
    with pytest.raises(ConfigError, match=r"by_method\.3st: not a method"):
        load_config_file(str(tmp_path / "method.yaml"))
    (tmp_path / "typo.yaml").write_text("by_method:\n  2st: {train: {epohcs: 1}}\n")
    with pytest.raises(ConfigError, match=r"unknown key 'by_method\.2st\.train\.epohcs' \(did you mean"):
        load_config_file(str(tmp_path / "typo.yaml"))
    assert main([*BASE, "--recipe", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: no such file" in capsys.readouterr().err
    assert main([*BASE, "--set", "optim.lr"]) == 2
    assert "--set 'optim.lr': expected key=value" in capsys.readouterr().err
    assert main([*BASE, "--set", "optim.lrr=1"]) == 2
    assert "unknown key 'optim.lrr' (did you mean 'optim.lr'?)" in capsys.readouterr().err


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
        "--train-steps",
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
    assert "elasticbert-static: overridden on the command line:" in err and "stopped early" in err
    saved = json.loads((out / "run_config.json").read_text())
    config, sources = saved["config"], saved["sources"]
    assert config["optim"]["warmup_fraction"] == 0.06 and config["optim"]["weight_decay"] == 0.1
    assert config["optim"]["lr"] == 1e-7 and config["train"]["eval_every"] == 1
    assert config["train"]["early_stopping_patience"] == 1
    assert sources["optim.warmup_fraction"] == "recipe elasticbert-static" and sources["optim.lr"] == "--lr"
    # the recipe's values the flags replaced
    recipe = load_config_file("elasticbert-static").values
    replaced = {
        k for k, v in sources.items() if v.startswith("--") and k.split(".")[1] in recipe.get(k.split(".")[0], {})
    }
    assert replaced == {
        "optim.lr",
        "train.eval_every",
        "train.early_stopping_patience",
        "train.batch_size",
        "data.max_length",
    }
    assert saved["resolved"]["model_path"] == str(minilm)
    assert load_run_config(out / "run_config.json").optim.lr == 1e-7  # read back as predict/evaluate do
    scores = json.loads((out / "dev_scores.json").read_text())
    stop = scores["stopped_early"][0]
    assert stop["step"] < 6 and stop["patience"] == 1 and len(scores["history"]) == stop["step"]
    assert scores["trained_exits"] == [1]


def test_every_config_key_has_one_flag_and_every_flag_one_key():
    """The shortcut flags cover the config exactly: a key added to a section gets its flag (or this fails)."""
    from finetune.config import SHORTCUTS, flag
    from finetune.train.cli import OPTIONS

    keys = [key for rows in OPTIONS.values() for key, _ in rows]
    assert sorted(keys) == sorted(SHORTCUTS) and len(set(keys)) == len(keys)
    flags = [flag(key) for key in keys]
    assert len(set(flags)) == len(flags)
    for key in keys:  # each flag sets exactly its key
        section, name = key.split(".")
        default = getattr(getattr(FinetuneConfig(), section), name)
        assert resolved_with_sources()[1][key] in ("default", "--model", "--task")
        if isinstance(default, bool):
            cfg, sources = resolved_with_sources(f"--no-{flag(key)[2:]}" if default else flag(key))
            assert cfg.value(key) is (not default) and sources[key] == flag(key)
