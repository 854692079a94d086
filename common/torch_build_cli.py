"""`python -m common.torch_build_cli plan [--python PY]`: the torch build this node's GPUs need (common/torch_build.py),
for `make install` and `make torch-plan`: from the PyTorch wheel index (TORCH_INDEX_URL: a mirror of it), or from
pip's configured index when that one does not answer (one line on stderr says so). Standard library only: it runs
with the system Python before any virtual environment exists."""

from __future__ import annotations

import argparse
import os
import sys

from .torch_build import TORCH_VERSION, choose_index, installed_build, plan_build, query_gpus


def main(argv: list[str] | None = None) -> int:
    """`python -m common.torch_build_cli plan [--python PY]`: the torch build this node needs and why, and the pip
    command that installs it; with --python, only the command for that interpreter, or nothing when that interpreter
    already has the planned build (what `make install` runs)."""
    ap = argparse.ArgumentParser(prog="python -m common.torch_build_cli", description=main.__doc__)
    ap.add_argument("command", choices=["plan"])
    ap.add_argument("--python", default=None, help="print only the pip command for this interpreter")
    args = ap.parse_args(argv)
    try:
        plan = plan_build(query_gpus(), os.environ.get("TORCH_CUDA"))
    except ValueError as e:
        print(f"torch_build: error: {e}", file=sys.stderr)
        return 2
    version = os.environ.get("TORCH_VERSION", TORCH_VERSION)
    if args.python:
        have = installed_build(args.python)
        if have is not None and have[0].split("+")[0] == version and have[1] == plan.build.cuda:
            print(f"torch_build: {args.python} has torch {have[0]}, the {plan.build.name} build: kept", file=sys.stderr)
            return 0
        if have is not None:
            print(
                f"torch_build: {args.python} has torch {have[0]} (CUDA {have[1]}); this node needs the "
                f"{plan.build.name} build ({plan.reason}): replacing it",
                file=sys.stderr,
            )
    source = choose_index(plan.build, version)
    if source.note:
        print(f"torch_build: {source.note}", file=sys.stderr)
    command = plan.build.pip_command(args.python or "python", version, source.index)
    if args.python:
        print(" ".join(command))
    else:
        print(f"torch build: {plan.build.name} ({plan.reason})")
        print(f"install: {' '.join(command)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
