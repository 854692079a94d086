"""`predict` (CLI), `EarlyExitClassifier` (Python) and `pipeline("text-classification")` give the same predictions,
and those equal `early-exit`'s per-sample records on the same rows; the input formats, stdin streaming."""

import json
import os
import queue
import subprocess
import sys
import threading

import pytest
import torch
from transformers import pipeline

from elasticbert import save_early_exit
from finetune.__main__ import main
from finetune.data import EncodedSplit, load_tokenizer
from finetune.model import load_finetuned
from finetune.serve.early_exit import make_rule, run_dataset
from finetune.serve.predict import EarlyExitClassifier
from finetune.tasks import get_task, load_split


def _records(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _predict(*argv):
    assert main(["predict", "--no-progress", *argv]) == 0


@pytest.fixture(scope="module")
def early_exit_run(saved_model, small_glue, entropy_tau, tmp_path_factory):
    """`early-exit` on the small dev rows at one entropy threshold: its result JSON and per-sample TSV rows."""
    out = tmp_path_factory.mktemp("ee")
    argv = ["early-exit", "--model", str(saved_model), "--task", "SST-2", "--data-dir", str(small_glue)]
    argv += ["--strategy", "entropy", "--sweep", f"{entropy_tau}", "--batch-size", "8", "--output", str(out)]
    assert main(argv) == 0
    lines = (out / "samples" / f"entropy_{entropy_tau:g}.tsv").read_text().splitlines()
    header = lines[0].split("\t")
    return out / "early_exit_SST-2_dev_bs8.json", [dict(zip(header, line.split("\t"))) for line in lines[1:]]


def test_predictions_equal_early_exits_per_sample_records(
    saved_model, small_glue, entropy_tau, early_exit_run, tmp_path
):
    result_json, samples = early_exit_run
    dev = small_glue / "SST-2" / "dev.tsv"  # a TSV with a header: read as it is (column `sentence`)
    out = tmp_path / "p.jsonl"
    _predict(
        *("--model", str(saved_model), "--strategy", "entropy", "--threshold", f"{entropy_tau}", "--input", str(dev)),
        *("--output", str(out), "--batch-size", "8"),
    )
    records = _records(out)
    assert len(records) == len(samples) == 16
    assert len({r["exit_layer"] for r in records}) >= 3, "the threshold must send samples to several exits"
    model = load_finetuned(saved_model, require_trained=True)
    names = model.config.id2label
    for record, sample in zip(records, samples):
        assert record["label"] == names[int(sample["prediction"])]
        assert record["exit_layer"] == int(sample["exit_layer"])
        assert record["flops"] == int(sample["flops"])
        assert record["tokens"] == int(sample["length"])
    # probabilities: the engine's logits on the same rows. predict's layer queues batch a row with other rows than
    # early-exit's fixed batches of 8 do after the first layer: fp32 float noise (~1e-7), which the fixture's spread
    # heads amplify ~1e3 (test_engine.py)
    split = EncodedSplit.from_examples(
        load_tokenizer(saved_model), load_split(get_task("SST-2"), small_glue, "dev"), 128
    )
    result, _ = run_dataset(model, split.batches(8), make_rule("entropy", entropy_tau, 2))
    wanted = torch.softmax(result.logits.double(), -1)
    got = torch.tensor([[r["probabilities"][names[k]] for k in range(2)] for r in records], dtype=torch.double)
    torch.testing.assert_close(got, wanted, atol=1e-3, rtol=0)
    # the same point taken from the sweep's result by name, and by a rule
    by_name = tmp_path / "by_name.jsonl"
    point = f"{result_json}:entropy={entropy_tau}"
    common = ("--model", str(saved_model), "--input", str(dev), "--batch-size", "8")
    _predict(*common, "--operating-point", point, "--output", str(by_name))
    assert _records(by_name) == records
    fastest = tmp_path / "fastest.jsonl"
    spec = f"{result_json}:fastest-within=100"  # any score qualifies: the fewest FLOPs, the entropy point here
    _predict(*common, "--operating-point", spec, "--output", str(fastest))
    assert _records(fastest) == records


def test_python_api_and_pipeline_agree_with_the_cli(
    saved_model, save_classifier, small_glue, dev_texts, entropy_tau, tmp_path
):
    cli = tmp_path / "cli.jsonl"
    dev = small_glue / "SST-2" / "dev.tsv"
    _predict(
        *("--model", str(saved_model), "--strategy", "entropy", "--threshold", f"{entropy_tau}"),
        *("--input", str(dev), "--output", str(cli)),
    )
    classifier = EarlyExitClassifier.from_pretrained(saved_model, strategy="entropy", threshold=entropy_tau)
    api = classifier.predict(dev_texts)
    assert api == _records(cli)

    deployed = tmp_path / "deployed"
    save_classifier(load_finetuned(saved_model), deployed, finetuning_task="SST-2")
    save_early_exit(deployed, "entropy", entropy_tau)
    saved = EarlyExitClassifier.from_pretrained(deployed)  # no rule given: the config's setting
    assert saved.setting.to_dict() == {"strategy": "entropy", "threshold": entropy_tau}
    assert saved.predict(dev_texts) == api
    classify = pipeline("text-classification", model=str(deployed))
    one_by_one = saved.predict(dev_texts, batch_size=1)
    # one text per batch on both sides: the same computation; padded batches differ by float noise, which the
    # fixture's spread-out heads amplify ~1e3 (see test_engine), hence the looser tolerance there. A batch of 8 holds
    # more rows than the model has exits: every field of the output must split into samples
    for batch_size, want, tolerance in ((1, one_by_one, 1e-6), (8, api, 2e-3)):
        for record, scores in zip(want, classify(dev_texts, top_k=None, batch_size=batch_size)):
            by_label = {s["label"]: s["score"] for s in scores}
            assert by_label == pytest.approx(record["probabilities"], abs=tolerance)
            assert max(by_label, key=by_label.get) == record["label"]
    # the model's own forward says which exit each sample took
    tokenizer = load_tokenizer(deployed)
    out = classify.model(**tokenizer(dev_texts, padding=True, return_tensors="pt"))
    assert out.sample_exit_layers.tolist() == [r["exit_layer"] for r in api]

    save_early_exit(deployed, None)  # no setting: the pipeline runs the full model, as the API's static rule
    full = EarlyExitClassifier.from_pretrained(deployed).predict(dev_texts)
    assert {r["exit_layer"] for r in full} == {6}
    full_one_by_one = EarlyExitClassifier.from_pretrained(deployed).predict(dev_texts, batch_size=1)
    classify = pipeline("text-classification", model=str(deployed))
    for record, scores in zip(full_one_by_one, classify(dev_texts, top_k=None, batch_size=1)):
        assert {s["label"]: s["score"] for s in scores} == pytest.approx(record["probabilities"], abs=1e-6)


def test_input_formats(classifier, save_classifier, dev_texts, entropy_tau, tmp_path):
    """txt and JSONL files, single texts and pairs mixed (a model that names no task takes both), ids echoed."""
    model_dir = save_classifier(classifier, tmp_path / "model")  # no finetuning_task
    texts = dev_texts[:4]
    txt = tmp_path / "in.txt"
    txt.write_text("\n".join(texts) + "\n\n\n", encoding="utf-8")  # blank lines at the end are forgiven
    jsonl = tmp_path / "in.jsonl"
    rows = [
        {"id": "a", "text": texts[0]},
        {"text_a": texts[1], "text_b": texts[2], "label": 1},
        {"sentence1": texts[2], "sentence2": texts[3]},
        {"premise": texts[3], "hypothesis": texts[0], "id": 7},
        {"sentence": texts[1]},
    ]
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    rule = ("--model", str(model_dir), "--strategy", "entropy", "--threshold", f"{entropy_tau}")
    _predict(*rule, "--input", str(txt), "--output", str(tmp_path / "t.jsonl"))
    _predict(*rule, "--input", str(jsonl), "--output", str(tmp_path / "j.jsonl"))
    api = EarlyExitClassifier.from_pretrained(model_dir, strategy="entropy", threshold=entropy_tau)
    assert _records(tmp_path / "t.jsonl") == api.predict(texts)
    got = _records(tmp_path / "j.jsonl")
    inputs = [texts[0], (texts[1], texts[2]), (texts[2], texts[3]), (texts[3], texts[0]), texts[1]]
    want = api.predict(inputs)
    assert [r.pop("id", None) for r in got] == ["a", None, None, 7, None]
    assert got == want
    assert want[1] != api.predict([texts[1]])[0]  # a pair is classified as a pair


def test_stdin_is_streamed(saved_model, entropy_tau, dev_texts):
    """An answer comes back for each line before the input ends (small batches as lines arrive)."""
    argv = [sys.executable, "-m", "finetune", "predict", "--model", str(saved_model), "--strategy", "entropy"]
    proc = subprocess.Popen(
        [*argv, "--threshold", f"{entropy_tau}", "--threads", "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        answers = []
        for text in dev_texts[:2]:
            proc.stdin.write(text + "\n")
            proc.stdin.flush()
            answers.append(json.loads(lines.get(timeout=180)))  # while stdin is still open
        proc.stdin.write(dev_texts[2] + "\n" + dev_texts[3] + "\n")
        proc.stdin.close()
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    finally:
        proc.kill()
    while not lines.empty():
        answers.append(json.loads(lines.get()))
    api = EarlyExitClassifier.from_pretrained(saved_model, strategy="entropy", threshold=entropy_tau)
    want = api.predict(dev_texts[:4])
    assert [a["exit_layer"] for a in answers] == [w["exit_layer"] for w in want]
    assert [a["label"] for a in answers] == [w["label"] for w in want]
    for got, wanted in zip(answers, want):  # batchings differ: float noise, amplified by the spread heads
        assert got["probabilities"] == pytest.approx(wanted["probabilities"], abs=2e-3)


def test_a_fast_pipe_is_answered_in_order_and_max_wait_is_checked(saved_model, entropy_tau, dev_texts):
    """Every line at once on stdin: the queues fill across arrivals, and the answers still come one per line, in
    order, equal to the batch call's; a negative --max-wait is refused in one line."""
    argv = [sys.executable, "-m", "finetune", "predict", "--model", str(saved_model), "--strategy", "entropy"]
    argv += ["--threshold", f"{entropy_tau}", "--threads", "1", "--batch-size", "4"]
    texts = [*dev_texts, "", *dev_texts[:3]]
    proc = subprocess.run(
        [*argv, "--max-wait", "0.5"], input="\n".join(texts) + "\n", capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(answers) == len(texts) and answers[len(dev_texts)]["flag"] == "empty"
    want = EarlyExitClassifier.from_pretrained(saved_model, strategy="entropy", threshold=entropy_tau).predict(texts)
    assert [a.get("exit_layer") for a in answers] == [w.get("exit_layer") for w in want]
    assert [a.get("label") for a in answers] == [w.get("label") for w in want]
    refused = subprocess.run([*argv, "--max-wait", "-1"], input="x\n", capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "--max-wait must be >= 0" in refused.stderr
    assert "Traceback" not in refused.stderr
