"""The on-disk shard format: `shard_XXXXX.bin` (token ids) + `shard_XXXXX.idx` (sentence/document index).

`.bin`: the token ids of all sentences back to back, little-endian uint16 (vocab < 65,536) or uint32.

`.idx` (little-endian), read with `numpy.memmap`, never loaded whole:

    offset 0   8s   magic  b"EBERTIDX"
           8   u32  format version (1)
          12   u32  dtype code = bytes per token id (2 -> uint16, 4 -> uint32)
          16   u64  S = number of sentences
          24   u64  D = number of documents
          32   u64  T = number of tokens (the .bin holds exactly T ids)
          40   32s  sha256 of the .bin (binds this .idx to its .bin: an .idx from another shard is detected)
          72   u64  reserved (0)
          80        int64[S]   sentence start offsets (in tokens, into the .bin)
                    int32[S]   sentence lengths (tokens, all > 0)
                    (4 zero bytes of padding when S is odd, so the next array is 8-byte aligned)
                    int64[D+1] document boundaries: document d = sentences [b[d], b[d+1]); b[0] = 0, b[D] = S

A document never spans two shards, so a document's tokens are one contiguous slice of one `.bin`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DataPrepError, with_path

FORMAT = "elasticbert-data_prep"  # manifest.json "format": a directory written by `data_prep tokenize`
MAGIC = b"EBERTIDX"
VERSION = 1
HEADER = struct.Struct("<8sIIQQQ32sQ")
HEADER_SIZE = HEADER.size  # 80
DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab < 65,536), else uint32."""
    return DTYPES[2] if vocab_size < 65536 else DTYPES[4]


@dataclass(frozen=True)
class IdxHeader:
    version: int
    itemsize: int
    num_sentences: int
    num_docs: int
    num_tokens: int
    bin_sha256: str

    @property
    def dtype(self) -> np.dtype:
        return DTYPES[self.itemsize]

    def layout(self) -> tuple[int, int, int, int]:
        """Byte offsets of (starts, lengths, doc boundaries) and the expected total .idx size."""
        s = self.num_sentences
        starts = HEADER_SIZE
        lengths = starts + 8 * s
        docs = lengths + 4 * s + (4 if s % 2 else 0)
        end = docs + 8 * (self.num_docs + 1)
        return starts, lengths, docs, end


def write_idx(
    path: str | os.PathLike, header: IdxHeader, lengths: np.ndarray, doc_bounds: np.ndarray
) -> tuple[str, int]:
    """Write a whole .idx, array by array (no joined copy: a part's index is tens of MB at 16 M tokens); returns
    its sha256 and size. A failed write names the file."""
    lengths = np.ascontiguousarray(lengths, dtype="<i4")
    starts = np.zeros(len(lengths), dtype="<i8")
    if len(lengths) > 1:
        np.cumsum(lengths[:-1], out=starts[1:])
    head = HEADER.pack(
        MAGIC,
        header.version,
        header.itemsize,
        header.num_sentences,
        header.num_docs,
        header.num_tokens,
        bytes.fromhex(header.bin_sha256),
        0,
    )
    pieces = [head, starts, lengths, b"\0\0\0\0" if len(lengths) % 2 else b"", np.ascontiguousarray(doc_bounds, "<i8")]
    digest, size = hashlib.sha256(), 0
    try:
        with open(path, "wb") as f:
            for piece in pieces:
                view = memoryview(piece).cast("B")
                f.write(view)
                digest.update(view)
                size += len(view)
    except OSError as err:
        raise with_path(err, path) from None
    return digest.hexdigest(), size


