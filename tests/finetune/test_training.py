"""Real (short) fine-tuning from the MiniLM weights on real GLUE subsets: every method × exit type, every
objective, 2ST freezing, static truncation, evaluation files and the CLI's error messages."""

import json

import numpy as np
import pytest
import torch

from common.dist import free_port
from elasticbert import ElasticBertForSequenceClassification, load_pretrained
from finetune.__main__ import main
from finetune.config import FinetuneConfig, from_shortcuts
from finetune.data import load_tokenizer, subsample
from finetune.model import backbone_modules, build_model, exit_modules
from finetune.tasks import get_task, load_split
from finetune.train.trainer import Trainer, run_training

# Tiny and fast: 2 layers of MiniLM, short sequences, a few steps per phase, a small dev subset.
TINY = dict(
    exits=[1, 2],
    max_length=48,
    batch_size=8,
    eval_batch_size=64,
    max_train_examples=64,
    max_dev_examples=32,
    train_steps=2,
    lr=1e-4,
    exit_lr=1e-3,
    progress=False,
)


def config(minilm, glue_dir, **overrides):
    """A tiny run's config, read through the flags' names as a command line's is."""
    return from_shortcuts(model=str(minilm), data_dir=str(glue_dir), **{**TINY, **overrides})


def read_scores(run):
    return json.loads((run / "dev_scores.json").read_text())


@pytest.fixture(scope="session")
def rte_run(tmp_path_factory, minilm, glue_dir):
    """One trained multi-exit RTE run (JT, linear exits, ACL objective), reused by evaluation/CLI tests."""
    out = tmp_path_factory.mktemp("rte") / "run"
    run_training(config(minilm, glue_dir, task="RTE", objective="acl", acl_grad=True), out)
    return out


def test_sst2_learns_clearly_above_majority(tmp_path, minilm, glue_dir):
    """The real check that fine-tuning works: ~1 CPU-minute on 640 SST-2 sentences (MHA exit at layer 2)."""
    out = tmp_path / "sst2"
    summary = run_training(
        config(
            minilm,
            glue_dir,
            task="SST-2",
            exits=None,
            layers=2,
            exit_type="mha",
            max_train_examples=2000,
            max_dev_examples=200,
            batch_size=16,
            max_length=40,
            train_steps=40,
            lr=2e-4,
            exit_lr=2e-3,
        ),
        out,
    )
    dev_labels = [e.label for e in subsample(load_split("SST-2", glue_dir, "dev"), 200)]
    majority = 100 * max(dev_labels.count(0), dev_labels.count(1)) / len(dev_labels)
    accuracy = summary["best"]["exits"]["2"]["accuracy"]
    assert accuracy >= majority + 10, (accuracy, majority)


class RecordingTrainer(Trainer):
    """Snapshots the weights after each phase (to check what 2ST's stage 2 may touch)."""

    snapshots: list = []

    def run_phase(self, phase, index=0):
        super().run_phase(phase, index)
        self.snapshots.append((phase.name, {k: v.clone() for k, v in self.model.state_dict().items()}))


def train_recorded(cfg, out):
    task = get_task(cfg.data.task)
    torch.manual_seed(cfg.train.seed)
    model, _ = build_model(cfg, task)
    train = subsample(load_split(task, cfg.data.dir, "train"), cfg.data.max_train_examples, cfg.train.seed)
    dev = subsample(load_split(task, cfg.data.dir, "dev"), cfg.data.max_dev_examples, cfg.data.dev_subset_seed)
    RecordingTrainer.snapshots = []
    summary = RecordingTrainer(cfg, task, model, load_tokenizer(cfg.model.path), train, dev, out).fit()
    return model, summary, RecordingTrainer.snapshots


# Every method × exit type, each with a different objective / ACL-Grad setting so that all of them run for real.
MATRIX = [
    ("jt", "linear", dict(objective="ce", jt_weights="layer", gradient_equilibrium=True)),
    ("jt", "mha", dict(objective="ce+scl", acl_grad=True)),
    (
        "2st",
        "linear",
        dict(objective="acl-cl", acl_grad=True, acl_grad_scope="representation", acl_grad_granularity="exit"),
    ),
    ("2st", "mha", dict(objective="acl", acl_grad=True)),
    ("alt", "linear", dict(objective="acl", acl_grad=True, acl_grad_scope="all")),
    ("alt", "mha", dict(objective="acl-cl", acl_grad=False)),
]


