"""`early-exit`, `elue-score` and `submission` end to end on a saved model and a small copy of real GLUE rows (in
tmp_path); the renamed options parse."""

import json

import pytest

from common.errors import ConfigError, UserError
from elasticbert import minilm_dir
from finetune.__main__ import build_parser
from finetune.serve import early_exit
from finetune.serve.early_exit import SweepConfig


def _parser():
    return build_parser()


def test_early_exit_then_elue_score_and_submission(saved_model, small_glue, small_glue_rows, tmp_path, capsys):
    rows = small_glue_rows
    out = tmp_path / "run"
    common = ["--model", str(saved_model), "--task", "SST-2", "--data-dir", str(small_glue), "--output", str(out)]
    runs = [["lte", "--sweep", "0.3,0.6"], ["patience", "--sweep", "1,4"], ["entropy,maxprob,pcee"]]
    for run in runs:  # each run keeps the others' points (one JSON, one plot)
        args = _parser().parse_args(["early-exit", *common, "--batch-size", "8", "--strategy", *run])
        assert args.func(args) == 0

    stem = out / "early_exit_SST-2_dev_bs8"
    results = json.loads(stem.with_suffix(".json").read_text())
    assert stem.with_suffix(".png").stat().st_size > 10_000
    assert set(results["strategies"]) == set(early_exit.STRATEGIES)
    assert len(results["strategies"]["entropy"]["points"]) == 7  # the default sweep
    assert [p["threshold"] for p in results["strategies"]["patience"]["points"]] == [1, 4]
    assert [p["layer"] for p in results["static"]] == [1, 2, 3, 4, 5, 6]
    assert results["full_model"]["score"] == results["static"][-1]["score"]
    for entry in results["strategies"].values():
        for point in entry["points"]:
            assert sum(point["exit_histogram"].values()) == rows["dev"] - 1
            assert point["flops_speedup"] > 0.99 and point["wall_time_s"] > 0  # < 1: all heads ran, none exited
    assert (out / "lte_head_SST-2.safetensors").is_file()
    samples = (out / "samples" / "patience_4.tsv").read_text().splitlines()
    assert samples[0].split("\t") == ["index", "prediction", "label", "exit_layer", "length", "flops", "exits_run"]
    assert len(samples) == rows["dev"]

    report_path = tmp_path / "elue.json"
    run_json = str(stem.with_suffix(".json"))
    args = _parser().parse_args(
        [
            "elue-score",
            "--baseline",
            run_json,
            "--points",
            run_json,
            "--output",
            str(report_path),
            "--system",
            "patience",
        ]
    )
    assert args.func(args) == 0
    report = json.loads(report_path.read_text())["patience"]
    assert set(report["tasks"]) == {"SST-2"} and report["score"] is not None
    assert "ELUE score" in capsys.readouterr().out

    sub_dir = tmp_path / "submission"
    args = _parser().parse_args(
        ["submission", "--results", run_json, "--output", str(sub_dir), "--strategy", "patience"]
    )
    assert args.func(args) == 0
    point_dirs = sorted(p.name for p in sub_dir.iterdir())
    assert point_dirs == ["patience_1", "patience_4"]
    files = sorted(p.name for p in (sub_dir / "patience_1").iterdir())
    assert files == ["SST-2.tsv", "SST-2_exit_layer.tsv", "SST-2_modules.tsv", "model.py", "submission.json"]
    predictions = (sub_dir / "patience_1" / "SST-2.tsv").read_text().splitlines()
    assert predictions[0] == "index\tprediction" and len(predictions) == rows["test"]
    assert all(line.split("\t")[1] in ("0", "1") for line in predictions[1:])
    exits = (sub_dir / "patience_1" / "SST-2_exit_layer.tsv").read_text().splitlines()
    assert exits[0] == "index\texit_layer\tlength\tflops"
    layers = {line.split("\t")[0]: int(line.split("\t")[1]) for line in exits[1:]}
    assert min(layers.values()) >= 2  # patience 1: two exits must agree first
    lengths = {line.split("\t")[0]: line.split("\t")[2] for line in exits[1:]}
    modules = (sub_dir / "patience_1" / "SST-2_modules.tsv").read_text().splitlines()
    assert modules[0] == "index\tmodules" and len(modules) == rows["test"]
    for line in modules[1:]:  # ELUE's trace: (L),emb; (L,H),layer_1; (H),exit_1; ... with the sample's real length
        index, trace = line.split("\t")
        length = lengths[index]
        layer_by_layer = [f"({length},384),layer_{i}; (384),exit_{i}" for i in range(1, layers[index] + 1)]
        assert trace == f"({length}),emb; " + "; ".join(layer_by_layer)
    meta = json.loads((sub_dir / "patience_4" / "submission.json").read_text())["SST-2"]
    assert meta["strategy"] == "patience" and sum(meta["test_exit_histogram"].values()) == rows["test"] - 1
    assert meta["split"] == "test" and meta["num_samples"] == rows["test"] - 1

    # a task's files from another early-exit result (another model) are never mixed into the same folder
    other_json = tmp_path / "other.json"
    other = json.loads((tmp_path / "run" / "early_exit_SST-2_dev_bs8.json").read_text())
    other["identity"] = {**other["identity"], "weights_sha256": "0" * 64}
    other_json.write_text(json.dumps(other))
    before = (sub_dir / "patience_4" / "SST-2.tsv").read_bytes()
    args = _parser().parse_args(["submission", "--results", str(other_json), "--output", str(sub_dir)])
    with pytest.raises(ConfigError, match="holds SST-2's submission files of another early-exit result"):
        args.func(args)
    assert (sub_dir / "patience_4" / "SST-2.tsv").read_bytes() == before
    args = _parser().parse_args(
        ["submission", "--results", run_json, "--output", str(sub_dir), "--strategy", "patience"]
    )
    assert args.func(args) == 0  # the same result again: rewritten, fine
    replace = ["submission", "--results", str(other_json), "--output", str(sub_dir), "--strategy", "entropy"]
    args = _parser().parse_args([*replace, "--overwrite"])
    assert args.func(args) == 0
    assert not (sub_dir / "patience_4" / "SST-2.tsv").exists()  # the other result's SST-2 files are gone
    assert json.loads((sub_dir / "patience_4" / "submission.json").read_text()) == {}

    # the LTE points of the merged result keep their head: all strategies write their files
    every = tmp_path / "every"
    args = _parser().parse_args(["submission", "--results", run_json, "--output", str(every)])
    assert args.func(args) == 0
    assert {p.name.split("_")[0] for p in every.iterdir()} == set(early_exit.STRATEGIES)


