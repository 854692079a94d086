"""`python -m finetune <command>` (console script `elasticbert-finetune`).

Each room's command module (`train/cli.py`, `score/cli.py`, `serve/cli.py`, `serve/early_exit/cli.py`) exposes
`add_subparser(subparsers)`, which registers its commands, each with its `func`; this module only assembles them and
dispatches. A user error
(bad option, data, checkpoint) prints `finetune: error: MESSAGE` and exits 2 (`common.cli.dispatch`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from common.cli import add_debug, add_switch, dispatch, exit_without_teardown
from elasticbert.loading import set_checksum_verification

from . import hashee_cli
from .score import cli as score_cli
from .serve import cli as serve_cli
from .serve.early_exit import cli as early_exit_cli
from .train import cli as train_cli

COMMAND_MODULES = (train_cli, score_cli, early_exit_cli, serve_cli, hashee_cli)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="finetune", description="ElasticBERT GLUE/ELUE fine-tuning")
    add_debug(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.add_subparser(subparsers)
    for command in subparsers.choices.values():  # every command that loads a model checks the files we wrote
        if any("--model" in action.option_strings for action in command._actions):
            add_switch(
                command,
                "--verify-checksums",
                True,
                "check a model directory's checksums.json before loading it (--no-verify-checksums: load one "
                "that fails it)",
            )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch(build_parser(), argv, prepare=_apply_global_options)


def _apply_global_options(args: argparse.Namespace) -> None:
    set_checksum_verification(getattr(args, "verify_checksums", True))


if __name__ == "__main__":
    # every command closes its files before it returns: skip the interpreter's teardown of torch, transformers and
    # DeepSpeed (~1.2 s of CPU per process here; `common.cli.exit_without_teardown`)
    exit_without_teardown(main())
