"""Inputs: discovery (files, folders, globs, HF dataset dirs, hub names), description, work-unit planning, and
streaming documents out of one unit.

Work units depend on the inputs (and `unit_bytes`) only, never on the number of workers or array tasks: sources
are sorted by path; a large uncompressed file is cut into byte ranges of ~`unit_bytes` at document boundaries
(a blank line, a line, a JSONL record), small ones are packed together. Compressed files cannot be seeked, so each
is one segment; a dataset is cut into row ranges. Everything is streamed in blocks: memory stays bounded whatever
the file size (documents longer than `max_doc_bytes` are cut).

A document is a JSONL record, a dataset row, or a block of text separated by a blank line (`doc_boundary="blank"`)
or a single line (`"line"`, e.g. WikiText, one paragraph per line), or a whole file (`"file"`, e.g. a book: read
and tokenized paragraph by paragraph, a new document every `max_doc_bytes`). `"auto"` picks `blank` when the first
64 KiB of a text file's body hold a blank line, else `line`. Project Gutenberg books (a `*** START OF ... PROJECT
GUTENBERG` marker near the top) lose their header and license footer. A document's stable id is (source key,
byte offset / row index), the source key being its path relative to the input argument: the validation split is a
hash of that id, so it depends neither on the unit cutting nor on where the corpus is mounted.

What is not text is counted per file as documents are read (U+FFFD after decoding - an undecodable byte sequence,
e.g. Latin-1 read as UTF-8 -, control characters and lines of letter soup: `ReadStats.text_faults`, `text_checks`;
in every unit record, summed into the manifest or the dedup report and logged per file), and a file most of whose
first MiB is neither (an executable, an archive) is refused before any work unless `--max-nontext-fraction` says
otherwise (`text_faults`).
"""

from __future__ import annotations

import codecs
import glob
import gzip
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

from common.io import parse_object

from .errors import DataPrepError
from .text_checks import SoupCounter, nontext_counts

BLOCK = 4 << 20
HEAD_BYTES = 64 << 10
TAIL_BYTES = 1 << 20
JSONL_EXTS = {".jsonl", ".ndjson", ".json"}
COMPRESSION_EXTS = {".gz": "gz", ".zst": "zst", ".zstd": "zst"}
SEP_BLANK = re.compile(rb"\n(?:[ \t\r\f\v]*\n)+")
SEP_LINE = re.compile(rb"\n")
_PG_START = re.compile(
    rb"^\*{3}\s*START OF (?:THE|THIS) PROJECT GUTENBERG[^\n]*|^\*END\*THE SMALL PRINT[^\n]*", re.I | re.M
)
_PG_END = re.compile(rb"^\*{3}\s*END OF (?:THE|THIS) PROJECT GUTENBERG[^\n]*", re.I | re.M)
_PG_END_LINE = re.compile(rb"^End of (?:the )?Project Gutenberg", re.I | re.M)
_WS = b" \t\r\n\f\v"

DocBoundary = Literal["auto", "blank", "line", "file"]  # what the user asks for (PrepConfig.doc_boundary)
DecodeErrorPolicy = Literal["replace", "fail"]  # invalid UTF-8: replace with U+FFFD and count, or stop
SourceKind = Literal["text", "jsonl", "hf", "hub"]  # plain text, JSON lines, a dataset dir, a hub dataset
Compression = Literal["", "gz", "zst"]

# --------------------------------------------------------------------------------------------- decode policy

_DECODE_ERRORS = [0]


def _count_and_replace(err: UnicodeDecodeError) -> tuple[str, int]:
    _DECODE_ERRORS[0] += 1
    return "\ufffd", err.end


codecs.register_error("data_prep_count", _count_and_replace)

# ------------------------------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class SourceSpec:
    """One input as found on disk: `path` is absolute (or `hf:NAME[:CONFIG]` for a hub dataset)."""

    path: str
    key: str
    kind: SourceKind
    compression: Compression = ""


def _is_hf_dir(p: Path) -> bool:
    return (p / "dataset_dict.json").is_file() or ((p / "state.json").is_file() and (p / "dataset_info.json").is_file())


def _file_spec(p: Path, key: str) -> SourceSpec:
    suffixes = [s.lower() for s in p.suffixes]
    compression = ""
    if suffixes and suffixes[-1] in COMPRESSION_EXTS:
        compression = COMPRESSION_EXTS[suffixes[-1]]
        suffixes = suffixes[:-1]
    kind = "jsonl" if suffixes and suffixes[-1] in JSONL_EXTS else "text"
    return SourceSpec(str(p), key, kind, compression)


