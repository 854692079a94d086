"""SIGTERM (`kill`, `timeout`, the end of a Slurm job's time) or Ctrl-C while `predict` answers a stream: it stops
between two writes and says, in one line, how many of the lines it read were not answered.

Without this, SIGTERM killed `predict` wherever it was: mid-write on stdout (a cut last line), with no word of how far
it got. While `StopGuard` is installed (the main thread, while answers are written), the signal raises `Stopped` at
once — also out of a wait for the next line of stdin — except inside a write (`StopGuard.writing`), which is
finished first: every answered line is on the output whole. An `--output` file is written under a temporary name and
renamed only when complete (`common.io.atomic_path`), so a stopped run leaves no file that looks complete; on stdout
the answered lines stay, each whole, and the line says where to resume. A second signal during a write (a reader that
never drains the pipe) stops at once. `ReadLines` counts the lines read (stdin's as its reader takes them).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any, BinaryIO

from common.errors import EXIT_INTERRUPTED, EXIT_TERMINATED

STOP_SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}
EXIT_CODES = {signal.SIGTERM: EXIT_TERMINATED, signal.SIGINT: EXIT_INTERRUPTED}  # the shell's codes: 143, 130


class Stopped(BaseException):
    """A stop signal reached `predict` while it answered (`StopGuard`); a BaseException, as KeyboardInterrupt is, so
    that no `except Exception` of a library swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(STOP_SIGNALS.get(signum, f"signal {signum}"))
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.signum, 128 + self.signum)


class StopGuard:
    """Installs a handler of SIGTERM and SIGINT for the `with` block (in the main thread; elsewhere nothing changes)
    that raises `Stopped`, deferred to the end of a `writing()` block; the handlers before are put back after."""

    def __init__(self) -> None:
        self.in_write = False
        self.pending: int | None = None
        self.before: dict[int, Any] = {}

    def __enter__(self) -> StopGuard:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                if signal.getsignal(signum) is not signal.SIG_IGN:  # an ignored signal (nohup) stays ignored
                    self.before[signum] = signal.signal(signum, self._stop)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.before.items():
            signal.signal(signum, handler)
        self.before.clear()

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        if self.in_write and self.pending is None:  # the line being written is finished first
            self.pending = signum
            return
        raise Stopped(signum)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """A write that a stop signal does not cut: it is raised as the block ends."""
        self.in_write = True
        try:
            yield
        finally:
            self.in_write = False
        if self.pending is not None:
            raise Stopped(self.pending)


class ReadLines:
    """The inputs `predict` has read, for the line a stop prints: a file's (read whole before any is answered), or
    the lines of stdin its reader took (`readline`, counted as taken: lines queued and not yet answered included; a
    TSV's header is not an input)."""

    def __init__(self, source: str, tsv: bool) -> None:
        self.source, self.tsv = source, tsv
        self.inputs: list | None = None
        self.stream: BinaryIO | None = None
        self.lines = 0

    def readline(self, size: int = -1) -> bytes:
        """stdin's next line (this object stands for stdin as the reader's stream), counted."""
        assert self.stream is not None
        line = self.stream.readline(size)
        if line:
            self.lines += 1
        return line

    def count(self) -> int:
        if self.inputs is not None:
            return len(self.inputs)
        return max(self.lines - (1 if self.tsv else 0), 0)

    def next_to_answer(self, answered: int) -> str:
        """FILE:LINE of the first input not answered."""
        if self.inputs is not None:
            return self.inputs[answered].where
        return f"{self.source}:{answered + (2 if self.tsv else 1)}"

    def stopped(self, stop: Stopped, answered: int, output: str | None) -> str:
        """The one line of a stopped run: how many of the lines read were not answered, and what is on the output."""
        read = self.count()
        if read == 0:
            return f"stopped by {stop} before any input was read" + (f"; {output} was not written" if output else "")
        unanswered = read - answered
        head = f"stopped by {stop}: "
        head += f"{unanswered:,} of the {read:,} lines read {'was' if unanswered == 1 else 'were'} not answered"
        if not unanswered:
            head = f"stopped by {stop}: every line read ({read:,}) was answered"
        if output is not None:
            return head + f"; {output} was not written (it is written whole or not at all): rerun the command"
        if not unanswered:
            return head + f" (the {answered:,} answers are on stdout, each a whole line)"
        resume = f"from {self.next_to_answer(answered)} on"
        return head + f" ({resume}; the {answered:,} answers before are on stdout, each a whole line)"
