"""data_prep at size: `tokenize` over 100 MB → ≥ 1 GB of real text, then `finalize` and `verify`, each measured as a
user runs it (`python -m data_prep ...` under `/usr/bin/time`), and projected to 160 GB.

    python bench/prep_scale.py --sizes 100M,300M,1G --workdir /tmp/prep_scale --output docs/scale

The inputs are the Gutenberg books and WikiText of ../shared/data given many times over as separate files (hard
links in a scratch folder, so nothing is copied and nothing lands in the repository). Per size: wall time, CPU
time, MB/s per core (input bytes ÷ CPU seconds), the peak RSS (the kernel's VmHWM) of the largest worker process
and of the parent, then `finalize` (units → shards + manifest) and `verify` (re-hash everything) wall time and peak
RSS. The projection:
core-hours for 160 GB at the measured MB/s per core, and the wall time of a 64-task Slurm array with a stated number
of cores per task, assuming storage keeps up (the measured finalize/verify throughputs say how fast it must be).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "corpus"
REAL_BYTES = 160e9
ARRAY_TASKS, CORES_PER_TASK = 64, 8


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMG]?)", text.strip().upper())
    if not m:
        raise SystemExit(f"not a size: {text}")
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)])


def make_inputs(target: int, folder: Path) -> int:
    """Hard links of the real corpus files, repeated until `target` bytes; returns the bytes linked."""
    sources = sorted((SHARED / "gutenberg").glob("*.txt")) + sorted((SHARED / "wikitext-2-raw").glob("*"))
    if not sources:
        raise SystemExit(f"{SHARED}: no corpus files (../shared/data is needed)")
    shutil.rmtree(folder, ignore_errors=True)
    total, copy = 0, 0
    while total < target:
        sub = folder / f"copy_{copy:04d}"
        sub.mkdir(parents=True)
        for src in sources:
            if total >= target:
                break
            os.link(src, sub / src.name)
            total += src.stat().st_size
        copy += 1
    return total


def timed(cmd: list[str], env: dict) -> dict:
    """Wall and CPU time (children included) and peak RSS (largest process, /usr/bin/time -v) of one command."""
    start = time.perf_counter()
    run = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.perf_counter() - start
    if run.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}")
    fields = dict(re.findall(r"^\s*(.+?):\s+(.+)$", run.stderr, re.M))
    cpu = float(fields["User time (seconds)"]) + float(fields["System time (seconds)"])
    return {"wall_s": wall, "cpu_s": cpu, "max_rss_mb": int(fields["Maximum resident set size (kbytes)"]) / 1024}


def _peak_rss_mb(pid: int) -> float:
    """The kernel's high-water mark of a process's RSS (VmHWM), in MB; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def worker_peak_rss(cmd: list[str], env: dict) -> tuple[dict, float, float]:
    """Run `cmd` and return (timing, parent peak MB, largest child peak MB), read from each process's VmHWM every
    0.2 s. The high-water mark is kept by the kernel, so a short spike between two reads still counts (sampling the
    current RSS instead missed them: 81 MB at 100 MB of input vs 104 MB at 1 GB was an artefact of how many spikes a
    run gave it the chance to catch; the true peak is the same at every size). /usr/bin/time reports only the largest
    process, not which one it was."""
    import psutil

    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ps = psutil.Process(proc.pid)
    parent_peak, child_peaks = 0.0, {}
    while proc.poll() is None:
        parent_peak = max(parent_peak, _peak_rss_mb(proc.pid))
        try:
            children = ps.children(recursive=True)
        except psutil.Error:
            children = []
        for child in children:
            child_peaks[child.pid] = max(child_peaks.get(child.pid, 0.0), _peak_rss_mb(child.pid))
        time.sleep(0.2)
    err = proc.stderr.read()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err[-3000:]}")
    return {"wall_s": time.perf_counter() - start}, parent_peak, max(child_peaks.values(), default=0.0)


