"""`python -m pretrain {train,preflight,export,build-index,check-config,convert-universal}` (console script:
`elasticbert-pretrain`).

Exit codes: 0 done; 2 bad input (config, data, run directory in use, incompatible or corrupt checkpoint: any
`common.errors.UserError`) printed as `pretrain: error: MESSAGE`, no traceback; 3 training diverged (a non-finite
loss, gradient norm or weight: stopped without saving, `pretrain.guards`); 4 a checkpoint or log could not be
written (disk full: `latest` unchanged); 75 (EX_TEMPFAIL) after a preemption-triggered checkpoint (requeue and
rerun the same command); 130 Ctrl-C.

The commands live in `pretrain.cli` (each imports what it needs when it runs, so `--help` starts without torch or
DeepSpeed); this module only assembles them and dispatches.
"""

from __future__ import annotations

import argparse
import os
import sys

from common.cli import add_debug, dispatch, exit_without_teardown
from common.errors import EXIT_PEER_LOST

from .cli import add_commands


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m pretrain", description="ElasticBERT multi-exit pre-training")
    # the deepspeed launcher inserts --local_rank=N before the subcommand (LOCAL_RANK is read from the environment)
    ap.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    add_debug(ap)
    add_commands(ap.add_subparsers(dest="command", required=True))
    return ap


def main(argv: list[str] | None = None) -> int:
    """Parse and run one command; user errors exit 2 with `pretrain: error: ...` (common.cli.dispatch)."""
    return dispatch(build_parser(), argv, prog="pretrain")


def _exit(code: int) -> None:
    """Exit with `code` without the interpreter's teardown (`common.cli.exit_without_teardown`: 1.4 s of CPU per rank
    here). After a lost peer (5) at once, without even the atexit handlers: gloo closes this rank's sockets only when
    the process ends, and the ranks still blocked in a collective learn that the job is dead only from those sockets
    closing, rank after rank around the ring. With the normal teardown the news took 45-60 s to go round 64 ranks;
    leaving at once makes each hop a few milliseconds."""
    if code == EXIT_PEER_LOST:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    exit_without_teardown(code)


if __name__ == "__main__":
    _exit(main())
