"""bench/gpu_check.sh runs end to end (CPU smoke mode, toy sizes): the GPU tests, the benchmark and the report."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_script_runs_on_the_cpu(tmp_path):
    out = tmp_path / "gpu_check"
    run = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu_check.sh"), str(out), "--cpu"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    results = json.loads((out / "gpu_check.json").read_text())
    states = {c["test"]: c["state"] for c in results["tests"]["cases"]}
    assert states["test_deepspeed_steps_train_and_resume_exactly[bf16-False]"] == "passed"
    assert states["test_early_exit_agrees_between_cpu_and_gpu"] == "passed"
    assert states["test_the_preflight_passes_on_this_node"] == "passed"  # first contact runs first
    assert "preflight ok: 1 node(s) agree" in (out / "first_contact.log").read_text()
    assert {(r["seq"], r["groups"], r["compiled"]) for r in results["pretrain"]} == {
        (32, 1, False),
        (32, 2, False),
        (32, 2, True),
    }
    assert all(r["tokens_per_s"] > 0 for r in results["pretrain"])
    assert {r["batch"] for r in results["early_exit"]} == {1, 32}
    assert all(r["flops_speedup"] >= 1 for r in results["early_exit"])
    report = (out / "gpu_check.md").read_text()
    assert "| seq | G | compiled |" in report and "train.compile step" in report
