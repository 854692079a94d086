"""The users' 64-rank job, on this box: `sbatch slurm/pretrain_base.sh` unchanged on 8 Slurm nodes (the namespace
nodes of tests/slurm/local_cluster.sh, partition `scale`) with 8, 16, 32 and 64 ranks and a tiny model (--set), each
job measured from the outside and through its own events.

    python bench/pretrain/slurm_scale.py run --ranks 8,16,32,64 --output docs/scale   # ~45 min on 2 cores; root (Slurm)
    python bench/pretrain/slurm_scale.py report --output docs/scale                    # table + plot from the JSON

Per rank count R (R/8 tasks on each of the 8 nodes; global batch 64 = micro-batch 1 x 64/R accumulation x R):

- reference job, 12 steps, checkpoints at 4/8/12: time from `sbatch` to the first step and the start-up phases the
  trainer records (the last rank to import, to join the rendezvous, to build the model, to finish
  `deepspeed.initialize`); per-rank peak RSS (the trainer gathers /proc VmHWM from every rank) and the box's memory
  footprint per rank (MemAvailable before minus its minimum during the job, / R); time per step and the part spent
  in DeepSpeed's collectives (`logging.comm_timing`: each collective timed, blocking); checkpoint save time and
  files; job-log lines at start-up and per step; per-step loss and sample digest against the smallest R;
- preempted job: USR1 at step 6 -> save -> exit 75 -> requeue -> resume: the save, the requeue-to-first-step time,
  checkpoint load time, and whether the resumed steps are bit-identical to the reference;
- killed job: SIGKILL to the last rank after checkpoint 4: seconds until the job is FAILED and the trainer processes
  are gone, lines the failure adds to the log, whether the log names the rank and node;
- the universal-checkpoint conversion of the reference's last checkpoint (`python -m pretrain convert-universal`,
  what rank 0 runs when a job is requeued onto fewer nodes): seconds and files.

Everything runs on 2 cores shared by all R ranks: what is CPU-bound per rank (imports, the model's compute) is
serialised here and grows ~ R, where on the users' nodes each rank has its own cores; the report separates these.
Results are merged into OUTPUT/slurm_scale.json after each rank count (a later `run --ranks 64` adds to it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

from bench.harness import REPO, write_result  # noqa: E402

for sub in ("tests/slurm", "tests/support"):
    sys.path.insert(0, str(REPO / sub))

import pretrain_runs as pr  # noqa: E402  (the scale job's definition, shared with tests/slurm/test_slurm_scale.py)

NODES = [f"ebnode{i}" for i in range(1, pr.SCALE_NODES + 1)]
STEP_WAIT = 60
KNOBS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "EB_STEP_WAIT", "EB_RANK_LOGS")


# ------------------------------------------------------------------------------------------------ the cluster
def ensure_cluster() -> None:
    r = subprocess.run(["sinfo", "-h", "-N", "-p", pr.SCALE_PARTITION, "-o", "%N"], capture_output=True, text=True)
    if sorted(r.stdout.split()) == sorted(NODES):
        return
    if os.geteuid() != 0:
        sys.exit("slurm_scale.py: needs the 8-node local cluster: sudo bash tests/slurm/local_cluster.sh start")
    subprocess.run(["bash", str(REPO / "tests/slurm/local_cluster.sh"), "start"], check=True)


def submit(run_dir: Path, corpus: Path, ranks: int, **env: Any) -> tuple[str, float]:
    base = {k: v for k, v in os.environ.items() if k not in KNOBS}
    environ = pr.scale_job_env(base, run_dir, **env)
    t = time.time()
    r = subprocess.run(
        ["sbatch", "--parsable", *map(str, pr.scale_job_args(run_dir, corpus, ranks))],
        env=environ,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if r.returncode:
        sys.exit(f"sbatch failed: {r.stderr}")
    return r.stdout.strip().split(";")[0], t


def wait_for(what: str, pred, timeout: float, poll: float = 0.5):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(poll)
    raise TimeoutError(f"timeout ({timeout:.0f}s) waiting for {what}")


def final_state(job: str, timeout: float = 3600) -> dict:
    final = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
    return wait_for(f"job {job} to end", lambda: (rec := pr.job_record(job)).get("JobState") in final and rec, timeout)


class MemoryWatch:
    """MemAvailable's minimum while a job runs, against its value before (the box-wide cost of the job)."""

    def __init__(self) -> None:
        self.before = self.minimum = self.available()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    @staticmethod
    def available() -> float:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("MemAvailable:"))

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            self.minimum = min(self.minimum, self.available())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.before - self.minimum