def _abs(p: Path) -> Path:
    """Absolute and normalised, symlinks kept (so sorting follows the names the user sees)."""
    return Path(os.path.abspath(p))


def _walk(root: Path, key_base: Path, exclude: Path | None, out: list[SourceSpec]) -> None:
    if _is_hf_dir(root):
        out.append(SourceSpec(str(root), root.relative_to(key_base).as_posix() or root.name, "hf"))
        return
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as e:
        raise DataPrepError(f"{root}: cannot list folder ({e.strerror or e})") from e
    for entry in entries:
        if entry.name.startswith("."):
            continue
        p = Path(entry.path)
        if exclude is not None and p.resolve() == exclude:
            continue
        if entry.is_dir():
            _walk(p, key_base, exclude, out)
        elif entry.is_file():
            out.append(_file_spec(_abs(p), p.relative_to(key_base).as_posix()))


def discover(inputs: Sequence[str], exclude: str | os.PathLike | None = None) -> list[SourceSpec]:
    """Expand files, folders (recursively; hidden entries skipped) and globs into sorted, de-duplicated sources."""
    if not inputs:
        raise DataPrepError("no inputs given")
    excl = Path(exclude).resolve() if exclude is not None else None
    found: list[SourceSpec] = []
    for item in inputs:
        item = str(item)
        if item.startswith("hf:"):
            found.append(SourceSpec(item, item[3:].replace(":", "/"), "hub"))
            continue
        p = Path(item).expanduser()
        if p.is_dir():
            p = _abs(p)
            _walk(p, p.parent, excl, found)
            if not any(s.path.startswith(str(p)) for s in found):
                raise DataPrepError(f"{p}: folder contains no input files")
        elif p.is_file():
            found.append(_file_spec(_abs(p), p.name))
        elif glob.has_magic(item):
            matches = sorted(glob.glob(item, recursive=True))
            if not matches:
                raise DataPrepError(f"no files match {item!r}")
            prefix = item.split("*")[0].split("?")[0].split("[")[0]
            base = _abs(Path(os.path.dirname(prefix) or "."))
            for m in matches:
                mp = _abs(Path(m))
                if mp.is_dir():
                    _walk(mp, base, excl, found)
                elif mp.is_file():
                    found.append(_file_spec(mp, os.path.relpath(mp, base)))
        elif p.is_symlink():
            raise DataPrepError(f"{p}: cannot read input (broken symbolic link)")
        else:
            raise DataPrepError(f"{item}: input not found")
    seen: set[str] = set()
    unique = []
    for s in found:  # the same file reached twice (e.g. through a symlink) is read once
        real = os.path.realpath(s.path) if s.kind != "hub" else s.path
        if real not in seen:
            seen.add(real)
            unique.append(s)
    unique.sort(key=lambda s: s.path)
    return unique


# --------------------------------------------------------------------------------------------------- reading


def open_raw(path: str) -> BinaryIO:
    """Open a file for binary reading; an unreadable file becomes a DataPrepError naming it."""
    try:
        return open(path, "rb")
    except OSError as e:
        raise DataPrepError(f"{path}: cannot read input file ({e.strerror or e})") from e


def open_stream(path: str, compression: str) -> BinaryIO:
    """The (decompressed) byte stream of a file."""
    raw = open_raw(path)
    if compression == "gz":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if compression == "zst":
        try:
            import zstandard
        except ImportError as e:  # pragma: no cover - zstandard is in the train/dev extras
            raise DataPrepError(f"{path}: reading .zst needs the 'zstandard' package (pip install zstandard)") from e
        return _ZstdStream(raw, zstandard.ZstdDecompressor())  # type: ignore[return-value]
    return raw