@pytest.mark.parametrize("method,exit_type,extra", MATRIX, ids=[f"{m}-{e}-{x['objective']}" for m, e, x in MATRIX])
def test_every_method_exit_type_and_objective(tmp_path, minilm, glue_dir, method, exit_type, extra):
    out = tmp_path / "run"
    exits = [1, 2, 3] if method == "2st" else [1, 2]
    cfg = config(
        minilm,
        glue_dir,
        task="RTE" if method != "2st" else "MRPC",
        method=method,
        exit_type=exit_type,
        exits=exits,
        **extra,
    )
    model, summary, snapshots = train_recorded(cfg, out)

    # a per-exit dev curve, plot, TensorBoard events and a loadable checkpoint
    scores = read_scores(out)
    assert set(scores["best"]["exits"]) == {str(e) for e in exits}
    assert all(0 <= v["accuracy"] <= 100 for v in scores["best"]["exits"].values())
    assert (out / "layer_curve.png").stat().st_size > 1000
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    loaded, report = load_pretrained(ElasticBertForSequenceClassification, out / "best")
    assert loaded.exit_layers == tuple(exits) and loaded.config.exit_type == exit_type and report.initialised == []
    assert loaded.config.num_hidden_layers == exits[-1] and loaded.config.id2label[1] in ("1", "not_entailment")

    phases = [name for name, _ in snapshots]
    assert phases == (["stage1", "stage2"] if method == "2st" else ["train"])
    if method == "2st":  # stage 2 leaves the backbone and the last exit bit-identical, and trains the others
        (_, after1), (_, after2) = snapshots
        frozen = {id(p) for m in backbone_modules(model) + exit_modules(model, exits[-1]) for p in m.parameters()}
        names = {n for n, p in model.named_parameters() if id(p) in frozen}
        assert any(n.startswith(f"exits.{exits[-1]}.") for n in names) and any("layer.0." in n for n in names)
        for name in names:
            assert torch.equal(after1[name], after2[name]), name
        trained = [n for n in after2 if n.startswith(("exits.1.", "exits.2."))]
        assert any(not torch.equal(after1[n], after2[n]) for n in trained)

    if extra["objective"] != "ce":  # ACL diagnostics: angles per batch, drop rate, a plot
        diag = json.loads((out / "acl_diagnostics.json").read_text())
        assert diag["batches"] == TINY["train_steps"] * len(phases) and diag["acl_grad"] is extra["acl_grad"]
        angles = [r["angle"] for r in diag["records"]]
        assert all(a is None or 0.0 <= a <= 180.0 for a in angles) and any(a is not None for a in angles)
        assert 0.0 <= diag["drop_rate"] <= 1.0 and 0.0 <= diag["fraction_over_90"] <= 1.0
        if not extra["acl_grad"]:
            assert diag["drop_rate"] == 0.0
        assert main(["plot-angles", str(out)]) == 0 and (out / "angles.png").stat().st_size > 1000
    else:
        assert not (out / "acl_diagnostics.json").exists()


def test_static_truncation_computes_only_l_layers(tmp_path, minilm, glue_dir):
    cfg = config(minilm, glue_dir, task="SST-2", exits=None, layers=2)
    model, report = build_model(cfg, get_task("SST-2"))
    assert len(model.elasticbert.encoder.layer) == 2 and model.exit_layers == (2,)
    assert any("encoder.layer.5." in k for k in report.unused)
    calls = []
    for layer in model.elasticbert.encoder.layer:
        layer.register_forward_hook(lambda *a: calls.append(1))
    model(torch.tensor([[101, 2023, 102]]))
    assert len(calls) == 2
    run_training(cfg, tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "best" / "config.json").read_text())
    assert saved["num_hidden_layers"] == 2 and saved["exit_layers"] == [2]


