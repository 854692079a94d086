"""bench/gpu/gpu_check.sh runs end to end (CPU smoke mode, toy sizes, `--fast`: what a lent GPU runs first): the GPU
tests, the trainer-vs-model bench and the report, which ends with the one table of checks."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "bench" / "gpu" / "gpu_check.sh")


def test_gpu_check_fast_runs_on_the_cpu_and_ends_with_the_table(tmp_path):
    out = tmp_path / "gpu_check"
    run = subprocess.run(
        ["bash", SCRIPT, str(out), "--fast", "--cpu"], cwd=REPO, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    results = json.loads((out / "gpu_check.json").read_text())
    states = {c["test"]: c["state"] for c in results["tests"]["cases"]}
    assert states == {
        "test_the_preflight_passes_on_this_node": "passed",
        "test_deepspeed_steps_train_and_resume_exactly[bf16-False]": "passed",
        "test_deepspeed_steps_train_and_resume_exactly[fp16-False]": "skipped",  # no fp16 DeepSpeed on a CPU
        "test_the_export_loads": "passed",
        "test_early_exit_agrees_between_cpu_and_gpu": "passed",
    }
    (overhead,) = results["overhead"]
    assert overhead["precision"] == "bf16" and overhead["ratio"] > 0
    assert overhead["syncs"]["trainer"]["per_step"]["trainer"] == [1, 1]  # the one read of the step's sums
    assert "pretrain" not in results and "early_exit" not in results  # --fast: no model bench
    assert {name for name, _, code in results["parts"] if code == 0} == {"corpus", "tests", "overhead", "onnx-cuda"}
    assert json.loads((out / "onnx_cuda.json").read_text())["rows"]  # the one-file ONNX part ran (CPU provider)
    table = (out / "gpu_check.md").read_text().strip().splitlines()
    assert table[-1].startswith("| part: onnx-cuda | pass")  # the report ends with the table
    rows = "\n".join(table)
    assert "| preflight on this node (pretrain preflight) | pass |" in rows
    assert "| trainer step ÷ model step (bf16, h64 L4, seq 64, micro 4 x 2) |" in rows
    assert "| host syncs per step: trainer's code / model / DeepSpeed | pass: 1 / " in rows
    assert run.stdout.strip().splitlines()[-1].startswith("gpu_check fast: ")


def test_gpu_check_modes_and_a_wrong_option():
    fast = subprocess.run(["bash", SCRIPT, "/unused", "--fast", "--list"], capture_output=True, text=True, timeout=30)
    full = subprocess.run(["bash", SCRIPT, "/unused", "--list"], capture_output=True, text=True, timeout=30)
    assert fast.stdout.strip() == "gpu_check fast on cuda: corpus tests overhead onnx-cuda report"
    assert full.stdout.strip() == (
        "gpu_check full on cuda: corpus fused-adam-build tests overhead onnx-cuda model-bench report"
    )
    wrong = subprocess.run(["bash", SCRIPT, "/unused", "--quick"], capture_output=True, text=True, timeout=30)
    assert wrong.returncode == 2 and "unknown option --quick" in wrong.stderr


def test_the_python_our_shell_scripts_import_exists():
    """The `python -c` lines of our shell scripts import what they name. Some run only on a CUDA node (the FusedAdam
    build of `gpu_check.sh`'s full mode), so no CPU run would notice a name that moved: one did, when
    `quiet_deepspeed` went from `pretrain.ds_runtime` to `common.deepspeed_import`."""
    import importlib
    import re

    ours = ("bench", "common", "data_prep", "elasticbert", "finetune", "pretrain")
    scripts = subprocess.run(["git", "ls-files", "*.sh"], cwd=REPO, capture_output=True, text=True, check=True)
    checked = []
    for name in scripts.stdout.split():
        for module, names in re.findall(r"from ([\w.]+) import ([\w, ]+)", (REPO / name).read_text()):
            if module.split(".")[0] in ours:
                imported = importlib.import_module(module)
                for attr in (a.strip() for a in names.split(",") if a.strip()):
                    assert hasattr(imported, attr), f"{name}: {module} has no {attr}"
                    checked.append(f"{module}.{attr}")
    assert "common.deepspeed_import.quiet_deepspeed" in checked and "pretrain.ds_runtime.set_op_build_arch" in checked