# ------------------------------------------------------------------------------------------------ one rank count
def median(xs: list[float]) -> float:
    return round(statistics.median(xs), 3) if xs else float("nan")


def reference_job(work: Path, corpus: Path, ranks: int) -> dict[str, Any]:
    run = work / f"r{ranks}_reference"
    watch = MemoryWatch()
    job, t_submit = submit(run, corpus, ranks)
    rec = final_state(job)
    used_mb = watch.stop()
    steps = pr.metrics_by_step(run)
    (start,) = pr.events(run, "start")
    saves = pr.events(run, "checkpoint")
    lines = Path(f"{run}.out").read_text().splitlines()
    startup_end = max(i for i, line in enumerate(lines) if "start-up across" in line)
    later = [steps[s] for s in sorted(steps) if s >= 2]  # the first step of a job also warms up
    return {
        "state": rec.get("JobState"),
        "run_dir": str(run),
        "sbatch_to_first_step_s": round(steps[1]["time"] - t_submit, 1),
        "startup": start["startup"],
        "peak_rss_mb_max": max(e["memory"]["peak_rss_mb_max"] for e in [*saves, *pr.events(run, "end")]),
        "peak_rss_mb_mean": max(e["memory"]["peak_rss_mb_mean"] for e in [*saves, *pr.events(run, "end")]),
        "box_mb_per_rank": round(used_mb / ranks, 1),
        "box_mb": round(used_mb),
        "step_s": median([r["step_time_s"] for r in later]),
        "comm_s": median([r["comm_s"] for r in later]),
        "save_s": median([e["seconds"] for e in saves]),
        "checkpoint_files": saves[-1]["files"],
        "log_lines_startup": startup_end + 1,
        "log_lines_per_step": round((len(lines) - startup_end - 2) / len(steps), 2),  # minus "step finished"
        "loss": [steps[s]["loss"] for s in sorted(steps)],
        "digest": [steps[s]["samples_digest"] for s in sorted(steps)],
    }


def preempted_job(work: Path, corpus: Path, ranks: int, reference: Path) -> dict[str, Any]:
    run = work / f"r{ranks}_preempted"
    job, _ = submit(run, corpus, ranks)
    wait_for("step 6", lambda: pr.last_step(run) >= 6, 3600)
    t_signal = time.time()
    pr.preempt(_Runner(), job)
    rec = final_state(job)
    saved = pr.events(run, "preempted")[0]
    starts = pr.events(run, "start")
    requeued = [e for e in _tsv(run) if e[3] == "requeue"][0]
    first_after = min(r["time"] for r in pr.read_jsonl(run / "metrics.jsonl") if r["attempt"] == 2)
    got, ref = pr.metrics_by_step(run), pr.metrics_by_step(reference)
    same = all(got[s][k] == ref[s][k] for s in got for k in pr.EXACT_KEYS)
    return {
        "state": rec.get("JobState"),
        "restarts": rec.get("Restarts"),
        "signal_to_saved_s": round(saved["time"] - t_signal, 1),
        "saved_step": saved["step"],
        "requeue_to_first_step_s": round(first_after - _tsv_time(requeued), 1),
        "load_s": starts[1]["startup"]["loaded"]["took_s"],
        "resumed_bit_identical": same,
    }


def killed_job(work: Path, corpus: Path, ranks: int) -> dict[str, Any]:
    run = work / f"r{ranks}_killed"
    job, _ = submit(run, corpus, ranks, EB_STEP_WAIT=STEP_WAIT)
    latest = run / "checkpoints" / "latest"
    wait_for("step 5", lambda: latest.is_file() and pr.last_step(run) >= 5, 3600)
    before = len(Path(f"{run}.out").read_text().splitlines())
    node, pid = pr.rank_processes(NODES)[ranks - 1]
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    rec = final_state(job, timeout=STEP_WAIT + 300)
    failed_s = time.monotonic() - t_kill
    wait_for("every rank to exit", lambda: not pr.rank_processes(NODES), 120)
    text = Path(f"{run}.out").read_text()
    return {
        "state": rec.get("JobState"),
        "kill_to_failed_s": round(failed_s, 1),
        "bound_s": STEP_WAIT + 5,
        "log_lines_added": len(text.splitlines()) - before,
        "log_names_rank_and_node": f"first to fail: {node} task {ranks - 1} (Killed)" in text,
        "survivor_lines": text.count("a collective failed because another rank"),
        "tracebacks": text.count("Traceback"),
    }