def test_regression_stsb_trains_and_evaluates(tmp_path, minilm, glue_dir):
    run = tmp_path / "stsb"
    run_training(config(minilm, glue_dir, task="STS-B", method="2st", kd_weight=0.3), run)
    scores = read_scores(run)["best"]["exits"]
    assert {"pearson", "spearman", "score"} <= set(scores["1"])
    out = tmp_path / "eval"
    assert (
        main(
            [
                "evaluate",
                "--model",
                str(run / "best"),
                "--data-dir",
                str(glue_dir),
                "--output",
                str(out),
                "--max-length",
                "48",
                "--max-examples",
                "64",
                "--all-exits",
            ]
        )
        == 0
    )
    lines = (out / "predictions" / "STS-B.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 1379 + 1
    float(lines[1].split("\t")[1])
    assert (out / "predictions" / "layer_1" / "STS-B.tsv").is_file()
    assert set(json.loads((out / "dev_scores.json").read_text())["tasks"]["STS-B"]["exits"]) == {"1", "2"}


def test_evaluate_writes_curve_and_glue_submission(tmp_path, rte_run, glue_dir):
    # Real RTE dev; the first 300 rows of the real test file (the full 3,000 cost ~30 s on a busy 2-core box).
    data = tmp_path / "glue" / "RTE"
    data.mkdir(parents=True)
    (data / "dev.tsv").symlink_to(glue_dir / "RTE" / "dev.tsv")
    lines = (glue_dir / "RTE" / "test.tsv").read_text(encoding="utf-8").splitlines()
    (data / "test.tsv").write_text("\n".join(lines[:301]) + "\n", encoding="utf-8")
    out = tmp_path / "eval"
    assert (
        main(
            [
                "evaluate",
                "--model",
                str(rte_run / "best"),
                "--task",
                "RTE",
                "--data-dir",
                str(data.parent),
                "--output",
                str(out),
                "--max-length",
                "48",
                "--max-examples",
                "64",
            ]
        )
        == 0
    )
    result = json.loads((out / "dev_scores.json").read_text())
    assert set(result["tasks"]["RTE"]["exits"]) == {"1", "2"}
    assert (out / "layer_curve.png").stat().st_size > 1000
    rows = (out / "predictions" / "RTE.tsv").read_text().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == 301
    assert {r.split("\t")[1] for r in rows[1:]} <= {"entailment", "not_entailment"}
    assert [r.split("\t")[0] for r in rows[1:4]] == ["0", "1", "2"]


def test_plot_embeddings(tmp_path, rte_run, glue_dir):
    png = tmp_path / "emb.png"
    assert (
        main(
            [
                "plot-embeddings",
                "--model",
                str(rte_run / "best"),
                "--data-dir",
                str(glue_dir),
                "--layer",
                "1",
                "--max-examples",
                "40",
                "--max-length",
                "48",
                "--method",
                "pca",
                "--output",
                str(png),
            ]
        )
        == 0
    )
    arrays = np.load(png.with_suffix(".npz"))
    assert arrays["representations"].shape[0] == 40 and arrays["label_embeddings"].shape[0] == 2
    assert png.stat().st_size > 1000


def _error(capsys, argv):
    assert main(argv) == 2
    return capsys.readouterr().err


def test_cli_errors_are_clear(tmp_path, capsys, minilm, glue_dir, rte_run):
    base = ["train", "--data-dir", str(glue_dir), "--output", str(tmp_path / "o"), "--train-steps", "1"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no config.json" in _error(capsys, base + ["--model", str(empty), "--task", "RTE"])
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text((minilm / "config.json").read_text())
    err = _error(capsys, base + ["--model", str(tmp_path / "noweights"), "--task", "RTE"])
    assert "noweights" in err and "no model.safetensors" in err
    err = _error(capsys, base + ["--model", str(rte_run / "best"), "--task", "STS-B"])
    assert "num_labels mismatch" in err and "STS-B needs 1" in err
    assert "Did you mean 'MRPC'" in _error(capsys, base + ["--model", str(minilm), "--task", "MRCP"])
    assert "no 'train' split for task QNLI" in _error(capsys, base + ["--model", str(minilm), "--task", "QNLI"])
    assert "needs at least two exits" in _error(
        capsys, base + ["--model", str(minilm), "--task", "RTE", "--method", "2st"]
    )
    assert "regression" in _error(capsys, base + ["--model", str(minilm), "--task", "STS-B", "--objective", "acl"])
    assert "outside 1..6" in _error(capsys, base + ["--model", str(minilm), "--task", "RTE", "--exits", "2,9"])


def test_deepspeed_engine_runs_both_2st_stages(tmp_path, minilm, glue_dir, monkeypatch):
    pytest.importorskip("deepspeed")
    for key, value in (
        ("DS_ACCELERATOR", "cpu"),
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", str(free_port())),  # a fixed port collides with any other job on the machine
    ):
        monkeypatch.setenv(key, value)
    ds_config = tmp_path / "ds.json"
    ds_config.write_text(json.dumps({"zero_optimization": {"stage": 0}, "steps_per_print": 10**9}))
    out = tmp_path / "run"
    run_training(
        config(
            minilm,
            glue_dir,
            task="RTE",
            method="2st",
            objective="acl",
            acl_grad=True,
            acl_grad_scope="all",
            ds_config=str(ds_config),
        ),
        out,
    )
    assert set(read_scores(out)["best"]["exits"]) == {"1", "2"}
    assert json.loads((out / "acl_diagnostics.json").read_text())["batches"] == 2 * TINY["train_steps"]


def test_trains_from_our_pretraining_export(tmp_path, minilm, glue_dir, tokenizer):
    """An ElasticBERT export (our `save_pretrained` layout, as pre-training writes it) fine-tunes like MiniLM does."""
    from elasticbert import ElasticBertConfig, ElasticBertForPreTraining

    export = tmp_path / "export"
    cfg = ElasticBertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
    )
    ElasticBertForPreTraining(cfg).save_pretrained(export)
    tokenizer.save_pretrained(export)
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--model",
                str(export),
                "--task",
                "MRPC",
                "--data-dir",
                str(glue_dir),
                "--output",
                str(out),
                "--exits",
                "--exit-type",
                "mha",
                "--method",
                "alt",
                "--train-steps",
                "2",
                "--batch-size",
                "4",
                "--max-length",
                "32",
                "--max-train-examples",
                "16",
                "--max-dev-examples",
                "16",
                "--no-progress",
            ]
        )
        == 0
    )
    assert set(read_scores(out)["best"]["exits"]) == {"1", "2", "3"}


