"""Fixtures: MiniLM (real weights) with an exit at every layer, real GLUE rows, and random exit heads centred and
scaled on those rows so that confidences differ from sample to sample (untrained heads are nearly constant)."""

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch

from elasticbert import ElasticBertForSequenceClassification, load_pretrained, minilm_dir
from elasticbert.early_exit import entropy_nats
from finetune.data import EncodedSplit, load_tokenizer
from finetune.model import exit_logits
from finetune.tasks import get_task, load_split

GLUE = Path(__file__).resolve().parents[3] / "shared" / "data" / "glue"
EXITS = [1, 2, 3, 4, 5, 6]
SMALL_ROWS = {"train": 49, "dev": 17, "test": 9}  # header + rows of `small_glue`'s SST-2 files


def pytest_collection_modifyitems(config, items):
    if not GLUE.is_dir():  # pragma: no cover - the data is part of the environment
        skip = pytest.mark.skip(reason=f"GLUE data not found at {GLUE}")
        for item in items:
            if "finetune_early_exit" in str(item.fspath):
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a shared 2-core machine a second OpenMP thread mostly waits (3x slower under load).
    Results do not depend on it; the previous setting is restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def glue_dir():
    return GLUE


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer(minilm_dir())


def spread_heads(model, split, seed=0, logit_std=2.0):
    """Random exit heads, centred on `split`'s representations and scaled to `logit_std` across its samples."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        out = model(split.input_ids, attention_mask=split.attention_mask, token_type_ids=split.token_type_ids)
        for layer, rep in zip(model.exit_layers, out.representations):
            linear = model.exits[str(layer)].classifier
            weight = torch.randn(linear.weight.shape, generator=g)
            centred = rep - rep.mean(0)
            scale = (centred @ weight.T).std(0).clamp_min(1e-6)
            linear.weight.copy_(weight * (logit_std / scale)[:, None])
            linear.bias.copy_(-(rep.mean(0) @ linear.weight.T))
    return model


def _model(num_labels, split, exit_type="linear", seed=0):
    torch.manual_seed(seed)
    model, _ = load_pretrained(
        ElasticBertForSequenceClassification,
        minilm_dir(),
        num_labels=num_labels,
        exit_layers=EXITS,
        exit_type=exit_type,
    )
    model.eval()
    return spread_heads(model, split, seed=seed)


@pytest.fixture(scope="session")
def sst2_dev(tokenizer):
    examples = load_split(get_task("SST-2"), GLUE, "dev")[:32]
    return EncodedSplit.from_examples(tokenizer, examples, 128)


@pytest.fixture(scope="session")
def stsb_dev(tokenizer):
    examples = load_split(get_task("STS-B"), GLUE, "dev")[:32]
    return EncodedSplit.from_examples(tokenizer, examples, 128)


@pytest.fixture(scope="session")
def classifier(sst2_dev):
    return _model(2, sst2_dev)


@pytest.fixture(scope="session")
def regressor(stsb_dev):
    return _model(1, stsb_dev, seed=1)


@pytest.fixture(scope="session")
def mha_classifier(sst2_dev):
    return _model(2, sst2_dev, exit_type="mha", seed=2)


@pytest.fixture(scope="session")
def small_glue_rows():
    """Lines (header included) of each of `small_glue`'s SST-2 files."""
    return dict(SMALL_ROWS)


@pytest.fixture(scope="session")
def small_glue(glue_dir, tmp_path_factory):
    """A GLUE root holding the first rows of SST-2's train, dev and test files."""
    root = tmp_path_factory.mktemp("glue")
    (root / "SST-2").mkdir()
    for split, n in SMALL_ROWS.items():
        lines = (glue_dir / "SST-2" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[:n]
        (root / "SST-2" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def _save_classifier(model, directory, **config):
    """`model` saved as `finetune train` saves a run's best/ (tokenizer files, `trained_exits`, `config` fields)."""
    model.save_pretrained(directory)
    raw = json.loads((directory / "config.json").read_text())
    raw.update(trained_exits=list(model.exit_layers), **config)
    (directory / "config.json").write_text(json.dumps(raw))
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm_dir() / name, directory / name)
    return directory


@pytest.fixture(scope="session")
def saved_model(classifier, tmp_path_factory):
    """The spread random heads stand in for fine-tuned ones: the checkpoint records them as trained, as
    `finetune train` does (a classifier saved with no such record is refused as never fine-tuned)."""
    return _save_classifier(classifier, tmp_path_factory.mktemp("model"), finetuning_task="SST-2")


@pytest.fixture(scope="session")
def save_classifier():
    """`save_classifier(model, directory, **config_fields)`: a model saved as `finetune train` saves RUN/best."""
    return _save_classifier


@pytest.fixture(scope="session")
def dev_texts(small_glue):
    """The sentences of `small_glue`'s SST-2 dev rows, in file order."""
    lines = (small_glue / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0] for line in lines]


