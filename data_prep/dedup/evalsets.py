"""Decontamination against downstream evaluation sets: read them (TSV or JSONL files below the folders the user
names), index their word n-grams, find the n-grams a corpus document shares with them, and cut or drop it.

Which files: every `.tsv`/`.jsonl` (also `.json` lines, `.txt` one example a line) below each `--eval-sets DIR`
whose name starts with one of `--eval-splits` (default `dev`, `test`: GLUE's `dev.tsv`, `dev_matched.tsv`,
`test.tsv`; `all` takes every file). An evaluation set is one file, named by its path below DIR without the suffix
(`SST-2/dev`). Which text: every TSV cell, every JSON string (nested ones too) of at least `MIN_TEXT_WORDS` words —
labels, ids, genres and scores are shorter, so no column list per task is needed.

n (GPT-3, Brown et al. 2020, appendix C): the n-gram length of a set is the 5th percentile of its texts' lengths in
words, clamped to [`ngram_min`, `ngram`] (defaults 8 and 13): 13-grams for sets of long texts (RTE, QNLI, MRPC), 8
for sets of short sentences (CoLA, SST-2), which 13-grams would not see at all. A text shorter than its set's n
cannot match (counted as `too_short` in the report). A corpus document's hits are its n-grams found in the table.

What happens to a document with hits (`decontaminate`): `cut` (GPT-3's rule, the default) removes every matched
span plus `margin` characters on each side, keeps the pieces of at least `min_piece` characters, and drops the whole
document when it would fall into more than `max_pieces` pieces; `drop` removes the document; `report` only counts.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.integrity import sha256_file

from ..errors import DataPrepError
from . import text as T

EVAL_SUFFIXES = {".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".txt": "txt"}
MIN_TEXT_WORDS = 3
PERCENTILE = 5
FILTER_BITS = 23  # a 8 MB byte map per n of the table's grams: ~90 % of a document's n-grams skip the binary search


@dataclass(frozen=True)
class EvalSet:
    """One evaluation file: its name, path, n, examples (rows) and their texts."""

    name: str
    path: str
    sha256: str
    n: int
    examples: int
    texts: list[tuple[int, str]]  # (row, text)
    too_short: int


def find_eval_files(dirs: Sequence[str | os.PathLike], splits: Sequence[str]) -> list[tuple[str, Path]]:
    """(set name, path) of the evaluation files below `dirs`, sorted; a missing folder or one without a matching
    file is a DataPrepError naming it."""
    found: list[tuple[str, Path]] = []
    take_all = "all" in splits
    for d in dirs:
        root = Path(d).expanduser()
        if not root.is_dir():
            found = "is a file, not a folder" if root.exists() else "no such folder"
            raise DataPrepError(f"--eval-sets {d}: {found} (a folder of TSV/JSONL evaluation files)")
        mine = []
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root)
            if any(p.startswith(".") for p in rel.parts) or not path.is_file():
                continue
            if path.suffix.lower() in EVAL_SUFFIXES and (take_all or path.name.lower().startswith(tuple(splits))):
                name = (Path(root.name) / rel.with_suffix("")).as_posix() if len(dirs) > 1 else rel.with_suffix("")
                mine.append((str(Path(name).as_posix()), path))
        if not mine:
            wanted = "any" if take_all else "/".join(splits)
            raise DataPrepError(
                f"--eval-sets {d}: no {wanted} file (.tsv, .jsonl, .txt) in it; --eval-splits all takes every file"
            )
        found += mine
    names = [n for n, _ in found]
    if len(set(names)) != len(names):
        raise DataPrepError(f"--eval-sets: two evaluation files named {sorted(names)[0]!r}; use distinct folders")
    return found


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _rows(path: Path, kind: str) -> Iterator[tuple[int, list[str]]]:
    """(row number, its string values) of an evaluation file; a damaged line names the file and line."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            if kind == "tsv":
                for i, row in enumerate(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE), 1):
                    yield i, row
            elif kind == "txt":
                for i, line in enumerate(f, 1):
                    yield i, [line]
            else:
                for i, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            yield i, list(_strings(json.loads(line)))
                        except json.JSONDecodeError as e:
                            raise DataPrepError(
                                f"{path}:{i}: not valid JSON ({e.msg}); an evaluation JSONL file "
                                "holds one JSON object per line"
                            ) from None
    except UnicodeDecodeError as e:
        raise DataPrepError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except csv.Error as e:
        raise DataPrepError(f"{path}: not a TSV file ({e})") from None
    except OSError as e:
        raise DataPrepError(f"{path}: cannot read evaluation file ({e.strerror or e})") from None


def read_eval_set(name: str, path: Path, ngram: int, ngram_min: int) -> EvalSet:
    """The texts of one evaluation file and its n (see the module docstring)."""
    texts = [
        (row, value)
        for row, values in _rows(path, EVAL_SUFFIXES[path.suffix.lower()])
        for value in values
        if len(T.normalized_words(value)) >= MIN_TEXT_WORDS
    ]
    if not texts:
        raise DataPrepError(f"{path}: no text of {MIN_TEXT_WORDS}+ words in it (is it an evaluation set?)")
    lengths = np.array([len(T.normalized_words(t)) for _, t in texts])
    n = int(np.clip(np.percentile(lengths, PERCENTILE), ngram_min, ngram))
    rows = {row for row, _ in texts}
    return EvalSet(name, str(path), sha256_file(path), n, len(rows), texts, int((lengths < n).sum()))


