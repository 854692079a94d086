"""Issue 39: one word per concept across the trainers. `data.max_seq_len` is now `data.max_length`; the old key is
read (one deprecation line) until the next release, both spellings at once are refused, and checkpoints written under
the old key still resume (same config hash, same comparison of the stored config)."""

from __future__ import annotations

import pytest
import yaml

import common.config
from pretrain.checkpoint import ResumeError, ResumePoint, check_compatible
from pretrain.config import REPO_ROOT, ConfigError, config_from_dict, load_config

TINY = REPO_ROOT / "configs" / "tiny_cpu.yaml"
LINE = "pretrain: data.max_seq_len is deprecated: use data.max_length (accepted until the next release)"
# configs/tiny_cpu.yaml's hash as the release before the rename computed it (with data.max_seq_len: 128), recorded
# in every checkpoint's client state: a run started then must resume now
TINY_HASH_BEFORE_RENAME = "628c6bbe333d986e"


@pytest.fixture(autouse=True)
def fresh_deprecations(monkeypatch):
    """The deprecation line is printed once per process: start each test as a new process would."""
    monkeypatch.setattr(common.config, "_warned", set())


def old_yaml(tmp_path, **data) -> str:
    tree = yaml.safe_load(TINY.read_text())
    tree["data"].pop("max_length")
    tree["data"].update(data)
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(tree))
    return str(path)


def test_the_old_key_is_read_with_one_deprecation_line(tmp_path, capsys):
    old = load_config(old_yaml(tmp_path, max_seq_len=64))
    assert old.data.max_length == 64 and "max_seq_len" not in old.to_dict()["data"]
    assert capsys.readouterr().err.splitlines() == [LINE]
    load_config(old_yaml(tmp_path, max_seq_len=64), ["data.max_seq_len=96"])  # again, and in --set: no second line
    assert capsys.readouterr().err == ""
    assert load_config(TINY, ["data.max_seq_len=96"]).data.max_length == 96  # --set over the file's new key


def test_the_old_key_in_set_prints_the_line_too(capsys):
    assert load_config(TINY, ["data.max_seq_len=64"]).data.max_length == 64
    assert capsys.readouterr().err.splitlines() == [LINE]


@pytest.mark.parametrize("where", ["file", "set"])
def test_both_spellings_in_one_layer_are_refused_naming_both(tmp_path, where):
    path, sets = TINY, ["data.max_seq_len=64", "data.max_length=64"]
    if where == "file":
        path, sets = old_yaml(tmp_path, max_seq_len=64, max_length=64), []
    with pytest.raises(ConfigError, match=r"data.max_seq_len and data.max_length are both given") as e:
        load_config(path, sets)
    assert "keep data.max_length only" in str(e.value)


def test_an_old_checkpoint_resumes_under_the_new_key(capsys):
    """The hash a checkpoint of the previous release recorded, and its stored config (with data.max_seq_len), give
    the verdict they gave before: same settings resume, another setting is named under today's key."""
    new = load_config(TINY)
    assert new.semantic_hash() == TINY_HASH_BEFORE_RENAME
    stored = new.to_dict()
    stored["data"] = {("max_seq_len" if k == "max_length" else k): v for k, v in stored["data"].items()}
    point = ResumePoint(
        "global_step5", {"step": 5, "consumed_samples": 80, "config_hash": TINY_HASH_BEFORE_RENAME, "config": stored}
    )
    assert check_compatible(point, new.semantic_hash(), new.to_dict(), force=False) == []
    # the same verdict when the hash is not the deciding part (a forced resume lists the differences): none
    point_no_hash = ResumePoint("global_step5", {"step": 5, "config_hash": "x", "config": stored})
    assert check_compatible(point_no_hash, new.semantic_hash(), new.to_dict(), force=True) == []
    shorter = load_config(TINY, ["data.max_length=64"])
    with pytest.raises(ResumeError, match=r"data.max_length: 128 -> 64"):
        check_compatible(point, shorter.semantic_hash(), shorter.to_dict(), force=False)
    # RUN/config.yaml of an old run reads back, silently
    assert config_from_dict(stored).data.max_length == 128 and capsys.readouterr().err == ""


def test_a_tiny_run_started_under_the_old_key_resumes_under_the_new_one(prepared_gutenberg, tmp_path):
    """End to end (configs/tiny_cpu.yaml, one process under torchrun): started with data.max_seq_len, stopped at step
    2 with a checkpoint; the same run under data.max_length resumes from it (not refused as another config) and
    finishes."""
    from pretrain_testlib import launch_torchrun, train_args

    run, log = tmp_path / "run", tmp_path / "log"
    sets = ["train.train_steps=4", "checkpoint.interval=2", "logging.tensorboard=false"]
    old = train_args(old_yaml(tmp_path, max_seq_len=64), run, prepared_gutenberg, [*sets, "train.stop_after_steps=2"])
    assert launch_torchrun(old, 1, log).wait() == [0], log.read_text()
    assert LINE in log.read_text()
    assert (run / "checkpoints" / "latest").read_text().strip() == "global_step2"
    log.write_text("")
    new = train_args(TINY, run, prepared_gutenberg, [*sets, "data.max_length=64"])
    assert launch_torchrun(new, 1, log).wait() == [0], log.read_text()
    assert "different config" not in log.read_text() and "deprecated" not in log.read_text()
    assert (run / "checkpoints" / "latest").read_text().strip() == "global_step4"