def read_idx_header(path: str | os.PathLike) -> IdxHeader:
    """Parse and sanity-check an .idx header (magic, version, dtype, file size)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER_SIZE)
        size = path.stat().st_size
    except OSError as e:
        raise DataPrepError(f"{path}: cannot read index file ({e.strerror or e})") from e
    if len(raw) < HEADER_SIZE:
        raise DataPrepError(f"{path}: truncated index file ({len(raw)} bytes, header needs {HEADER_SIZE})")
    magic, version, itemsize, n_sent, n_docs, n_tok, digest, _ = HEADER.unpack(raw)
    if magic != MAGIC:
        raise DataPrepError(f"{path}: not a data_prep index file (bad magic {magic!r})")
    if version != VERSION:
        raise DataPrepError(f"{path}: index format version {version}, this code reads version {VERSION}")
    if itemsize not in DTYPES:
        raise DataPrepError(f"{path}: unknown token dtype code {itemsize}")
    header = IdxHeader(version, itemsize, n_sent, n_docs, n_tok, digest.hex())
    expected = header.layout()[3]
    if size != expected:
        raise DataPrepError(
            f"{path}: index file is {size} bytes, its header ({n_sent} sentences, {n_docs} docs) needs {expected}"
        )
    return header


def open_idx_arrays(path: str | os.PathLike, header: IdxHeader) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts int64[S], lengths int32[S], doc boundaries int64[D+1]) as read-only memmaps."""
    starts_off, lengths_off, docs_off, _ = header.layout()
    s, d = header.num_sentences, header.num_docs
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    starts = mm[starts_off : starts_off + 8 * s].view("<i8")
    lengths = mm[lengths_off : lengths_off + 4 * s].view("<i4")
    bounds = mm[docs_off : docs_off + 8 * (d + 1)].view("<i8")
    return starts, lengths, bounds


