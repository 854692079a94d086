"""`python -m finetune submission`: ELUE submission files from an `early-exit` result (the files and their layout:
`submission.py`, whose docstring is this command's help)."""

from __future__ import annotations

import argparse
from pathlib import Path

from common.cli import add_output

from . import submission
from .early_exit.operating_point import load_result
from .model import add_device
from .submission import write_submissions_for_results


def add_subparser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `submission` on the `python -m finetune` command line."""
    p = subparsers.add_parser(
        "submission",
        help="ELUE submission files: re-run each operating point of an early-exit result on the test split",
        description=submission.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--results", required=True, metavar="EARLY_EXIT.json", help="a result JSON of `early-exit`")
    add_output(p, "directory that receives one <strategy>_<threshold>/ directory per operating point", metavar="DIR")
    p.add_argument("--strategy", default=None, help="comma list of the result's strategies (default: all of them)")
    p.add_argument("--split", default="test", help="split to predict (default: %(default)s)")
    add_device(p)
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    """`python -m finetune submission ...`"""
    path = Path(args.results)
    results = load_result(path)
    chosen = [s.strip() for s in args.strategy.split(",") if s.strip()] if args.strategy else None
    written = write_submissions_for_results(
        results, args.output, split_name=args.split, strategies=chosen, device=args.device
    )
    print(f"{path}: wrote {len(written)} submission directories under {args.output}")
    return 0