def test_train_options_come_from_the_config(monkeypatch, capsys):
    """Defaults and choices of `train` are the config's; booleans are --x/--no-x; each flag sets one key;
    --data-dir defaults to $GLUE_DIR."""
    from finetune.__main__ import build_parser
    from finetune.train.cli import config_from_args

    monkeypatch.delenv("GLUE_DIR", raising=False)
    base = ["train", "--model", "M", "--task", "RTE", "--output", "O"]
    cfg, sources = config_from_args(build_parser().parse_args(base))
    expected = FinetuneConfig()
    expected.model.path, expected.data.task = "M", "RTE"
    assert cfg == expected
    assert sources["model.path"] == "--model" and sources["optim.lr"] == "default"
    args = build_parser().parse_args(
        base
        + [
            "--acl-grad",
            "--no-log-angles",
            "--gradient-equilibrium",
            "--exits",
            "--no-progress",
            "--max-train-examples",
            "5",
            "--lambda",
            "0.1",
        ]
    )
    cfg, sources = config_from_args(args)
    obj = cfg.objective
    assert (obj.acl_grad, obj.log_angles, cfg.method.gradient_equilibrium, cfg.model.exits, cfg.train.progress) == (
        True,
        False,
        True,
        "all",
        False,
    )
    assert (cfg.data.max_train_examples, obj.lam, cfg.data.dir) == (5, 0.1, None)
    assert sources["objective.lam"] == "--lambda" and sources["data.max_train_examples"] == "--max-train-examples"
    monkeypatch.setenv("GLUE_DIR", "/data/glue")
    cfg, sources = config_from_args(build_parser().parse_args(base))
    assert cfg.data.dir == "/data/glue" and sources["data.dir"] == "$GLUE_DIR"
    for wrong in (["--acl-grad", "on"], ["--method", "2sr"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(base + wrong)
    assert "invalid choice: '2sr'" in capsys.readouterr().err


def test_loading_a_model_reads_its_config_json_once(monkeypatch, rte_run, minilm, glue_dir):
    """Building a run's model and loading a fine-tuned one each read and check config.json once."""
    import elasticbert.loading
    import finetune.model
    from finetune.model import load_finetuned

    reads = []
    original = elasticbert.loading.read_object

    def counting(path, *args, **kwargs):
        reads.append(str(path))
        return original(path, *args, **kwargs)

    monkeypatch.setattr(elasticbert.loading, "read_object", counting)
    assert finetune.model.read_config is elasticbert.loading.read_config  # the one reader, patched underneath
    load_finetuned(rte_run / "best")
    assert [p for p in reads if p.endswith("config.json")] == [str(rte_run / "best" / "config.json")]
    reads.clear()
    build_model(config(minilm, glue_dir, task="RTE", exits=[1, 2]), get_task("RTE"))
    assert [p for p in reads if p.endswith("config.json")] == [str(minilm / "config.json")]