def open_bin(path: str | os.PathLike, header: IdxHeader) -> np.ndarray:
    """The token ids of a shard as a read-only memmap; checks the size against the .idx header."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as e:
        raise DataPrepError(f"{path}: cannot read token file ({e.strerror or e})") from e
    expected = header.num_tokens * header.itemsize
    if size != expected:
        raise DataPrepError(
            f"{path}: token file is {size} bytes, its index says {header.num_tokens} tokens = {expected} bytes"
            + (" (truncated?)" if size < expected else "")
        )
    if header.num_tokens == 0:
        return np.zeros(0, dtype=header.dtype)
    return np.memmap(path, dtype=header.dtype, mode="r", shape=(header.num_tokens,))


ShardTarget = Path | tuple[Path, Path]  # a stem (writes STEM.bin, STEM.idx) or the (.bin, .idx) paths themselves


def shard_paths(target: ShardTarget) -> tuple[Path, Path]:
    """The (.bin, .idx) paths a shard is written to."""
    if isinstance(target, tuple):
        return target
    return target.with_suffix(".bin"), target.with_suffix(".idx")


class PartWriter:
    """Streams one shard's token ids to `<stem>.bin` (hashing while writing) and writes `<stem>.idx` at close.

    `target` may also be the two paths, e.g. temporary names that are renamed into place afterwards. Only documents
    are added (never half a document), so the shard invariant "documents never span shards" holds.
    """

    def __init__(self, target: ShardTarget, dtype: np.dtype) -> None:
        self.bin_path, self.idx_path = shard_paths(target)
        self.dtype = np.dtype(dtype)
        self._f = open(self.bin_path, "wb")  # an OSError here names the file itself
        self._hash = hashlib.sha256()
        self._lengths: list[np.ndarray] = []
        self._doc_counts: list[np.ndarray] = []
        self.num_tokens = 0
        self.num_sentences = 0
        self.num_docs = 0

    def add(self, ids: np.ndarray, sent_lens: np.ndarray, sents_per_doc: np.ndarray) -> None:
        """Append whole documents: `ids` = their tokens, `sent_lens` per sentence, `sents_per_doc` per document."""
        if len(sents_per_doc) == 0:
            return
        ids = np.ascontiguousarray(ids, dtype=self.dtype)
        self.write_tokens(memoryview(ids).cast("B"))
        self._lengths.append(np.asarray(sent_lens, dtype=np.int32))
        self._doc_counts.append(np.asarray(sents_per_doc, dtype=np.int64))
        self.num_tokens += len(ids)
        self.num_sentences += len(sent_lens)
        self.num_docs += len(sents_per_doc)

    def write_tokens(self, buf: memoryview) -> None:
        """Append raw token bytes to the .bin (hashing them); a failed write (disk full) names the file."""
        try:
            self._f.write(buf)
        except OSError as err:
            with contextlib.suppress(OSError):  # its buffer cannot be flushed either
                self._f.close()
            raise with_path(err, self.bin_path) from None
        self._hash.update(buf)

    def close(self) -> dict[str, Any]:
        """Finish both files and return their counts and hashes.

        No fsync: a unit is trusted after a crash only if its files re-hash to the recorded sha256 (the resume
        check), so durability comes from verification, not from flushing every part (costly on small units)."""
        try:
            self._f.close()
        except OSError as err:
            raise with_path(err, self.bin_path) from None
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int32)
        counts = np.concatenate(self._doc_counts) if self._doc_counts else np.zeros(0, np.int64)
        self._lengths, self._doc_counts = [], []  # one copy at a time
        bounds = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=bounds[1:])
        bin_sha = self._hash.hexdigest()
        header = IdxHeader(VERSION, self.dtype.itemsize, self.num_sentences, self.num_docs, self.num_tokens, bin_sha)
        idx_sha, idx_bytes = write_idx(self.idx_path, header, lengths, bounds)
        return {
            "docs": self.num_docs,
            "sentences": self.num_sentences,
            "tokens": self.num_tokens,
            "bin_sha256": bin_sha,
            "idx_sha256": idx_sha,
            "bin_bytes": self.num_tokens * self.dtype.itemsize,
            "idx_bytes": idx_bytes,
        }


class SplitWriter:
    """All of one unit's documents of one split: parts of at most `shard_tokens` tokens (a bigger lone doc
    gets a part of its own). Parts are `<dir>/<split>_NNN.{bin,idx}`."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype, shard_tokens: int) -> None:
        self.directory = directory
        self.split = split
        self.dtype = dtype
        self.shard_tokens = shard_tokens
        self.parts: list[dict[str, Any]] = []
        self._cur: PartWriter | None = None

    def _open(self) -> PartWriter:
        name = f"{self.split}_{len(self.parts):03d}"
        self._cur = PartWriter(self.directory / name, self.dtype)
        self._cur_name = name
        return self._cur

    def _close_current(self) -> None:
        if self._cur is not None:
            info = self._cur.close()
            info["name"] = self._cur_name
            self.parts.append(info)
            self._cur = None

    def add(self, ids: np.ndarray, sent_lens: np.ndarray, sents_per_doc: np.ndarray) -> None:
        """Append documents, rolling over to a new part at document boundaries when the target is reached."""
        n_docs = len(sents_per_doc)
        if n_docs == 0:
            return
        sent_end = np.cumsum(sents_per_doc)
        tok_cum = np.concatenate([[0], np.cumsum(sent_lens, dtype=np.int64)])
        doc_tok_end = tok_cum[sent_end]  # tokens up to the end of each doc
        d0 = 0
        while d0 < n_docs:
            part = self._cur or self._open()
            room = self.shard_tokens - part.num_tokens
            base = int(doc_tok_end[d0 - 1]) if d0 else 0
            # docs d0..d1-1 fit in the room left
            d1 = int(np.searchsorted(doc_tok_end, base + room, side="right"))
            if d1 <= d0:
                if part.num_tokens > 0:
                    self._close_current()
                    continue
                d1 = d0 + 1  # a single document larger than a whole shard: it gets a part of its own
            s0 = int(sent_end[d0 - 1]) if d0 else 0
            s1 = int(sent_end[d1 - 1])
            part.add(ids[base : int(doc_tok_end[d1 - 1])], sent_lens[s0:s1], sents_per_doc[d0:d1])
            d0 = d1
            if part.num_tokens >= self.shard_tokens:
                self._close_current()

    def close(self) -> list[dict[str, Any]]:
        self._close_current()
        return self.parts


def concat_shards(stems: list[Path], target: ShardTarget, dtype: np.dtype) -> dict[str, Any]:
    """Concatenate whole shards (in order) into one new shard (`target`: see `PartWriter`), streaming the .bin
    parts."""
    writer = PartWriter(target, dtype)
    for stem in stems:
        header = read_idx_header(stem.with_suffix(".idx"))
        _, lengths, bounds = open_idx_arrays(stem.with_suffix(".idx"), header)
        counts = np.diff(np.asarray(bounds))
        ids = open_bin(stem.with_suffix(".bin"), header)
        # stream the tokens in blocks; the index arrays of a part are small
        writer_lengths = np.asarray(lengths)
        step = 1 << 24
        for a in range(0, len(ids), step):
            block = np.asarray(ids[a : a + step])
            writer.write_tokens(memoryview(np.ascontiguousarray(block, dtype=writer.dtype)).cast("B"))
        writer._lengths.append(writer_lengths.astype(np.int32))
        writer._doc_counts.append(counts.astype(np.int64))
        writer.num_tokens += header.num_tokens
        writer.num_sentences += header.num_sentences
        writer.num_docs += header.num_docs
    return writer.close()
