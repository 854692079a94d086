"""`python -m finetune export --layout fnlp` (finetune/serve/cli.py): a fine-tuned model directory as `finetune
train` writes RUN/best (weights, config, tokenizer), written in the official ElasticBERT layout; user errors are one
message and exit 2. The parser is built here (the module is registered in finetune/__main__.py separately)."""

from __future__ import annotations

import argparse
import json

import torch
from safetensors.torch import load_file
from tiny_models import tiny_config
from transformers import BertTokenizer

from common.cli import run_command
from elasticbert import ElasticBertForSequenceClassification, load_pretrained
from finetune.serve import cli as export_cli


def _parser():
    parser = argparse.ArgumentParser(prog="finetune")
    sub = parser.add_subparsers(dest="command")
    export_cli.add_subparser(sub)
    return parser


def _run(argv, capsys):
    args = _parser().parse_args(argv)
    code = run_command("finetune", lambda: args.func(args))
    out, err = capsys.readouterr()
    return code, out, err


def _best(directory, **overrides):
    """A RUN/best: model + tokenizer, `save_pretrained` both."""
    config = tiny_config(num_hidden_layers=3, num_labels=2, **overrides)
    torch.manual_seed(0)
    model = ElasticBertForSequenceClassification(config).eval()
    model.save_pretrained(directory)
    vocab = directory / "vocab_source.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(95)]))
    BertTokenizer(str(vocab)).save_pretrained(directory)
    vocab.unlink()
    return model


def test_export_writes_a_fine_tuned_run_in_the_fnlp_layout(tmp_path, capsys):
    model = _best(tmp_path / "best", exit_layers=[1, 2, 3])
    out = tmp_path / "fnlp"
    args = ["export", "--model", str(tmp_path / "best"), "--output", str(out), "--layout", "fnlp"]
    code, stdout, err = _run(args, capsys)
    assert code == 0, err
    assert "num_output_layers=3" in stdout and "entropy / patience" in stdout
    state = torch.load(out / "pytorch_model.bin", map_location="cpu", weights_only=True)
    assert {f"classifiers.{i}.weight" for i in range(3)} <= set(state)
    assert not any(k.startswith("exits.") for k in state)
    assert torch.equal(state["classifiers.0.weight"], model.exits["1"].classifier.weight)
    safetensors = load_file(str(out / "model.safetensors"))
    assert safetensors.keys() == state.keys() and all(torch.equal(safetensors[k], state[k]) for k in state)
    assert json.loads((out / "config.json").read_text())["num_output_layers"] == 3
    assert BertTokenizer.from_pretrained(str(out)).convert_tokens_to_ids("w0") == 5
    back, report = load_pretrained(ElasticBertForSequenceClassification, out)
    assert back.exit_layers == (1, 2, 3) and report.unused == [] and report.initialised == [], report


def test_export_errors_are_one_message_naming_the_cause(tmp_path, capsys):
    _best(tmp_path / "best")
    args = ["export", "--model", str(tmp_path / "best"), "--output", str(tmp_path / "fnlp"), "--layout", "fnlp"]
    assert _run(args, capsys)[0] == 0
    code, _, err = _run(args, capsys)
    assert code == 2 and f"--output {tmp_path / 'fnlp'} holds a model in the official ElasticBERT layout" in err
    assert "pass --overwrite to replace it" in err
    assert _run(args + ["--overwrite"], capsys)[0] == 0

    _best(tmp_path / "mha", exit_type="mha", exit_layers=[2, 3])
    code, _, err = _run(["export", "--model", str(tmp_path / "mha"), "--output", str(tmp_path / "x")], capsys)
    assert code == 2 and "exit_type='mha'" in err and "Traceback" not in err and not (tmp_path / "x").exists()

    code, _, err = _run(["export", "--model", str(tmp_path / "nowhere"), "--output", str(tmp_path / "y")], capsys)
    assert code == 2 and f"--model {tmp_path / 'nowhere'}: no such directory" in err

    for extra in ([], ["--overwrite"]):
        code, _, err = _run(
            ["export", "--model", str(tmp_path / "best"), "--output", str(tmp_path / "best"), *extra], capsys
        )
        assert code == 2 and f"--output {tmp_path / 'best'} is the input --model" in err, err
        assert (tmp_path / "best" / "model.safetensors").is_file()
