"""`early-exit` and `elue-score` end to end on a saved model and a small copy of real GLUE rows (in tmp_path)."""

import argparse
import json
import shutil

import pytest

from elasticbert import minilm_dir
from finetune import early_exit, elue

ROWS = {"train": 49, "dev": 17, "test": 9}  # header + rows


@pytest.fixture(scope="module")
def saved_model(classifier, tmp_path_factory):
    directory = tmp_path_factory.mktemp("model")
    classifier.save_pretrained(directory)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm_dir() / name, directory / name)
    return directory


@pytest.fixture(scope="module")
def small_glue(glue_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("glue")
    (root / "SST-2").mkdir()
    for split, n in ROWS.items():
        lines = (glue_dir / "SST-2" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[:n]
        (root / "SST-2" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def _parser():
    parser = argparse.ArgumentParser(prog="python -m finetune")
    sub = parser.add_subparsers(dest="command", required=True)
    early_exit.add_subparser(sub)
    elue.add_subparser(sub)
    return parser


def test_early_exit_then_elue_score_and_submission(saved_model, small_glue, tmp_path, capsys):
    out = tmp_path / "run"
    common = ["--model", str(saved_model), "--task", "SST-2", "--data-dir", str(small_glue), "--out", str(out)]
    runs = [["lte", "--sweep", "0.3,0.6"], ["patience", "--sweep", "0,5"], ["entropy,maxprob,pcee"]]
    for run in runs:  # each run keeps the others' points (one JSON, one plot)
        args = _parser().parse_args(["early-exit", *common, "--batch-size", "8", "--strategy", *run])
        assert args.func(args) == 0

    stem = out / "early_exit_SST-2_dev_bs8"
    results = json.loads(stem.with_suffix(".json").read_text())
    assert stem.with_suffix(".png").stat().st_size > 10_000
    assert set(results["strategies"]) == set(early_exit.STRATEGIES)
    assert len(results["strategies"]["entropy"]["points"]) == 7  # the default sweep
    assert [p["threshold"] for p in results["strategies"]["patience"]["points"]] == [0, 5]
    assert [p["layer"] for p in results["static"]] == [1, 2, 3, 4, 5, 6]
    assert results["full_model"]["score"] == results["static"][-1]["score"]
    for entry in results["strategies"].values():
        for point in entry["points"]:
            assert sum(point["exit_histogram"].values()) == ROWS["dev"] - 1
            assert point["flops_speedup"] > 0.99 and point["wall_time_s"] > 0  # < 1: all heads ran, none exited
    assert (out / "lte_head_SST-2.safetensors").is_file()
    samples = (out / "samples" / "patience_5.tsv").read_text().splitlines()
    assert samples[0].split("\t") == ["index", "prediction", "label", "exit_layer", "length", "flops", "exits_run"]
    assert len(samples) == ROWS["dev"]

    report_path = tmp_path / "elue.json"
    sub_dir = tmp_path / "submission"
    run_json = str(stem.with_suffix(".json"))
    args = _parser().parse_args(
        [
            "elue-score",
            "--baseline",
            run_json,
            "--points",
            run_json,
            "--out",
            str(report_path),
            "--system",
            "patience",
            "--write-submission",
            str(sub_dir),
        ]
    )
    assert args.func(args) == 0
    report = json.loads(report_path.read_text())["patience"]
    assert set(report["tasks"]) == {"SST-2"} and report["score"] is not None
    assert "ELUE score" in capsys.readouterr().out
    point_dirs = sorted(p.name for p in sub_dir.iterdir())
    assert point_dirs == ["patience_0", "patience_5"]
    predictions = (sub_dir / "patience_0" / "SST-2.tsv").read_text().splitlines()
    assert predictions[0] == "index\tprediction" and len(predictions) == ROWS["test"]
    assert all(line.split("\t")[1] in ("0", "1") for line in predictions[1:])
    exits = (sub_dir / "patience_0" / "SST-2_exit_layer.tsv").read_text().splitlines()[1:]
    assert {line.split("\t")[1] for line in exits} == {"1"}  # patience 0 exits at the first exit
    meta = json.loads((sub_dir / "patience_5" / "submission.json").read_text())["SST-2"]
    assert meta["strategy"] == "patience" and meta["test_exit_histogram"]["6"] == ROWS["test"] - 1


def test_cli_rejects_bad_requests(saved_model, small_glue, tmp_path):
    common = ["--model", str(saved_model), "--task", "SST-2", "--data-dir", str(small_glue), "--out", str(tmp_path)]
    args = _parser().parse_args(["early-exit", *common, "--strategy", "entropy,maxprob", "--sweep", "0.1"])
    with pytest.raises(SystemExit, match="exactly one"):
        args.func(args)
    args = _parser().parse_args(["early-exit", *common, "--task", "STS-B"])
    with pytest.raises(SystemExit, match="labels"):
        args.func(args)
