"""`slurm/pretrain_base.sh` checks every node before the training launch (`python -m pretrain preflight`, once per
node): a job with one node's data mount missing, or with a run directory that is full on one node, stops in seconds
before any rank starts, with that node and the reason on the job's last line; a healthy 3-node job passes it (CPU
nodes: "no GPU") and trains; EB_PREFLIGHT=0 skips it. The faults are made on ONE node only, in its slurmd's mount
namespace (tests/slurm/local_cluster.sh), as a cluster's node would differ from its neighbours."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from pretrain_runs import submit_pretrain

pytestmark = pytest.mark.slurm

# world 4: tiny_cpu.yaml's global batch 16 = micro-batch 4 x accumulation 1 x 4 ranks
TWO_NODES = ["--partition=multi", "--nodes=2", "--ntasks-per-node=2", "--gpus-per-node=2", "--cpus-per-task=1"]
TWO_NODES += ["--time=10"]
THREE_NODES = ["--partition=scale", "--nodes=3", "--ntasks-per-node=1", "--gpus-per-node=1", "--cpus-per-task=1"]
THREE_NODES += ["--time=10"]


def job_log_lines(run_dir: Path) -> list[str]:
    return [line for line in Path(f"{run_dir}.out").read_text(errors="replace").splitlines() if line.strip()]


def failed_fast(cluster, job: str, run_dir: Path) -> tuple[list[str], float]:
    """Wait for the job to fail; its log lines and the seconds from its start to its end."""
    rec = cluster.wait_state(job, "FAILED", timeout=240)
    took = _seconds(rec["EndTime"]) - _seconds(rec["StartTime"])
    lines = job_log_lines(run_dir)
    assert not any("[eb-task]" in line for line in lines), "a training rank started"
    assert not (run_dir / "metrics.jsonl").exists()
    return lines, took


def _seconds(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


def test_a_node_without_the_data_mount_stops_the_job_before_any_rank_trains(slurm_cluster, tiny_corpus, tmp_path):
    run_dir = tmp_path / "run"
    with slurm_cluster.node_mount("ebnode2", tiny_corpus):  # ebnode2 sees an empty folder where the corpus is
        job = submit_pretrain(slurm_cluster, run_dir, tiny_corpus, TWO_NODES)
        lines, took = failed_fast(slurm_cluster, job, run_dir)
    last = lines[-1]
    assert "ERROR: preflight FAILED on ebnode2 (node 1): data:" in last, last
    assert f"{tiny_corpus}/manifest.json: missing" in last and "no rank started" in last
    assert any("preflight ebnode1: ok" in line for line in lines)
    assert took <= 60, f"the job took {took} s to fail"


def test_a_full_run_directory_on_one_node_stops_the_job_naming_it(slurm_cluster, tiny_corpus, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with slurm_cluster.node_mount("ebnode1", run_dir, "size=256k"):  # a tmpfs with no room for a checkpoint
        job = submit_pretrain(slurm_cluster, run_dir, tiny_corpus, TWO_NODES)
        lines, took = failed_fast(slurm_cluster, job, run_dir)
    last = lines[-1]
    assert "ERROR: preflight FAILED on ebnode1 (node 0): run dir:" in last, last
    assert re.search(r"0\.00 GiB free, two checkpoints need 0\.\d\d GiB", last), last
    assert took <= 60, f"the job took {took} s to fail"


def standin_job(cluster, tmp_path: Path, **env) -> tuple[str, Path]:
    """pretrain_base.sh with the stand-in trainer (tests/slurm/standin_trainer.py): the script's plumbing alone."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("model: {num_hidden_layers: 2}\n")
    run_dir = tmp_path / "run"
    env = cluster.env(
        PYTHONPATH=Path(__file__).parent,
        PRETRAIN_MODULE="standin_trainer",
        CONFIG=cfg,
        DS_CONFIG="",
        RUN_DIR=run_dir,
        STANDIN_MODE="exit:0",
        **env,
    )
    return cluster.sbatch(*THREE_NODES, f"--output={run_dir}.out", "slurm/pretrain_base.sh", env=env), run_dir


def test_the_preflight_runs_once_per_node_with_the_train_arguments_before_the_launch(slurm_cluster, tmp_path):
    job, run_dir = standin_job(slurm_cluster, tmp_path)
    slurm_cluster.wait_state(job, "COMPLETED", timeout=120)
    calls = [json.loads(line) for line in (run_dir / "preflight.jsonl").read_text().splitlines()]
    assert sorted(c["host"] for c in calls) == ["ebnode1", "ebnode2", "ebnode3"]
    assert sorted(c["NODE_RANK"] for c in calls) == ["0", "1", "2"]
    assert {(c["EB_NUM_NODES"], c["EB_TASKS_PER_NODE"]) for c in calls} == {("3", "1")}
    assert all(
        c["argv"][:5] == ["preflight", "--config", str(tmp_path / "tiny.yaml"), "--output", str(run_dir)] for c in calls
    )
    text = Path(f"{run_dir}.out").read_text()
    assert text.index("preflight passed on 3 node(s)") < text.index("[eb-task]")


def test_a_failing_node_stops_the_job_and_eb_preflight_0_skips_the_check(slurm_cluster, tmp_path):
    job, run_dir = standin_job(slurm_cluster, tmp_path / "fail", STANDIN_PREFLIGHT="fail:2")
    lines, _ = failed_fast(slurm_cluster, job, run_dir)
    assert "preflight ebnode3: FAILED: data: standin failure" in lines[-1] and "no rank started" in lines[-1]
    job, run_dir = standin_job(slurm_cluster, tmp_path / "skip", STANDIN_PREFLIGHT="fail:2", EB_PREFLIGHT=0)
    slurm_cluster.wait_state(job, "COMPLETED", timeout=120)
    assert not (run_dir / "preflight.jsonl").exists()
    assert "preflight skipped (EB_PREFLIGHT=0)" in Path(f"{run_dir}.out").read_text()
