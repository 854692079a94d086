"""`finetune train --method hashee` and the entry points a HashEE run is used through (`evaluate`, `predict`,
`EarlyExitClassifier`, `pipeline`, `hashee-score` with ELUE points and submission files), on 2 layers of MiniLM and
the first rows of real SST-2; the options' errors; sentence-level early exit refused by name."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import small_glue
from transformers import pipeline

from elasticbert import ElasticBertHashEEForSequenceClassification, minilm_dir
from elasticbert.hash_maps import Buckets, frequency_map
from finetune.__main__ import main
from finetune.config import from_shortcuts
from finetune.data import load_tokenizer
from finetune.hashee import counted_examples, token_sequences
from finetune.model import load_finetuned
from finetune.serve.predict import EarlyExitClassifier
from finetune.tasks import get_task, load_split
from finetune.train.trainer import run_training

GLUE = Path(__file__).resolve().parents[3] / "shared" / "data" / "glue"
ROWS = {"SST-2": 41}
TEXTS = ["a gorgeous , witty , seductive movie .", "it 's a bad sign when you 're rooting for the villain ."]


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def glue(tmp_path_factory):
    if not GLUE.is_dir():  # pragma: no cover - the data is part of the environment
        pytest.skip(f"GLUE data not found at {GLUE}")
    return small_glue(GLUE, tmp_path_factory.mktemp("glue"), ROWS)


def tiny(glue, **overrides):
    values = dict(model=str(minilm_dir()), task="SST-2", data_dir=str(glue), method="hashee", layers=2,
                  max_length=32, batch_size=8, train_steps=2, lr=1e-4, progress=False, seed=3)  # fmt: skip
    return from_shortcuts(**{**values, **overrides})


@pytest.fixture(scope="module")
def run(glue, tmp_path_factory):
    out = tmp_path_factory.mktemp("hashee") / "run"
    run_training(tiny(glue, hash_buckets=2), out)
    return out


def test_the_run_saves_its_map_built_from_the_training_rows(run, glue):
    config = json.loads((run / "best" / "config.json").read_text())
    assert config["model_type"] == "elasticbert-hashee" and (run / "best" / "checksums.json").is_file()
    info = config["token_exit"]
    assert (info["hash"], info["buckets"], info["counted"], info["examples"]) == ("frequency", 2, ["train"], 40)
    model = load_finetuned(run / "best")
    assert isinstance(model, ElasticBertHashEEForSequenceClassification)
    tokenizer = load_tokenizer(run / "best")
    sequences = token_sequences(tokenizer, load_split("SST-2", glue, "train"), 32)
    expected = frequency_map(sequences, 30522, Buckets(2, 2), tokenizer.all_special_ids)
    assert np.array_equal(model.elasticbert.token_layers.numpy(), expected)


def test_predict_pipeline_and_the_classifier_agree_and_count_flops_per_token(run, tmp_path, capsys):
    model = load_finetuned(run / "best").eval()
    tokenizer = load_tokenizer(run / "best")
    encoded = tokenizer(TEXTS, return_tensors="pt", padding=True)
    with torch.inference_mode():
        logits = model(encoded["input_ids"], encoded["attention_mask"], encoded["token_type_ids"]).logits
    flops = model.input_flops(encoded["input_ids"], encoded["attention_mask"])
    records = EarlyExitClassifier.from_pretrained(run / "best").predict(TEXTS)
    assert [r["flops"] for r in records] == [round(f) for f in flops]
    assert all(r["exit_layer"] == 2 for r in records)
    probabilities = torch.softmax(logits, -1)
    assert np.allclose([r["probabilities"]["1"] for r in records], probabilities[:, 1].numpy(), atol=1e-5)
    piped = pipeline("text-classification", model=str(run / "best"), top_k=None)(TEXTS)
    assert np.allclose([{d["label"]: d["score"] for d in row}["1"] for row in piped], probabilities[:, 1], atol=1e-5)
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    assert main(["predict", "--model", str(run / "best"), "--input", str(tmp_path / "in.txt"), "--no-progress"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["flops"] for r in lines] == [r["flops"] for r in records]


def test_hashee_score_writes_points_and_a_submission(run, glue, tmp_path):
    out = tmp_path / "scores"
    args = ["hashee-score", "--model", str(run / "best"), "--data-dir", str(glue), "--output", str(out)]
    assert main([*args, "--submission"]) == 0
    report = json.loads((out / "hashee_scores.json").read_text())
    dev = report["dev"]
    assert dev["examples"] == 40 and dev["mean_flops"] < dev["full_model_mean_flops"]
    assert dev["running_share_per_layer"][0] == 1.0 > dev["running_share_per_layer"][1]
    points = json.loads((out / "elue_points.json").read_text())
    assert points["tasks"]["SST-2"] == [{"flops": dev["mean_flops"], "score": dev["score"]}]
    submission = out / "submission"
    trace = (submission / "SST-2_modules.tsv").read_text().splitlines()
    assert trace[0] == "index\tmodules" and len(trace) == 41 and ",384),layer_2; (384),exit_2" in trace[1]
    assert len((submission / "SST-2.tsv").read_text().splitlines()) == 41
    assert main([*args, "--max-examples", "5"]) == 2  # another configuration in the same folder: refused
    evaluation = tmp_path / "evaluation"
    assert main(["evaluate", "--model", str(run / "best"), "--data-dir", str(glue), "--output", str(evaluation)]) == 0
    scores = json.loads((evaluation / "dev_scores.json").read_text())["tasks"]["SST-2"]["exits"]["2"]
    assert scores["score"] == dev["score"]  # evaluate runs the same token-level forward


def test_sentence_level_early_exit_and_wrong_options_are_refused(run, glue, tmp_path, capsys):
    args = ["early-exit", "--model", str(run / "best"), "--task", "SST-2", "--data-dir", str(glue)]
    args += ["--output", str(tmp_path / "e")]
    assert main(args) == 2
    assert "exits per token" in capsys.readouterr().err
    for layout in ("fnlp", "onnx"):  # neither the official layout nor the early-exit ONNX files hold a token map
        export = tmp_path / f"export_{layout}"
        assert main(["export", "--model", str(run / "best"), "--output", str(export), "--layout", layout]) == 2
        assert "HashEE model" in capsys.readouterr().err and not export.exists()
    with pytest.raises(Exception, match="classifies at the top layer only"):
        run_training(tiny(glue, exits=[1, 2]), tmp_path / "x")
    with pytest.raises(Exception, match="must be within 1..2"):
        run_training(tiny(glue, hash_buckets=3), tmp_path / "z")  # the official step would be 0: all at layer 1
    with pytest.raises(Exception, match="applies to --method hashee only"):
        tiny(glue, method="jt", hash="mi").validate()
    with pytest.raises(Exception, match="only the frequency map counts"):
        tiny(glue, hash="mi", hash_count_dev=True)
    with pytest.raises(Exception, match="continue it with --method hashee"):
        run_training(tiny(glue, model=str(run / "best"), method="jt"), tmp_path / "y")


def test_a_changed_map_or_token_exit_record_is_refused_in_one_line(run, tmp_path, capsys):
    """A copy of best/ with one id's depth changed: the seal refuses it; past the seal (--no-verify-checksums) the
    map's digest does. A token_exit record that is not one (an unknown hash) is refused naming config.json. Each is
    exit 2 with one line, never a traceback."""
    tampered = tmp_path / "best"
    shutil.copytree(run / "best", tampered)
    state = load_file(tampered / "model.safetensors")
    state["elasticbert.token_layers"][2000] = 2 if int(state["elasticbert.token_layers"][2000]) == 1 else 1
    save_file(state, tampered / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "in.txt").write_text(TEXTS[0] + "\n")
    predict = ["predict", "--model", str(tampered), "--input", str(tmp_path / "in.txt"), "--no-progress"]

    def refused(args: list[str], *named: str) -> None:
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert all(word in err for word in named), err

    refused(predict, "checksums")
    refused([*predict, "--no-verify-checksums"], "token map", "map_sha256")
    config = json.loads((tampered / "config.json").read_text())
    config["token_exit"]["hash"] = "md5"
    (tampered / "config.json").write_text(json.dumps(config))
    refused([*predict, "--no-verify-checksums"], "config.json", "token_exit.hash")


def test_counting_the_dev_set_as_the_official_code_does(glue):
    examples, splits = counted_examples(tiny(glue, hash_count_dev=True), get_task("SST-2"))
    assert splits == ["train", "dev"] and len(examples) == 80
    assert counted_examples(tiny(glue, max_train_examples=7), get_task("SST-2"))[1] == ["train"]


def test_the_hashee_recipe_carries_the_official_scripts_values():
    from finetune.__main__ import build_parser
    from finetune.train.cli import config_from_args

    args = ["train", "--model", "M", "--task", "MRPC", "--output", "O", "--recipe", "hashee"]
    cfg, _ = config_from_args(build_parser().parse_args(args))
    m, o, t = cfg.method, cfg.optim, cfg.train
    assert (m.name, m.hash, m.hash_buckets, m.hash_count_dev, cfg.model.layers) == ("hashee", "frequency", 6, False, 6)
    assert (o.lr, o.exit_lr, o.warmup_fraction, o.weight_decay, o.grad_clip) == (5e-5, None, 0.1, 0.0, 1.0)
    assert (t.batch_size, t.epochs, t.seed) == (32, 4.0, 2021)
