"""CLI: `python -m data_prep {train-tokenizer,dedup,tokenize,finalize,verify,stats} ...` (also `elasticbert-data`).

The conventions of `common.cli`: `--output PATH` where a command writes (train-tokenizer, tokenize, stats); the
prepared directory is positional for the commands that act on one (finalize, verify, stats); booleans are
`--x/--no-x`; defaults and choices come from `PrepConfig`, `RunOptions` and `TokenizerTraining`.

Exit codes: 0 success; 1 `verify` found problems (all listed); 2 a user error (one line on stderr, no traceback:
bad input, a damaged file, a failed write such as a full disk, a vocabulary that does not fit the text), 130
interrupted. Every numeric option is range-checked before anything is read or written.

The commands live beside what they drive: the tokenizer pipeline's in `data_prep.cli`, `dedup` in
`data_prep.dedup.cli`; this module only assembles them and dispatches.

Sanity checks: `tokenize` and `finalize` refuse a corpus whose [UNK] rate is above `--max-unk-fraction` (default
`common.vocab.DEFAULT_MAX_UNK_FRACTION`, measured: see there); `tokenize`, `finalize` and `stats` print the rate.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from common.cli import add_debug, dispatch

from . import cli
from .dedup import cli as dedup_cli

PROG = "data_prep"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m data_prep",
        description="Corpus -> tokenizer -> sharded memory-mapped token files (.bin/.idx) -> manifest.",
    )
    add_debug(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cli.add_train_tokenizer(sub)
    dedup_cli.add_dedup(sub)
    cli.add_tokenize(sub)
    cli.add_finalize(sub)
    cli.add_verify(sub)
    cli.add_stats(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m data_prep` and the `elasticbert-data` console script."""

    def prepare(args: argparse.Namespace) -> None:
        logging.basicConfig(level=logging.INFO, format="data_prep: %(message)s", stream=sys.stderr)

    return dispatch(build_parser(), argv, prog=PROG, prepare=prepare)


if __name__ == "__main__":
    sys.exit(main())
