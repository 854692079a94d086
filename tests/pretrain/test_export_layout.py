"""`python -m pretrain export --layout fnlp` on a stand-in checkpoint (no DeepSpeed run: a ZeRO-0 tag directory as
the trainer commits it, its module state in `mp_rank_00_model_states.pt`), in seconds. The real DeepSpeed exports
are tested in test_training.py (slow); the layout itself in tests/elasticbert/test_fnlp_export.py."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file
from tiny_models import tiny_config

from common.integrity import hash_files, list_files, write_checksums
from elasticbert import ElasticBertForPreTraining, ElasticBertModel, load_pretrained
from pretrain.__main__ import main
from pretrain.checkpoint import CLIENT_STATE, LATEST

STEP = 3


def _checkpoint(ckpt_dir, **overrides):
    """RUN/checkpoints with one committed ZeRO-0 checkpoint of a tiny pre-training model; returns the model."""
    config = tiny_config(num_hidden_layers=3, **overrides)
    torch.manual_seed(0)
    model = ElasticBertForPreTraining(config)
    tag = ckpt_dir / f"global_step{STEP}"
    (tag / "export" / "tokenizer").mkdir(parents=True)
    torch.save({"module": model.state_dict()}, tag / "mp_rank_00_model_states.pt")
    (tag / CLIENT_STATE).write_text(json.dumps({"step": STEP, "consumed_samples": 16 * STEP}))
    config.to_json_file(tag / "export" / "config.json")
    (tag / "export" / "tokenizer" / "vocab.txt").write_text("\n".join(f"w{i}" for i in range(100)) + "\n")
    write_checksums(tag, hash_files(tag, list_files(tag)))
    (ckpt_dir / LATEST).write_text(tag.name)
    return model


def test_export_layout_fnlp_writes_the_released_shape(tmp_path, capsys):
    model = _checkpoint(tmp_path / "checkpoints")
    out = tmp_path / "fnlp"
    assert main(["export", "--checkpoint", str(tmp_path / "checkpoints"), "--output", str(out), "--layout=fnlp"]) == 0
    assert "(fnlp layout)" in capsys.readouterr().out
    state = torch.load(out / "pytorch_model.bin", map_location="cpu", weights_only=True)
    ours = model.state_dict()
    backbone = {k for k in ours if k.startswith("elasticbert.")}
    assert set(state) == backbone | {"elasticbert.embeddings.position_ids"}  # no cls.* (MLM/SOP) heads
    assert all(torch.equal(state[k], ours[k]) for k in backbone)
    assert load_file(str(out / "model.safetensors")).keys() == state.keys()
    config = json.loads((out / "config.json").read_text())
    assert config["num_output_layers"] == config["num_hidden_layers"] == 3 and "exit_layers" not in config
    assert (out / "vocab.txt").is_file() and json.loads((out / "pretrain_info.json").read_text())["step"] == STEP
    base, report = load_pretrained(ElasticBertModel, out)
    assert report.initialised == [] and report.unused == [], report

    # the default layout is unchanged: ours, with the heads, safetensors only
    assert main(["export", "--checkpoint", str(tmp_path / "checkpoints"), "--output", str(tmp_path / "ours")]) == 0
    assert not (tmp_path / "ours" / "pytorch_model.bin").exists()
    assert "cls.predictions.bias" in load_file(str(tmp_path / "ours" / "model.safetensors"))


def test_export_layout_fnlp_refuses_what_the_official_code_cannot_run(tmp_path, capsys):
    _checkpoint(tmp_path / "checkpoints", position_ids_style="roberta", pad_token_id=1)
    out = tmp_path / "fnlp"
    code = main(["export", "--checkpoint", str(tmp_path / "checkpoints"), "--output", str(out), "--layout", "fnlp"])
    err = capsys.readouterr().err
    assert code == 2 and "pretrain: error:" in err and "Traceback" not in err
    assert f"global_step{STEP} cannot be written in the official ElasticBERT layout" in err
    assert "position_ids_style='roberta'" in err and not out.exists()


def test_an_export_is_sealed_and_a_killed_exports_temporary_is_removed(tmp_path, capsys):
    """An export carries checksums.json (loading it verifies the files); the hidden temporary a killed export left
    beside OUTPUT (`.NAME.tmpPID` of a process that is gone) is removed by the next export."""
    import subprocess
    import sys

    from common.integrity import verify_directory

    _checkpoint(tmp_path / "checkpoints")
    out = tmp_path / "hf"
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)
    litter = tmp_path / f".hf.tmp{dead}"
    (litter / "half").mkdir(parents=True)
    (litter / "half" / "model.safetensors").write_bytes(b"\0" * 4096)
    assert main(["export", "--checkpoint", str(tmp_path / "checkpoints"), "--output", str(out)]) == 0
    assert not litter.exists() and (out / "checksums.json").is_file() and verify_directory(out) == []
    assert (out / "modeling_elasticbert.py").is_file()  # and plain transformers can load it (remote code)


def test_an_export_onto_a_full_disk_is_one_line_naming_the_file(tmp_path, capsys):
    """Issue 38 class 5: `pretrain export` onto a full disk ended in a 38-line traceback (safetensors' own error
    type, not an OSError). Now: one line naming the export and the file being written, ENOSPC, exit 4, and nothing
    left on the disk (nor the folder made for the export); both layouts."""
    from faults import small_tmpfs

    _checkpoint(tmp_path / "checkpoints")
    with small_tmpfs(tmp_path / "small", "64k") as small:
        for layout in ("ours", "fnlp"):
            out = small / "exports" / layout
            argv = ["export", "--checkpoint", str(tmp_path / "checkpoints"), "--output", str(out), "--layout", layout]
            capsys.readouterr()
            code = main(argv)
            err = capsys.readouterr().err
            assert code == 4 and "Traceback" not in err and err.count("pretrain: error:") == 1, err
            assert f"pretrain: error: {out}: cannot write the export ({out}/" in err, err
            assert "No space left on device (ENOSPC" in err and ".tmp" not in err, err
            assert list(small.iterdir()) == [], list(small.rglob("*"))
