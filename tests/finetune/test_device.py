"""`--device auto|cpu|cuda`: resolved up front (auto = CUDA when available), the same option on every command that
runs a model, recorded in the run's configuration."""

import pytest
import torch

from common.errors import ConfigError
from finetune.__main__ import build_parser
from finetune.config import TrainConfig
from finetune.model import resolve_device
from finetune.train.cli import config_from_args

COMMANDS = {
    "train": ["train", "--model", "M", "--task", "SST-2", "--output", "O"],
    "evaluate": ["evaluate", "--model", "M", "--output", "O"],
    "early-exit": ["early-exit", "--model", "M", "--task", "SST-2"],
    "predict": ["predict", "--model", "M"],
    "plot-embeddings": ["plot-embeddings", "--model", "M", "--output", "O.png"],
    "submission": ["submission", "--results", "R.json", "--output", "O"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_that_runs_a_model_takes_device(command):
    parser = build_parser()

    def device(argv):  # train's --device is a shortcut for the config key train.device
        args = parser.parse_args(argv)
        return config_from_args(args)[0].train.device if command == "train" else args.device

    assert device(COMMANDS[command]) == TrainConfig.device == "auto"
    assert device([*COMMANDS[command], "--device", "cpu"]) == "cpu"
    with pytest.raises(SystemExit):
        parser.parse_args([*COMMANDS[command], "--device", "tpu"])


def test_resolution(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="--device cuda: no CUDA device is available"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda", local_rank=3) == torch.device("cuda", 1)  # this process's GPU of the node
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="expected auto, cpu or cuda"):
        resolve_device("gpu")