@pytest.fixture(scope="session")
def entropy_tau(classifier, tokenizer, dev_texts):
    """An entropy threshold (4 decimals) in the widest gap of the inner exits' entropies on the small dev rows, so
    that samples leave at several exits and float noise between batchings cannot flip a decision."""
    enc = tokenizer(dev_texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        inner = exit_logits(classifier(**enc))[:-1]
    values = torch.sort(torch.cat([entropy_nats(lg) for lg in inner])).values
    lo, hi = len(values) // 4, 3 * len(values) // 4
    gaps = values[lo + 1 : hi + 1] - values[lo:hi]
    i = int(gaps.argmax())
    assert gaps[i] > 1e-3, "no usable gap between the observed entropies"
    return round(float((values[lo + i] + values[lo + i + 1]) / 2), 4)


def _conditioned(model, seed):
    """`model` with exit heads that do not amplify float noise: the fixtures' spread heads scale rounding ~1e3 on
    purpose (test_engine.py), so their logits cannot show a 1e-5 agreement; here weights ~N(0, 9/d), bias 0."""
    model = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for head in model.exits.values():
            weight = head.classifier.weight
            weight.copy_(torch.randn(weight.shape, generator=g) * (3.0 / weight.shape[1] ** 0.5))
            head.classifier.bias.zero_()
    return model.eval()


@pytest.fixture(scope="session")
def onnx_models(classifier, mha_classifier, tmp_path_factory):
    """{kind: (eager model, its ONNX export)} for linear and MHA exits, conditioned heads (needs onnx, onnxruntime)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from finetune.serve.onnx_export import export_onnx

    out = {}
    for kind, model in (("linear", classifier), ("mha", mha_classifier)):
        model = _conditioned(model, seed=3)
        model_dir = _save_classifier(model, tmp_path_factory.mktemp(kind), finetuning_task="SST-2")
        export = tmp_path_factory.mktemp(f"onnx_{kind}") / "export"
        export_onnx(model_dir, export, max_length=128)
        out[kind] = (model, export)
    return out


@pytest.fixture(scope="session")
def onnx_spread(classifier, mha_classifier, tmp_path_factory):
    """{kind: (eager model, its ONNX export)} for linear and MHA exits with the spread heads: confidences differ
    from row to row, so rules send rows out at several exits (their logits amplify float noise ~1e3)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from finetune.serve.onnx_export import export_onnx

    out = {}
    for kind, model in (("linear", classifier), ("mha", mha_classifier)):
        model_dir = _save_classifier(model, tmp_path_factory.mktemp(f"spread_{kind}"), finetuning_task="SST-2")
        export = tmp_path_factory.mktemp(f"onnx_spread_{kind}") / "export"
        export_onnx(model_dir, export, max_length=128)
        out[kind] = (model, export)
    return out


@pytest.fixture(scope="session")
def single_file_export(onnx_models, sst2_dev, tmp_path_factory):
    """(model, export, setting): the conditioned MHA model exported with an int8 entropy setting at a threshold in
    the widest gap of its first exit's entropies on `sst2_dev` (rows leave at several exits): its one files
    (`finetune.serve.onnx_single`) hold that rule, its config.json the setting."""
    from dataclasses import replace

    from thresholds import threshold_in_widest_gap

    from elasticbert.exit_setting import EarlyExitSetting
    from finetune.serve.onnx_export import export_onnx

    model = onnx_models["mha"][0]
    with torch.no_grad():
        out = model(sst2_dev.input_ids, attention_mask=sst2_dev.attention_mask, token_type_ids=sst2_dev.token_type_ids)
    tau = threshold_in_widest_gap(entropy_nats(exit_logits(out)[0]))
    setting = replace(EarlyExitSetting("entropy", tau), precision="int8")
    directory = _save_classifier(model, tmp_path_factory.mktemp("entropy_model"), finetuning_task="SST-2")
    export = tmp_path_factory.mktemp("entropy_onnx") / "export"
    export_onnx(directory, export, max_length=128, setting=setting)
    return model, export, setting
