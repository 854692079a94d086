"""ELUE score against a hand-computed table; file loading; submission files."""

import importlib.util
import json
from types import SimpleNamespace

import pytest
import torch

from finetune.score.elue import BaselineCurve, elue_score, load_baseline, load_curves, task_score
from finetune.score.submission import activation_trace, parse_activation_trace, write_submission
from finetune.tasks import DataError, get_task

# Baseline per-exit points (FLOPs, score). Task B is given unsorted on purpose.
BASELINE = {
    "SST-2": [(1.0, 70.0), (2.0, 80.0), (4.0, 84.0)],
    "MRPC": [(30.0, 50.0), (10.0, 40.0), (20.0, 46.0)],
}
SYSTEM = {
    # f=1.5 -> p_EB 75 (+3); f=3 -> 82 (-1); f=0.5 below range; f=5 above range
    "SST-2": [(1.5, 78.0), (3.0, 81.0), (0.5, 66.0), (5.0, 85.0)],
    # f=15 -> 43 (+2); f=25 -> 48 (-1); f=10 (end point, in range) -> 40 (+1)
    "MRPC": [(15.0, 45.0), (25.0, 47.0), (10.0, 41.0)],
}
# Hand-computed. Out of range on SST-2: below, clamp -> 70 (66-70 = -4), extrapolate along 70->80 (slope 10/FLOP)
# -> 65 (+1); above, clamp -> 84 (+1), extrapolate along 80->84 (slope 2) -> 86 (-1); drop -> left out.
EXPECTED = {
    "clamp": {"SST-2": (3 - 1 - 4 + 1) / 4, "MRPC": (2 - 1 + 1) / 3},
    "extrapolate": {"SST-2": (3 - 1 + 1 - 1) / 4, "MRPC": 2 / 3},
    "drop": {"SST-2": (3 - 1) / 2, "MRPC": 2 / 3},
}


@pytest.mark.parametrize("policy", list(EXPECTED))
def test_elue_score_hand_computed(policy):
    report = elue_score(BASELINE, SYSTEM, policy)
    for task, value in EXPECTED[policy].items():
        assert report["tasks"][task]["score"] == pytest.approx(value)
    assert report["score"] == pytest.approx(sum(EXPECTED[policy].values()) / 2)
    statuses = [p["status"] for p in report["tasks"]["SST-2"]["points"]]
    assert statuses == ["in", "in", "below", "above"]
    assert report["tasks"]["SST-2"]["dropped"] == (2 if policy == "drop" else 0)


def test_out_of_range_error_and_single_point_curve():
    with pytest.raises(ValueError, match="outside the baseline's range"):
        elue_score(BASELINE, SYSTEM, "error")
    # one point is not a curve (issue 28: it used to score every system against a flat line); nor is one FLOPs value
    for points in ([(5.0, 60.0)], [(5.0, 60.0), (5.0, 60.0)]):
        with pytest.raises(DataError, match="one point at FLOPs 5 is not a curve; a baseline needs the scores of at"):
            BaselineCurve.from_points(points)
    # duplicate FLOPs: the same score counts once; two different scores are refused, not averaged
    assert task_score([(1.0, 50.0), (1.0, 50.0), (3.0, 60.0)], [(2.0, 60.0)])["score"] == pytest.approx(5.0)
    with pytest.raises(DataError, match="two scores"):
        task_score([(1.0, 50.0), (1.0, 54.0), (3.0, 60.0)], [(2.0, 60.0)])


def test_task_names_match_across_spellings():
    report = elue_score({"elue/SST-2": BASELINE["SST-2"]}, {"sst2": [(2.0, 81.0)]})
    assert report["score"] == pytest.approx(1.0) and report["tasks_without_points"] == []
    with pytest.raises(ValueError, match="no baseline curve"):
        elue_score(BASELINE, {"RTE": [(1.0, 60.0)]})


def test_load_json_csv_and_early_exit_results(tmp_path):
    (tmp_path / "base.json").write_text(json.dumps({"tasks": {t: [list(p) for p in v] for t, v in BASELINE.items()}}))
    (tmp_path / "sys.csv").write_text(
        "system,task,flops,score\n" + "".join(f"mine,{t},{f},{s}\n" for t, v in SYSTEM.items() for f, s in v)
    )
    baseline = load_baseline([tmp_path / "base.json"])
    systems = load_curves(tmp_path / "sys.csv")
    assert elue_score(baseline, systems["mine"])["score"] == pytest.approx(sum(EXPECTED["clamp"].values()) / 2)

    result = {
        "format": "elasticbert-early-exit/1",
        "task": "SST-2",
        "static": [{"layer": 1, "mean_flops": 1.0, "score": 70.0}, {"layer": 2, "mean_flops": 2.0, "score": 80.0}],
        "strategies": {"entropy": {"points": [{"threshold": 0.1, "mean_flops": 1.5, "score": 76.0}]}},
    }
    (tmp_path / "run.json").write_text(json.dumps(result))
    assert load_curves(tmp_path / "run.json", role="baseline") == {"static": {"SST-2": [(1.0, 70.0), (2.0, 80.0)]}}
    points = load_curves(tmp_path / "run.json")
    assert elue_score(load_baseline([tmp_path / "run.json"]), points["entropy"])["score"] == pytest.approx(1.0)


