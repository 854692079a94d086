"""End-to-end checks of slurm/common.sh and the batch scripts on the real local cluster (see conftest.py).

The node has 2 CPUs and 2 fake GPUs, so every submission overrides the scripts' 8x8 defaults on the command line.
Stand-ins (tests/slurm/standin_*.py) replace the trainer/data_prep until the real ones are tested here too.
"""

import json
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SMALL = ["--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=2", "--cpus-per-task=1", "--time=10"]
NODE = socket.gethostname().split(".")[0]


@pytest.fixture
def standin_env(slurm_cluster):
    """slurm_cluster.env() plus the stand-ins (tests/slurm/standin_*.py) on PYTHONPATH."""
    return lambda **extra: slurm_cluster.env(PYTHONPATH=HERE, **extra)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_configs(tmp_path: Path) -> tuple[Path, Path]:
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("model: {num_hidden_layers: 2}\n")
    ds = tmp_path / "ds.json"
    ds.write_text("{}\n")
    return cfg, ds


# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_common_sh_srun_gloo_allreduce(slurm_cluster, standin_env, tmp_path):
    """(b) 1 node x 2 tasks: common.sh's rendezvous + eb_srun drive a real gloo all_reduce."""
    job = tmp_path / "job.sh"
    job.write_text(f"""#!/bin/bash
set -euo pipefail
EB_ROOT={REPO}
# shellcheck source=/dev/null
source "$EB_ROOT/slurm/common.sh"
eb_init
eb_rendezvous
eb_log_paths {tmp_path}/run
eb_srun "$EB_PYTHON" {HERE}/allreduce_check.py {tmp_path}
""")
    out = tmp_path / "out.txt"
    jid = slurm_cluster.sbatch(*SMALL, f"--output={out}", str(job), env=standin_env())
    rec = slurm_cluster.wait_state(jid, "COMPLETED", timeout=100)
    assert rec["ExitCode"] == "0:0"
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    port = str(10000 + int(jid) % 20000)
    for r, res in enumerate(ranks):
        assert res["rank"] == r and res["world"] == 2 and res["sum"] == 3.0 and res["gathered"] == [0, 1]
        env = res["env"]
        assert env["RANK"] == env["SLURM_PROCID"] == str(r)
        assert env["WORLD_SIZE"] == "2" and env["LOCAL_RANK"] == str(r) and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["NODE_RANK"] == "0" and env["SLURM_JOB_ID"] == jid
        assert env["MASTER_ADDR"] == NODE and env["MASTER_PORT"] == port  # derived, not the inherited bogus ones
        assert env["OMP_NUM_THREADS"] == "1" and env["DS_ACCELERATOR"] == "cpu"
    text = out.read_text()
    assert f"rendezvous MASTER_ADDR={NODE} MASTER_PORT={port}" in text


