"""`python -m finetune <command>` (console script `elasticbert-finetune`).

Each command module exposes `add_subparser(subparsers)`; a user error (bad option, data, checkpoint) prints
`finetune: error: MESSAGE` and exits 2 (`common.cli.run_command`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from common.cli import add_debug, run_command

from . import diagnostics, elue, evaluation, predict_cli, submission, train_cli
from .early_exit import cli as early_exit_cli

COMMAND_MODULES = (train_cli, evaluation, diagnostics, early_exit_cli, elue, submission, predict_cli)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="finetune", description="ElasticBERT GLUE/ELUE fine-tuning")
    add_debug(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.add_subparser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # `train` reads which options were given explicitly (they override a --recipe)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return run_command(parser.prog, lambda: args.func(args), debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