def measure(size: int, work: Path, workers: int) -> dict:
    inputs = work / "inputs"
    linked = make_inputs(size, inputs)
    out = work / "prepared"
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    py = [sys.executable, "-m", "data_prep"]
    from elasticbert import minilm_dir

    vocab = str(minilm_dir() / "vocab.txt")
    tok_cmd = [
        *py,
        "tokenize",
        str(inputs),
        "--output",
        str(out),
        "--tokenizer",
        vocab,
        "--workers",
        str(workers),
        "--no-finalize",
        "--no-progress",
        "--doc-boundary",
        "auto",
    ]
    tok = timed(tok_cmd, env)
    shutil.rmtree(out, ignore_errors=True)
    sampled, parent_peak, child_peak = worker_peak_rss(tok_cmd, env)
    fin = timed([*py, "finalize", str(out)], env)
    ver = timed([*py, "verify", str(out), "--workers", str(workers)], env)
    manifest = json.loads((out / "manifest.json").read_text())
    tokens = manifest["totals"]["tokens"]
    result = {
        "input_bytes": linked,
        "tokens": tokens,
        "workers": workers,
        "tokenize_wall_s": tok["wall_s"],
        "tokenize_cpu_s": tok["cpu_s"],
        "mb_per_cpu_s": linked / 1e6 / tok["cpu_s"],
        "mb_per_s_wall": linked / 1e6 / tok["wall_s"],
        "worker_peak_rss_mb": child_peak,
        "parent_peak_rss_mb": parent_peak,
        "finalize_wall_s": fin["wall_s"],
        "finalize_peak_rss_mb": fin["max_rss_mb"],
        "verify_wall_s": ver["wall_s"],
        "verify_peak_rss_mb": ver["max_rss_mb"],
        "token_bytes": sum(s["bin_bytes"] for sp in manifest["splits"].values() for s in sp["shards"]),
    }
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(inputs, ignore_errors=True)
    return result


def _mb(value: float) -> str:
    return f"{value:.0f} MB" if value > 0 else "– (one unit: tokenised in the parent)"


def projection(rows: list[dict]) -> dict:
    big = max(rows, key=lambda r: r["input_bytes"])
    core_hours = REAL_BYTES / 1e6 / big["mb_per_cpu_s"] / 3600
    scale = REAL_BYTES / big["input_bytes"]
    return {
        "core_hours": core_hours,
        "array_wall_h": core_hours / (ARRAY_TASKS * CORES_PER_TASK),
        "array": f"{ARRAY_TASKS} tasks × {CORES_PER_TASK} cores",
        "finalize_h": big["finalize_wall_s"] * scale / 3600,
        "finalize_mb_s": big["token_bytes"] / 1e6 / big["finalize_wall_s"],
        "verify_h": big["verify_wall_s"] * scale / 3600,
        "token_gb": big["token_bytes"] * scale / 1e9,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100M,300M,1G")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/prep_scale"))
    ap.add_argument("--output", type=Path, default=REPO / "docs" / "scale")
    args = ap.parse_args()
    rows = []
    for text in args.sizes.split(","):
        rows.append(measure(parse_size(text), args.workdir, args.workers))
        print(json.dumps(rows[-1], indent=1), flush=True)
    proj = projection(rows)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "prep_scale.json").write_text(json.dumps({"rows": rows, "projection_160gb": proj}, indent=1))
    lines = [
        "| input | tokens | tokenize wall | MB/s per core | worker peak RSS | parent peak RSS | finalize | "
        "finalize peak RSS | verify | verify peak RSS |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['input_bytes'] / 1e9:.2f} GB | {r['tokens'] / 1e6:.0f} M | {r['tokenize_wall_s']:.0f} s | "
            f"{r['mb_per_cpu_s']:.2f} | {_mb(r['worker_peak_rss_mb'])} | {r['parent_peak_rss_mb']:.0f} MB | "
            f"{r['finalize_wall_s']:.1f} s | {r['finalize_peak_rss_mb']:.0f} MB | {r['verify_wall_s']:.1f} s | "
            f"{r['verify_peak_rss_mb']:.0f} MB |"
        )
    lines.append(
        f"| **160 GB (projected)** | | {proj['core_hours']:.0f} core-hours = {proj['array_wall_h']:.2f} h on "
        f"{proj['array']} | | | | {proj['finalize_h']:.2f} h ({proj['finalize_mb_s']:.0f} MB/s) | | "
        f"{proj['verify_h']:.2f} h | |"
    )
    (args.output / "prep_scale.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
