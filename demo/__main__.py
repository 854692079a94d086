"""`python -m demo` (= `make demo`): the whole ElasticBERT pipeline on one CPU box.

Every stage runs the project's own command-line tools (printed before they run, so you can rerun any of them):
  1. data_prep   tokenise a real corpus into .bin/.idx shards with the bert-base-uncased vocab
  2. pretrain    multi-exit MLM+SOP pre-training under DeepSpeed (2 processes, srun-style) from the MiniLM weights,
                 grouped exits + gradient equilibrium; a simulated preemption (SIGUSR1 → save → exit 75 → resume)
  3. export      DeepSpeed checkpoint → Hugging Face directory
  4. finetune    2ST with MHA exits and ACL-CL on a real GLUE task; per-exit dev scores
  5. early exit  entropy and patience sweeps with FLOPs; ELUE score against the model's own static curve
  6. report      PNGs + summary.md + TensorBoard logs in one folder

DEMO_SCALE=small (default, ≤ 15 min here) or medium; DEMO_OUT chooses the folder (default demo_out/).
Data: ../shared/data when present, else GLUE SST-2 + WikiText-2 from the Hugging Face hub (fetched once into its
cache), else a toy fallback that the console and the report label as such (demo/data.py).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from common.dist import free_port
from common.io import parse_object, read_object
from demo.data import HOW_TO_GET_REAL_DATA, DemoData, demo_data
from elasticbert import minilm_dir

REPO = Path(__file__).resolve().parents[1]
PRETRAIN_CONFIG = "configs/tiny_cpu.yaml"  # with its ds_configs/ JSON: checkout files, not package data
TASK = "SST-2"  # the fine-tuning task of the demo (GLUE SST-2, or its toy stand-in)


@dataclass(frozen=True)
class Scale:
    books: int  # Gutenberg books tokenised
    pretrain_steps: int
    preempt_at: int  # optimizer step after which the demo sends SIGUSR1
    seq_len: int
    train_examples: int  # fine-tuning subset
    dev_examples: int
    epochs: int


SCALES = {
    "tiny": Scale(books=2, pretrain_steps=6, preempt_at=3, seq_len=64, train_examples=320, dev_examples=128, epochs=2),
    "small": Scale(
        books=6, pretrain_steps=40, preempt_at=20, seq_len=128, train_examples=1600, dev_examples=277, epochs=1
    ),
    "medium": Scale(
        books=20, pretrain_steps=150, preempt_at=60, seq_len=128, train_examples=4000, dev_examples=872, epochs=3
    ),
}


def say(stage: str, line: str) -> None:
    print(f"\n=== [{stage}] {line}", flush=True)


def run(cmd: list[str], log: Path | None = None, env: dict | None = None) -> None:
    """Run one project command, echoing it; fail the demo with the command's own output when it fails."""
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    full_env = {**os.environ, **(env or {})}
    if log is None:
        subprocess.run(cmd, cwd=REPO, env=full_env, check=True)
        return
    with open(log, "ab") as f:
        code = subprocess.run(cmd, cwd=REPO, env=full_env, stdout=f, stderr=subprocess.STDOUT).returncode
    if code:
        sys.exit(f"demo: command failed with exit code {code}; last lines of {log}:\n{tail(log)}")


def tail(path: Path, n: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    lines = enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
    return [parse_object(line, f"{path}:{n}", record=True) for n, line in lines if line.strip()]


def launch_srun_style(args: list[str], ntasks: int, log: Path) -> list[subprocess.Popen]:
    """What `srun --ntasks N python -m pretrain train ...` gives each task: SLURM_* variables, no RANK."""
    port = str(free_port())
    procs = []
    for rank in range(ntasks):
        env = {
            **os.environ,
            "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": str(ntasks),
            "SLURM_LOCALID": str(rank),
            "SLURM_JOB_NODELIST": "localhost",
            "SLURM_JOB_ID": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "OMP_NUM_THREADS": "1",
            "DS_ACCELERATOR": "cpu",
        }
        with open(log, "ab") as f:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "pretrain", *args], cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT
                )
            )
    return procs


def wait_all(procs: list[subprocess.Popen], log: Path, timeout: float = 1800) -> list[int]:
    deadline = time.time() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(deadline - time.time(), 1)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            sys.exit(f"demo: pre-training did not finish in {timeout:.0f}s; see {log}")
    return codes


