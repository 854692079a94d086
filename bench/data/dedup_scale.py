"""`data_prep dedup` at size: 0.1 / 1 / 5 GB of real text with injected duplicates, each stage run as a user runs it
(`python -m data_prep dedup ... --stage S` under `/usr/bin/time -v`), projected to 160 GB on 64-core nodes.

    nice -n 10 python bench/data/dedup_scale.py --sizes 0.1,1,5 --workdir /tmp/eb_dedup_scale --output docs/dedup

Inputs (built in --workdir, deleted after each size): four corpora like the recipe's (`wiki`, `books`, `owt`, `c4`;
plain text, one paragraph a line and a blank line between documents, one quarter of the bytes each), of documents
made by `bench/data/dedup_data.py` from the real paragraphs of ../shared/data (3-8 paragraphs drawn at random from 106
Gutenberg books and WikiText, seeded). Plain text, not JSONL: `sources.DocumentReader` finds the line number of
every JSONL record eagerly (it re-reads the file up to the record: quadratic, 0.4 MB/s on an 8 MB file; reported
with its fix). Of every 100
documents, 80 are distinct, 10 are exact copies (re-cased, re-punctuated) and 10 near copies (1-3 % of the words
replaced) of an earlier document of any corpus (a uniform draw among the last 50,000), written to a random corpus.
Decontamination runs against the shared GLUE dev and test sets (the default), as in a real run.

Per size and stage: wall, CPU (user + system, workers included), MB/s per core (input bytes / CPU seconds of the
stages that read the text: signatures + write), peak RSS of the largest process, the disk of the signatures, and
the detector's recall on the injected copies (exact copies found as exact, near copies found at all). Resumable per
size: a size already in the results JSON is skipped. The projection to 160 GB: stages 1 and 3 at the measured CPU
seconds per GB spread over N nodes x 64 cores; stage 2 (one node) by its measured seconds per million documents
(the sorts are n log n: the factor is stated), its memory = the union-find's 8 bytes per document + one key range
(`--lsh-memory`, 2 GB by default); disk = signatures (bytes per document measured) + the output (compressed JSONL).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

from bench.data import dedup_data as D  # noqa: E402
from bench.harness import REPO, run_timed, write_result  # noqa: E402

CORPORA = ("wiki", "books", "owt", "c4")
REAL_BYTES = 160e9
NODES, CORES = 8, 64
STAGES = ("signatures", "clusters", "write", "report")


def build_inputs(target: int, folder: Path, seed: int = 0) -> dict:
    """The four JSONL corpora (see the module docstring); returns what was injected."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = random.Random(seed)
    files = {c: open(folder / f"{c}.txt", "w", encoding="utf-8") for c in CORPORA}
    recent: list[str] = []
    counts = {"docs": 0, "distinct": 0, "exact": 0, "near": 0, "bytes": 0}
    while counts["bytes"] < target:
        draw = rng.random()
        if draw < 0.1 and recent:
            text, kind = D.reformat(rng.choice(recent)), "exact"
        elif draw < 0.2 and recent:
            text, kind = D.edit_words(rng.choice(recent), rng.uniform(0.01, 0.03), rng), "near"
        else:
            text, kind = D.distinct_document(rng), "distinct"
            recent.append(text)
            if len(recent) > 50_000:
                recent[rng.randrange(len(recent))] = recent.pop()
        line = text.replace("\n\n", "\n") + "\n\n"  # one paragraph a line, documents between blank lines
        files[rng.choice(CORPORA)].write(line)
        counts[kind] += 1
        counts["docs"] += 1
        counts["bytes"] += len(line.encode())
    for f in files.values():
        f.close()
    return counts


