"""`python -m finetune <command>` (console script `elasticbert-finetune`).

Each command module (`*_cli`) exposes `add_subparser(subparsers)`, which sets the command's `func`; a user error
(bad option, data, checkpoint) prints `finetune: error: MESSAGE` and exits 2 (`common.cli.dispatch`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from common.cli import add_debug, dispatch

from . import diagnostics_cli, elue_cli, evaluate_cli, export_cli, predict_cli, submission_cli, train_cli
from .early_exit import cli as early_exit_cli

COMMAND_MODULES = (
    train_cli,
    evaluate_cli,
    diagnostics_cli,
    early_exit_cli,
    elue_cli,
    submission_cli,
    predict_cli,
    export_cli,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="finetune", description="ElasticBERT GLUE/ELUE fine-tuning")
    add_debug(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.add_subparser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