def stage_pretrain(scale: Scale, data: Path, run_dir: Path, logs: Path) -> dict:
    say(
        "2 pretrain",
        "multi-exit MLM+SOP pre-training from the MiniLM weights: DeepSpeed (fp32, gloo), 2 processes, "
        "exit groups alternating per step, gradient equilibrium",
    )
    sets = [
        "model.init_from=minilm",
        "model.hidden_size=384",
        "model.num_hidden_layers=6",
        "model.num_attention_heads=12",
        "model.intermediate_size=1536",
        "model.max_position_embeddings=512",
        f"data.corpora=[{{name: corpus, path: {data}, weight: 1.0}}]",
        f"data.max_length={scale.seq_len}",
        f"train.train_steps={scale.pretrain_steps}",
        "train.global_batch_size=16",
        "train.micro_batch_size=4",
        "optim.lr=1.0e-4",
        f"optim.warmup_steps={max(scale.pretrain_steps // 10, 1)}",
        f"checkpoint.interval={max(scale.preempt_at // 2, 1)}",
        "eval.interval=0",
        f"eval.max_samples={64 if scale.pretrain_steps < 20 else 256}",
        "logging.progress=false",
    ]
    args = ["train", "--config", PRETRAIN_CONFIG, "--output", str(run_dir)]
    for s in sets:
        args += ["--set", s]
    log = logs / "pretrain.log"
    print("$ srun --ntasks 2 python -m pretrain " + " ".join(shlex.quote(a) for a in args), flush=True)
    procs = launch_srun_style(args, 2, log)
    while not any(r["step"] >= scale.preempt_at for r in metrics(run_dir)):
        if any(p.poll() is not None for p in procs):
            sys.exit(f"demo: pre-training stopped early; last lines of {log}:\n{tail(log)}")
        time.sleep(0.2)
    print(f"   step {scale.preempt_at} reached: sending SIGUSR1 to both ranks (what Slurm does before a time limit)")
    for p in procs:
        p.send_signal(signal.SIGUSR1)
    codes = wait_all(procs, log)
    saved_at = max(r["step"] for r in metrics(run_dir))
    print(f"   ranks exited with {codes} (75 = checkpoint saved, requeue me) after step {saved_at}")
    if set(codes) != {75}:
        sys.exit(f"demo: expected exit code 75 after the preemption signal, got {codes}; see {log}")
    print("   restarting the same command: it resumes from the `latest` checkpoint")
    codes = wait_all(launch_srun_style(args, 2, log), log)
    if set(codes) != {0}:
        sys.exit(f"demo: resumed pre-training failed with {codes}; last lines of {log}:\n{tail(log)}")
    records = metrics(run_dir)
    return {"preempted_after_step": saved_at, "steps": max(r["step"] for r in records), "records": records}


def stage_data(data_source: DemoData, out: Path) -> tuple[Path, dict]:
    """1. data_prep: tokenize (2 workers) and verify the demo corpus."""
    if data_source.is_toy:
        print(
            f"\ndemo: WARNING: no real data here — running on TOY data, so the scores below mean nothing; "
            f"{HOW_TO_GET_REAL_DATA}",
            flush=True,
        )
    inputs, source = data_source.corpus, data_source.corpus_source
    say("1 data_prep", f"tokenising {source} with the bert-base-uncased vocab (MiniLM package), 2 workers")
    data = out / "data"
    vocab = str(minilm_dir() / "vocab.txt")
    tokenize = ["tokenize", *inputs, "--output", str(data), "--tokenizer", vocab, "--workers", "2"]
    run([sys.executable, "-m", "data_prep", *tokenize, "--valid-fraction", "0.05", "--no-progress"])
    run([sys.executable, "-m", "data_prep", "verify", str(data)])
    manifest = read_object(data / "manifest.json")
    return data, {"source": source, "totals": manifest.get("totals")}


