"""int8 inference (`elasticbert.precision`): the early-exit engine on an int8 model equals that model's own per-layer
reference, exits where the rule says, stays close to fp32; the precision travels from a sweep to its operating point,
to `save-early-exit`, `predict`, `EarlyExitClassifier` and a pipeline; int8 is refused where it cannot run."""

import json

import pytest
import torch
from torch import nn
from transformers import pipeline

from common.errors import ConfigError
from elasticbert import precision as precision_module
from elasticbert.early_exit import entropy_nats
from elasticbert.masks import attention_mask_for_sdpa
from elasticbert.precision import PerTokenInt8Linear, for_inference, model_precision, precision_problem
from finetune.__main__ import main
from finetune.data import EncodedSplit, load_tokenizer
from finetune.model import load_finetuned
from finetune.serve.early_exit import make_rule, run_batch, run_full_model
from finetune.serve.early_exit.operating_point import choose_operating_point
from finetune.serve.predict import EarlyExitClassifier
from finetune.tasks import get_task, load_split


def _int8_linears(model):
    return [m for m in model.modules() if isinstance(m, PerTokenInt8Linear)]


def _reference(model, ids, mask, types, tau):
    """One sample, layer by layer through the model's modules: each exit's logits and the first exit whose entropy is
    below τ (else the last) - what the engine must reproduce."""
    with torch.inference_mode():
        hidden = model.elasticbert.embeddings(ids, types, None)
        for index in range(model.exit_layers[-1]):
            hidden = model.elasticbert.encoder.run_layer(index, hidden, attention_mask_for_sdpa(mask))
            layer = index + 1
            if layer in model.exit_layers:
                _, logits = model.classify(layer, hidden, None)
                if layer == model.exit_layers[-1] or bool(entropy_nats(logits)[0] < tau):
                    return layer, logits[0]
    raise AssertionError("unreachable")


@pytest.mark.parametrize("kind", ["linear", "mha"])
def test_int8_engine_equals_its_per_layer_reference(kind, classifier, mha_classifier, sst2_dev):
    model = classifier if kind == "linear" else mha_classifier
    int8 = for_inference(model, "int8")
    assert model_precision(int8) == "int8" and model_precision(model) == "fp32"
    linears = [m for m in model.elasticbert.encoder.layer.modules() if type(m) is nn.Linear]
    assert len(linears) == 6 * len(model.elasticbert.encoder.layer)  # query, key, value as one product below
    assert len(_int8_linears(int8)) == 4 * len(int8.elasticbert.encoder.layer)  # the exit heads stay fp32
    assert not [m for m in int8.elasticbert.encoder.layer.modules() if type(m) is nn.Linear]
    assert not _int8_linears(int8.exits)
    assert not _int8_linears(model), "the fp32 model passed in must stay as it was"
    with torch.inference_mode():
        out = int8(sst2_dev.input_ids, attention_mask=sst2_dev.attention_mask, token_type_ids=sst2_dev.token_type_ids)
    entropies = torch.cat([entropy_nats(lg) for lg in out.exit_logits[:-1]])
    samples = []
    for i in range(len(sst2_dev)):
        length = int(sst2_dev.attention_mask[i].sum())
        columns = (sst2_dev.input_ids, sst2_dev.attention_mask, sst2_dev.token_type_ids)
        samples.append(tuple(t[i : i + 1, :length] for t in columns))

    def reference_layers(tau):
        return [_reference(int8, *sample, tau)[0] for sample in samples]

    # coverage: of a few thresholds, the one that spreads the samples over the most exits
    taus = [float(entropies.quantile(q)) for q in (0.1, 0.2, 0.3, 0.4, 0.5)]
    tau = max(taus, key=lambda t: len(set(reference_layers(t))))
    assert len(set(reference_layers(tau))) >= 3, "no threshold sends samples to several exits"
    for sample in samples:
        result = run_batch(int8, *sample, make_rule("entropy", tau, 2))
        layer, logits = _reference(int8, *sample, tau)
        assert int(result.exit_layers[0]) == layer
        torch.testing.assert_close(result.logits[0], logits, atol=1e-5, rtol=0)