class _ZstdStream:
    """Decompressed bytes of a .zst file, frame after frame. Why not `ZstdDecompressor.stream_reader`: on a file cut
    inside a frame it returns what it has and then b"" without an error, silently dropping the rest of the file;
    here the end of the file inside a frame raises EOFError (reported as a truncated stream)."""

    CHUNK = 64 << 10  # compressed bytes fed at a time (bounds the memory one feed can expand to)

    def __init__(self, raw: BinaryIO, dctx: Any) -> None:
        self._raw = raw
        self._dctx = dctx
        self._obj = dctx.decompressobj()
        self._buf = bytearray()
        self._in_frame = False
        self._eof = False

    def read(self, n: int) -> bytes:
        while len(self._buf) < n and not self._eof:
            chunk = self._raw.read(self.CHUNK)
            if not chunk:
                self._eof = True
                if self._in_frame:
                    raise EOFError("the file ends inside a zstd frame")
                break
            self._feed(chunk)
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def _feed(self, data: bytes) -> None:
        while data:
            self._in_frame = True
            self._buf += self._obj.decompress(data)
            if not self._obj.eof:
                return
            data = self._obj.unused_data  # the next frame starts here
            self._obj = self._dctx.decompressobj()
            self._in_frame = False

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> _ZstdStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read(stream: BinaryIO, n: int, path: str, compression: str) -> bytes:
    try:
        return stream.read(n)
    except (OSError, EOFError, ValueError) as e:
        what = f"corrupt or truncated {compression} stream" if compression else "read error"
        raise DataPrepError(f"{path}: {what} ({e})") from e
    except Exception as e:  # zstandard.ZstdError and friends
        if compression:
            raise DataPrepError(f"{path}: corrupt or truncated {compression} stream ({e})") from e
        raise


def iter_blocks(path: str, compression: str, start: int, end: int, block: int = BLOCK) -> Iterator[tuple[int, bytes]]:
    """Yield (offset, bytes) covering [start, end) of the decompressed content; end < 0 means to the end."""
    with open_stream(path, compression) as f:
        pos = 0
        if start:
            if compression:
                while pos < start:
                    got = _read(f, min(block, start - pos), path, compression)
                    if not got:
                        return
                    pos += len(got)
            else:
                f.seek(start)
                pos = start
        while end < 0 or pos < end:
            n = block if end < 0 else min(block, end - pos)
            data = _read(f, n, path, compression)
            if not data:
                return
            yield pos, data
            pos += len(data)


def line_number(path: str, compression: str, offset: int) -> int:
    """1-based line number of byte `offset` (only computed when reporting an error)."""
    count = 0
    for _, data in iter_blocks(path, compression, 0, offset):
        count += data.count(b"\n")
    return count + 1


# ----------------------------------------------------------------------------------------------- description


def _gutenberg_range(head: bytes, tail: bytes, tail_offset: int) -> tuple[int, int] | None:
    """Byte range of a Project Gutenberg book's body (header and license footer removed), or None."""
    if b"gutenberg" not in head[:HEAD_BYTES].lower():
        return None
    m = _PG_START.search(head)
    if not m:
        return None
    start = m.end()
    # a title can wrap: the marker ends at the closing "***"
    if not m.group().rstrip().endswith(b"***"):
        close = head.find(b"***", start, start + 1000)
        if close >= 0:
            start = close + 3
    nl = head.find(b"\n", start)
    start = nl + 1 if nl >= 0 else start
    end = None
    for e in _PG_END.finditer(tail):
        if tail_offset + e.start() >= start:
            end_local = e.start()
            lines = list(_PG_END_LINE.finditer(tail, max(0, end_local - 4096), end_local))
            if lines:
                end_local = lines[-1].start()
            end = tail_offset + end_local
            break
    return start, end if end is not None else -1


def describe(
    spec: SourceSpec, doc_boundary: DocBoundary, strip_gutenberg: bool, hf_split: str, text_field: str
) -> dict:
    """Stat a source and fix the facts units need: size, mtime, content byte range, and the document boundary it
    is read with ("auto" resolved to "blank" or "line"; "record" for JSONL, "row" for datasets)."""
    if spec.kind in ("hf", "hub"):
        return _describe_hf(spec, hf_split, text_field)
    path = spec.path
    try:
        st = os.stat(path)
    except OSError as e:
        raise DataPrepError(f"{path}: cannot read input file ({e.strerror or e})") from e
    rec: dict[str, Any] = {
        "path": path,
        "key": spec.key,
        "kind": spec.kind,
        "compression": spec.compression,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "gutenberg": False,
    }
    with open_raw(path):
        pass  # unreadable files fail here, naming the file
    head = b"".join(d for _, d in iter_blocks(path, spec.compression, 0, HEAD_BYTES))
    start, end = 0, (-1 if spec.compression else st.st_size)
    if spec.kind == "text" and strip_gutenberg and _PG_START.search(head):  # only PG books read their tail
        if spec.compression:  # not seekable: a full pass to find the footer
            size = 0
            tail = b""
            for off, data in iter_blocks(path, spec.compression, 0, -1):
                tail = (tail + data)[-TAIL_BYTES:]
                size = off + len(data)
            rng = _gutenberg_range(head, tail, size - len(tail))
        else:
            tail_off = max(0, st.st_size - TAIL_BYTES)
            tail = b"".join(d for _, d in iter_blocks(path, "", tail_off, st.st_size))
            rng = _gutenberg_range(head, tail, tail_off)
        if rng is not None:
            start = rng[0]
            if rng[1] >= 0:
                end = rng[1]
            rec["gutenberg"] = True
    if start == 0 and head.startswith(codecs.BOM_UTF8):
        start = 3
    if spec.kind == "jsonl":
        boundary = "record"
    elif doc_boundary == "auto":
        sample = (
            head
            if start <= 3
            else b"".join(d for _, d in iter_blocks(path, spec.compression, start, start + HEAD_BYTES))
        )
        boundary = "blank" if SEP_BLANK.search(sample) else "line"
    else:
        boundary = doc_boundary
    rec.update(start=start, end=end, doc_boundary=boundary)
    return rec