def universal_conversion(reference: Path) -> dict[str, Any]:
    ckpt = Path(reference) / "checkpoints"
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "pretrain", "convert-universal", "--checkpoint", str(ckpt)],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    seconds = time.perf_counter() - t
    out = next(ckpt.glob("*_universal"))
    return {"convert_s": round(seconds, 1), "universal_files": sum(1 for p in out.rglob("*") if p.is_file())}


class _Runner:
    """What pretrain_runs.preempt needs of a cluster: `run(*args)`."""

    @staticmethod
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(map(str, args)), capture_output=True, text=True)


def _tsv(run: Path) -> list[list[str]]:
    return [line.split("\t") for line in (run / "logs" / "slurm_jobs.tsv").read_text().splitlines()]


def _tsv_time(row: list[str]) -> float:
    return time.mktime(time.strptime(row[0], "%Y-%m-%d %H:%M:%S"))


PARTS = ("reference", "preempted", "killed")


def measure(ranks: int, work: Path, corpus: Path, parts: tuple[str, ...], out: dict[str, Any]) -> dict[str, Any]:
    """The `parts` of one rank count, into `out` (an earlier run's results for it, or {})."""
    print(f"== {ranks} ranks ({ranks // pr.SCALE_NODES} per node on {pr.SCALE_NODES} nodes)", flush=True)
    out.update(ranks=ranks, nodes=pr.SCALE_NODES)
    if "reference" in parts:
        out["reference"] = reference_job(work, corpus, ranks)
        shown = {k: v for k, v in out["reference"].items() if k not in ("loss", "digest", "startup")}
        print(f"   reference: {json.dumps(shown)}", flush=True)
        out["conversion"] = universal_conversion(Path(out["reference"]["run_dir"]))
    if "preempted" in parts:
        out["preempted"] = preempted_job(work, corpus, ranks, Path(out["reference"]["run_dir"]))
        print(f"   preempted: {json.dumps(out['preempted'])}", flush=True)
    if "killed" in parts:
        out["killed"] = killed_job(work, corpus, ranks)
        print(f"   killed: {json.dumps(out['killed'])}", flush=True)
    return out


# ------------------------------------------------------------------------------------------------ report
def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares y = a + b x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


ROWS = [  # (label, getter)
    ("sbatch → first step (s)", lambda r: r["reference"]["sbatch_to_first_step_s"]),
    ("  last rank imported (s)", lambda r: r["reference"]["startup"]["imported"]["s"]),
    ("  rendezvous done (s)", lambda r: r["reference"]["startup"]["rendezvous"]["s"]),
    ("  engine ready (s)", lambda r: r["reference"]["startup"]["engine"]["s"]),
    ("peak RSS per rank, max (MB)", lambda r: r["reference"]["peak_rss_mb_max"]),
    ("box memory per rank (MB)", lambda r: r["reference"]["box_mb_per_rank"]),
    ("time per step (s)", lambda r: r["reference"]["step_s"]),
    ("  in collectives (s)", lambda r: r["reference"]["comm_s"]),
    ("checkpoint save (s)", lambda r: r["reference"]["save_s"]),
    ("checkpoint files", lambda r: r["reference"]["checkpoint_files"]),
    ("checkpoint load (s)", lambda r: r["preempted"]["load_s"]),
    ("universal conversion (s)", lambda r: r["conversion"]["convert_s"]),
    ("kill → job FAILED (s)", lambda r: r["killed"]["kill_to_failed_s"]),
    ("  before the fast exit (s)", lambda r: r.get("killed_slow_exit", {}).get("kill_to_failed_s", float("nan"))),
    ("log lines at start-up", lambda r: r["reference"]["log_lines_startup"]),
    ("log lines per step", lambda r: r["reference"]["log_lines_per_step"]),
    ("log lines of a killed rank's failure", lambda r: r["killed"]["log_lines_added"]),
    ("  survivors that said why (one line each)", lambda r: r["killed"].get("survivor_lines", float("nan"))),
]


