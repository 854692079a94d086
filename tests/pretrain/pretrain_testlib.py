"""Helpers for the pretrain tests: launchers that start the trainer the ways a cluster does (torchrun with 1-2
processes; srun-style SLURM_* variables), kill them like a failing node, and read their metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from requirements import GUTENBERG, require_data

from common.dist import free_port

REPO = Path(__file__).resolve().parents[2]
BOOKS = ("11-0.txt", "1952-0.txt", "16-0.txt", "120-0.txt")  # Alice, Yellow Wallpaper, Peter Pan, Treasure Island
TINY = REPO / "configs" / "tiny_cpu.yaml"


def prepare_gutenberg(out: Path) -> Path:
    """Four Project Gutenberg books through data_prep into `out` (bert-base-uncased WordPiece vocab of the MiniLM
    package); skips the test when the books are not there. Shared by tests/pretrain and tests/faults."""

    from data_prep.pipeline import tokenize_corpus
    from elasticbert import minilm_dir

    require_data(*(GUTENBERG / b for b in BOOKS))  # [needs-data]: fails under CI=true
    tokenize_corpus([str(GUTENBERG / b) for b in BOOKS], out, tokenizer=minilm_dir() / "vocab.txt", valid_fraction=0.05)
    return out


def base_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") and not k.startswith("SLURM_")
    }
    env.update(
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    return env


def train_args(config: Path, run_dir: Path, data: Path, overrides: list[str]) -> list[str]:
    sets = [f"data.corpora.0.path={data}", *overrides]
    return ["train", "--config", str(config), "--output", str(run_dir), *[a for s in sets for a in ("--set", s)]]


class Launch:
    """A started training job (one or more processes in their own session, so it can be killed as a whole)."""

    def __init__(self, procs: list[subprocess.Popen], log: Path, records_before: int = 0) -> None:
        self.procs = procs
        self.log = log
        self.records_before = records_before

    def wait(self, timeout: float = 300) -> list[int]:
        deadline = time.time() + timeout
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=max(deadline - time.time(), 1)))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"training did not finish in {timeout}s; log:\n{self.output()}") from None
        return codes

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal every process of the job, launcher and workers (torchrun starts each worker in its own
        session, so a process-group kill would miss them)."""
        import psutil

        victims = []
        for p in self.procs:
            try:
                parent = psutil.Process(p.pid)
                victims += [parent, *parent.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        for v in victims:
            try:
                v.send_signal(sig)
            except psutil.NoSuchProcess:
                pass

    def signal_each(self, sig: int) -> None:
        for p in self.procs:
            try:
                p.send_signal(sig)
            except ProcessLookupError:
                pass

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:] if self.log.exists() else ""


def _records(args: list[str]) -> int:
    return len(read_metrics(Path(args[args.index("--output") + 1])))


def launch_torchrun(args: list[str], nproc: int, log: Path) -> Launch:
    before = _records(args)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "-m",
        "pretrain",
        *args,
    ]
    with open(log, "ab") as f:
        p = subprocess.Popen(cmd, cwd=REPO, env=base_env(), stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    return Launch([p], log, before)


def launch_deepspeed(args: list[str], nproc: int, log: Path) -> Launch:
    """The DeepSpeed launcher (it passes --local_rank=N before our subcommand)."""
    before = _records(args)
    cmd = [
        sys.executable,
        "-m",
        "deepspeed.launcher.runner",
        "--num_gpus",
        str(nproc),
        "--master_port",
        str(free_port()),
        "--module",
        "pretrain",
        *args,
    ]
    with open(log, "ab") as f:
        p = subprocess.Popen(cmd, cwd=REPO, env=base_env(), stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    return Launch([p], log, before)


def launch_srun_style(args: list[str], ntasks: int, log: Path) -> Launch:
    """What `srun --ntasks N python -m pretrain ...` gives each task: SLURM_* only, no RANK/WORLD_SIZE."""
    before = _records(args)
    port = free_port()
    procs = []
    for r in range(ntasks):
        env = base_env()
        env.update(
            SLURM_PROCID=str(r),
            SLURM_NTASKS=str(ntasks),
            SLURM_LOCALID=str(r),
            SLURM_JOB_NODELIST="localhost",
            SLURM_JOB_ID="4242",
            MASTER_PORT=str(port),
        )
        with open(log, "ab") as f:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "pretrain", *args],
                    cwd=REPO,
                    env=env,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    return Launch(procs, log, before)


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for_step(run_dir: Path, step: int, launch: Launch, timeout: float = 240) -> int:
    """Block until metrics.jsonl has a record of `step` or later logged after `launch` started (records of earlier
    attempts are skipped); returns the newest step seen."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        recs = read_metrics(run_dir)[launch.records_before :]
        if recs and recs[-1]["step"] >= step:
            return recs[-1]["step"]
        if any(p.poll() is not None for p in launch.procs):
            raise AssertionError(f"trainer exited before step {step}:\n{launch.output()}")
        time.sleep(0.05)
    launch.kill()
    raise AssertionError(f"step {step} not reached in {timeout}s:\n{launch.output()}")
