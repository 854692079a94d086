"""What `predict` reads: texts or text pairs from a file or stdin, one per line, in one of three formats.

- `txt`: one text per line (tabs are part of the text);
- `jsonl`: one JSON object per line; a pair as `text_a`/`text_b`, `sentence1`/`sentence2`, `premise`/`hypothesis`,
  `question1`/`question2` or `question`/`sentence`; a single text as `text`, `sentence`, `text_a` or `sentence1`.
  Other fields are ignored, except `id`, which the prediction echoes;
- `tsv`: a header row naming the text columns (the same names, or the columns of the task the model was fine-tuned
  on, so GLUE/ELUE files read as they are), then tab-separated rows (no quoting, as GLUE's files). A header with
  another task's columns (QNLI's `question` before an SST-2 model, MNLI's `promptID`) is refused: the model would
  read its own columns and drop the rest (`tasks.foreign_columns`).

`--format auto` takes the format from the file's suffix (.txt/.text, .jsonl/.ndjson, .tsv); stdin is txt unless told.
A malformed line is a `DataError` naming `FILE:LINE`; in a file an empty text is refused (a blank line is not a
text), except blank lines at the very end. In a stream (stdin) every line is an input and gets its answer, a blank
one too (the `empty` verdict, `verdicts.py`): a live stream goes on past it, and answers stay one per line.
`arriving_batches` reads a stream line by line and hands out small batches as lines arrive (a batch closes as soon
as no further line is waiting, and says whether the stream is quiet then), so an interactive user gets each answer
at once and a fast pipe fills whole batches.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

from common.io import parse_object

from ..tasks import DataError, foreign_columns, tasks_reading

InputFormat = Literal["auto", "txt", "jsonl", "tsv"]
SUFFIXES = {".txt": "txt", ".text": "txt", ".jsonl": "jsonl", ".ndjson": "jsonl", ".tsv": "tsv"}
PAIR_FIELDS = (
    ("text_a", "text_b"),
    ("sentence1", "sentence2"),
    ("premise", "hypothesis"),
    ("question1", "question2"),
    ("question", "sentence"),
)
SINGLE_FIELDS = ("text", "sentence", "text_a", "sentence1")
STDIN = "<stdin>"


@dataclass(frozen=True)
class TextInput:
    """One text (or pair) to classify; `where` (FILE:LINE) names it in messages, `id` is echoed in its prediction."""

    text_a: str
    text_b: str | None = None
    where: str = ""
    id: Any = None


def resolve_format(source: str, fmt: str) -> str:
    """The format of `source` (a path or '-'): `fmt`, or for `auto` the file's suffix (stdin: txt)."""
    if fmt != "auto":
        return fmt
    if source == "-":
        return "txt"
    suffix = Path(source).suffix.lower()
    if suffix not in SUFFIXES:
        raise DataError(
            f"{source}: cannot tell its format from the suffix {suffix or '(none)'!r}; pass --format txt, jsonl or tsv"
        )
    return SUFFIXES[suffix]


