"""Stage 4 of `data_prep.dedup` (`report`): add up the units' counts into `dedup_report.json` and
`dedup_report.md`, remove output files no unit wrote (an earlier plan's), seal the output with `checksums.json`
(`common.integrity`: sha256 of every text file and of both reports; written last, so its presence means the output
is complete) and remove `.work`.

What `tokenize` records of a dedup output it reads is in `data_prep.dedup.manifest`.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from common.integrity import hash_files, sha256_bytes, write_checksums
from common.io import atomic_write_text, peek_object, read_object

from .. import text_faults as TF
from ..errors import DataPrepError
from ..util import canonical_json
from .lsh import load_roots
from .manifest import REPORT, TEXT_DIR
from .plan import REPORT_MD, DedupRun, remove_work
from .stages import DedupContext, every_unit
from .text import candidate_probability
from .write import load_write_record, write_dir, write_keys

EXAMPLES = 10
COUNTS = (
    "docs_in",
    "bytes_in",
    "short_docs",
    "exact_docs",
    "exact_bytes",
    "near_docs",
    "near_bytes",
    "contaminated_docs",
    "decontam_cut_docs",
    "decontam_dropped_docs",
    "decontam_removed_bytes",
    "docs_kept",
    "pieces_kept",
    "bytes_kept",
)


def _records(ctx: DedupContext, run: DedupRun) -> list[dict[str, Any]]:
    """Every unit's write record (files re-hashed); missing units are an error naming the stage to run."""
    sets = peek_object(write_dir(ctx.out) / "eval_sets.json")
    if sets is None:
        raise DataPrepError(f"{ctx.out}: nothing written yet: run --stage write first")
    _, clusters = load_roots(ctx)
    if sets.get("roots") != clusters["roots_sha256"]:
        raise DataPrepError(f"{ctx.out}: the written units are of other clusters: rerun --stage write")
    keys = write_keys(ctx, clusters["roots_sha256"], [{k: s[k] for k in ("name", "sha256", "n")} for s in sets["sets"]])
    recs = [load_write_record(ctx.out, k, rehash=True) for k in keys]
    todo = "run --stage write for them first (in an array, the tasks u mod J)"
    return every_unit(ctx, recs, "are not written yet", todo)


def _add(records: list[dict[str, Any]], corpora: list[str]) -> dict[str, Any]:
    per = {name: dict.fromkeys(COUNTS, 0) for name in corpora}
    cross: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(lambda: {"docs": 0, "bytes": 0}))
    contamination: dict[str, dict[str, dict[str, int]]] = defaultdict(
        lambda: defaultdict(lambda: {"docs": 0, "grams": 0})
    )
    examples: dict[str, list[Any]] = defaultdict(list)
    for rec in records:
        for name, counts in rec["corpora"].items():
            for k, v in counts.items():
                per[name][k] += v
        for removed, row in rec["cross"].items():
            for keeper, (docs, nbytes) in row.items():
                cross[removed][keeper]["docs"] += docs
                cross[removed][keeper]["bytes"] += nbytes
        for name, sets in rec["contamination"].items():
            for s, cell in sets.items():
                for k in ("docs", "grams"):
                    contamination[name][s][k] += cell[k]
        for kind, items in rec["examples"].items():
            examples[kind].extend(items[: max(0, EXAMPLES - len(examples[kind]))])
    totals = {k: sum(c[k] for c in per.values()) for k in COUNTS}
    return {
        "per_corpus": per,
        "totals": totals,
        "cross_corpus": cross,
        "contamination": contamination,
        "examples": examples,
    }


def _by_set(contamination: dict[str, dict[str, dict[str, int]]], sets: list[dict[str, Any]]) -> dict[str, Any]:
    out = {s["name"]: {"docs": 0, "grams": 0} for s in sets}
    for per_set in contamination.values():
        for name, cell in per_set.items():
            out[name]["docs"] += cell["docs"]
            out[name]["grams"] += cell["grams"]
    return out


def build_report(ctx: DedupContext, records: list[dict[str, Any]], clusters: dict[str, Any]) -> dict[str, Any]:
    """The report (see the module docstring); JSON-ready."""
    plan, d = ctx.plan, ctx.plan["dedup"]
    sums = _add(records, plan["corpora"])
    eval_sets = read_object(write_dir(ctx.out) / "eval_sets.json", DataPrepError, hint="rerun --stage write")["sets"]
    sims = [0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95]
    detector = {
        "shingle_words": d["shingle"],
        "bands": d["bands"],
        "rows": d["rows"],
        "signature": d["signature"],
        "threshold": round((1 / d["bands"]) ** (1 / d["rows"]), 4),
        "candidate_probability": {
            str(s): round(float(candidate_probability(s, d["bands"], d["rows"])), 4) for s in sims
        },
    }
    sources = defaultdict(int)
    for c in plan["source_corpus"]:
        sources[plan["corpora"][c]] += 1
    files = sorted(n for r in records for n in r["files"])
    report = {
        "format": d["format"],
        "plan_hash": ctx.phash,
        "params": d,
        "params_sha256": sha256_bytes(canonical_json(d).encode()),
        "input_settings": plan["config"],
        "corpora": [{"name": n, "priority": i, "sources": sources[n]} for i, n in enumerate(plan["corpora"])],
        "detector": detector,
        "clusters": {k: v for k, v in clusters.items() if k != "plan_hash"},
        "eval_sets": eval_sets,
        "contamination_by_set": _by_set(sums["contamination"], eval_sets),
        "outputs": {"files": files, "bytes": sum(r["files"][n]["size"] for r in records for n in r["files"])},
        # per input file: [U+FFFD after decoding, control characters] (files without either are not listed)
        "text_faults": TF.merge_text_faults(records),
        **sums,
    }
    return report


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.2f} %" if whole else "-"