def test_cli_rejects_bad_requests(saved_model, small_glue, tmp_path, capsys):
    common = ["--model", str(saved_model), "--task", "SST-2", "--data-dir", str(small_glue), "--output", str(tmp_path)]
    args = _parser().parse_args(["early-exit", *common, "--strategy", "entropy,maxprob", "--sweep", "0.1"])
    with pytest.raises(ConfigError, match="exactly one"):
        args.func(args)
    args = _parser().parse_args(["early-exit", *common, "--task", "STS-B"])
    with pytest.raises(UserError, match="--task STS-B needs a regression value, but .* has a head of 2 labels"):
        args.func(args)
    # through `python -m finetune`: a message and exit 2, no traceback
    from finetune.__main__ import main

    assert main(["early-exit", *common, "--strategy", "magic"]) == 2
    assert "unknown strategy 'magic'" in capsys.readouterr().err
    # a model without trained exits is refused (early exit needs them)
    assert main(["early-exit", *common, "--model", str(minilm_dir())]) == 2
    assert "not a fine-tuned classifier" in capsys.readouterr().err


def test_renamed_options_parse(monkeypatch, tmp_path):
    """The CLI convention: --output, --max-*-examples, --x/--no-x, one --data-dir default, defaults from the
    config dataclasses."""
    monkeypatch.setenv("GLUE_DIR", str(tmp_path))
    args = _parser().parse_args(
        [
            "early-exit",
            "--model",
            "M",
            "--task",
            "SST-2",
            "--output",
            "O",
            "--max-examples",
            "10",
            "--max-lte-examples",
            "20",
            "--no-merge",
            "--train-lte",
        ]
    )
    assert (args.output, args.max_examples, args.max_lte_examples, args.merge, args.train_lte) == (
        "O",
        10,
        20,
        False,
        True,
    )
    assert args.data_dir == str(tmp_path)
    defaults = SweepConfig()
    assert (args.batch_size, args.repeats, args.patience, args.delta) == (
        defaults.batch_size,
        defaults.repeats,
        defaults.patience,
        defaults.delta,
    )
    args = _parser().parse_args(["elue-score", "--baseline", "b.json", "--points", "p.json", "--output", "r.json"])
    assert args.output == "r.json" and args.out_of_range == "clamp"
    args = _parser().parse_args(["submission", "--results", "r.json", "--output", "D"])
    assert (args.results, args.output, args.strategy, args.split) == ("r.json", "D", None, "test")
    monkeypatch.delenv("GLUE_DIR")
    args = _parser().parse_args(["evaluate", "--model", "M", "--output", "O", "--no-test", "--all-exits"])
    assert args.data_dir is None and args.test is False and args.all_exits is True
    for gone in (
        ["early-exit", "--model", "M", "--task", "T", "--limit", "3"],
        ["elue-score", "--baseline", "b", "--points", "p", "--write-submission", "D"],
    ):
        with pytest.raises(SystemExit):
            _parser().parse_args(gone)
