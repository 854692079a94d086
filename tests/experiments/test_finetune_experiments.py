"""The fine-tuning experiments (ACL ladder + gradient conflict, early-exit Pareto) end to end at smoke size on real
GLUE rows: every rung/task/seed/exit has a finite score, conflict fractions are fractions, every strategy has Pareto
points, and the PNGs and section drafts are written. ~2 CPU-minutes; the report scale is not run in CI."""

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GLUE = REPO.parent / "shared" / "data" / "glue"

RUNGS = ["2ST-linear", "2ST-MHA", "CE+SCL", "ACL-Embed", "+ACL-Grad", "+ACL-CL"]

pytestmark = pytest.mark.skipif(not GLUE.is_dir(), reason=f"GLUE data not found at {GLUE} (../shared/data absent)")


def run_script(name, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "experiments" / name), "--scale", "smoke", *map(str, args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    root = tmp_path_factory.mktemp("ladder")
    run_script("acl_ladder.py", "--work-dir", root / "work", "--output", root / "out")
    return root


@pytest.mark.slow
def test_acl_ladder_smoke(ladder):
    out = ladder / "out"
    results = json.loads((out / "results.json").read_text())
    assert [r["name"] for r in results["rungs"]] == RUNGS
    expected = {(t, r, s) for t in results["tasks"] for r in RUNGS for s in results["seeds"]}
    assert {(r["task"], r["rung"], r["seed"]) for r in results["runs"]} == expected
    for run in results["runs"]:
        assert run["status"] == "ok", run
        # every hyper-parameter is explicit (the trainer's defaults are not relied on); one dev evaluation per stage
        for flag in ("--lambda 0.02", "--tau 0.5", "--contrastive-reduction sum", "--eval-every 1000000", "--exit-lr"):
            assert flag in run["command"], (flag, run["command"])
        gated = "--acl-grad " in run["command"] + " "
        assert gated == (run["rung"] in ("+ACL-Grad", "+ACL-CL")), run["command"]
        assert set(run["per_exit"]) == {str(i) for i in range(1, 7)}
        assert all(math.isfinite(v) and 0 <= v <= 100 for v in run["per_exit"].values())
        assert math.isfinite(run["cross_layer_avg"]) and run["wall_s"] > 0
    for task in results["tasks"]:
        table = results["summary"]["table"][task]
        assert set(table) == set(RUNGS)
        assert all(math.isfinite(m) and math.isfinite(s) for e in table.values() for m, s in e["per_exit"].values())
        conflict = results["summary"]["conflict"][task]
        assert {"CE+SCL", "ACL-Embed"} <= set(conflict)
        for entry in conflict.values():
            for phase in entry.values():
                assert all(f is not None and 0.0 <= f <= 1.0 for f in phase["fraction_over_90"])
        assert results["summary"]["verdicts"][task]["verdict"].split(":")[0] in (
            "reproduced",
            "not reproduced",
            "inconclusive",
        )
    for png in ("per_exit_curves.png", "conflict_angles.png"):
        assert (out / png).stat().st_size > 1000
    assert "| +ACL-CL |" in (out / "section.md").read_text()

    # resumable: a second invocation trains nothing (every dev_scores.json exists) and gives the same table
    logs = {p: p.stat().st_size for p in (ladder / "work" / "logs").glob("*.log")}
    run_script("acl_ladder.py", "--work-dir", ladder / "work", "--output", ladder / "again")
    assert {p: p.stat().st_size for p in (ladder / "work" / "logs").glob("*.log")} == logs
    rerun = json.loads((ladder / "again" / "results.json").read_text())
    assert rerun["summary"]["table"] == results["summary"]["table"]


@pytest.mark.slow
def test_early_exit_pareto_smoke(ladder, tmp_path):
    run_script(
        "early_exit_pareto.py",
        "--ladder-results",
        ladder / "out" / "results.json",
        "--work-dir",
        tmp_path / "work",
        "--output",
        tmp_path / "out",
    )
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    for task, curve in results["curves"].items():
        assert len(curve["static"]) == 6
        for strategy in ("entropy", "patience", "pcee", "lte"):
            points = curve["strategies"][strategy]["points"]
            assert points and all(math.isfinite(p["mean_flops"]) and p["score"] is not None for p in points)
            assert results["pareto_fronts"][task][strategy]
            assert math.isfinite(results["elue"][strategy]["tasks"][task]["score"])
    assert (tmp_path / "out" / "pareto.png").stat().st_size > 1000
    assert "ELUE score" in (tmp_path / "out" / "section.md").read_text()


@pytest.fixture(scope="module")
def lambda_work(tmp_path_factory):
    """One --work-dir for both phases of acl_lambda.py, as a user runs them: the exit-lr phase's 2ST-MHA arm is the
    grid's (same command), found there and not trained again."""
    return tmp_path_factory.mktemp("acl_lambda") / "work"


@pytest.mark.slow
def test_acl_lambda_grid_smoke(tmp_path, lambda_work):
    """The λ grid's first arms at smoke size: each arm passes its λ and reduction to the trainer, the table pairs it
    with the baseline per seed, and partial results are on disk after every run."""
    run_script("acl_lambda.py", "--work-dir", lambda_work, "--output", tmp_path / "out")
    results = json.loads((tmp_path / "out" / "grid" / "results.json").read_text())
    assert [r["rung"] for r in results["runs"]] == ["2ST-MHA", "CE+SCL_mean_lam0.005", "ACL_mean_lam0.005"]
    for run in results["runs"][1:]:
        assert run["status"] == "ok" and "--lambda 0.005" in run["command"]
        assert "--contrastive-reduction mean" in run["command"]
    assert "--objective acl-cl" in results["runs"][2]["command"] and "--acl-grad " in results["runs"][2]["command"]
    rows = results["summary"]["rows"]
    assert rows["2ST-MHA"]["paired_diffs_vs_2st_mha"] == []
    base = results["runs"][0]["cross_layer_avg"]
    for run in results["runs"][1:]:
        assert rows[run["rung"]]["paired_diffs_vs_2st_mha"] == [pytest.approx(run["cross_layer_avg"] - base)]
    assert (tmp_path / "out" / "grid" / "lambda_grid.png").stat().st_size > 0
    assert results["verdict"].count("not run") == 2  # one λ per objective: no sensitivity verdict is claimed


@pytest.mark.slow
def test_acl_lambda_exit_lr_smoke(tmp_path, lambda_work):
    """`--phase exit-lr`: the arms at `--exit-lr same` pass it to the trainer and are paired with the baseline at the
    same exit learning rate, not with the default one."""
    run_script("acl_lambda.py", "--phase", "exit-lr", "--work-dir", lambda_work, "--output", tmp_path / "out")
    results = json.loads((tmp_path / "out" / "exit_lr" / "results.json").read_text())
    assert [r["rung"] for r in results["runs"]] == ["2ST-MHA", "ACL_mean_lam0.02", "2ST-MHA_exitlr-same"]
    assert "--exit-lr same" in results["runs"][2]["command"] and "--exit-lr 0.001" in results["runs"][0]["command"]
    rows = results["summary"]["rows"]
    assert rows["2ST-MHA_exitlr-same"]["paired_diffs_vs_2st_mha"] == []  # a baseline itself


def test_acl_lambda_reuses_only_identical_ladder_runs(tmp_path):
    """A ladder run enters the grid only when its command is the grid arm's command but for --output: a run at
    another λ, or another seed's command under this seed, is trained instead."""
    sys.path.insert(0, str(REPO))
    from experiments.acl_lambda import SCALES, TASK, Arm, ladder_runs, train_args

    base, work = SCALES["report"], tmp_path / "work"
    arm = Arm("ACL", 0.02, "sum", 1)

    def ladder_record(seed, lam=0.02, command_seed=None):
        scale = dataclasses.replace(arm.scale(base), lam=lam)
        args = train_args("M", TASK, arm.rung(), command_seed or seed, scale, tmp_path / "elsewhere")
        return {
            "task": TASK,
            "rung": "+ACL-CL",
            "seed": seed,
            "status": "ok",
            "command": "python -m finetune " + " ".join(args),
        }

    ladder = tmp_path / "ladder.json"
    records = [ladder_record(1), ladder_record(2, lam=0.1), ladder_record(3, command_seed=1)]
    ladder.write_text(json.dumps({"runs": records}))
    reused = ladder_runs("M", base, (1, 2, 3), work, ladder)
    assert list(reused) == [(arm.name, 1)]
    assert reused[(arm.name, 1)]["rung"] == arm.name and "ladder.json" in reused[(arm.name, 1)]["source"]
