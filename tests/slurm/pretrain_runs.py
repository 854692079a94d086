"""Real `slurm/pretrain_base.sh` runs of configs/tiny_cpu.yaml for the Slurm tests (single- and multi-node), and
the readers their assertions share. tests/slurm/conftest.py puts this folder on sys.path and builds the shared
fixtures (the tokenised corpus, the single-node reference run) from it."""

from __future__ import annotations

import json
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


def preempt(cluster, job_id: str) -> None:
    """What Slurm does before a time limit (--signal=B:USR1@300), now: USR1 to the batch shell."""
    r = cluster.run("scancel", "-b", "-s", "USR1", job_id)
    if r.returncode != 0:
        pytest.fail(f"scancel -b -s USR1 {job_id}: {r.stderr}", pytrace=False)