def stage_finetune(scale: Scale, hf: Path, data_source: DemoData, out: Path, logs: Path) -> Path:
    """4. fine-tuning: 2ST, MHA exits at every layer, ACL-CL with ACL-Grad."""
    say("4 finetune", f"2ST fine-tuning with MHA exits at every layer and ACL-CL on {data_source.task_source}")
    ft = out / "finetune"
    args = ["train", "--model", str(hf), "--task", TASK, "--data-dir", data_source.glue_dir, "--output", str(ft)]
    args += ["--exits", "all", "--exit-type", "mha", "--method", "2st", "--objective", "acl-cl", "--acl-grad"]
    args += ["--max-train-examples", str(scale.train_examples), "--max-dev-examples", str(scale.dev_examples)]
    args += ["--max-length", "64", "--epochs", str(scale.epochs), "--lr", "1e-4", "--exit-lr", "2e-3"]
    args += ["--batch-size", "16", "--no-progress", "--seed", "1"]
    run([sys.executable, "-m", "finetune", *args], log=logs / "finetune.log")
    return ft


def stage_early_exit(scale: Scale, ft: Path, data_source: DemoData, out: Path, logs: Path) -> dict:
    """5. entropy and patience sweeps, then the ELUE score against the model's own static curve."""
    say(
        "5 early exit",
        "entropy and patience sweeps on the dev set: score vs FLOPs, measured speed-ups, ELUE score "
        "against this model's own static per-layer curve",
    )
    ee = out / "early_exit"
    for strategy, sweep in (("entropy", "0.05,0.2,0.4,0.6"), ("patience", "1,2,3,4")):
        args = ["early-exit", "--model", str(ft / "best"), "--task", TASK, "--data-dir", data_source.glue_dir]
        args += ["--strategy", strategy, "--sweep", sweep, "--max-examples", str(scale.dev_examples)]
        run([sys.executable, "-m", "finetune", *args, "--output", str(ee)], log=logs / "early_exit.log")
    sweep_json = str(next(ee.glob("early_exit_*.json")))  # static curve + every operating point of both sweeps
    score = ["elue-score", "--baseline", sweep_json, "--points", sweep_json, "--output", str(ee / "elue_score.json")]
    run([sys.executable, "-m", "finetune", *score], log=logs / "early_exit.log")
    return read_object(ee / "elue_score.json")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", default=os.environ.get("DEMO_SCALE", "small"), choices=sorted(SCALES))
    parser.add_argument(
        "--output",
        default=os.environ.get("DEMO_OUT", "demo_out"),
        help="report folder (default: $DEMO_OUT or %(default)s); must be empty or absent",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Every stage in order, each a function above; the report folder is printed on the last line."""
    args = parse_args(argv)
    if not (REPO / PRETRAIN_CONFIG).is_file():
        sys.exit(
            f"demo: {REPO / PRETRAIN_CONFIG} not found: the demo runs from a checkout of the repository (its configs/ "
            "and ds_configs/ are not installed with the package); clone it and run `make demo` there"
        )
    scale = SCALES[args.scale]
    out = (REPO / args.output).resolve() if not Path(args.output).is_absolute() else Path(args.output)
    if out.exists() and any(out.iterdir()):
        sys.exit(f"demo: {out} is not empty; remove it or set DEMO_OUT to another folder")
    logs = out / "logs"
    logs.mkdir(parents=True)
    started = time.time()

    # 1. data: ../shared/data, else the Hugging Face hub (cached), else a labelled toy fallback
    data_source = demo_data(out, scale.books, scale.train_examples)
    summary: dict = {"scale": args.scale, "data_origin": data_source.origin}
    data, summary["data"] = stage_data(data_source, out)
    # 2-3. pre-training with a preemption, then export
    pre = stage_pretrain(scale, data, out / "pretrain", logs)
    summary["pretrain"] = {k: v for k, v in pre.items() if k != "records"}
    say("3 export", "DeepSpeed checkpoint → Hugging Face directory (safetensors + tokenizer)")
    hf = out / "elasticbert-demo"
    checkpoints = str(out / "pretrain" / "checkpoints")
    run([sys.executable, "-m", "pretrain", "export", "--checkpoint", checkpoints, "--output", str(hf)])
    # 4-5. fine-tuning, early exit + ELUE
    ft = stage_finetune(scale, hf, data_source, out, logs)
    summary["finetune"] = read_object(ft / "dev_scores.json")
    summary["early_exit"] = stage_early_exit(scale, ft, data_source, out, logs)
    # 6. report
    from demo.report import write_report

    report_dir = write_report(out, pre["records"], summary, time.time() - started)
    print(f"\nDemo finished in {(time.time() - started) / 60:.1f} min. Report: {report_dir / 'summary.md'}")


if __name__ == "__main__":
    main()