class EvalTable:
    """The n-grams of all evaluation sets: for each n in use, the sorted gram hashes with the (set, row) each comes
    from (a gram shared by several sets or rows appears once per (set, row))."""

    def __init__(self, sets: list[EvalSet]) -> None:
        self.sets = sets
        self.grams: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.filters: dict[int, np.ndarray] = {}
        by_n: dict[int, list[tuple[np.ndarray, int, int]]] = {}
        for s_id, s in enumerate(sets):
            words = [T.normalized_words(t) for _, t in s.texts]
            flat, offsets = T.hash_words(words)
            grams, g_off = T.doc_ngrams(flat, offsets, s.n)
            counts = np.diff(g_off)
            rows = np.repeat(np.array([r for r, _ in s.texts], dtype=np.int64), counts)
            by_n.setdefault(s.n, []).append((grams, np.full(len(grams), s_id, np.int32), rows))
        for n, parts in by_n.items():
            g = np.concatenate([p[0] for p in parts])
            sid = np.concatenate([p[1] for p in parts])
            row = np.concatenate([p[2] for p in parts])
            order = np.lexsort((row, sid, g))
            g, sid, row = g[order], sid[order], row[order]
            keep = np.ones(len(g), bool)
            keep[1:] = (g[1:] != g[:-1]) | (sid[1:] != sid[:-1]) | (row[1:] != row[:-1])
            self.grams[n] = (g[keep], sid[keep], row[keep])
            self.filters[n] = np.zeros(1 << FILTER_BITS, dtype=bool)
            self.filters[n][g & np.uint64((1 << FILTER_BITS) - 1)] = True

    def doc_hits(self, flat: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Number of n-grams of each document (of a batch: flat word hashes cut at `offsets`) found in the table."""
        hits = np.zeros(len(offsets) - 1, dtype=np.int64)
        for n, (table, _, _) in self.grams.items():
            grams, g_off = T.doc_ngrams(flat, offsets, n)
            maybe = np.flatnonzero(self.filters[n][grams & np.uint64((1 << FILTER_BITS) - 1)])
            at = np.minimum(np.searchsorted(table, grams[maybe]), len(table) - 1)
            found = np.zeros(len(grams), dtype=bool)
            found[maybe] = table[at] == grams[maybe]
            if found.any():
                doc_of = np.repeat(np.arange(len(hits)), np.diff(g_off))
                hits += np.bincount(doc_of[found], minlength=len(hits))
        return hits

    def matches(self, word_hashes: np.ndarray) -> list[tuple[int, int, int, int]]:
        """Hits in one document: (first word, word count, set id, row) per matched n-gram and (set, row)."""
        out = []
        for n, (table, sid, row) in self.grams.items():
            grams = T.fold_windows(word_hashes, n)
            lo = np.searchsorted(table, grams, "left")
            hi = np.searchsorted(table, grams, "right")
            for start in np.flatnonzero(hi > lo):
                out.extend((int(start), n, int(sid[k]), int(row[k])) for k in range(lo[start], hi[start]))
        return sorted(out)


def load_eval_table(dirs: Sequence[str | os.PathLike], splits: Sequence[str], ngram: int, ngram_min: int) -> EvalTable:
    """Read every evaluation file and index its n-grams."""
    return EvalTable([read_eval_set(name, path, ngram, ngram_min) for name, path in find_eval_files(dirs, splits)])


def fingerprint(table: EvalTable) -> list[dict[str, Any]]:
    """What the output depends on: each set's name, content hash and n."""
    return [{"name": s.name, "sha256": s.sha256, "n": s.n} for s in table.sets]


@dataclass(frozen=True)
class CutRule:
    """GPT-3's rule: remove each match +- `margin` characters, keep pieces of >= `min_piece` characters, drop a
    document that would fall into more than `max_pieces` pieces."""

    margin: int = 200
    min_piece: int = 200
    max_pieces: int = 10


def cut_document(
    text: str, hits: list[tuple[int, int, int, int]], spans: list[tuple[int, int]] | None, rule: CutRule
) -> list[str]:
    """The pieces of `text` left after removing its matched spans (empty: drop the document)."""
    if spans is None:
        return []
    removed: list[tuple[int, int]] = []
    for first, n, _, _ in hits:
        a = max(0, spans[first][0] - rule.margin)
        b = min(len(text), spans[first + n - 1][1] + rule.margin)
        if removed and a <= removed[-1][1]:
            removed[-1] = (removed[-1][0], max(removed[-1][1], b))
        else:
            removed.append((a, b))
    pieces, pos = [], 0
    for a, b in removed:
        pieces.append(text[pos:a])
        pos = b
    pieces.append(text[pos:])
    if len(pieces) > rule.max_pieces:
        return []
    return [p.strip() for p in pieces if len(p.strip()) >= rule.min_piece]