def test_int8_stays_close_to_fp32(classifier, sst2_dev):
    """Every layer's token states (MiniLM's real weights) point where fp32's do: cosine >= 0.95 per token on average
    (per-tensor weight scales fall to ~0.92 by the last layer). The fixture's spread heads amplify differences ~1e3 on
    purpose, so logits are not the measure here; bench/serving.py measures accuracy on fine-tuned models."""
    int8 = for_inference(classifier, "int8")
    batch = dict(attention_mask=sst2_dev.attention_mask, token_type_ids=sst2_dev.token_type_ids)
    with torch.inference_mode():
        fp32_states = classifier(sst2_dev.input_ids, **batch, output_hidden_states=True).hidden_states
        int8_states = int8(sst2_dev.input_ids, **batch, output_hidden_states=True).hidden_states
    real = sst2_dev.attention_mask.bool()
    for a, b in zip(fp32_states[1:], int8_states[1:]):
        cosine = float(torch.nn.functional.cosine_similarity(a[real], b[real], dim=-1).mean())
        assert 0.95 <= cosine < 0.9999  # close, and quantized (not the fp32 path)


def test_int8_is_refused_where_it_cannot_run(classifier, monkeypatch):
    assert "CPU only" in precision_problem("int8", "cuda") and "--device cpu" in precision_problem("int8", "cuda")
    assert "unknown precision 'int4'" in precision_problem("int4")
    monkeypatch.setattr(precision_module, "quantized_engine", lambda: None)
    with pytest.raises(ConfigError, match="no quantized CPU engine"):
        for_inference(classifier, "int8")
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="already quantized"):
        for_inference(for_inference(classifier, "int8"), "fp32")


def test_precision_travels_from_sweep_to_serving(saved_model, save_classifier, small_glue, dev_texts, tmp_path):
    out = tmp_path / "ee"
    argv = ["early-exit", "--model", str(saved_model), "--task", "SST-2", "--data-dir", str(small_glue)]
    argv += ["--strategy", "entropy", "--batch-size", "8", "--output", str(out), "--precision", "int8"]
    assert main(argv) == 0
    result = out / "early_exit_SST-2_dev_bs8_int8.json"
    data = json.loads(result.read_text())
    assert data["precision"] == "int8"
    # "within D" counts from the fp32 model's score (the model as trained), measured on the same rows
    fp32_full = load_finetuned(saved_model, require_trained=True)
    labels = torch.tensor([e.label for e in load_split(get_task("SST-2"), small_glue, "dev")])
    split = EncodedSplit.from_examples(
        load_tokenizer(saved_model), load_split(get_task("SST-2"), small_glue, "dev"), 128
    )
    logits, _ = run_full_model(fp32_full, split.batches(8))
    fp32_accuracy = 100 * float((logits.argmax(-1) == labels).float().mean())
    assert data["full_model_fp32"]["score"] == pytest.approx(fp32_accuracy)
    assert choose_operating_point(f"{result}:fastest-within=100").full_score == pytest.approx(fp32_accuracy)
    # the operating point runs at the precision it was measured at; asking for another is refused
    tau = json.loads(result.read_text())["strategies"]["entropy"]["points"][2]["threshold"]
    classifier = EarlyExitClassifier.from_pretrained(saved_model, operating_point=f"{result}:entropy={tau}")
    assert model_precision(classifier.model) == "int8" and "int8" in classifier.description
    with pytest.raises(ConfigError, match="chosen at int8"):
        EarlyExitClassifier.from_pretrained(saved_model, operating_point=f"{result}:entropy={tau}", precision="fp32")
    # save-early-exit records it; the saved setting then runs at int8, as predict does
    deployed = save_classifier(load_finetuned(saved_model), tmp_path / "deployed", finetuning_task="SST-2")
    assert main(["save-early-exit", "--model", str(deployed), "--operating-point", f"{result}:entropy={tau}"]) == 0
    assert json.loads((deployed / "config.json").read_text())["early_exit"]["precision"] == "int8"
    saved = EarlyExitClassifier.from_pretrained(deployed)
    assert model_precision(saved.model) == "int8"
    predictions = saved.predict(dev_texts, batch_size=1)
    # a pipeline over the int8 model object gives the same answers, one text per batch on both sides
    model = for_inference(load_finetuned(deployed), "int8")
    classify = pipeline("text-classification", model=model, tokenizer=saved.tokenizer)
    for record, scores in zip(predictions, classify(dev_texts, top_k=None, batch_size=1)):
        assert {s["label"]: s["score"] for s in scores} == pytest.approx(record["probabilities"], abs=1e-5)
    # the fp32 model a pipeline loads from the directory says, once, that the threshold was chosen at int8
    with pytest.warns(UserWarning, match="chosen at int8; this model runs at fp32"):
        pipeline("text-classification", model=str(deployed))(dev_texts[:2])
    # a hand-given threshold runs at any precision; an unknown one is a usage error
    EarlyExitClassifier.from_pretrained(saved_model, strategy="entropy", threshold=0.3, precision="int8")
    with pytest.raises(SystemExit) as exit_:
        main(["predict", "--model", str(deployed), "--precision", "int4", "--input", "-"])
    assert exit_.value.code == 2
