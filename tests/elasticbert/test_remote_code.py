"""A directory we saved loads with plain `transformers` — `AutoModel*` and `pipeline` — without `import elasticbert`
first, the way the Hugging Face ecosystem serves custom architectures (`auto_map` + code files, opted into with
`trust_remote_code=True`); without the opt-in transformers refuses in a message that says to pass it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from tiny_models import tiny_config
from transformers import BertTokenizer

from elasticbert import ElasticBertForSequenceClassification

PROBE = """
import json, sys
from transformers import pipeline
assert "elasticbert" not in sys.modules
trust = sys.argv[2] == "trust"
try:
    classify = pipeline("text-classification", model=sys.argv[1], trust_remote_code=trust, top_k=None)
except ValueError as err:
    print(json.dumps({"error": str(err)}))
    sys.exit(0)
scores = classify(["w1 w2 w3"])[0]
print(json.dumps({"scores": {s["label"]: s["score"] for s in scores}, "class": type(classify.model).__name__}))
"""


def _saved(directory):
    torch.manual_seed(0)
    model = ElasticBertForSequenceClassification(tiny_config(num_labels=2, exit_layers=[2, 4])).eval()
    model.save_pretrained(directory)
    vocab = directory / "vocab_source.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(95)]))
    tokenizer = BertTokenizer(str(vocab))
    tokenizer.save_pretrained(directory)
    return model, tokenizer


def _probe(directory, trust, tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(directory), "trust" if trust else "no"],
        cwd=tmp_path,  # not the repository: nothing of ours is importable by accident... except the installed package
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_saved_directory_loads_in_plain_transformers_with_trust_remote_code(tmp_path):
    model, tokenizer = _saved(tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSequenceClassification"] == (
        "modeling_elasticbert.ElasticBertForSequenceClassification"
    )
    result = _probe(tmp_path / "model", True, tmp_path)
    assert result["class"] == "ElasticBertForSequenceClassification"
    with torch.no_grad():
        logits = model(**tokenizer("w1 w2 w3", return_tensors="pt")).logits[0]
    expected = torch.softmax(logits.double(), -1).tolist()
    assert [result["scores"][f"LABEL_{i}"] for i in range(2)] == [pytest.approx(p, abs=1e-5) for p in expected]


def test_without_the_opt_in_transformers_says_what_to_pass(tmp_path):
    _saved(tmp_path / "model")
    result = _probe(tmp_path / "model", False, tmp_path)
    assert "trust_remote_code=True" in result["error"]


SEALED_PROBE = """
import json, sys
from transformers import pipeline
assert "elasticbert" not in sys.modules
out = {}
for directory in sys.argv[1:]:
    for verify in (True, False):
        extra = {} if verify else {"model_kwargs": {"verify_checksums": False}}
        try:
            scores = pipeline("text-classification", model=directory, trust_remote_code=True, top_k=None, **extra)(
                ["w1 w2 w3"]
            )[0]
            out[f"{directory}:{verify}"] = {"scores": {s["label"]: s["score"] for s in scores}}
        except ValueError as err:  # CheckpointError is a UserError, a ValueError
            out[f"{directory}:{verify}"] = {"error": f"{type(err).__name__}: {err}"}
print(json.dumps(out))
"""


def test_the_remote_code_path_verifies_a_sealed_directory(tmp_path):
    """`pipeline(..., trust_remote_code=True)` in a process that never imported elasticbert runs our classes'
    `from_pretrained`, which checks checksums.json: flipped tensor bytes and a lost checksums.json are refused by
    name; `model_kwargs={"verify_checksums": False}` loads them anyway (and the flipped weights then score
    differently: the refusal was not a false alarm)."""
    from common.integrity import seal

    _saved(tmp_path / "model")
    seal(tmp_path / "model")
    flipped, lost = tmp_path / "flipped", tmp_path / "lost"
    shutil.copytree(tmp_path / "model", flipped)
    shutil.copytree(tmp_path / "model", lost)
    weights = bytearray((flipped / "model.safetensors").read_bytes())
    for i in range(len(weights) - 400, len(weights) - 100):  # tensor data (the header is at the front)
        weights[i] ^= 0xFF
    (flipped / "model.safetensors").write_bytes(bytes(weights))
    (lost / "checksums.json").unlink()
    out = subprocess.run(
        [sys.executable, "-c", SEALED_PROBE, str(tmp_path / "model"), str(flipped), str(lost)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "scores" in result[f"{tmp_path / 'model'}:True"]
    assert "model.safetensors: contents differ from the sha256" in result[f"{flipped}:True"]["error"]
    assert "checksums.json is missing, but" in result[f"{lost}:True"]["error"]
    assert "verify_checksums=False" in result[f"{lost}:True"]["error"]
    assert result[f"{lost}:False"]["scores"] == result[f"{tmp_path / 'model'}:True"]["scores"]
    assert result[f"{flipped}:False"]["scores"] != result[f"{tmp_path / 'model'}:True"]["scores"]
