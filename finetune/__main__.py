"""`python -m finetune <command>` (console script `elasticbert-finetune`).

Each command module exposes `add_subparser(subparsers)`; optional modules (early exit, ELUE) join when present.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMAND_MODULES = (
    "finetune.train_cli",
    "finetune.evaluation",
    "finetune.diagnostics",
    "finetune.early_exit",
    "finetune.elue",
)
OPTIONAL = {"finetune.early_exit", "finetune.elue"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="finetune", description="ElasticBERT GLUE/ELUE fine-tuning")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if name in OPTIONAL and err.name == name:
                continue
            raise
        if hasattr(module, "add_subparser"):
            module.add_subparser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from elasticbert import CheckpointError

    from .config import ConfigError
    from .tasks import DataError

    try:
        return int(args.func(args) or 0)
    except (DataError, CheckpointError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