@pytest.mark.timeout(150)
def test_pretrain_base_preemption_requeues_once_and_completes(slurm_cluster, standin_env, tmp_path):
    """(c) USR1 to the batch shell -> forwarded to both ranks -> exit 75 -> scontrol requeue -> restart -> exit 0."""
    cfg, ds = write_configs(tmp_path)
    run_dir, out = tmp_path / "run", tmp_path / "out.txt"
    env = standin_env(PRETRAIN_MODULE="standin_trainer", CONFIG=cfg, DS_CONFIG=ds, RUN_DIR=run_dir)
    # submitted from the repo root without EB_ROOT: the script must find the repo through SLURM_SUBMIT_DIR
    jid = slurm_cluster.sbatch(
        *SMALL, f"--output={out}", "slurm/pretrain_base.sh", "--set", "train.train_steps=3", env=env
    )
    slurm_cluster.wait_state(jid, "RUNNING", timeout=60)
    # both ranks have their handlers installed (and the batch shell its trap) before we signal
    slurm_cluster.wait_until(
        "both ranks ready", lambda: all((run_dir / f"ready.rank{r}").exists() for r in (0, 1)), timeout=60, job_id=jid
    )
    r = subprocess.run(["scancel", "-b", "-s", "USR1", jid], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    rec = slurm_cluster.wait_state(jid, "COMPLETED", timeout=90)
    assert rec["Restarts"] == "1", slurm_cluster.diagnose(jid)
    assert rec["ExitCode"] == "0:0"
    assert rec["JobName"] == "eb-pretrain-base"

    starts = read_jsonl(run_dir / "starts.jsonl")
    assert sorted((s["env"]["SLURM_RESTART_COUNT"] or "0", s["env"]["RANK"]) for s in starts) == [
        ("0", "0"),
        ("0", "1"),
        ("1", "0"),
        ("1", "1"),
    ]
    for s in starts:
        assert s["argv"][:2] == ["train", "--config"] and s["argv"][2] == str(cfg)
        assert s["argv"][3:] == ["--output", str(run_dir), "--ds-config", str(ds), "--set", "train.train_steps=3"]
        assert s["env"]["WORLD_SIZE"] == "2" and s["env"]["MASTER_PORT"] == str(10000 + int(jid) % 20000)
        assert s["cwd"] == str(REPO) and s["python"].startswith(str(REPO / ".venv"))
    for rank in (0, 1):
        assert (run_dir / f"preempted.rank{rank}").read_text() == "SIGUSR1"
        assert (run_dir / f"done.rank{rank}").exists()
    events = [line.split("\t")[2:4] for line in (run_dir / "logs/slurm_jobs.tsv").read_text().splitlines()]
    preflight = [["preflight-start"], ["preflight-ok"]]  # every run of the job checks its nodes first
    assert events == [
        *(["0", *e] for e in preflight),
        *[["0", "start"], ["0", "signal"], ["0", "exit"], ["0", "requeue"]],
        *(["1", *e] for e in preflight),
        *[["1", "start"], ["1", "exit"]],
    ]
    text = out.read_text()  # --open-mode=append: both runs in one file
    assert "forwarding it to the job step" in text and "requeueing job" in text and "step finished (exit 0)" in text


@pytest.mark.timeout(60)
def test_exit_75_without_requeue_permission_fails(slurm_cluster, standin_env, tmp_path):
    """A trainer asking for a requeue in a --no-requeue job: the job FAILS with 75 instead of vanishing."""
    cfg, _ = write_configs(tmp_path)
    env = standin_env(
        PRETRAIN_MODULE="standin_trainer", CONFIG=cfg, DS_CONFIG="", RUN_DIR=tmp_path / "run", STANDIN_MODE="exit:75"
    )
    jid = slurm_cluster.sbatch(
        *SMALL, "--no-requeue", f"--output={tmp_path}/out.txt", "slurm/pretrain_base.sh", env=env
    )
    rec = slurm_cluster.wait_state(jid, "FAILED", timeout=50)
    assert rec["ExitCode"] == "75:0" and rec["Restarts"] == "0"
    starts = read_jsonl(tmp_path / "run/starts.jsonl")
    assert len(starts) == 2 and "--ds-config" not in starts[0]["argv"]  # DS_CONFIG="" omits it
    assert "'scontrol requeue" in (tmp_path / "out.txt").read_text()


@pytest.mark.timeout(60)
def test_trainer_failure_is_not_requeued(slurm_cluster, standin_env, tmp_path):
    cfg, ds = write_configs(tmp_path)
    env = standin_env(
        PRETRAIN_MODULE="standin_trainer", CONFIG=cfg, DS_CONFIG=ds, RUN_DIR=tmp_path / "run", STANDIN_MODE="exit:3"
    )
    jid = slurm_cluster.sbatch(*SMALL, f"--output={tmp_path}/out.txt", "slurm/pretrain_base.sh", env=env)
    rec = slurm_cluster.wait_state(jid, "FAILED", timeout=50)
    assert rec["ExitCode"] == "3:0" and rec["Restarts"] == "0"
    assert "step failed (exit 3)" in (tmp_path / "out.txt").read_text()


@pytest.mark.timeout(60)
def test_pretrain_large_runs_base_with_large_config(slurm_cluster, standin_env, tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "out.txt"
    env = standin_env(PRETRAIN_MODULE="standin_trainer", DS_CONFIG="", RUN_DIR=run_dir, STANDIN_MODE="exit:0")
    jid = slurm_cluster.sbatch(*SMALL, f"--output={out}", "slurm/pretrain_large.sh", env=env)
    rec = slurm_cluster.wait_state(jid, "COMPLETED", timeout=50)
    assert rec["JobName"] == "eb-pretrain-large"
    starts = read_jsonl(run_dir / "starts.jsonl")
    assert {s["argv"][2] for s in starts} == {"configs/elasticbert_large.yaml"} and len(starts) == 2


@pytest.mark.timeout(120)
def test_prep_data_array_then_dependent_finalize(slurm_cluster, standin_env, tmp_path):
    out_dir = tmp_path / "tok"
    env = standin_env(DATA_PREP_MODULE="standin_data_prep", PREP_TASKS=2)
    r = subprocess.run(
        [
            "bash",
            "slurm/prep_data.sh",
            "submit",
            "--cpus-per-task=1",
            "--time=5",
            f"--chdir={tmp_path}",
            "--",
            "a.txt",
            "b.txt",
            "--output",
            str(out_dir),
            "--tokenizer",
            "vocab.txt",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    array_id, fin_id = r.stdout.split()
    tasks = slurm_cluster.wait_array_final(array_id, 2, timeout=60)
    assert {t: rec["JobState"] for t, rec in tasks.items()} == {0: "COMPLETED", 1: "COMPLETED"}
    fin = slurm_cluster.wait_state(fin_id, "COMPLETED", timeout=60)
    assert fin["JobName"] == "eb-prep-finalize" and fin["Dependency"] in ("(null)", "")
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert manifest["ok"] and manifest["job"] == fin_id
    assert [(s["num_tasks"], s["task_index"], s["array_task"]) for s in manifest["shards"]] == [
        (2, 0, "0"),
        (2, 1, "1"),
    ]
    assert all(s["inputs"] == ["a.txt", "b.txt"] and s["tokenizer"] == "vocab.txt" for s in manifest["shards"])
    assert manifest["time"] > max(s["time"] for s in manifest["shards"])


@pytest.mark.timeout(120)
def test_prep_data_failed_shard_blocks_finalize(slurm_cluster, standin_env, tmp_path):
    out_dir = tmp_path / "tok"
    env = standin_env(DATA_PREP_MODULE="standin_data_prep", PREP_TASKS=2, STANDIN_FAIL_INDEX=1)
    r = subprocess.run(
        [
            "bash",
            "slurm/prep_data.sh",
            "submit",
            "-c",
            "1",
            "-t",
            "5",
            f"--chdir={tmp_path}",
            "--",
            "a.txt",
            "--output",
            str(out_dir),
            "--tokenizer",
            "v.txt",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    array_id, fin_id = r.stdout.split()
    tasks = slurm_cluster.wait_array_final(array_id, 2, timeout=60)
    assert {t: rec["JobState"] for t, rec in tasks.items()} == {0: "COMPLETED", 1: "FAILED"}
    slurm_cluster.wait_state(fin_id, "CANCELLED", timeout=60)  # --kill-on-invalid-dep: not left pending forever
    assert not (out_dir / "manifest.json").exists()


@pytest.mark.timeout(120)
def test_finetune_glue_array_over_tasks_and_seeds(slurm_cluster, standin_env, tmp_path):
    ft_dir = tmp_path / "ft"
    env = standin_env(
        FINETUNE_MODULE="standin_trainer",
        STANDIN_MODE="exit:0",
        TASKS="rte mrpc",
        SEEDS="7 8",
        FT_OUT=ft_dir,
        MODEL="some/model",
        DATA_DIR="",
    )
    r = subprocess.run(
        [
            "bash",
            "slurm/finetune_glue.sh",
            "submit",
            "--gpus-per-node=1",
            "--cpus-per-task=1",
            "--time=5",
            f"--output={tmp_path}/%x-%A_%a.out",
            "--",
            "--train-steps",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    jid = r.stdout.strip()
    tasks = slurm_cluster.wait_array_final(jid, 4, timeout=90)
    assert all(rec["JobState"] == "COMPLETED" for rec in tasks.values()), slurm_cluster.diagnose(jid)
    got = {}
    for task, seed in [("rte", 7), ("rte", 8), ("mrpc", 7), ("mrpc", 8)]:
        (s,) = read_jsonl(ft_dir / task / f"seed{seed}" / "starts.jsonl")
        assert s["env"]["RANK"] == "0" and s["env"]["WORLD_SIZE"] == "1" and s["env"]["LOCAL_RANK"] == "0"
        out = str(ft_dir / task / f"seed{seed}")
        assert s["argv"] == [
            "train",
            "--task",
            task,
            "--seed",
            str(seed),
            "--output",
            out,
            "--model",
            "some/model",
            "--train-steps",
            "2",
        ]  # DATA_DIR="" omits --data-dir
        got[int(s["env"]["SLURM_ARRAY_TASK_ID"])] = (task, seed)
    assert got == {0: ("rte", 7), 1: ("rte", 8), 2: ("mrpc", 7), 3: ("mrpc", 8)}


@pytest.mark.timeout(60)
def test_script_headers_accepted_by_sbatch(slurm_cluster):
    """Every #SBATCH header is valid for sbatch (sizes shrunk to this node): --test-only schedules nothing."""
    for script, extra in [
        ("pretrain_base.sh", SMALL),
        ("pretrain_large.sh", SMALL),
        ("prep_data.sh", ["--array=0-1", "--cpus-per-task=1"]),
        ("finetune_glue.sh", ["--array=0-1", "--cpus-per-task=1"]),
    ]:
        r = subprocess.run(
            ["sbatch", "--test-only", *extra, f"slurm/{script}"], capture_output=True, text=True, timeout=30, cwd=REPO
        )
        assert r.returncode == 0 and re.search(r"to start at", r.stderr), (script, r.stdout + r.stderr)


@pytest.mark.timeout(30)
def test_rendezvous_multi_node_nodelist(slurm_cluster):
    """MASTER_ADDR is the first host of the (compressed) node list; the port is derived from the job id."""
    r = subprocess.run(
        [
            "bash",
            "-c",
            'set -euo pipefail; source slurm/common.sh; eb_rendezvous 2>/dev/null; echo "$MASTER_ADDR $MASTER_PORT"',
        ],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        env={**os.environ, "SLURM_JOB_ID": "987654", "SLURM_JOB_NODELIST": "gpu[007-014],gpu020"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["gpu007", str(10000 + 987654 % 20000)]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("first_host", "why"),
    [("localhost", "resolves to the loopback address 127.0.0.1"), ("no-such-host.invalid", "does not resolve")],
)
def test_rendezvous_refuses_unreachable_master_in_multi_node_jobs(first_host, why):
    """With several nodes, a MASTER_ADDR the others cannot reach stops the job at once, saying what to set, instead
    of every rank waiting out the rendezvous timeout; a single-node job may use any name."""

    def rendezvous(nodes: int) -> subprocess.CompletedProcess:
        env = {**os.environ, "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": f"{first_host},gpu2"}
        env["SLURM_JOB_NUM_NODES"] = str(nodes)
        return subprocess.run(
            ["bash", "-c", "set -euo pipefail; source slurm/common.sh; eb_rendezvous"],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=REPO,
            env=env,
        )

    r = rendezvous(2)
    assert r.returncode == 1 and f"MASTER_ADDR={first_host} {why}" in r.stderr and "EB_MASTER_ADDR" in r.stderr
    assert "Traceback" not in r.stderr
    assert rendezvous(1).returncode == 0
