"""`python -m finetune elue-score`: score points files against a baseline (`elue.py`) and print every score with
the baseline it was measured against."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from common.cli import add_command, add_output, add_switch
from common.errors import ConfigError
from common.io import atomic_write_json, make_dirs, peek_object, removed_on_failure
from common.outputs import Output, check_output

from .elue import OUT_OF_RANGE, elue_score, load_baseline_with_info, load_curves, merge_systems


def _is_report(path: Path) -> bool:
    """An `elue-score` report: a JSON object of systems, each with its tasks and score."""
    report = peek_object(path)
    return bool(report) and all(isinstance(v, Mapping) and "tasks" in v and "score" in v for v in report.values())


REPORT = Output("elue-score", "an ELUE score report (JSON)", own=_is_report)


def format_table(name: str, report: Mapping) -> str:
    """The report of one system: every score line names the baseline it was measured against."""
    base = report.get("baseline", {})
    against = f"vs baseline {base.get('name', '?')!r}"
    lines = [
        f"system {name}: ELUE score {_fmt(report['score'])} {against} (out-of-range: {report['out_of_range']})",
        f"  baseline: {base.get('name', '?')} [{base.get('kind', '?')}] - source: {base.get('source', 'not given')}",
    ]
    for task, entry in report["tasks"].items():
        lines.append(
            f"  {task:10s} {_fmt(entry['score'])} {against}  ({entry['used']} points, {entry['dropped']} dropped)"
        )
        for pt in entry["points"]:
            lines.append(
                f"      FLOPs {pt['flops']:.4g}  score {pt['score']:.2f}  baseline {_fmt(pt['baseline'])}"
                f"  [{pt['status']}]"
            )
    if report["tasks_without_points"]:
        lines.append(f"  (no points for: {', '.join(report['tasks_without_points'])})")
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f}" if abs(x) < 50 else f"{x:.2f}"


ELUE_SCORE_HELP = "ELUE score of operating points against a baseline per-exit curve"


ELUE_SCORE_DESCRIPTION = (
    "score = mean_i (p_i - p_EB(f_i)) per task with p_EB linearly interpolated from the baseline's "
    "points; the benchmark score is the mean over tasks. Baseline/points files: JSON {name, source, tasks: "
    "{TASK: [{flops, score}, ...]}}, CSV task,flops,score[,system], or an early-exit result (as a baseline: the "
    "model's own static curve, and every score says so). FLOPs > 0 per sample, scores in [-100, 100]. See "
    "finetune/elue.py and finetune/README.md."
)


def add_subparser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `elue-score` on the `python -m finetune` command line."""
    p = add_command(
        subparsers,
        "elue-score",
        main,
        ELUE_SCORE_HELP,
        description=ELUE_SCORE_DESCRIPTION,
    )
    p.add_argument("--baseline", required=True, nargs="+", help="baseline curve file(s): JSON, CSV or early-exit JSON")
    p.add_argument("--points", required=True, nargs="+", help="system points file(s): JSON, CSV or early-exit JSON")
    p.add_argument("--out-of-range", choices=OUT_OF_RANGE, default="clamp")
    p.add_argument("--system", default=None, help="score only this system (e.g. one strategy)")
    add_output(p, "write the full report as JSON here", required=False)
    add_switch(p, "--overwrite", False, "replace an existing --output report of elue-score (never another file)")
    return p


def main(args: argparse.Namespace) -> int:
    """`python -m finetune elue-score ...`"""
    if args.output:
        read = [*(("--baseline", path) for path in args.baseline), *(("--points", path) for path in args.points)]
        check_output(args.output, REPORT, read, args.overwrite)
    baseline, info = load_baseline_with_info(args.baseline)
    systems = merge_systems([load_curves(path, role="points") for path in args.points])
    if args.system:
        if args.system not in systems:
            raise ConfigError(f"no system {args.system!r} in --points (have: {', '.join(systems)})")
        systems = {args.system: systems[args.system]}
    report = {name: elue_score(baseline, tasks, args.out_of_range, info) for name, tasks in systems.items()}
    for name, entry in report.items():
        print(format_table(name, entry))
    if args.output:
        with removed_on_failure(Path(args.output).parent) as folder:  # no folder left behind by a failed write
            make_dirs(folder)
            atomic_write_json(args.output, report, indent=1)
    return 0
