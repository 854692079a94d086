"""Choosing an operating point of an early-exit result by a rule (`RESULT.json[:RULE]`), on a hand-made result."""

import json

import pytest

from common.errors import ConfigError
from finetune.serve.early_exit import RESULT_FORMAT, choose_operating_point
from finetune.tasks import DataError

FULL = {"layer": 6, "score": 90.0, "mean_flops": 100.0}
STRATEGIES = {
    "entropy": {
        "params": {"patience": 2, "delta": 0.1},
        "points": [
            {"threshold": 0.05, "score": 90.2, "mean_flops": 80.0},
            {"threshold": 0.1, "score": 89.5, "mean_flops": 60.0},
            {"threshold": 0.3, "score": 88.0, "mean_flops": 40.0},
        ],
    },
    "patience": {
        "params": {"patience": 2, "delta": 0.1},
        "points": [{"threshold": 1, "score": 89.2, "mean_flops": 55.0}],
    },
    "pcee": {
        "params": {"patience": 3, "delta": 0.1},
        "points": [{"threshold": 0.2, "patience": 3.0, "score": 85.0, "mean_flops": 30.0}],
    },
}


@pytest.fixture
def result(tmp_path):
    path = tmp_path / "r.json"
    data = {"format": RESULT_FORMAT, "task": "SST-2", "model": "m", "max_length": 64, "full_model": FULL}
    path.write_text(json.dumps({**data, "strategies": STRATEGIES}))
    return path


@pytest.mark.parametrize(
    "rule,strategy,want",
    [
        ("fastest-within=1.0", None, ("patience", 1.0)),  # 89.2 >= 89: the fewest FLOPs among 89.5, 89.2, 90.2, 90
        ("fastest-within=1", "entropy", ("entropy", 0.1)),
        ("fastest-within=0", None, ("entropy", 0.05)),  # scores as well as the full model, cheaper
        ("fastest-within=2.5", None, ("entropy", 0.3)),
        ("fastest-within=10", None, ("pcee", 0.2)),
        ("best", None, ("entropy", 0.05)),
        ("entropy=0.3", None, ("entropy", 0.3)),
        ("fastest-within=0", "static", ("static", None)),  # the full model is a point of every result
    ],
)
def test_rules_pick_the_point_they_name(result, rule, strategy, want):
    point = choose_operating_point(f"{result}:{rule}", strategy)
    assert (point.setting.strategy, point.setting.threshold) == want
    assert point.max_length == 64 and point.full_score == 90.0 and point.full_flops == 100.0


def test_the_point_carries_its_parameters_and_the_default_rule(result):
    pcee = choose_operating_point(f"{result}:pcee=0.2")
    assert (pcee.setting.patience, pcee.score, pcee.mean_flops) == (3, 85.0, 30.0)
    assert "pcee τ=0.2" in pcee.describe() and "x3.33 fewer" in pcee.describe()
    default = choose_operating_point(str(result))  # fastest-within=1.0
    assert (default.setting.strategy, default.setting.threshold) == ("patience", 1.0)
    assert "fastest-within=1.0" in default.source


def test_bad_rules_and_results_are_named(result, tmp_path):
    for spec, error, message in [
        (f"{result}:entropy=0.2", DataError, "no entropy point at threshold 0.2 (the sweep's: 0.05, 0.1, 0.3)"),
        (f"{result}:fastest", ConfigError, "expected fastest-within=D, best, or STRATEGY=THRESHOLD"),
        (f"{result}:fastest-within=-1", ConfigError, "the margin must be >= 0"),
        (f"{result}:fastest-within=x", ConfigError, "margin must be a finite number"),
        (f"{result}:fastest-within=0", DataError, "no pcee point scores within 0 of the full model's 90.00"),
        (f"{tmp_path / 'missing.json'}:best", DataError, "missing.json: no such file"),
    ]:
        with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
            choose_operating_point(spec, "pcee" if "within=0" in spec else None)
    with pytest.raises(ConfigError, match="has only entropy, patience, pcee"):
        choose_operating_point(str(result), "maxprob")
    foreign = tmp_path / "foreign.json"
    foreign.write_text('{"tasks": {}}')
    with pytest.raises(DataError, match="not an early-exit result"):
        choose_operating_point(str(foreign))
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": ')
    with pytest.raises(DataError, match="broken.json:1:12: not valid JSON"):
        choose_operating_point(str(broken))
    unlabelled = tmp_path / "unlabelled.json"
    data = json.loads(result.read_text())
    data["full_model"]["score"] = None
    unlabelled.write_text(json.dumps(data))
    with pytest.raises(DataError, match="no scores"):
        choose_operating_point(f"{unlabelled}:best")
    assert choose_operating_point(f"{unlabelled}:entropy=0.1").setting.threshold == 0.1
    data["full_model"]["mean_flops"] = 0
    unlabelled.write_text(json.dumps(data))
    with pytest.raises(DataError, match="full_model.*'mean_flops' must be a number > 0"):
        choose_operating_point(f"{unlabelled}:entropy=0.1")