def _load_hf(path: str, kind: str, split: str) -> Any:
    try:
        import datasets
    except ImportError as e:  # pragma: no cover
        raise DataPrepError(f"{path}: reading Hugging Face datasets needs the 'datasets' package") from e
    if kind == "hub":
        name, _, config = path[3:].partition(":")
        try:
            return datasets.load_dataset(name, config or None, split=split)
        except Exception as e:
            raise DataPrepError(f"{path}: cannot load hub dataset ({type(e).__name__}: {e})") from e
    try:
        ds = datasets.load_from_disk(path)
    except Exception as e:
        raise DataPrepError(f"{path}: cannot load dataset directory ({type(e).__name__}: {e})") from e
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataPrepError(f"{path}: dataset has no split {split!r} (splits: {', '.join(ds)}); use --hf-split")
        ds = ds[split]
    return ds


def _describe_hf(spec: SourceSpec, split: str, text_field: str) -> dict:
    ds = _load_hf(spec.path, spec.kind, split)
    if text_field not in ds.column_names:
        raise DataPrepError(
            f"{spec.path}: dataset has no {text_field!r} column (columns: {', '.join(ds.column_names)}); "
            "use --text-field"
        )
    size = int(ds.data.nbytes)
    return {
        "path": spec.path,
        "key": spec.key,
        "kind": spec.kind,
        "compression": "",
        "size": size,
        "mtime_ns": 0,
        "fingerprint": getattr(ds, "_fingerprint", ""),
        "split": split,
        "gutenberg": False,
        "start": 0,
        "end": len(ds),
        "doc_boundary": "row",
    }


# ------------------------------------------------------------------------------------------------- planning


def _separator(boundary: str) -> re.Pattern[bytes]:
    """Pieces are split at lines ("line", "record") or at blank lines ("blank", and "file": paragraphs)."""
    return SEP_LINE if boundary in ("line", "record") else SEP_BLANK


def _find_cut(src: dict, pos: int, end: int, max_doc_bytes: int) -> int:
    """First document boundary at or after `pos` (deterministic: depends on the file bytes only)."""
    sep = _separator(src["doc_boundary"])
    path = src["path"]
    window = b""
    wstart = pos
    for off, data in iter_blocks(path, "", pos, end, block=1 << 20):
        window += data
        for m in sep.finditer(window):
            if m.end() < len(window) or off + len(data) >= end:
                return wstart + m.end()
        if src["doc_boundary"] != "record" and len(window) > max_doc_bytes:
            # no boundary within a huge document: cut at a line end, else at a UTF-8 character boundary
            nl = window.rfind(b"\n", 0, max_doc_bytes)
            if nl >= 0:
                return wstart + nl + 1
            cut = max_doc_bytes
            while cut > 1 and 0x80 <= window[cut] < 0xC0:
                cut -= 1
            return wstart + cut
    return end