def report_markdown(report: dict[str, Any]) -> str:
    """A short human summary of the report."""
    p, det = report["params"], report["detector"]
    lines = [
        "# Deduplication and decontamination report",
        "",
        f"MinHash: {p['shingle']}-word shingles, {p['bands']} bands x {p['rows']} rows ({det['signature']}), "
        f"documents of {p['min_words']}+ words; P(candidate) at Jaccard 0.7/0.8/0.9 = "
        f"{det['candidate_probability']['0.7']}/{det['candidate_probability']['0.8']}/"
        f"{det['candidate_probability']['0.9']}. Keeper: the highest-priority corpus, then the first by (source "
        f"path, offset). Decontamination: {p['decontaminate']}, n-grams {p['ngram_min']}-{p['ngram']}.",
        "",
        "| corpus | docs in | MB in | exact dup docs (MB) | near dup docs (MB) | contaminated docs | cut / dropped | "
        "docs kept | MB kept | removed bytes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in [*report["per_corpus"].items(), ("**total**", report["totals"])]:
        removed = c["bytes_in"] - c["bytes_kept"]
        lines.append(
            f"| {name} | {c['docs_in']:,} | {c['bytes_in'] / 1e6:.2f} | {c['exact_docs']:,} "
            f"({c['exact_bytes'] / 1e6:.2f}) | {c['near_docs']:,} ({c['near_bytes'] / 1e6:.2f}) | "
            f"{c['contaminated_docs']:,} | {c['decontam_cut_docs']:,} / {c['decontam_dropped_docs']:,} | "
            f"{c['docs_kept']:,} | {c['bytes_kept'] / 1e6:.2f} | {_pct(removed, c['bytes_in'])} |"
        )
    lines += ["", "Cross-corpus duplicates (removed from -> kept in): docs (MB)", ""]
    for removed, row in report["cross_corpus"].items():
        for keeper, cell in row.items():
            lines.append(f"- {removed} -> {keeper}: {cell['docs']:,} ({cell['bytes'] / 1e6:.2f})")
    lines += [
        "",
        "| evaluation set | n | examples | texts shorter than n | corpus docs with hits | n-gram hits |",
        "|---|---|---|---|---|---|",
    ]
    for s in report["eval_sets"]:
        cell = report["contamination_by_set"][s["name"]]
        lines.append(
            f"| {s['name']} | {s['n']} | {s['examples']:,} | {s['too_short']:,} | {cell['docs']:,} | "
            f"{cell['grams']:,} |"
        )
    if report.get("text_faults"):
        lines += ["", "Input files holding what is not text (kept in the documents as read):", ""]
        lines += [f"- {line}" for line in TF.describe_text_faults(report["text_faults"], most=20)]
    lines += ["", "Examples of contamination (corpus text around the first hit):", ""]
    for ex in report["examples"].get("contamination", [])[:5]:
        text = " ".join(ex["text"].split())
        lines.append(
            f'- {ex["corpus"]} {ex["source"]}@{ex["offset"]} ~ {ex["eval_set"]} row {ex["eval_row"]}: "{text}"'
        )
    return "\n".join(lines) + "\n"


def _prune(out: Path, files: list[str]) -> None:
    """Output files that no unit of this plan wrote (an earlier plan's) are removed."""
    keep = set(files)
    for path in sorted((out / TEXT_DIR).rglob("*")):
        if path.is_file() and path.relative_to(out).as_posix() not in keep:
            path.unlink()


def stage_report(ctx: DedupContext, run: DedupRun) -> dict[str, Any]:
    """Stage 4: the report, the seal, and `.work` removed."""
    _, clusters = load_roots(ctx)
    records = _records(ctx, run)
    report = build_report(ctx, records, clusters)
    _prune(ctx.out, report["outputs"]["files"])
    atomic_write_text(ctx.out / REPORT, canonical_json(report))
    atomic_write_text(ctx.out / REPORT_MD, report_markdown(report))
    names = [*report["outputs"]["files"], REPORT, REPORT_MD]
    write_checksums(ctx.out, hash_files(ctx.out, names))
    remove_work(ctx.out)
    return report
