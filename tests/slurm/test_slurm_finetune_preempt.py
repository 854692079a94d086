"""slurm/finetune_glue.sh with the REAL `finetune train` on the local Slurm cluster (see conftest.py): the signal
Slurm sends before a time limit (SIGUSR1 to the batch shell, `--signal=B:USR1@300`) is forwarded to the trainer, which
saves a resume checkpoint and exits 75; slurm/common.sh requeues the array task; the restarted task resumes and ends
with the weights and dev scores of an uninterrupted run of the same command, bit for bit (issue 38, class 7)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from finetune_preemption import results
from requirements import GLUE, require_data

REPO = Path(__file__).resolve().parents[2]
STEPS = 60
# a run of ~20-40 s on one CPU: long enough to be signalled in the middle of it
ARGS = ["--exits", "1,2", "--max-length", "32", "--batch-size", "4", "--max-train-examples", "24"]
ARGS += ["--max-dev-examples", "16", "--train-steps", str(STEPS), "--eval-every", "20", "--no-progress"]


def sbatch_directives(path: Path) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^#SBATCH\s+(\S+)", path.read_text(), re.M)]


def test_finetune_glue_asks_for_the_preemption_signal_and_requeues():
    """Static: the early warning the trainer needs (USR1 300 s before the limit, to the batch shell that forwards
    it) and the requeue permission."""
    d = sbatch_directives(REPO / "slurm" / "finetune_glue.sh")
    assert "--signal=B:USR1@300" in d and "--requeue" in d and "--open-mode=append" in d
    text = (REPO / "slurm" / "finetune_glue.sh").read_text()
    assert re.search(r"^eb_run_preemptible .*-m \"\$\{FINETUNE_MODULE:-finetune\}\"", text, re.M)


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_finetune_glue_preempted_requeues_and_resumes_bit_identical(slurm_cluster, tmp_path):
    from elasticbert import minilm_dir

    require_data(GLUE / "RTE")
    model = str(minilm_dir())
    ft_out = tmp_path / "ft"
    env = slurm_cluster.env(TASKS="RTE", SEEDS="1", FT_OUT=ft_out, MODEL=model, DATA_DIR=GLUE)
    submit = ["bash", "slurm/finetune_glue.sh", "submit", "--gpus-per-node=1", "--cpus-per-task=1", "--time=10"]
    submit += [f"--output={tmp_path}/%x-%A_%a.out", "--", *ARGS]
    r = subprocess.run(submit, capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    jid = r.stdout.strip()
    run = ft_out / "RTE" / "seed1"

    # the uninterrupted reference: the same command, one thread as in the job (CPU sums depend on the thread count)
    reference = tmp_path / "reference"
    argv = ["train", "--task", "RTE", "--seed", "1", "--output", str(reference), "--model", model]
    argv += ["--data-dir", str(GLUE), *ARGS]
    ref_env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ref = subprocess.Popen([sys.executable, "-m", "finetune", *argv], cwd=REPO, env=ref_env, stderr=subprocess.PIPE)

    slurm_cluster.wait_until(
        "training to start", lambda: list((run / "tensorboard").glob("events.*")), 600, jid, poll=0.2
    )
    time.sleep(2.0)  # into the steps
    task = f"{jid}_0"
    s = slurm_cluster.run("scancel", "-b", "-s", "USR1", task)
    assert s.returncode == 0, s.stderr
    rec = slurm_cluster.wait_array_final(jid, 1, timeout=800)[0]
    assert rec["JobState"] == "COMPLETED" and rec["Restarts"] == "1", slurm_cluster.diagnose(jid)

    text = Path(rec["StdOut"]).read_text()
    assert "got SIGUSR1: forwarding it to the job step" in text and "requeueing job" in text, text[-4000:]
    saved = re.search(r"finetune: SIGUSR1 at train step (\d+) of 60: saved a resume checkpoint in (\S+);", text)
    assert saved and 0 < int(saved.group(1)) < STEPS, text[-4000:]
    assert f"resuming the preempted run from {saved.group(2)}" in text
    events = [line.split("\t")[3] for line in (run / "logs" / "slurm_jobs.tsv").read_text().splitlines()]
    assert events[:4] == ["start", "signal", "exit", "requeue"] and events[-1] == "exit", events

    _, err = ref.communicate(timeout=600)
    assert ref.returncode == 0, err.decode()[-3000:]
    assert results(run) == results(reference)
    history = json.loads((run / "dev_scores.json").read_text())["history"]
    assert [h["step"] for h in history] == [20, 40, 60]