def plan_units(sources: list[dict], unit_bytes: int, max_doc_bytes: int) -> list[list[list[int]]]:
    """Cut the sorted sources into work units: lists of [source index, start, end] segments of ~unit_bytes.

    A source of at least `unit_bytes` gets units of its own, cut at document boundaries found from
    start + k * unit_bytes onwards: its cuts depend on its own bytes only. Runs of smaller sources are packed
    together. So a changed or added file changes its own units (and those of its run of small files), and a
    rerun reuses every other finished unit.
    """
    units: list[list[list[int]]] = []
    cur: list[list[int]] = []
    cur_size = 0

    def close() -> None:
        nonlocal cur, cur_size
        if cur:
            units.append(cur)
        cur, cur_size = [], 0

    for i, src in enumerate(sources):
        start, end = src["start"], src["end"]
        if src["kind"] in ("hf", "hub"):
            close()
            n = end
            per_row = max(1.0, src["size"] / max(1, n))
            rows = max(1, int(unit_bytes // per_row))
            units.extend([[i, a, min(n, a + rows)]] for a in range(0, n, rows))
            continue
        size = src["size"] * 4 if src["compression"] else end - start
        if size < unit_bytes:  # small: packed with its neighbours
            cur.append([i, start, end])
            cur_size += size
            if cur_size >= unit_bytes:
                close()
            continue
        close()
        if src["compression"]:  # not seekable: one segment
            units.append([[i, start, end]])
            continue
        a = start
        while end - a > unit_bytes:
            cut = _find_cut(src, a + unit_bytes, end, max_doc_bytes)
            units.append([[i, a, cut]])
            a = cut
        if a < end:
            units.append([[i, a, end]])
    close()
    return units


# ---------------------------------------------------------------------------------------------- documents


@dataclass
class ReadStats:
    """Counters a unit reports: raw bytes read, documents, decode errors (replaced), what is not text per file."""

    bytes_read: int = 0
    decode_errors: int = 0
    skipped_empty: int = 0
    hasher: Any = field(default=None)
    _faults: dict[str, list[int]] = field(default_factory=dict)  # path -> [U+FFFD, control characters, soup lines]
    _soup: SoupCounter = field(default_factory=SoupCounter)

    def count_faults(self, path: str, text: str, raw: bytes | None = None) -> None:
        """Add the U+FFFD and control characters (`nontext_counts`) and the lines of letter soup (`SoupCounter`)
        of a document of `path`."""
        replaced, control = nontext_counts(text, raw)
        if replaced or control:
            now = self._faults.setdefault(path, [0, 0, 0])
            now[0], now[1] = now[0] + replaced, now[1] + control
        self._soup.add(path, raw if raw is not None else text.encode("utf-8", "surrogatepass"))

    @property
    def text_faults(self) -> dict[str, list[int]]:
        """path -> [U+FFFD, control characters, lines of letter soup] of the files with any, sorted by path."""
        for path, soup in self._soup.flush().items():
            self._faults.setdefault(path, [0, 0, 0])[2] = soup
        return dict(sorted(self._faults.items()))


class DocumentReader:
    """Streams (doc offset, text) of one segment of one source, applying the decode-error policy."""

    def __init__(
        self, src: dict, on_decode_error: DecodeErrorPolicy, text_field: str, max_doc_bytes: int, stats: ReadStats
    ) -> None:
        self.src = src
        self.path = src["path"]
        self.policy = on_decode_error
        self.text_field = text_field
        self.max_doc_bytes = max_doc_bytes
        self.stats = stats

    def _where(self, offset: int) -> str:
        comp = self.src.get("compression", "")
        try:
            return f"{self.path}: line {line_number(self.path, comp, offset)}"
        except DataPrepError:
            return f"{self.path}: byte {offset}"

    def _decode(self, raw: bytes, offset: int) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            if self.policy == "fail":
                raise DataPrepError(
                    f"{self._where(offset + e.start)}: invalid UTF-8 at byte {offset + e.start} "
                    f"({e.reason}); use --on-decode-error replace to replace and count such bytes"
                ) from None
            before = _DECODE_ERRORS[0]
            text = raw.decode("utf-8", "data_prep_count")
            self.stats.decode_errors += _DECODE_ERRORS[0] - before
            return text

    def _pieces(self, off: int, raw: bytes) -> Iterator[tuple[int, bytes]]:
        """A document longer than max_doc_bytes is cut (at a line end, else a UTF-8 character boundary); the
        cut points depend on the document's bytes only, never on how it was read."""
        limit = self.max_doc_bytes
        if self.src["doc_boundary"] == "record":
            yield off, raw
            return
        while len(raw) > limit:
            cut = raw.rfind(b"\n", 0, limit)
            if cut <= 0:
                cut = limit
                while cut > 1 and 0x80 <= raw[cut] < 0xC0:
                    cut -= 1
            yield off, raw[:cut]
            raw = raw[cut:]
            off += cut
        if raw:
            yield off, raw

    def _raw_docs(self, start: int, end: int) -> Iterator[tuple[int, bytes]]:
        """Split the byte range into raw document byte strings at the source's boundary (streaming)."""
        sep = _separator(self.src["doc_boundary"])
        comp = self.src.get("compression", "")
        hasher = self.stats.hasher
        carry = b""
        carry_off = start
        is_record = self.src["doc_boundary"] == "record"
        for _, data in iter_blocks(self.path, comp, start, end):
            self.stats.bytes_read += len(data)
            if hasher is not None:
                hasher.update(data)
            buf = carry + data if carry else data
            pos = 0
            for m in sep.finditer(buf):
                if m.end() == len(buf):
                    break  # the separator may continue in the next block: decide then
                yield from self._pieces(carry_off + pos, buf[pos : m.start()])
                pos = m.end()
            carry = buf[pos:]
            carry_off += pos
            # bounded memory: a document that has outgrown the limit is emitted piece by piece already
            while not is_record and len(carry) > self.max_doc_bytes:
                off, piece = next(self._pieces(carry_off, carry))
                yield off, piece
                carry = carry[len(piece) :]
                carry_off += len(piece)
        if carry:
            yield from self._pieces(carry_off, carry)

    def documents(self, start: int, end: int) -> Iterator[tuple[int, str]]:
        """(document id, text) of every non-empty piece in [start, end). The id is the stable offset where the
        document starts; consecutive pieces with the same id are one document (only in "file" mode, where a
        document is read paragraph by paragraph)."""
        if self.src["doc_boundary"] != "file":
            yield from self._pieces_of(start, end)
            return
        doc, size = start, 0
        for off, text in self._pieces_of(start, end):
            n = len(text)
            if size and size + n > self.max_doc_bytes:  # cut long files into documents at paragraph breaks
                doc, size = off, 0
            size += n
            yield doc, text

    def _pieces_of(self, start: int, end: int) -> Iterator[tuple[int, str]]:
        kind = self.src["kind"]
        if kind in ("hf", "hub"):
            yield from self._hf_documents(start, end)
            return
        for off, raw in self._raw_docs(start, end):
            stripped = raw.lstrip(_WS)
            if not stripped:
                continue
            off += len(raw) - len(stripped)
            stripped = stripped.rstrip(_WS)
            if kind == "jsonl":
                text = self._parse_record(stripped, off)
                if text is None:
                    continue
                self.stats.count_faults(self.path, text)
            else:
                text = self._decode(stripped, off)
                self.stats.count_faults(self.path, text, stripped)
            yield off, text

    def _parse_record(self, raw: bytes, offset: int) -> str | None:
        line = self._decode(raw, offset)
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            rec = None
        if not isinstance(rec, dict):  # only now the line number: `_where` re-reads the file up to here
            rec = parse_object(line, self._where(offset), DataPrepError, "a JSON object per line", record=True)
        if self.text_field not in rec:
            keys = ", ".join(list(rec)[:8]) or "none"
            raise DataPrepError(
                f"{self._where(offset)}: record has no {self.text_field!r} field (keys: {keys}); use --text-field"
            )
        text = rec[self.text_field]
        if not isinstance(text, str):
            raise DataPrepError(
                f"{self._where(offset)}: field {self.text_field!r} is {type(text).__name__}, not a string"
            )
        if not text.strip():
            self.stats.skipped_empty += 1
            return None
        return text

    def _hf_documents(self, start: int, end: int) -> Iterator[tuple[int, str]]:
        ds = _load_hf(self.path, self.src["kind"], self.src.get("split", "train"))
        table = ds.with_format("arrow")
        step = 1000
        for a in range(start, end, step):
            b = min(end, a + step)
            col = table[a:b][self.text_field].to_pylist()
            for i, text in enumerate(col):
                if text is None or not isinstance(text, str):
                    raise DataPrepError(
                        f"{self.path}: record {a + i}: field {self.text_field!r} is {type(text).__name__}, not a string"
                    )
                n = len(text)
                self.stats.bytes_read += n
                if self.stats.hasher is not None:
                    self.stats.hasher.update(text.encode("utf-8", "surrogatepass"))
                if text.strip():
                    self.stats.count_faults(self.path, text)
                    yield a + i, text
