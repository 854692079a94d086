"""Issue 59, part 5 (docs/reliability_vi_serving.md): a truncated file of an ONNX export served under
`--no-verify-checksums` (or `verify_checksums=False`) is one line naming the file, exit 2, never ONNX Runtime's
traceback: a per-layer step (fp32, int8), the word embeddings the first steps read as external data, and the one-file
models (`onnx/early_exit.onnx`, `early_exit.int8.onnx`: served at batch size 1), through `predict` and
`EarlyExitClassifier`. With the checksums verified (the default) the same file is refused by them, naming it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from common.errors import UserError  # noqa: E402
from elasticbert.verification import CheckpointError, set_checksum_verification  # noqa: E402
from finetune.__main__ import main  # noqa: E402
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


def truncated_copy(export: Path, target: Path, name: str) -> Path:
    """`export` as hard links (cheap: nothing is written through them), with `name` a new file of half its bytes."""
    for path in sorted(export.rglob("*")):
        copy = target / path.relative_to(export)
        if path.is_dir():
            copy.mkdir(parents=True)
        else:
            copy.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, copy)
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
