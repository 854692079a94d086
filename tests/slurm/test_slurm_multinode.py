"""The multi-node path of slurm/common.sh on two real Slurm nodes (ebnode1, ebnode2: slurmds in their own network
and UTS namespaces, see local_cluster.sh): node list -> MASTER_ADDR, node rank, one task per node on two hosts, gloo
across them, preemption and requeue of a 2-node job, a requeue onto fewer nodes, a rank that dies.

The real runs use pretrain_base.sh with configs/tiny_cpu.yaml (fp32 on CPU) and compare per-step records with the
single-node reference run of the same config (conftest.py: 1 node x 2 ranks)."""

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest
from pretrain_runs import (
    STEPS,
    TWO_NODES,
    assert_same_steps,
    events,
    last_step,
    metrics_by_step,
    preempt_and_resume,
    preempt_onto_fewer_nodes,
    submit_pretrain,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# the standin jobs: two nodes, one task each
STANDIN_SIZES = ["--partition=multi", "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=1", "--cpus-per-task=1"]
STANDIN_SIZES += ["--time=10"]
# After the 2 -> 1 switch a step's gradient is the sum of 4 micro-batches on one rank instead of 2 per rank plus an
# all-reduce: the same fp32 numbers added in another order, an ulp or so apart (measured: <= 1e-7 relative).
RESHAPED_RTOL = 1e-6


def job_script(tmp_path: Path, body: str) -> Path:
    """A batch script that sources slurm/common.sh from this checkout and runs BODY after eb_init/eb_rendezvous."""
    job = tmp_path / "job.sh"
    job.write_text(f"""#!/bin/bash
set -euo pipefail
EB_ROOT={REPO}
# shellcheck source=/dev/null
source "$EB_ROOT/slurm/common.sh"
eb_init
eb_rendezvous
eb_log_paths {tmp_path}/run
{body}
""")
    return job


def trainer_processes(cluster, nodes) -> dict[str, list[int]]:
    """node -> pids of the python processes in its namespace (the trainer or stand-in ranks it runs)."""
    return {n: [p for p, comm in cluster.node_processes(n).items() if comm == "python"] for n in nodes}


# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_common_sh_spans_two_hosts_over_gloo(slurm_cluster, multi_nodes, tmp_path):
    """2 nodes x 1 task: each rank on its own host (own name, own address), MASTER_ADDR = the first node, node ranks
    0/1, one local rank each, and a gloo all_reduce between the two network namespaces."""
    job = job_script(tmp_path, f'eb_srun "$EB_PYTHON" {HERE}/allreduce_check.py {tmp_path}')
    out = tmp_path / "out.txt"
    jid = slurm_cluster.sbatch(*STANDIN_SIZES, f"--output={out}", str(job), env=slurm_cluster.env())
    rec = slurm_cluster.wait_state(jid, "COMPLETED", timeout=100)
    assert rec["NodeList"] == "ebnode[1-2]" and rec["ExitCode"] == "0:0"
    port = str(10000 + int(jid) % 20000)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r, res in enumerate(ranks):
        assert res["sum"] == 3.0 and res["gathered"] == [0, 1] and res["world"] == 2
        assert res["host"] == multi_nodes[r] and res["host_addr"] == socket.gethostbyname(multi_nodes[r])
        env = res["env"]
        assert env["RANK"] == str(r) and env["WORLD_SIZE"] == "2" and env["NODE_RANK"] == str(r)
        assert env["LOCAL_RANK"] == "0" and env["LOCAL_WORLD_SIZE"] == "1"
        assert env["MASTER_ADDR"] == multi_nodes[0] and env["MASTER_PORT"] == port
    assert ranks[0]["host_addr"] != ranks[1]["host_addr"]
    text = out.read_text()
    assert f"host={multi_nodes[0]} nodes=ebnode[1-2]" in text  # the batch shell runs on the first node
    for r in range(2):
        assert f"[eb-task] rank {r}/2 local 0/1 node {r} host {multi_nodes[r]} master {multi_nodes[0]}:{port}" in text


@pytest.mark.timeout(120)
def test_rank_dead_outside_a_collective_ends_the_step_within_step_wait(slurm_cluster, multi_nodes, tmp_path):
    """Rank 1 dies (SIGKILL) while rank 0 waits for it in the rendezvous, where no collective can notice: srun's
    --wait=EB_STEP_WAIT ends the step that many seconds later (+ KillWait, 5 s here); the job FAILS, nothing is left
    running on either node, and there is no requeue (a crash is no preemption)."""
    step_wait = 10
    job = job_script(tmp_path, f'eb_run_preemptible "$EB_PYTHON" {HERE}/dead_peer_check.py {tmp_path}')
    out = tmp_path / "out.txt"
    env = slurm_cluster.env(EB_STEP_WAIT=step_wait)
    jid = slurm_cluster.sbatch(*STANDIN_SIZES, f"--output={out}", str(job), env=env)
    pid_file = tmp_path / "rank1.pid"
    slurm_cluster.wait_until("rank 1 to start", lambda: pid_file.is_file() and pid_file.read_text(), 90, jid)
    time.sleep(2)  # rank 0 is in init_process_group by now (or gets there: it waits for rank 1 either way)
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    killed = time.monotonic()
    rec = slurm_cluster.wait_state(jid, "FAILED", timeout=step_wait + 60)
    took = time.monotonic() - killed
    print(f"rank 1 killed in the rendezvous: job FAILED {took:.1f}s later (EB_STEP_WAIT={step_wait})")
    assert took <= step_wait + 5 + 15, f"the step outlived its dead rank by {took:.0f}s"
    assert rec["Restarts"] == "0" and rec["ExitCode"] != "0:0"
    assert trainer_processes(slurm_cluster, multi_nodes) == {n: [] for n in multi_nodes}
    assert "step failed" in out.read_text() and "requeueing" not in out.read_text()


# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_node_run(slurm_cluster, multi_nodes, tiny_corpus, tmp_path_factory) -> tuple[dict, Path]:
    """`sbatch --nodes=2 --ntasks-per-node=1 slurm/pretrain_base.sh` with the tiny config, uninterrupted."""
    run_dir = tmp_path_factory.mktemp("multinode") / "two_nodes"
    jid = submit_pretrain(slurm_cluster, run_dir, tiny_corpus, TWO_NODES)
    return slurm_cluster.wait_state(jid, "COMPLETED", timeout=600), run_dir


@pytest.mark.timeout(900)
def test_two_nodes_train_like_one_node_with_two_ranks(two_node_run, reference_run, multi_nodes):
    """Over gloo across the two hosts, the per-step records equal the 1 node x 2 ranks run bit for bit (fp32: each
    step's gradient is the sum of the same two per-rank sums, whichever transport adds them)."""
    rec, run_dir = two_node_run
    _, ref_dir = reference_run
    assert rec["NodeList"] == "ebnode[1-2]" and rec["Restarts"] == "0" and rec["ExitCode"] == "0:0"
    text = Path(f"{run_dir}.out").read_text()
    port = 10000 + int(rec["JobId"]) % 20000
    for r in range(2):
        assert f"[eb-task] rank {r}/2 local 0/1 node {r} host {multi_nodes[r]} master {multi_nodes[0]}:{port}" in text
    got, ref = metrics_by_step(run_dir), metrics_by_step(ref_dir)
    assert sorted(got) == sorted(ref) == list(range(1, STEPS + 1))
    assert {m["world_size"] for m in got.values()} == {2}
    assert_same_steps(got, ref, ref)


@pytest.mark.timeout(900)
def test_two_node_preemption_requeue_then_requeue_onto_one_node(
    slurm_cluster, multi_nodes, two_node_run, tiny_corpus, tmp_path
):
    """USR1 to the 2-node job -> checkpoint, exit 75, requeue, resume on both nodes: bit-identical to the
    uninterrupted run. Then ebnode2 is drained and the job preempted again: requeued, it cannot get two nodes, is
    shrunk to one (`scontrol update JobId=J NumNodes=1-1 NumTasks=1 NumCPUs=1`, what slurm/README.md tells an
    operator) and resumes with 1 rank through DeepSpeed's universal checkpoint (ZeRO-1 shards of 2 ranks)."""
    _, ref_dir = two_node_run
    run_dir = tmp_path / "preempted"
    jid = submit_pretrain(slurm_cluster, run_dir, tiny_corpus, TWO_NODES)
    preempt_and_resume(slurm_cluster, jid, run_dir, steps_after=2, timeout=600, poll=0.1)
    try:
        preempt_onto_fewer_nodes(slurm_cluster, jid, [multi_nodes[1]], nodes=1, tasks=1)
        rec = slurm_cluster.wait_state(jid, "COMPLETED", timeout=600)
    finally:
        slurm_cluster.set_node_state(multi_nodes[1], "RESUME")
    assert rec["Restarts"] == "2" and rec["ExitCode"] == "0:0" and rec["NodeList"] == multi_nodes[0]

    saved, starts = events(run_dir, "preempted"), events(run_dir, "start")
    assert [e["signal"] for e in saved] == ["SIGUSR1", "SIGUSR1"]
    s1, s2 = saved[0]["step"], saved[1]["step"]
    assert 2 <= s1 < s2 < STEPS
    assert [(s["step"], s["world_size"], s["grad_accum"]) for s in starts] == [(0, 2, 2), (s1, 2, 2), (s2, 1, 4)]
    assert starts[1]["resumed_from"] == starts[1]["load_tag"] == f"global_step{s1}"
    assert starts[2]["resumed_from"] == f"global_step{s2}" and starts[2]["load_tag"] == f"global_step{s2}_universal"

    got, ref = metrics_by_step(run_dir), metrics_by_step(ref_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert_same_steps(got, ref, range(1, s2 + 1))  # one requeue on the same 2 nodes: bit-identical
    for step in range(s2 + 1, STEPS + 1):  # 1 rank now: same samples, same lr, sums in another order
        assert got[step]["world_size"] == 1
        assert got[step]["samples_digest"] == ref[step]["samples_digest"] and got[step]["lr"] == ref[step]["lr"]
        for key in ("loss", "mlm_loss", "sop_loss", "grad_norm"):  # (mlm_loss: one value per exit)
            assert got[step][key] == pytest.approx(ref[step][key], rel=RESHAPED_RTOL, abs=0), (step, key)

    text = Path(f"{run_dir}.out").read_text()
    assert f"[eb-task] rank 1/2 local 0/1 node 1 host {multi_nodes[1]}" in text
    after = text[text.index("restart=2]") :]  # the third run of the job
    assert "SLURM_NTASKS=2 is from an earlier run of this job; this one has 1 node(s)" in after
    assert f"[eb-task] rank 0/1 local 0/1 node 0 host {multi_nodes[0]}" in after and "rank 1/" not in after


@pytest.mark.timeout(900)
def test_rank_killed_fails_the_job_fast_and_the_next_submission_resumes(
    slurm_cluster, multi_nodes, two_node_run, tiny_corpus, tmp_path
):
    """SIGKILL to the trainer on ebnode2 mid-training: rank 0 fails at its next collective and says a rank is gone in
    one line, the step and the job end at once (bounded by EB_STEP_WAIT + KillWait anyway), FAILED, not requeued,
    nothing left running; resubmitting the same command resumes from the last complete checkpoint and reproduces
    the uninterrupted run bit for bit."""
    _, ref_dir = two_node_run
    run_dir = tmp_path / "killed"
    step_wait = 30
    jid = submit_pretrain(slurm_cluster, run_dir, tiny_corpus, TWO_NODES, EB_STEP_WAIT=step_wait)
    latest = run_dir / "checkpoints" / "latest"

    def past_a_checkpoint() -> bool:
        return latest.is_file() and latest.read_text().strip() == "global_step5" and last_step(run_dir) >= 6

    slurm_cluster.wait_until("step 6, after checkpoint 5", past_a_checkpoint, 600, jid, poll=0.1)
    victims = trainer_processes(slurm_cluster, multi_nodes[1:])[multi_nodes[1]]
    assert len(victims) == 1, victims
    os.kill(victims[0], signal.SIGKILL)
    killed = time.monotonic()
    rec = slurm_cluster.wait_state(jid, "FAILED", timeout=step_wait + 90)
    took = time.monotonic() - killed
    print(f"trainer rank 1 killed at step {last_step(run_dir)}: job FAILED {took:.1f}s later")
    assert took <= step_wait + 5 + 15, f"the job outlived its dead rank by {took:.0f}s"
    assert rec["Restarts"] == "0" and rec["ExitCode"] != "0:0"
    assert trainer_processes(slurm_cluster, multi_nodes) == {n: [] for n in multi_nodes}
    committed = latest.read_text().strip()
    killed_at = last_step(run_dir)
    text = Path(f"{run_dir}.out").read_text()
    # gloo's words for the dead peer vary with how its socket went ("Connection closed by peer", "... reset by
    # peer": both seen here); the line that says so is ours
    assert "a collective failed because another rank of the job is gone" in text
    assert "step failed" in text and "requeueing" not in text

    jid2 = submit_pretrain(slurm_cluster, run_dir, tiny_corpus, TWO_NODES)  # the same command again
    rec2 = slurm_cluster.wait_state(jid2, "COMPLETED", timeout=600)
    assert rec2["ExitCode"] == "0:0"
    starts = events(run_dir, "start")
    assert len(starts) == 2 and starts[1]["resumed_from"] == committed == f"global_step{starts[1]['step']}"
    assert starts[1]["step"] < killed_at  # steps done after the checkpoint were lost and are done again
    got, ref = metrics_by_step(run_dir), metrics_by_step(ref_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert_same_steps(got, ref, ref)
