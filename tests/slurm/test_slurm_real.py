"""The batch scripts with the REAL data_prep and pretrain CLIs on the local Slurm cluster (1 node, 2 CPUs, 2 fake
GPUs): prep_data.sh array + finalize vs one process; pretrain_base.sh with configs/tiny_cpu.yaml, uninterrupted and
preempted (SIGUSR1 -> checkpoint -> exit 75 -> requeue -> resume), whose losses must match step for step."""

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
GUTENBERG = REPO.parent / "shared" / "data" / "corpus" / "gutenberg"
if not GUTENBERG.is_dir():
    GUTENBERG = Path("/work/shared/data/corpus/gutenberg")
BOOKS = ["11-0.txt", "1952-0.txt", "pg1080.txt"]  # ~50-180 KB each: ~425 training samples at seq 128
SMALL = ["--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=2", "--cpus-per-task=1", "--time=30"]
STEPS = 12


def books() -> list[str]:
    missing = [b for b in BOOKS if not (GUTENBERG / b).is_file()]
    if missing:
        pytest.skip(f"Gutenberg books {missing} not found under {GUTENBERG}")
    return [str(GUTENBERG / b) for b in BOOKS]


def metrics_by_step(run_dir: Path) -> dict[int, dict]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: r for r in recs}  # a step logged again after a resume: the last one counts


def shard_hashes(out: Path) -> dict[str, str]:
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for split in ("train", "valid")
        for p in sorted((out / split).glob("shard_*"))
    }


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory) -> Path:
    from data_prep import minilm_vocab, tokenize_corpus

    out = tmp_path_factory.mktemp("corpus") / "gutenberg"
    tokenize_corpus(books(), out, tokenizer=minilm_vocab(), valid_fraction=0.05)
    return out


def pretrain_job(slurm_cluster, tmp: Path, name: str, data: Path) -> tuple[str, Path, Path]:
    run_dir, out = tmp / name, tmp / f"{name}.out"
    env = slurm_cluster.env(CONFIG="configs/tiny_cpu.yaml", DS_CONFIG="ds_configs/cpu_fp32.json", RUN_DIR=run_dir)
    jid = slurm_cluster.sbatch(
        *SMALL,
        f"--output={out}",
        "slurm/pretrain_base.sh",
        "--set",
        f"data.corpora.0.path={data}",
        "--set",
        f"train.train_steps={STEPS}",
        env=env,
    )
    return jid, run_dir, out


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


@pytest.fixture(scope="module")
def reference_run(slurm_cluster, tiny_corpus, tmp_path_factory):
    """pretrain_base.sh with the tiny CPU config, 2 ranks, uninterrupted."""
    tmp = tmp_path_factory.mktemp("pretrain")
    jid, run_dir, out = pretrain_job(slurm_cluster, tmp, "reference", tiny_corpus)
    rec = slurm_cluster.wait_state(jid, "COMPLETED", timeout=600)
    return rec, run_dir, out


@pytest.mark.timeout(900)
def test_pretrain_base_tiny_cpu_completes(reference_run):
    rec, run_dir, out = reference_run
    assert rec["Restarts"] == "0" and rec["ExitCode"] == "0:0"
    assert sorted(metrics_by_step(run_dir)) == list(range(1, STEPS + 1))
    assert all(m["world_size"] == 2 for m in metrics_by_step(run_dir).values())
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"global_step{STEPS}"
    assert "step finished (exit 0)" in out.read_text()


@pytest.mark.timeout(900)
def test_pretrain_base_preempted_resumes_with_identical_losses(slurm_cluster, reference_run, tiny_corpus, tmp_path):
    _, ref_dir, _ = reference_run
    jid, run_dir, out = pretrain_job(slurm_cluster, tmp_path, "preempted", tiny_corpus)
    slurm_cluster.wait_until(
        "step 2 in metrics.jsonl",
        lambda: (run_dir / "metrics.jsonl").is_file() and max(metrics_by_step(run_dir)) >= 2,
        timeout=600,
        job_id=jid,
        poll=0.1,
    )
    r = subprocess.run(["scancel", "-b", "-s", "USR1", jid], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    rec = slurm_cluster.wait_state(jid, "COMPLETED", timeout=700)
    assert rec["Restarts"] == "1" and rec["ExitCode"] == "0:0", slurm_cluster.diagnose(jid)

    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines() if x.strip()]
    preempted = [e for e in events if e["event"] == "preempted"]
    starts = [e for e in events if e["event"] == "start"]
    assert len(preempted) == 1 and preempted[0]["signal"] == "SIGUSR1" and 2 <= preempted[0]["step"] < STEPS
    assert len(starts) == 2 and starts[1]["resumed_from"] is not None and starts[1]["step"] == preempted[0]["step"]

    ref, got = metrics_by_step(ref_dir), metrics_by_step(run_dir)
    assert sorted(got) == sorted(ref) == list(range(1, STEPS + 1))
    for step in ref:  # fp32 on CPU, same world size: the resumed run is bit-identical
        for key in ("loss", "mlm_loss", "sop_loss", "grad_norm", "lr", "consumed_samples", "samples_digest"):
            assert got[step][key] == ref[step][key], (step, key, got[step][key], ref[step][key])
    text = out.read_text()
    assert "forwarding it to the job step" in text and "requeueing job" in text