def timed(cmd: list[str]) -> dict:
    """`run_timed`, rounded to the report's 0.1."""
    return {key: round(value, 1) for key, value in run_timed(cmd).items()}


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def measure(size_gb: float, workdir: Path, workers: int) -> dict:
    inputs, out = workdir / f"in_{size_gb:g}", workdir / f"out_{size_gb:g}"
    t0 = time.perf_counter()
    injected = build_inputs(int(size_gb * 1e9), inputs)
    build_s = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    base = [
        sys.executable,
        "-m",
        "data_prep",
        "dedup",
        *[f"{c}={inputs / c}.txt" for c in CORPORA],
        "--output",
        str(out),
        "--workers",
        str(workers),
    ]
    stages, sig_bytes = {}, 0
    for stage in STAGES:
        stages[stage] = timed([*base, "--stage", stage])
        if stage == "signatures":
            sig_bytes = du(out / ".work" / "sig")
    report = json.loads((out / "dedup_report.json").read_text())
    t = report["totals"]
    read_cpu = stages["signatures"]["cpu_s"] + stages["write"]["cpu_s"]
    result = {
        "size_gb": size_gb,
        "input_bytes": injected["bytes"],
        "build_s": round(build_s, 1),
        "injected": injected,
        "workers": workers,
        "stages": stages,
        "docs": t["docs_in"],
        "signature_bytes": sig_bytes,
        "signature_bytes_per_doc": round(sig_bytes / max(1, t["docs_in"]), 1),
        "output_bytes": du(out / "text"),
        "mb_per_core_s": round(injected["bytes"] / 1e6 / read_cpu, 2),
        "removed": {"exact": t["exact_docs"], "near": t["near_docs"]},
        # a copy counts as exact when its keeper has its normalised text: an exact copy of a document whose near copy
        # sits in a higher-priority corpus is removed as "near" (its keeper is that near copy); so recall is over both
        "recall": {
            "copies": round((t["exact_docs"] + t["near_docs"]) / max(1, injected["exact"] + injected["near"]), 4),
            "exact_as_exact": round(t["exact_docs"] / max(1, injected["exact"]), 4),
        },
        "contaminated_docs": t["contaminated_docs"],
        "clusters": report["clusters"],
    }
    shutil.rmtree(inputs, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    return result


def projection(rows: list[dict]) -> dict:
    """160 GB from the largest measured size (see the module docstring)."""
    big = max(rows, key=lambda r: r["input_bytes"])
    gb = big["input_bytes"] / 1e9
    docs = big["docs"] * REAL_BYTES / big["input_bytes"]
    read_cpu_per_gb = (big["stages"]["signatures"]["cpu_s"] + big["stages"]["write"]["cpu_s"]) / gb
    nlogn = (docs * math.log2(docs)) / (big["docs"] * math.log2(big["docs"]))
    core_h = read_cpu_per_gb * REAL_BYTES / 1e9 / 3600
    return {
        "docs": int(docs),
        "core_hours": round(core_h, 1),
        "wall_h_stages_1_3": round(core_h / (NODES * CORES), 3),
        "nodes": NODES,
        "cores": CORES,
        "clusters_cpu_h": round(big["stages"]["clusters"]["cpu_s"] * nlogn / 3600, 2),
        "clusters_memory_gb": round((8 * docs + (2 << 30)) / 1e9, 1),
        "signature_disk_gb": round(big["signature_bytes_per_doc"] * docs / 1e9, 1),
        "output_disk_gb": round(big["output_bytes"] / big["input_bytes"] * REAL_BYTES / 1e9, 1),
        "report_wall_s": round(big["stages"]["report"]["wall_s"] * REAL_BYTES / big["input_bytes"], 0),
    }


def markdown(rows: list[dict], proj: dict) -> str:
    lines = [
        "| input | docs | signatures: wall / CPU / peak RSS | clusters: wall / peak RSS | write: wall / CPU / peak "
        "RSS | report | MB/s per core | signature disk | copies found (exact as exact) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r["stages"]
        lines.append(
            f"| {r['input_bytes'] / 1e9:.2f} GB | {r['docs']:,} | {s['signatures']['wall_s']:.0f} s / "
            f"{s['signatures']['cpu_s']:.0f} s / {s['signatures']['max_rss_mb']:.0f} MB | "
            f"{s['clusters']['wall_s']:.1f} s / {s['clusters']['max_rss_mb']:.0f} MB | "
            f"{s['write']['wall_s']:.0f} s / {s['write']['cpu_s']:.0f} s / "
            f"{s['write']['max_rss_mb']:.0f} MB | {s['report']['wall_s']:.1f} s | {r['mb_per_core_s']} | "
            f"{r['signature_bytes_per_doc']:.0f} B/doc | {r['recall']['copies']:.4f} "
            f"({r['recall']['exact_as_exact']:.3f}) |"
        )
    lines.append(
        f"| **160 GB (projected)** | {proj['docs']:,} | {proj['core_hours']} core-h = {proj['wall_h_stages_1_3']} h on "
        f"{proj['nodes']} x {proj['cores']} cores (stages 1+3) | {proj['clusters_cpu_h']} CPU-h, "
        f"{proj['clusters_memory_gb']} GB | | {proj['report_wall_s']:.0f} s | | {proj['signature_disk_gb']} GB "
        f"(+ {proj['output_disk_gb']} GB output) | |"
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="0.1,1,5", help="GB of input, comma-separated")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/eb_dedup_scale"))
    ap.add_argument("--output", type=Path, default=REPO / "docs" / "dedup")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    path = args.output / "scale.json"
    rows = json.loads(path.read_text())["rows"] if path.is_file() else []
    for size in [float(s) for s in args.sizes.split(",")]:
        if any(r["size_gb"] == size for r in rows):
            print(f"{size} GB: measured before, skipped", flush=True)
            continue
        print(f"{size} GB: building and running ...", flush=True)
        rows.append(measure(size, args.workdir, args.workers))
        rows.sort(key=lambda r: r["size_gb"])
        proj = projection(rows)
        write_result(path, {"rows": rows, "projection": proj})
        (args.output / "scale.md").write_text(markdown(rows, proj))
        print(json.dumps(rows[-1]["stages"]), rows[-1]["recall"], flush=True)
    shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(REPO))
    main()