def test_activation_trace_in_the_elue_papers_form():
    # the paper's example: a 10-token sample, hidden 768, through the embeddings, layer 1 and exit 1
    assert activation_trace((1,), 1, 10, 768) == "(10),emb; (10,768),layer_1; (768),exit_1"
    # exits only where the rule looked (exit 2 not run); an MHA exit reads the whole sequence
    assert activation_trace((1, 3), 3, 7, 64, "mha") == (
        "(7),emb; (7,64),layer_1; (7,64),exit_1; (7,64),layer_2; (7,64),layer_3; (7,64),exit_3"
    )
    assert parse_activation_trace("(10),emb; (10,768),layer_1; (768),exit_1") == [
        ((10,), "emb"),
        ((10, 768), "layer_1"),
        ((768,), "exit_1"),
    ]
    with pytest.raises(DataError, match="not an activation trace"):
        parse_activation_trace("emb; layer_1")


TINY_CONFIG = SimpleNamespace(
    vocab_size=50,
    hidden_size=16,
    num_hidden_layers=6,
    num_attention_heads=4,
    intermediate_size=32,
    max_position_embeddings=32,
    type_vocab_size=2,
    layer_norm_eps=1e-12,
    num_labels=1,
    exit_layers=[1, 2, 3, 4, 5, 6],
    exit_type="linear",
    exit_mha_dim=8,
    exit_mha_heads=2,
)


@pytest.mark.parametrize("exit_type", ["linear", "mha"])
def test_write_submission_files(tmp_path, exit_type):
    """A hand-made example: two STS-B test samples (9 and 14 tokens) leaving at exits 2 and 6."""
    task = get_task("STS-B")
    config = SimpleNamespace(**{**vars(TINY_CONFIG), "exit_type": exit_type})
    paths = write_submission(
        tmp_path,
        task,
        [0, 1],
        [1.23456, 4.0],
        [2, 6],
        [9, 14],
        [1e6, 2e6],
        [(1, 2), (1, 2, 3, 4, 5, 6)],
        {"a": 1},
        config,
    )
    names = ["STS-B.tsv", "STS-B_modules.tsv", "STS-B_exit_layer.tsv", "model.py", "submission.json"]
    assert [p.name for p in paths] == names
    assert (tmp_path / "STS-B.tsv").read_text() == "index\tprediction\n0\t1.235\n1\t4.000\n"
    assert (tmp_path / "STS-B_exit_layer.tsv").read_text() == (
        "index\texit_layer\tlength\tflops\n0\t2\t9\t1000000\n1\t6\t14\t2000000\n"
    )
    rows = (tmp_path / "STS-B_modules.tsv").read_text().splitlines()
    exit_in = "(9,16)" if exit_type == "mha" else "(16)"
    assert rows[:2] == [
        "index\tmodules",
        f"0\t(9),emb; (9,16),layer_1; {exit_in},exit_1; (9,16),layer_2; {exit_in},exit_2",
    ]
    assert rows[2].count("layer_") == 6 and rows[2].count("exit_") == 6
    assert json.loads((tmp_path / "submission.json").read_text()) == {"STS-B": {"a": 1}}

    # model.py runs on its own (torch only) and every traced module accepts its traced input shape
    spec = importlib.util.spec_from_file_location("submitted_model", tmp_path / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.CONFIG["exit_type"] == exit_type and module.CONFIG["hidden_size"] == 16
    modules = module.build()
    for row in rows[1:]:
        for shape, name in parse_activation_trace(row.split("\t")[1]):
            dtype = torch.long if name == "emb" else torch.float32
            out = modules[name](torch.zeros((1, *shape), dtype=dtype))
            expected = (1, 1) if name.startswith("exit_") else (1, shape[0], 16)
            assert tuple(out.shape) == expected, name


def test_a_points_file_with_no_points_is_refused(tmp_path):
    """A task listed with an empty list of points used to score nothing and exit 0."""
    from finetune.score.elue import read_curve_file

    empty = tmp_path / "points.json"
    empty.write_text(json.dumps({"name": "mine", "tasks": {"SST-2": []}}))
    with pytest.raises(DataError, match=r"points\.json: tasks\.SST-2: no points; a task lists its operating points"):
        read_curve_file(empty)
