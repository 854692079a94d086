"""Issue 59, part 5 (docs/reliability_vi_serving.md): a truncated file of an ONNX export served under
`--no-verify-checksums` (or `verify_checksums=False`) is one line naming the file, exit 2, never ONNX Runtime's
traceback: a per-layer step (fp32, int8), the word embeddings the first steps read as external data, and the one-file
models (`onnx/early_exit.onnx`, `early_exit.int8.onnx`: served at batch size 1), through `predict` and
`EarlyExitClassifier`. With the checksums verified (the default) the same file is refused by them, naming it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from common.errors import UserError  # noqa: E402
from elasticbert.verification import CheckpointError, set_checksum_verification  # noqa: E402
from finetune.__main__ import main  # noqa: E402
from finetune.serve.early_exit import RESULT_FORMAT  # noqa: E402
from finetune.serve.predict import EarlyExitClassifier  # noqa: E402

DAMAGED = [  # (the file cut in half, predict's options that make it the one served)
    ("onnx/step_2.onnx", ["--batch-size", "4"]),
    ("onnx/word_embeddings.bin", ["--batch-size", "4"]),
    ("onnx/step_4.int8.onnx", ["--batch-size", "4", "--precision", "int8"]),
    ("onnx/early_exit.onnx", ["--batch-size", "1"]),
    ("onnx/early_exit.int8.onnx", ["--batch-size", "1", "--precision", "int8"]),
]


@pytest.fixture(autouse=True)
def verification_restored():
    yield
    set_checksum_verification(True)  # in-process `--no-verify-checksums` sets the process's verification


def linked_copy(export: Path, target: Path) -> Path:
    """`export` as hard links: cheap, and safe as long as nothing is written through them (files are replaced)."""
    for path in sorted(export.rglob("*")):
        copy = target / path.relative_to(export)
        if path.is_dir():
            copy.mkdir(parents=True)
        else:
            copy.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, copy)
    return target


def truncated_copy(export: Path, target: Path, name: str) -> Path:
    """`export` (`linked_copy`) with `name` a new file of half its bytes."""
    linked_copy(export, target)
    data = (export / name).read_bytes()
    (target / name).unlink()
    (target / name).write_bytes(data[: len(data) // 2])
    return target


def culprit(copy: Path, name: str) -> str:
    """How the refusal starts: the file, and for the embeddings the step that reads them."""
    if name.endswith(".bin"):
        return f"{copy / name} (external data of {copy / 'onnx/step_0.onnx'}): ONNX Runtime cannot load it ("
    return f"{copy / name}: ONNX Runtime cannot load it ("


@pytest.mark.parametrize(("name", "options"), DAMAGED, ids=[name for name, _ in DAMAGED])
def test_a_truncated_onnx_file_is_one_line_naming_it(onnx_models, tmp_path, capsys, name, options):
    """Named: `predict --runtime onnxruntime --no-verify-checksums` on an export with a truncated step or embeddings
    file ended in ONNX Runtime's traceback (InvalidProtobuf, Fail), exit 1. Not named: the one-file models."""
    copy = truncated_copy(onnx_models["linear"][1], tmp_path / "export", name)
    source, out = tmp_path / "in.txt", tmp_path / "out.jsonl"
    source.write_text("a fine film .\nit is dull .\n")
    argv = ["predict", "--model", str(copy), "--runtime", "onnxruntime", "--input", str(source), "--no-progress"]
    capsys.readouterr()
    code = main([*argv, "--output", str(out), "--no-verify-checksums", *options])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("finetune: error: ")]
    assert code == 2 and "Traceback" not in err and len(errors) == 1, err
    assert errors[0].startswith(f"finetune: error: {culprit(copy, name)}") and "truncated or damaged" in errors[0]
    assert "re-export it: python -m finetune export --layout onnx" in errors[0] and not out.exists()

    code = main([*argv, "--output", str(out), *options])  # verified (the default): the checksums name it
    assert code == 2 and f"{copy / name}: " in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("name", ["onnx/step_2.onnx", "onnx/early_exit.onnx"])
def test_a_truncated_onnx_file_through_the_python_api(onnx_models, tmp_path, name):
    """`EarlyExitClassifier.from_pretrained(EXPORT, runtime="onnxruntime", verify_checksums=False)`: the same one
    refusal (a `UserError`) as the sessions open — the one file's at the first request served at batch size 1."""
    copy = truncated_copy(onnx_models["linear"][1], tmp_path / "export", name)
    with pytest.raises(UserError, match="checksums"):
        EarlyExitClassifier.from_pretrained(copy, runtime="onnxruntime")
    with pytest.raises(CheckpointError) as refused:
        classifier = EarlyExitClassifier.from_pretrained(
            copy, runtime="onnxruntime", batch_size=1, verify_checksums=False
        )
        classifier.predict(["a fine film ."])
    assert str(refused.value).startswith(culprit(copy, name)) and "truncated or damaged" in str(refused.value)


def test_an_unsealed_exports_refusal_names_the_python_spelling(onnx_models, tmp_path):
    """Not named: an export without its checksums.json was refused advising `--no-verify-checksums` only, which the
    Python API has no way to say; the refusal now names `verify_checksums=False`, and that loads it."""
    copy = linked_copy(onnx_models["linear"][1], tmp_path / "export")
    (copy / "checksums.json").unlink()
    with pytest.raises(UserError) as refused:
        EarlyExitClassifier.from_pretrained(copy, runtime="onnxruntime")
    assert "verify_checksums=False (EarlyExitClassifier.from_pretrained)" in str(refused.value)
    classifier = EarlyExitClassifier.from_pretrained(copy, runtime="onnxruntime", verify_checksums=False)
    assert "label" in classifier.predict(["a fine film ."])[0]


def test_an_export_of_the_swept_model_is_not_another_model(onnx_models, tmp_path, capsys):
    """Not named: `predict` on an export with an operating point swept on the model it was exported from noted "the
    operating point was measured on RUN/best, predictions use EXPORT": the export records its source, the same model."""
    export = onnx_models["linear"][1]
    source = json.loads((export / "onnx/manifest.json").read_text())["source"]
    points = [{"threshold": 0.3, "score": 50.0, "mean_flops": 3e7}]
    result = tmp_path / "early_exit_SST-2_dev_bs32.json"
    fields = {"format": RESULT_FORMAT, "task": "SST-2", "model": source, "max_length": 128}
    full = {"layer": 6, "score": 50.0, "mean_flops": 4e7}
    result.write_text(json.dumps({**fields, "full_model": full, "strategies": {"entropy": {"points": points}}}))
    inputs = tmp_path / "in.txt"
    inputs.write_text("a fine film .\n")
    argv = ["predict", "--model", str(export), "--runtime", "onnxruntime", "--input", str(inputs), "--no-progress"]
    capsys.readouterr()
    assert main([*argv, "--operating-point", f"{result}:entropy=0.3"]) == 0
    assert "was measured on" not in capsys.readouterr().err
