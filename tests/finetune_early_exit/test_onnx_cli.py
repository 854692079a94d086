"""The ONNX commands: `finetune export --format onnx` then `predict --runtime onnxruntime`, their answers equal to the
eager `predict`'s; bad input is one line naming the file, a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from finetune.__main__ import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cli_export(saved_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "sst2_onnx"
    assert main(["export", "--model", str(saved_model), "--output", str(out), "--format", "onnx"]) == 0
    return out


def _predict(model, texts, tmp_path, *extra):
    source, out = tmp_path / "in.txt", tmp_path / f"out{len(extra)}.jsonl"
    source.write_text("\n".join(texts) + "\n")
    argv = ["predict", "--model", str(model), "--input", str(source), "--output", str(out), "--overwrite"]
    assert main([*argv, "--strategy", "entropy", "--threshold", "0.3", "--threads", "1", "--no-progress", *extra]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_export_then_predict_on_onnxruntime(saved_model, cli_export, dev_texts, tmp_path):
    manifest = json.loads((cli_export / "onnx" / "manifest.json").read_text())
    assert manifest["max_length"] == 128 and len(manifest["pieces"]["steps"]["int8"]) == 6
    eager = _predict(saved_model, dev_texts, tmp_path)
    served = _predict(cli_export, dev_texts, tmp_path, "--runtime", "onnxruntime")
    assert [r["exit_layer"] for r in served] == [r["exit_layer"] for r in eager]
    assert [r["label"] for r in served] == [r["label"] for r in eager]
    int8 = _predict(cli_export, dev_texts, tmp_path, "--runtime", "onnxruntime", "--precision", "int8")
    assert len(int8) == len(eager) and all("label" in r for r in int8)


def _cli(*argv):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "finetune", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_bad_input_is_one_line(saved_model, cli_export, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(cli_export, copy)
    (copy / "onnx" / "step_3.onnx").write_bytes(b"not a graph")
    for argv, needle in (
        (["predict", "--model", str(saved_model), "--runtime", "onnxruntime"], "not an ONNX early-exit export"),
        (["predict", "--model", str(copy), "--runtime", "onnxruntime"], "step_3.onnx"),
        (["export", "--model", str(saved_model), "--output", str(cli_export), "--format", "onnx"], "pass --overwrite"),
        (["predict", "--model", str(cli_export), "--runtime", "onnxruntime", "--device", "cuda"], "--device cpu"),
    ):
        proc = _cli(*argv)
        assert proc.returncode != 0, argv
        assert "Traceback" not in proc.stderr and needle in proc.stderr, proc.stderr
