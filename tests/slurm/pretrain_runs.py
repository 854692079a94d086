"""Real `slurm/pretrain_base.sh` runs of configs/tiny_cpu.yaml for the Slurm tests (single- and multi-node), and
the readers their assertions share. tests/slurm/conftest.py puts this folder on sys.path and builds the shared
fixtures (the tokenised corpus, the single-node reference run) from it."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from requirements import GUTENBERG, require_data

REPO = Path(__file__).resolve().parents[2]
BOOKS = ["11-0.txt", "1952-0.txt", "pg1080.txt"]  # ~50-180 KB each: ~420 training samples at seq 128
# one node x 2 ranks (the single-node reference) and two nodes x 1 rank (the multi-node runs)
ONE_NODE = ["--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=2", "--cpus-per-task=1", "--time=30"]
TWO_NODES = ["--partition=multi", "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=1", "--cpus-per-task=1"]
TWO_NODES += ["--time=30"]
STEPS = 16  # checkpoints every 5 steps (tiny_cpu.yaml): room for two preemptions and a kill in one run
# the per-step records that must be equal between runs of the same world size (fp32 on CPU: bit-identical)
EXACT_KEYS = ("loss", "mlm_loss", "sop_loss", "grad_norm", "lr", "consumed_samples", "samples_digest")


def books() -> list[str]:
    require_data(*(GUTENBERG / b for b in BOOKS))
    return [str(GUTENBERG / b) for b in BOOKS]


def tokenize_books(out: Path) -> Path:
    from data_prep import minilm_vocab, tokenize_corpus

    tokenize_corpus(books(), out, tokenizer=minilm_vocab(), valid_fraction=0.05)
    return out


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def metrics_by_step(run_dir: Path) -> dict[int, dict]:
    """Step -> record of RUN/metrics.jsonl; a step logged again after a resume: the last one counts."""
    return {r["step"]: r for r in read_jsonl(run_dir / "metrics.jsonl")}


def last_step(run_dir: Path) -> int:
    return max(metrics_by_step(run_dir), default=0)


def events(run_dir: Path, kind: str) -> list[dict]:
    return [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == kind]


def submit_pretrain(cluster, run_dir: Path, data: Path, sizes: list[str], **env_extra) -> str:
    """sbatch slurm/pretrain_base.sh with the tiny CPU config on `data`, STEPS steps; the job log is RUN.out."""
    env = cluster.env(
        CONFIG="configs/tiny_cpu.yaml", DS_CONFIG="ds_configs/cpu_fp32.json", RUN_DIR=run_dir, **env_extra
    )
    return cluster.sbatch(
        *sizes,
        f"--output={run_dir}.out",
        "slurm/pretrain_base.sh",
        "--set",
        f"data.corpora.0.path={data}",
        "--set",
        f"train.train_steps={STEPS}",
        env=env,
    )


def assert_same_steps(got: dict[int, dict], ref: dict[int, dict], steps) -> None:
    """Bit-identical per-step records (same world size, fp32 on CPU)."""
    for step in steps:
        for key in EXACT_KEYS:
            assert got[step][key] == ref[step][key], (step, key, got[step][key], ref[step][key])


def preempt_and_resume(cluster, job_id: str, run_dir: Path, steps_after: int, timeout: float, poll: float) -> None:
    """Preempt the job at step 2 and wait until the requeued job has resumed and made `steps_after` steps."""
    cluster.wait_until("step 2", lambda: last_step(run_dir) >= 2, timeout, job_id, poll=poll)
    preempt(cluster, job_id)

    def resumed_and_stepping() -> bool:
        saved = events(run_dir, "preempted")
        return (
            len(events(run_dir, "start")) == 2 and bool(saved) and last_step(run_dir) >= saved[0]["step"] + steps_after
        )

    cluster.wait_until(
        f"the resumed job to make {steps_after} step(s)", resumed_and_stepping, timeout, job_id, poll=poll
    )


def preempt_onto_fewer_nodes(
    cluster, job_id: str, drained: list[str], nodes: int, tasks: int, restarts: int = 2
) -> None:
    """Drain `drained`, preempt the job and, once it waits requeued (its `restarts`-th restart), shrink it to `nodes`
    nodes and `tasks` tasks (one CPU each): what slurm/README.md tells an operator to do."""
    for node in drained:
        cluster.set_node_state(node, "DRAIN")
    preempt(cluster, job_id)

    def pending_again() -> bool:
        recs = cluster.jobs(job_id)
        return len(recs) == 1 and recs[0]["Restarts"] == str(restarts) and recs[0]["JobState"] == "PENDING"

    cluster.wait_until(f"requeue {restarts}", pending_again, 600, job_id)
    shrink = [f"JobId={job_id}", f"NumNodes={nodes}-{nodes}", f"NumTasks={tasks}", f"NumCPUs={tasks}"]
    r = cluster.run("scontrol", "update", *shrink)
    assert r.returncode == 0, r.stderr


def preempt(cluster, job_id: str) -> None:
    """What Slurm does before a time limit (--signal=B:USR1@300), now: USR1 to the batch shell."""
    r = cluster.run("scancel", "-b", "-s", "USR1", job_id)
    if r.returncode != 0:
        pytest.fail(f"scancel -b -s USR1 {job_id}: {r.stderr}", pytrace=False)


# ---- the job at the users' rank count: partition `scale` (ebnode1..8 of local_cluster.sh, 8 "CPUs" and 8 fake GPUs
# each), the unchanged slurm/pretrain_base.sh, a tiny model by --set. Used by test_slurm_scale.py and
# bench/pretrain/slurm_scale.py (no pytest in this part).
SCALE_PARTITION = "scale"
SCALE_NODES = 8
SCALE_STEPS = 12  # checkpoints at 4, 8, 12
# hidden 32, 4 layers (G=2), seq 64; global batch 64 = micro-batch 1 x accumulation (64 / ranks) x ranks, so 8, 16,
# 32 and 64 ranks train the same samples per step and a job shrunk to half its nodes keeps the global batch
TINY_SCALE = [
    "model.hidden_size=32",
    "model.num_hidden_layers=4",
    "model.num_attention_heads=2",
    "model.intermediate_size=64",
    "model.max_position_embeddings=64",
    "data.max_length=64",
    "train.global_batch_size=64",
    "train.micro_batch_size=1",
    "checkpoint.interval=4",
    "logging.progress=false",
    "logging.comm_timing=true",
]


def scale_sizes(ranks: int, nodes: int = SCALE_NODES) -> list[str]:
    """sbatch sizes for `ranks` ranks on `nodes` namespace nodes: one task per (fake) GPU, one CPU each."""
    if ranks % nodes:
        raise ValueError(f"{ranks} ranks do not split over {nodes} nodes")
    tpn = ranks // nodes
    return [f"--partition={SCALE_PARTITION}", f"--nodes={nodes}", f"--ntasks-per-node={tpn}", "--cpus-per-task=1"] + [
        f"--gpus-per-node={tpn}",
        "--time=60",
    ]


def scale_job_args(run_dir: Path, data: Path, ranks: int, steps: int = SCALE_STEPS, nodes: int = SCALE_NODES) -> list:
    """The whole sbatch command line (after `sbatch`) of a scale job; the job log is RUN.out."""
    sets = [*TINY_SCALE, f"data.corpora.0.path={data}", f"train.train_steps={steps}"]
    return [*scale_sizes(ranks, nodes), f"--output={run_dir}.out", "slurm/pretrain_base.sh"] + [
        arg for s in sets for arg in ("--set", s)
    ]


def scale_job_env(base: dict, run_dir: Path, **extra) -> dict:
    """The environment a scale job is submitted with (sbatch exports it): the tiny CPU config, fp32 DeepSpeed."""
    env = dict(base, CONFIG="configs/tiny_cpu.yaml", DS_CONFIG="ds_configs/cpu_fp32.json", RUN_DIR=str(run_dir))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def rank_processes(nodes) -> dict[int, tuple[str, int]]:
    """rank -> (node, pid) of every trainer process in the namespaces of `nodes` (RANK from its environment)."""
    found = {}
    for node in nodes:
        r = subprocess.run(["ip", "netns", "pids", node], capture_output=True, text=True)
        for pid in map(int, r.stdout.split()):
            try:
                if b"pretrain" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                    continue
                env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
            except OSError:
                continue  # gone meanwhile
            if "RANK" in env and Path(f"/proc/{pid}/comm").read_text().strip() == "python":
                found[int(env["RANK"])] = (node, pid)
    return found


def job_record(job_id: str) -> dict:
    """`scontrol show job -o JOB` as a dict ({} once Slurm forgot the job)."""
    r = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
    return dict(re.findall(r"(\w+(?:/\w+)?)=(\S*)", r.stdout)) if r.returncode == 0 else {}
