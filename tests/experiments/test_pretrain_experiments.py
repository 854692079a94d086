"""Smoke scale of experiments 1 and 2 end to end (real Gutenberg + GLUE from ../shared/data, MiniLM weights).

One seed and a shared work dir (experiment 2 reuses experiment 1's G=2 arm, as at report scale) keep it near two
minutes; the report scale runs the same code with more steps, examples, layers and seeds.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from experiments.pretrain_lab import data_available  # noqa: E402

pytestmark = pytest.mark.skipif(data_available() is not None, reason=str(data_available()))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("exp_pretrain")


def run_script(module: str, work: Path, out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            module,
            "--scale",
            "smoke",
            "--work-dir",
            str(work / "work"),
            "--output",
            str(out),
            "--seeds",
            "1",
        ],
        cwd=REPO,
        env=env,
        check=True,
        timeout=600,
    )
    return json.loads((out / "results.json").read_text())


def finite(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def test_pretrain_exits_smoke(work):
    out = work / "out_pretrain_exits"
    results = run_script("experiments.pretrain_exits", work, out)
    layers = results["settings"]["layers"]
    for task in ("SST-2", "MRPC"):
        for model in ("multi_exit_G2", "last_layer_only", "minilm"):
            for layer in layers:
                row = results["summary"][task][model][str(layer)]
                assert row["seeds"] == [1] and all(finite(s) for s in row["scores"]), (task, model, layer, row)
    for by_seed in results["pretrain"].values():
        assert all(finite(t) for t in by_seed["1"]["step_time_s"])
    assert (out / "per_layer_dev.png").stat().st_size > 0
    assert "Verdict" in (out / "section.md").read_text()


def test_grouping_smoke(work):
    out = work / "out_grouping"
    results = run_script("experiments.grouping", work, out)
    for arm in ("G2_equal_steps", "G1_equal_steps", "G1_equal_time"):
        run = results["runs"][arm]["1"]
        assert len(run["heldout"]["mlm_loss"]) == 6 and all(finite(x) for x in run["heldout"]["mlm_loss"]), arm
        assert finite(run["pretrain"]["median_step_s"]) and run["steps"] >= 1
    assert results["runs"]["G1_equal_steps"]["1"]["pretrain"]["active_exits"][0] == [1, 2, 3, 4, 5, 6]
    assert results["runs"]["G2_equal_steps"]["1"]["pretrain"]["active_exits"][:2] == [[1, 3, 5, 6], [2, 4, 6]]
    for png in ("heldout_mlm_loss.png", "step_time.png"):
        assert (out / png).stat().st_size > 0
