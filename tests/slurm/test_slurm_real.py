"""The batch scripts with the REAL data_prep and pretrain CLIs on the local Slurm cluster (1 node, 2 CPUs, 2 fake
GPUs): prep_data.sh array + finalize vs one process; pretrain_base.sh with configs/tiny_cpu.yaml, uninterrupted and
preempted (SIGUSR1 -> checkpoint -> exit 75 -> requeue -> resume), whose losses must match step for step. The
tokenised corpus and the uninterrupted reference run are session fixtures (conftest.py) the multi-node tests share."""

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from pretrain_runs import ONE_NODE, STEPS, assert_same_steps, books, metrics_by_step, preempt, submit_pretrain

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def shard_hashes(out: Path) -> dict[str, str]:
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for split in ("train", "valid")
        for p in sorted((out / split).glob("shard_*"))
    }


# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.timeout(600)
def test_prep_data_array_matches_single_process(slurm_cluster, tmp_path):
    from data_prep import minilm_vocab

    args = [
        *books(),
        "--tokenizer",
        str(minilm_vocab()),
        "--unit-size",
        "48K",
        "--shard-tokens",
        "30000",
        "--valid-fraction",
        "0.05",
        "--no-progress",
    ]
    env = slurm_cluster.env(PREP_TASKS=3)
    r = subprocess.run(
        [
            "bash",
            "slurm/prep_data.sh",
            "submit",
            "-c",
            "1",
            "-t",
            "10",
            f"--chdir={tmp_path}",
            "--",
            *args,
            "--output",
            str(tmp_path / "array"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    array_id, fin_id = r.stdout.split()
    single_id = slurm_cluster.sbatch(
        "-c",
        "1",
        "-t",
        "10",
        f"--chdir={tmp_path}",
        "slurm/prep_data.sh",
        *args,
        "--output",
        str(tmp_path / "single"),
        env=env,
    )
    tasks = slurm_cluster.wait_array_final(array_id, 3, timeout=400)
    assert [tasks[t]["JobState"] for t in range(3)] == ["COMPLETED"] * 3, slurm_cluster.diagnose(array_id)
    slurm_cluster.wait_state(fin_id, "COMPLETED", timeout=200)
    slurm_cluster.wait_state(single_id, "COMPLETED", timeout=200)

    arr, single = tmp_path / "array", tmp_path / "single"
    records = sorted((arr / ".work" / "tasks").glob("task_*.json"))
    assert [json.loads(p.read_text())["num_tasks"] for p in records] == [3, 3, 3]
    assert [json.loads(p.read_text())["task"] for p in records] == [0, 1, 2]
    assert (arr / "manifest.json").read_bytes() == (single / "manifest.json").read_bytes()
    assert shard_hashes(arr) == shard_hashes(single) and len(shard_hashes(arr)) >= 4
    v = subprocess.run(
        [str(REPO / ".venv/bin/python"), "-m", "data_prep", "verify", str(arr)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert v.returncode == 0, v.stdout + v.stderr


@pytest.mark.timeout(900)
def test_pretrain_base_tiny_cpu_completes(reference_run):
    rec, run_dir = reference_run
    assert rec["Restarts"] == "0" and rec["ExitCode"] == "0:0"
    assert sorted(metrics_by_step(run_dir)) == list(range(1, STEPS + 1))
    assert all(m["world_size"] == 2 for m in metrics_by_step(run_dir).values())
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"global_step{STEPS}"
    assert "step finished (exit 0)" in Path(f"{run_dir}.out").read_text()


@pytest.mark.timeout(900)
def test_pretrain_base_preempted_resumes_with_identical_losses(slurm_cluster, reference_run, tiny_corpus, tmp_path):
    _, ref_dir = reference_run
    run_dir = tmp_path / "preempted"
    jid = submit_pretrain(slurm_cluster, run_dir, tiny_corpus, ONE_NODE)
    slurm_cluster.wait_until(
        "step 2 in metrics.jsonl", lambda: max(metrics_by_step(run_dir), default=0) >= 2, 600, jid, poll=0.1
    )
    preempt(slurm_cluster, jid)
    rec = slurm_cluster.wait_state(jid, "COMPLETED", timeout=700)
    assert rec["Restarts"] == "1" and rec["ExitCode"] == "0:0", slurm_cluster.diagnose(jid)

    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines() if x.strip()]
    preempted = [e for e in events if e["event"] == "preempted"]
    starts = [e for e in events if e["event"] == "start"]
    assert len(preempted) == 1 and preempted[0]["signal"] == "SIGUSR1" and 2 <= preempted[0]["step"] < STEPS
    assert len(starts) == 2 and starts[1]["resumed_from"] is not None and starts[1]["step"] == preempted[0]["step"]

    ref, got = metrics_by_step(ref_dir), metrics_by_step(run_dir)
    assert sorted(got) == sorted(ref) == list(range(1, STEPS + 1))
    assert_same_steps(got, ref, ref)  # fp32 on CPU, same world size: the resumed run is bit-identical
    text = Path(f"{run_dir}.out").read_text()
    assert "forwarding it to the job step" in text and "requeueing job" in text