def _text(value: object, where: str, field: str) -> str:
    if not isinstance(value, str):
        raise DataError(f"{where}: field {field!r} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise DataError(f"{where}: field {field!r} is an empty text")
    return value


def parse_record(line: str, where: str) -> TextInput:
    """One JSONL line as a text or a pair (see the module docstring for the field names)."""
    record = parse_object(line, where, DataError, "a JSON object with a text field", record=True)
    ident = record.get("id")
    for first, second in PAIR_FIELDS:
        if first in record and second in record:
            return TextInput(_text(record[first], where, first), _text(record[second], where, second), where, ident)
    singles = [name for name in SINGLE_FIELDS if name in record]
    if len(singles) > 1:
        raise DataError(f"{where}: fields {singles} each name a text; give one (or a pair such as text_a/text_b)")
    if not singles:
        seconds = [second for first, second in PAIR_FIELDS if second in record and first not in record]
        hint = f" ({seconds[0]!r} needs its first text)" if seconds else ""
        raise DataError(
            f"{where}: no text field{hint}; expected one of {', '.join(SINGLE_FIELDS)}, or a pair "
            + ", ".join("/".join(pair) for pair in PAIR_FIELDS)
        )
    return TextInput(_text(record[singles[0]], where, singles[0]), None, where, ident)


def text_columns(header: list[str], where: str, task_columns: Sequence[Sequence[str]] | None = None) -> tuple[int, ...]:
    """The positions of the text column(s) a TSV header names: the task's own columns first (when known), then the
    pairs and single texts of the module docstring."""
    lowered = [name.strip().lower() for name in header]
    if task_columns and (foreign := foreign_columns(tasks_reading(task_columns), header)):
        said = ", ".join(f"{column!r} ({' or '.join(owners)}'s)" for column, owners in foreign.items())
        reads = " and ".join("|".join(names) for names in task_columns)
        raise DataError(
            f"{where}: header {header} has column{'s' if len(foreign) > 1 else ''} {said}: another task's data, and "
            f"the model reads only {reads} (its task's text), so the rest would be dropped. Keep only the columns to "
            "classify (e.g. `cut -f`), or use a model fine-tuned on that task"
        )
    candidates = [tuple(tuple(names) for names in task_columns)] if task_columns else []
    candidates += [((a,), (b,)) for a, b in PAIR_FIELDS] + [((name,),) for name in SINGLE_FIELDS]
    for columns in candidates:
        found = [next((lowered.index(n.lower()) for n in names if n.lower() in lowered), None) for names in columns]
        if all(i is not None for i in found):
            return tuple(found)
    names = ", ".join(SINGLE_FIELDS) + ", or a pair " + ", ".join("/".join(p) for p in PAIR_FIELDS)
    raise DataError(f"{where}: header {header} names no text column; expected {names}")


class LineParser:
    """Turns the lines of one input (a file or stdin), one at a time, into `TextInput`s in one format.

    In a file a blank line is refused when a text follows it (`finish` forgives blank lines at the very end); in a
    `stream` it is an empty input (answered with its verdict, not the end of the stream)."""

    def __init__(
        self, fmt: str, name: str, task_columns: Sequence[Sequence[str]] | None = None, stream: bool = False
    ) -> None:
        if fmt not in ("txt", "jsonl", "tsv"):
            raise DataError(f"--format {fmt!r}: expected txt, jsonl or tsv")
        self.fmt, self.name, self.task_columns, self.stream = fmt, name, task_columns, stream
        self.columns: tuple[int, ...] | None = None
        self.width = 0
        self.blank: int | None = None  # the first blank line since the last text
        self.count = 0

    def feed(self, number: int, raw: bytes | str) -> TextInput | None:
        """Line `number` (1-based) -> its input, or None (a header or a blank line)."""
        where = f"{self.name}:{number}"
        line = raw if isinstance(raw, str) else _decode(raw, where)
        line = line.removesuffix("\n").removesuffix("\r")
        if number == 1:
            line = line.removeprefix("\ufeff")
        if not line.strip():
            if self.fmt == "tsv" and self.columns is None:
                raise DataError(f"{where}: a TSV input starts with a header row naming its text columns")
            if self.stream:  # an input with nothing in it: its verdict says so, and the stream goes on
                self.count += 1
                return TextInput(line, None, where)
            self.blank = self.blank or number
            return None
        if self.blank is not None:
            raise DataError(f"{self.name}:{self.blank}: blank line (one text per line; a blank line is not a text)")
        if self.fmt == "tsv" and self.columns is None:
            header = line.split("\t")
            self.columns, self.width = text_columns(header, where, self.task_columns), len(header)
            return None
        self.count += 1
        if self.fmt == "txt":
            return TextInput(line, None, where)
        if self.fmt == "jsonl":
            return parse_record(line, where)
        return self._tsv_row(line, where)

    def _tsv_row(self, line: str, where: str) -> TextInput:
        cells = line.split("\t")
        if len(cells) != self.width:
            raise DataError(f"{where}: expected {self.width} tab-separated columns (as the header), got {len(cells)}")
        texts = [_text(cells[i], where, f"column {i + 1}") for i in self.columns]
        return TextInput(texts[0], texts[1] if len(texts) == 2 else None, where)

    def finish(self) -> None:
        """The end of the input: one with no text at all is refused."""
        if self.count == 0:
            raise DataError(f"{self.name}: no texts to classify")


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{where}: not UTF-8 text ({err.reason} at byte {err.start} of the line)") from None


def read_inputs(path: str | Path, fmt: str, task_columns: Sequence[Sequence[str]] | None = None) -> list[TextInput]:
    """Every input of a file, all checked before any is classified."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    parser = LineParser(fmt, str(path), task_columns)
    try:
        with open(path, "rb") as handle:
            inputs = [item for number, raw in enumerate(handle, start=1) if (item := parser.feed(number, raw))]
    except OSError as err:  # a failed read() names no file by itself
        err.filename = err.filename or str(path)
        raise
    parser.finish()
    return inputs


_END = object()


def _read_lines(stream: BinaryIO, lines: queue.Queue) -> None:
    """The reader thread: every line of `stream` into `lines` as it arrives, then `_END` (or the error)."""
    try:
        for raw in iter(stream.readline, b""):
            lines.put(raw)
        lines.put(_END)
    except BaseException as err:  # handed to the main thread, which raises it
        if isinstance(err, OSError) and not err.filename:
            err.filename = STDIN  # a failed read() names no file by itself
        lines.put(err)


def arriving_batches(stream: BinaryIO, parser: LineParser, batch_size: int) -> Iterator[tuple[list[TextInput], bool]]:
    """Inputs from a stream in batches of up to `batch_size`, each closed as soon as no further line is waiting, with
    whether the stream is quiet as it closes (no line waiting, or the end): a server answers everything it holds
    then, rather than wait for lines that are not coming."""
    lines: queue.Queue = queue.Queue(maxsize=4 * batch_size)
    threading.Thread(target=_read_lines, args=(stream, lines), daemon=True).start()
    number, batch, ended = 0, [], False
    while not ended:
        item = lines.get()  # wait for the next line
        while True:
            if item is _END:
                ended = True
                break
            if isinstance(item, BaseException):
                raise item
            number += 1
            if (text := parser.feed(number, item)) is not None:
                batch.append(text)
            if len(batch) >= batch_size:
                break
            try:
                item = lines.get_nowait()
            except queue.Empty:
                break
        quiet = ended or lines.empty()
        if batch or quiet:
            yield batch, quiet
            batch = []
    parser.finish()
