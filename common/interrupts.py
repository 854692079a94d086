"""Ctrl-C while a command is starting exits 130 in one line, as it does once the command runs; SIGTERM stops a
command as Ctrl-C does.

`python -m finetune|pretrain|data_prep` (and the `elasticbert-*` scripts) spend their first seconds importing torch,
transformers and DeepSpeed before `common.cli.run_command` runs the command's body, where Ctrl-C becomes `PROG:
interrupted`, exit 130. A KeyboardInterrupt raised in the middle of those imports printed a traceback instead.
`quiet_while_starting` (called by `common/__init__.py`, the first of our code each of these programs imports) makes
SIGINT end such a process at once with that line and code: nothing has been claimed or written yet. `command_started`
gives SIGINT back to Python when the command's body starts, so that an interrupted command cleans up (temporary
files, claims) as before. Nothing changes for a program of someone else that imports our packages.

SIGTERM (`kill`, `timeout`, the end of a job's time) killed a command outright, leaving its temporary files (`.NAME
.tmpPID`, empty when nothing was written yet) and its claim for the next run to find. While a command runs
(`terminated_as_exception`), SIGTERM raises `common.errors.Terminated` in its main thread instead, which unwinds like
a KeyboardInterrupt: exit 143 in one line, nothing left behind. A command with its own handler (the trainers'
preemption: checkpoint, exit 75) installs it over this one; a forked child (a worker of a pool) still dies at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator

# imported first of all by every program: only modules the interpreter has loaded already and `signal`

PROGRAMS = {"finetune": "finetune", "pretrain": "pretrain", "data_prep": "data_prep", "demo": "demo"}
SCRIPTS = {"elasticbert-finetune": "finetune", "elasticbert-pretrain": "pretrain", "elasticbert-data": "data_prep"}
SCRIPTS["elasticbert-demo"] = "demo"


def launched_program() -> str | None:
    """Which of our programs this process is (`python -m finetune ...`, `elasticbert-finetune ...`), or None."""
    argv = list(getattr(sys, "orig_argv", ()))
    for i, arg in enumerate(argv[1:], start=1):
        if arg == "-m":
            return PROGRAMS.get(argv[i + 1] if i + 1 < len(argv) else "")
        if arg == "-c" or not arg.startswith("-"):
            break
    return SCRIPTS.get(os.path.basename(sys.argv[0]) if sys.argv else "")


def _interrupted(signum: int, frame: object) -> None:
    from .errors import EXIT_INTERRUPTED

    os.write(2, f"{launched_program() or 'elasticbert'}: interrupted\n".encode())
    os._exit(EXIT_INTERRUPTED)


def quiet_while_starting() -> None:
    """In one of our programs, before its command runs: SIGINT exits 130 with one line (see the module docstring).
    A SIGINT that is ignored (a background job of a script) stays ignored."""
    if launched_program() is not None and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        try:
            signal.signal(signal.SIGINT, _interrupted)
        except ValueError:  # imported by a thread that is not the main one: nothing to change
            pass


def command_started() -> None:
    """The command's body runs: Ctrl-C is a KeyboardInterrupt again (`common.cli.run_command` reports it)."""
    if signal.getsignal(signal.SIGINT) is _interrupted:
        try:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        except ValueError:  # a command run by a thread: signals stay the main thread's
            pass


class _RaiseTerminated:
    """The SIGTERM handler of a running command: `Terminated` in the process that installed it; in a forked child
    (a pool's worker, stopped by its pool with SIGTERM) the default, death."""

    def __init__(self) -> None:
        self.pid = os.getpid()

    def __call__(self, signum: int, frame: object) -> None:
        from .errors import Terminated

        if os.getpid() == self.pid:
            raise Terminated()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def terminated_as_exception() -> Iterator[None]:
    """While the block runs: SIGTERM raises `common.errors.Terminated` (where SIGTERM has its default action and this
    is the main thread); the handler before is put back after."""
    try:
        before = signal.getsignal(signal.SIGTERM)
        if before is not signal.SIG_DFL:
            before = None
        else:
            signal.signal(signal.SIGTERM, _RaiseTerminated())
    except ValueError:  # not the main thread
        before = None
    try:
        yield
    finally:
        if before is not None:
            signal.signal(signal.SIGTERM, before)
