"""Early exit said once (issue 39): one rule table (`elasticbert.exit_setting.RULES`) that every command reads and
fine-tuning registers LTE into, one setting record (`EarlyExitSetting`) that operating points and classifiers hold,
one check of a threshold on its way from `predict --threshold` to the rule's decision, and plots below early_exit."""

import argparse
import ast
import subprocess
import sys
from pathlib import Path

import pytest

import finetune.serve.loading as predict_module
from common.errors import ConfigError
from elasticbert import early_exit as engine
from elasticbert import exit_setting
from elasticbert.exit_setting import RULES, EarlyExitSetting, rule_names
from finetune.__main__ import build_parser, main
from finetune.serve.early_exit import PREDICT_STRATEGIES, STRATEGIES, LearnedExitRule, default_sweep
from finetune.serve.early_exit.operating_point import OperatingPoint

ROOT = Path(__file__).resolve().parents[2]


def _choices(argv0: str, option: str) -> tuple | None:
    command = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in command.choices[argv0]._actions if option in a.option_strings)
    return tuple(action.choices) if action.choices else None


def test_every_strategy_a_command_accepts_is_in_the_one_table():
    assert set(_choices("predict", "--strategy")) == set(RULES) == set(PREDICT_STRATEGIES)
    assert set(_choices("save-early-exit", "--strategy")) == set(RULES)
    assert STRATEGIES == rule_names(swept=True) and "static" not in STRATEGIES  # a sweep: every rule with a τ
    assert {"entropy", "maxprob", "patience", "pcee", "static", "lte"} <= set(RULES)
    for name, rule in RULES.items():
        assert rule.name == name and callable(rule.build)
        if rule.range is not None:  # every swept rule has its default grid, inside its range
            assert all(rule.range[0] <= tau <= rule.range[1] for tau in default_sweep(name, 2, 4))


def test_lte_is_registered_by_fine_tuning_not_rewrapped():
    lte = RULES["lte"]
    assert lte.side_model and lte.build.__module__ == "finetune.serve.early_exit.rules"
    assert "lte" not in rule_names(configurable=True)  # a config.json cannot carry its head
    assert all(RULES[n].build.__module__ == "elasticbert.early_exit" for n in rule_names(configurable=True))
    source = (ROOT / "finetune/serve/early_exit/rules.py").read_text(encoding="utf-8")
    for duplicate in ("THRESHOLD_RANGES", "def threshold_problem", "def check_strategy", "CLASSIFICATION_ONLY"):
        assert duplicate not in source
    with pytest.raises(ConfigError, match="strategy 'lte' cannot be saved in a config"):
        EarlyExitSetting("lte", 0.1).validated(in_config=True)
    assert LearnedExitRule.name == "lte"


def test_an_operating_point_is_a_setting_and_its_measurements():
    fields = {f for f in OperatingPoint.__dataclass_fields__}
    assert "setting" in fields and not fields & {"strategy", "threshold", "patience", "delta", "lte_head"}


def test_plots_is_below_early_exit():
    tree = ast.parse((ROOT / "finetune/plots.py").read_text(encoding="utf-8"))
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if "early_exit" in m]
    code = "import sys, finetune.plots; print(any(m.startswith('finetune.serve.early_exit') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    "message",
    [
        "chooses the threshold",
        "takes no threshold",
        "needs --strategy",
        "needs a trained LearnedExitHead",
        "needs class probabilities",
        "threshold must be a number",
        "cannot be saved in a config",
    ],
)
def test_each_message_is_written_once(message):
    files = [*ROOT.glob("elasticbert/*.py"), *ROOT.glob("finetune/*.py"), *ROOT.glob("finetune/serve/early_exit/*.py")]
    written = [p for p in files if any(message in s for s in _strings(p))]
    assert len(written) == 1 and sum(s.count(message) for s in _strings(written[0])) == 1, (message, written)


def _strings(path: Path) -> list[str]:
    """The string literals (f-string parts included) of a module, docstrings left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Module | ast.FunctionDef | ast.ClassDef) and n.body and isinstance(n.body[0], ast.Expr)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


@pytest.fixture
def checks(monkeypatch):
    """Counts the calls of the setting check (`EarlyExitSetting.problems`) and of the range and degeneracy checks of
    a threshold, by their code objects (whatever name a module imported them under), and the thresholds an entropy
    rule decides with."""
    seen = {"checked": 0, "ranged": 0, "degenerate": 0, "decided": set()}
    counted = {
        EarlyExitSetting.problems.__code__: "checked",
        exit_setting.threshold_problem.__code__: "ranged",
        exit_setting.degenerate_problem.__code__: "degenerate",
    }
    decide = engine.EntropyRule.decide

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in counted:
            seen[counted[frame.f_code]] += 1

    def spied(self, *args):
        seen["decided"].add(self.threshold)
        return decide(self, *args)

    monkeypatch.setattr(engine.EntropyRule, "decide", spied)
    sys.setprofile(profile)
    yield seen
    sys.setprofile(None)


def test_predict_threshold_is_checked_once_on_its_way_to_the_decision(saved_model, tmp_path, checks):
    texts = tmp_path / "in.txt"
    texts.write_text("a fine film\nnot a good one\n", encoding="utf-8")
    argv = ["predict", "--model", str(saved_model), "--input", str(texts), "--no-progress"]
    assert main([*argv, "--strategy", "entropy", "--threshold", "0.25", "--output", str(tmp_path / "o.jsonl")]) == 0
    assert checks == {"checked": 1, "ranged": 1, "degenerate": 1, "decided": {0.25}}


def test_a_bad_threshold_is_refused_once_before_the_model_loads(saved_model, tmp_path, checks, capsys, monkeypatch):
    monkeypatch.setattr(predict_module, "load_finetuned", lambda *a, **k: pytest.fail("the model was loaded"))
    texts = tmp_path / "in.txt"
    texts.write_text("a fine film\n", encoding="utf-8")
    argv = ["predict", "--model", str(saved_model), "--input", str(texts), "--no-progress"]
    for threshold, message in [
        ("-1", "entropy threshold -1: must be an entropy in nats, >= 0"),
        ("0.6931", "at most ln 2"),
        ("nan", "entropy threshold nan"),
    ]:
        checks.update(checked=0, ranged=0, degenerate=0)
        capsys.readouterr()
        assert main([*argv, "--strategy", "entropy", "--threshold", threshold]) == 2
        err = capsys.readouterr().err
        assert err.count(message) == 1 and checks["checked"] == checks["ranged"] == 1, (threshold, err)