def report(results: dict[str, Any], out: Path) -> None:
    runs = [results[k] for k in sorted(results, key=int)]
    ranks = [r["ranks"] for r in runs]
    lines = [
        "# The 64-rank job on one box (`python bench/pretrain/slurm_scale.py run`)",
        "",
        f"8 Slurm nodes (network namespaces) on 2 cores and {MemoryWatch.available() / 1024:.0f} GB; tiny model "
        "(hidden 32, 4 layers, seq 64), global batch 64, fp32 gloo, ZeRO-1. Fit: least squares y = a + b·R.",
        "",
        "| | " + " | ".join(f"{r} ranks" for r in ranks) + " | fit a + b·R |",
        "|---|" + "---|" * (len(ranks) + 1),
    ]
    for label, get in ROWS:
        ys = [float(get(r)) for r in runs]
        a, b = fit_line([float(x) for x in ranks], ys) if len(ranks) > 1 else (ys[0], 0.0)
        cells = " | ".join(f"{y:g}" for y in ys)
        lines.append(f"| {label} | {cells} | {a:.3g} + {b:.3g}·R |")
    base = runs[0]["reference"]
    lines += ["", "Same run at every rank count (global batch fixed):", ""]
    for r in runs:
        ref = r["reference"]
        rel = max(abs(x / y - 1) for x, y in zip(ref["loss"], base["loss"]))
        same_digest = ref["digest"] == base["digest"]
        lines.append(
            f"- {r['ranks']} ranks vs {runs[0]['ranks']}: samples identical at every step: {same_digest}; max relative "
            f"loss difference {rel:.1e}; preempted+resumed bit-identical to its reference: "
            f"{r['preempted']['resumed_bit_identical']}; killed rank named in the log: "
            f"{r['killed']['log_names_rank_and_node']} (tracebacks: {r['killed']['tracebacks']})"
        )
    (out / "slurm_scale.md").write_text("\n".join(lines) + "\n")
    plot(runs, out / "slurm_scale.png")
    print("\n".join(lines))


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = [r["ranks"] for r in runs]
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2))
    panels = [
        ("start-up (s)", ["sbatch → first step (s)", "  last rank imported (s)", "  rendezvous done (s)"]),
        ("per step (s)", ["time per step (s)", "  in collectives (s)"]),
        (
            "checkpoints and failures (s)",
            [
                "checkpoint save (s)",
                "checkpoint load (s)",
                "universal conversion (s)",
                "kill → job FAILED (s)",
                "  before the fast exit (s)",
            ],
        ),
        ("memory per rank (MB)", ["peak RSS per rank, max (MB)", "box memory per rank (MB)"]),
    ]
    getters = dict(ROWS)
    for ax, (title, labels) in zip(axes, panels):
        for label in labels:
            ax.plot(ranks, [getters[label](r) for r in runs], marker="o", label=label.strip())
        ax.set_title(title)
        ax.set_xlabel("ranks (8 nodes)")
        ax.set_xticks(ranks)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=1, frameon=False)
    fig.suptitle("slurm/pretrain_base.sh at 8-64 ranks on one 2-core box (tiny model)")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")


# ------------------------------------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--ranks", default="8,16,32,64")
    r.add_argument("--output", type=Path, default=REPO / "docs" / "scale")
    r.add_argument("--work", type=Path, default=Path("/tmp/eb_slurm_scale"))
    r.add_argument("--parts", default=",".join(PARTS), help="which jobs to run (preempted needs reference's run)")
    p = sub.add_parser("report")
    p.add_argument("--output", type=Path, default=REPO / "docs" / "scale")
    args = ap.parse_args()
    path = args.output / "slurm_scale.json"
    results = json.loads(path.read_text()) if path.is_file() else {}
    if args.command == "run":
        ensure_cluster()
        args.work.mkdir(parents=True, exist_ok=True)
        corpus = args.work / "corpus"
        if not (corpus / "manifest.json").is_file():
            shutil.rmtree(corpus, ignore_errors=True)
            pr.tokenize_books(corpus)
        parts = tuple(args.parts.split(","))
        for ranks in map(int, args.ranks.split(",")):
            for part in parts:
                for stale in args.work.glob(f"r{ranks}_{part}*"):
                    shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
            results[str(ranks)] = measure(ranks, args.work, corpus, parts, results.get(str(ranks), {}))
            args.output.mkdir(parents=True, exist_ok=True)
            write_result(path, results)
    report(results, args.output)


if __name__ == "__main__":
    main()
