"""The one-file early-exit model served without our code: the Python lines of docs/onnx_single_file.md run as they
are written there (a plain `onnxruntime.InferenceSession` and `tokenizers`), the Node.js client examples/node/ on
onnxruntime-node, and the C++ client examples/cpp/ on ONNX Runtime's C++ API, each giving our Python engine's labels,
exit layers and FLOPs on the token ids our tokenizer produced.

Tools: `.ci/run` installs onnxruntime-node (examples/node/node_modules) and ONNX Runtime's C++ headers
(examples/cpp/get_onnxruntime.sh); without them these tests skip with a [needs-tool] reason, which fails CI."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

from finetune.serve.onnx_export import MANIFEST  # noqa: E402
from finetune.serve.onnx_single import SINGLE_FILES  # noqa: E402
from finetune.serve.predict import EarlyExitClassifier  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "onnx_single_file.md"
NODE_DIR = REPO / "examples" / "node"
CPP_DIR = REPO / "examples" / "cpp"


@pytest.fixture(scope="module")
def served(single_file_export, dev_texts):
    """(export, our engine's records of the dev texts (int8, the queues), their token ids)."""
    _, export, _ = single_file_export
    classifier = EarlyExitClassifier.from_pretrained(export, runtime="onnxruntime", precision="int8", threads=1)
    records = classifier.predict(dev_texts, batch_size=32)
    assert all("label" in r for r in records) and len({r["exit_layer"] for r in records}) > 1
    encoded = classifier.tokenizer(dev_texts, truncation=True, max_length=classifier.max_length)
    return export, records, encoded


def _doc_block(marker: str) -> str:
    """The fenced code block after `<!-- marker -->` in the doc."""
    text = DOC.read_text(encoding="utf-8")
    match = re.search(rf"<!-- {marker} -->\s*```[a-z]*\n(.*?)```", text, re.S)
    assert match, f"{DOC}: no code block marked <!-- {marker} -->"
    return match.group(1)


def test_the_docs_python_lines_run_as_written_and_give_our_answers(served, dev_texts, tmp_path):
    """The lines are run exactly as the doc shows them, in a folder where `exports/sst2_onnx` is the export and
    `texts` are the dev texts (the only line the test adds, before them)."""
    export, records, _ = served
    (tmp_path / "exports").mkdir()
    (tmp_path / "exports" / "sst2_onnx").symlink_to(export)
    lines = _doc_block("python-lines")
    assert 10 <= len(lines.strip().splitlines()) <= 20
    script = f"texts = {json.dumps(dev_texts)}\n" + lines.replace("texts = [", "_example_texts = [", 1)
    script += "\nimport json as _json\nprint(_json.dumps({'labels': labels, 'exit_layer': exit_layer.tolist(), "
    script += "'flops': flops.tolist()}))\n"
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["labels"] == [r["label"] for r in records]
    assert got["exit_layer"] == [r["exit_layer"] for r in records]
    assert got["flops"] == [r["flops"] for r in records]


def _labels(export: Path) -> dict:
    """The file's id2label (its metadata, copied into the manifest's single_file)."""
    return json.loads((export / MANIFEST).read_text())["single_file"]["id2label"]


def _node_or_skip() -> str:
    node = shutil.which("node")
    if node is None or not (NODE_DIR / "node_modules" / "onnxruntime-node").is_dir():
        pytest.skip(
            "[needs-tool] node or onnxruntime-node is missing: cd examples/node && ONNXRUNTIME_NODE_INSTALL=skip "
            "npm install (.ci/run does it)"
        )
    return node


def test_node_serves_the_file_with_our_answers(served):
    """examples/node/classify.js on onnxruntime-node: each input alone, then all of them as one padded batch."""
    node = _node_or_skip()
    export, records, encoded = served
    rows = [
        {"input_ids": [ids], "attention_mask": [[1] * len(ids)], "token_type_ids": [types]}
        for ids, types in zip(encoded["input_ids"], encoded["token_type_ids"])
    ]
    longest = max(len(ids) for ids in encoded["input_ids"])

    def padded(key: str, value: int = 0) -> list:
        return [row + [value] * (longest - len(row)) for row in encoded[key]]

    batch = {"input_ids": padded("input_ids"), "token_type_ids": padded("token_type_ids")}
    batch["attention_mask"] = [[1] * len(ids) + [0] * (longest - len(ids)) for ids in encoded["input_ids"]]
    lines = "\n".join(json.dumps(row) for row in [*rows, batch]) + "\n"
    model = str(export / SINGLE_FILES["int8"])
    run = subprocess.run(
        [node, "classify.js", model], cwd=NODE_DIR, input=lines, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    answers = [json.loads(line) for line in run.stdout.strip().splitlines()]
    label_of = _labels(export)
    alone = {key: [a[key][0] for a in answers[:-1]] for key in ("label", "exit_layer", "flops")}
    for got in (alone, answers[-1]):
        assert [label_of[str(label)] for label in got["label"]] == [r["label"] for r in records]
        assert got["exit_layer"] == [r["exit_layer"] for r in records]
        assert got["flops"] == [r["flops"] for r in records]


def test_cpp_serves_the_file_with_our_answers(served):
    """examples/cpp/classify built against ONNX Runtime's C++ API (the PyPI wheel's library), each input alone; a
    threshold given on its command line is fed to the file's optional input."""
    if shutil.which("g++") is None or not (CPP_DIR / "onnxruntime" / "include" / "onnxruntime_cxx_api.h").is_file():
        pytest.skip("[needs-tool] g++ or ONNX Runtime's C++ headers are missing: examples/cpp/get_onnxruntime.sh")
    built = subprocess.run(["bash", str(CPP_DIR / "build.sh")], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    export, records, encoded = served
    lines = "".join(
        " ".join(map(str, ids)) + " | " + " ".join(map(str, types)) + "\n"
        for ids, types in zip(encoded["input_ids"], encoded["token_type_ids"])
    )
    model = str(export / SINGLE_FILES["int8"])
    run = subprocess.run([str(CPP_DIR / "classify"), model], input=lines, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = [list(map(int, line.split())) for line in run.stdout.strip().splitlines()]
    label_of = _labels(export)
    assert [label_of[str(label)] for label, _, _ in got] == [r["label"] for r in records]
    assert [layer for _, layer, _ in got] == [r["exit_layer"] for r in records]
    assert [flops for _, _, flops in got] == [r["flops"] for r in records]
    never = subprocess.run([str(CPP_DIR / "classify"), model, "0"], input=lines, capture_output=True, text=True)
    assert {int(line.split()[1]) for line in never.stdout.strip().splitlines()} == {6}  # τ = 0: nobody leaves early
