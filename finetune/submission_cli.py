"""`python -m finetune submission`: ELUE submission files from an `early-exit` result (the files and their layout:
`submission.py`, whose docstring is this command's help)."""

from __future__ import annotations

import argparse
from pathlib import Path

from common.cli import add_command, add_device, add_output, add_switch

from . import submission
from .early_exit.operating_point import load_result
from .submission import write_submissions_for_results

SUBMISSION_HELP = "ELUE submission files: re-run each operating point of an early-exit result on the test split"


def add_subparser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `submission` on the `python -m finetune` command line."""
    p = add_command(subparsers, "submission", main, SUBMISSION_HELP, description=submission.__doc__)
    p.add_argument("--results", required=True, metavar="EARLY_EXIT.json", help="a result JSON of `early-exit`")
    add_output(p, "directory that receives one <strategy>_<threshold>/ directory per operating point", metavar="DIR")
    p.add_argument("--strategy", default=None, help="comma list of the result's strategies (default: all of them)")
    p.add_argument("--split", default="test", help="split to predict (default: %(default)s)")
    add_switch(p, "--overwrite", False, "replace a task's files that another early-exit result wrote in --output")
    add_device(p)
    return p


def main(args: argparse.Namespace) -> int:
    """`python -m finetune submission ...`"""
    path = Path(args.results)
    results = load_result(path)
    chosen = [s.strip() for s in args.strategy.split(",") if s.strip()] if args.strategy else None
    written = write_submissions_for_results(
        results,
        args.output,
        split_name=args.split,
        strategies=chosen,
        device=args.device,
        overwrite=args.overwrite,
        inputs=[("--results", path)],
    )
    print(f"{path}: wrote {len(written)} submission directories under {args.output}")
    return 0
