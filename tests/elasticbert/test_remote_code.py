"""A directory we saved loads with plain `transformers` — `AutoModel*` and `pipeline` — without `import elasticbert`
first, the way the Hugging Face ecosystem serves custom architectures (`auto_map` + code files, opted into with
`trust_remote_code=True`); without the opt-in transformers refuses in a message that says to pass it."""

from __future__ import annotations

import json
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
