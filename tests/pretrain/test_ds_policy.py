"""Issue 39: one DeepSpeed-config policy for both trainers (`common.ds_config`). The same path resolution (as given,
else from the repository root, so `ds_configs/NAME.json` works from any directory), "auto" filled from the run
config, a JSON value that disagrees refused naming the key, the file and both values, a `scheduler` refused, and an
`optimizer` checked against the run config's (pre-training hands it to DeepSpeed; fine-tuning builds its AdamW itself,
so it drops a section that agrees and refuses one that does not). Fast, in-process."""

from __future__ import annotations

import json

import pytest

from common.ds_config import REPO_ROOT, load_ds_json, resolve_ds_path
from common.errors import ConfigError
from finetune.config import from_shortcuts
from finetune.train.methods import ds_config as finetune_ds_config
from finetune.train.trainer import run_training
from pretrain.__main__ import main as pretrain_main
from pretrain.config import load_config
from pretrain.ds_config import fill_ds_config

TINY = REPO_ROOT / "configs" / "tiny_cpu.yaml"
SHIPPED = REPO_ROOT / "ds_configs"


def finetune_cfg(**values):
    return from_shortcuts(model="m", task="RTE", batch_size=4, **values)


def written(tmp_path, name: str, tree: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(tree))
    return str(path)


# ---------------------------------------------------------------------------------------------- where it is read


def test_a_shipped_name_resolves_from_any_directory_and_a_local_file_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_ds_path("ds_configs/zero1.json") == SHIPPED / "zero1.json"
    assert load_ds_json("ds_configs/zero1.json").source == str(SHIPPED / "zero1.json")
    (tmp_path / "ds_configs").mkdir()
    (tmp_path / "ds_configs" / "zero1.json").write_text("{}")
    assert resolve_ds_path("ds_configs/zero1.json") == tmp_path / "ds_configs" / "zero1.json"  # as given, first
    with pytest.raises(
        ConfigError, match=rf"DeepSpeed config nope.json does not exist \(read from .* {tmp_path}, else"
    ):
        load_ds_json("nope.json")
    with pytest.raises(ConfigError, match=r"DeepSpeed config /nope.json does not exist \(--ds-config, train.ds_config"):
        load_ds_json("/nope.json")


def test_pretrain_check_config_reads_a_shipped_json_from_another_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["check-config", "--config", str(TINY), "--ds-config", "ds_configs/cpu_fp32.json"]
    assert pretrain_main(argv) == 0
    assert json.loads(capsys.readouterr().out)["deepspeed"]["train_micro_batch_size_per_gpu"] == 4


def test_finetune_reads_a_shipped_json_from_another_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ds = finetune_ds_config(load_ds_json("ds_configs/zero1.json"), finetune_cfg(), world_size=2)
    batch = (ds["train_micro_batch_size_per_gpu"], ds["train_batch_size"], ds["gradient_accumulation_steps"])
    assert batch == (4, 8, 1)
    assert ds["gradient_clipping"] == 1.0 and ds["bf16"]["enabled"] is False and ds["fp16"]["enabled"] is False
    assert "optimizer" not in ds  # checked against the trainer's AdamW (all "auto"), then left to the trainer


# ------------------------------------------------------------------------------------------------ disagreements


def test_pretrain_refuses_a_disagreeing_value_naming_key_file_and_both_values(tmp_path):
    path = written(tmp_path, "ds.json", {**json.loads((SHIPPED / "cpu_fp32.json").read_text()), "gradient_clipping": 5})
    with pytest.raises(ConfigError) as e:
        fill_ds_config(load_ds_json(path), load_config(TINY), world_size=1)
    assert (
        "gradient_clipping=5 in the DeepSpeed JSON disagrees with the run config: optim.grad_clip=1.0 "
        f'(JSON: {path}); set it to "auto" or change the run config'
    ) in str(e.value)


def test_finetune_refuses_a_disagreeing_value_naming_key_file_and_both_values(tmp_path):
    """It used to overwrite the micro-batch without a word."""
    path = written(tmp_path, "ds.json", {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 0}})
    with pytest.raises(ConfigError) as e:
        finetune_ds_config(load_ds_json(path), finetune_cfg(), world_size=1)
    assert (
        f"train_micro_batch_size_per_gpu=8 in the DeepSpeed JSON disagrees with the run config: train.batch_size=4 "
        f"(JSON: {path})"
    ) in str(e.value)


@pytest.mark.parametrize("trainer", ["pretrain", "finetune"])
def test_both_refuse_a_scheduler(tmp_path, trainer):
    raw = {"zero_optimization": {"stage": 0}, "scheduler": {"type": "WarmupLR"}}
    with pytest.raises(ConfigError, match=r"has a 'scheduler': the lr schedule lives in the run config"):
        if trainer == "pretrain":
            fill_ds_config(load_ds_json(written(tmp_path, "s.json", raw)), load_config(TINY), world_size=1)
        else:
            finetune_ds_config(load_ds_json(written(tmp_path, "s.json", raw)), finetune_cfg(), world_size=1)


def test_finetune_checks_a_json_optimizer_against_its_adamw(tmp_path):
    """It used to drop the section without a word: one that says what the run config makes is dropped after the
    check, one that asks for anything else is refused."""
    same = {"type": "AdamW", "params": {"lr": 2e-5, "weight_decay": 0.01, "betas": [0.9, 0.999], "torch_adam": True}}
    ds = finetune_ds_config(load_ds_json(written(tmp_path, "a.json", {"optimizer": same})), finetune_cfg(), 1)
    assert "optimizer" not in ds
    other = {"type": "AdamW", "params": {"lr": 1e-3, "eps": 1e-6}}
    with pytest.raises(ConfigError) as e:
        finetune_ds_config(load_ds_json(written(tmp_path, "b.json", {"optimizer": other})), finetune_cfg(), 1)
    message = str(e.value)
    assert "optimizer.params.lr=0.001 in the DeepSpeed JSON disagrees with the run config: optim.lr=2e-05" in message
    assert "optimizer.params.eps=1e-06" in message
    fused = {"type": "auto", "params": {"fused": True}}
    with pytest.raises(ConfigError, match=r"optimizer.params.fused .* cannot honour it"):
        finetune_ds_config(load_ds_json(written(tmp_path, "c.json", {"optimizer": fused})), finetune_cfg(), 1)
    with pytest.raises(ConfigError, match=r"optimizer.type='Lamb' in the DeepSpeed JSON disagrees"):
        finetune_ds_config(
            load_ds_json(written(tmp_path, "d.json", {"optimizer": {"type": "Lamb"}})), finetune_cfg(), 2
        )


def test_finetune_training_refuses_the_json_before_anything_loads(tmp_path):
    """`finetune train` checks the JSON first (the model path here does not exist: it is never reached)."""
    path = written(tmp_path, "ds.json", {"gradient_accumulation_steps": 4})
    with pytest.raises(ConfigError, match=r"gradient_accumulation_steps=4 in the DeepSpeed JSON disagrees"):
        run_training(finetune_cfg(ds_config=path), tmp_path / "run")
    assert not (tmp_path / "run").exists()
