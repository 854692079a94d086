"""What is not text in a document, counted as it is read (`sources.ReadStats.count_faults`; the per-file record, the
summing and the messages are `text_faults`'s):

- U+FFFD after decoding (an undecodable byte sequence replaced, or one the input already held) and control characters
  (`nontext_counts`);
- lines of letter soup (`letter_soup_lines`): random letters rather than words - keyboard mashing, base64 and other
  encoded blobs, a test file's filler. Words of any language written in Latin letters are made of letter pairs that
  their language uses; random letters are not: a quarter of the 676 pairs of ASCII letters almost never occur inside
  an English word (`RARE_PAIRS`: each under 3 in a million of the 40.7 M letter pairs of the shared Gutenberg and
  WikiText text), and random letters hit them a quarter of the time. A line with at least `SOUP_MIN_PAIRS` pairs of
  which `SOUP_MIN_RARE` and `SOUP_MIN_SHARE` are rare is soup: measured on 8,000 random lines (letters in words of
  2-10, mashed keyboard rows, mixed-case runs; 25-120 letters) 97-99 % are flagged, of the 991,769 lines of the
  shared corpus 1 (a "Gvozdyov" twice, 10 % rare, passes the share; the alphabet printed as an illustration is
  flagged), and UDHR sentences in 16 other Latin-script languages none (Polish 4-8 % rare, its tongue-twister
  "Chrząszcz brzmi w trzcinie w Szczebrzeszynie" 18 %: flagged).

Both run at C speed on ordinary text: a document with no rare pair at all (one regex scan) costs nothing more, and
only the lines holding one are looked at.
"""

from __future__ import annotations

import re

import numpy as np

# Not text: U+FFFD and control characters - C0 but tab, LF, VT, FF, CR; DEL; C1 in decoded text.
_CONTROL = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f]")
# the same in UTF-8 bytes, C0 and DEL (C1 needs two bytes; a file's raw bytes are counted at C speed: 380 MB/s)
_NOT_CONTROL_BYTES = bytes(b for b in range(256) if not (b < 9 or 14 <= b < 32 or b == 127))


def nontext_counts(text: str, raw: bytes | None = None) -> tuple[int, int]:
    """(U+FFFD characters, control characters) of `text`; `raw`: the bytes it was decoded from, whose control
    bytes are counted instead (C0 and DEL, at C speed; the text's own regex scan runs at ~90 MB/s)."""
    replaced = text.count("\ufffd")
    if raw is not None:
        return replaced, len(raw.translate(None, _NOT_CONTROL_BYTES))
    return replaced, len(_CONTROL.findall(text)) if _CONTROL.search(text) else 0


# Letter pairs (either case) that English words almost never hold, by first letter (see the module docstring).
RARE_PAIRS = {
    "b": "cfgkpqwxz",
    "c": "bfgjmnpvwz",
    "d": "xz",
    "f": "bcdghjkmpqvwxz",
    "g": "cfjkpqvxz",
    "h": "jqvxz",
    "j": "bcdfghklmnpqrstvwxyz",
    "k": "djkpqvxz",
    "l": "q",
    "m": "ghjkqvxz",
    "p": "jqvxz",
    "q": "abcdefghijklmnopqrstvwxyz",
    "r": "x",
    "s": "x",
    "t": "jqvx",
    "u": "u",
    "v": "bcdfghjkmpqtvwxz",
    "w": "gjpqvxz",
    "x": "bdgjkmnrswz",
    "y": "jqx",
    "z": "cdfgjknpqrstvwx",
}
_RARE = re.compile("(?=" + "|".join(f"{a}[{b}]" for a, b in RARE_PAIRS.items()) + ")", re.IGNORECASE)
_WORD = re.compile("[A-Za-z]{2,}")
SOUP_MIN_PAIRS, SOUP_MIN_RARE, SOUP_MIN_SHARE = 15, 3, 0.12
_RARE_CODES = np.zeros(1 << 16, dtype=bool)  # byte pair (first << 8 | second) -> rare, both cases
for _first, _seconds in RARE_PAIRS.items():
    for _a in (_first, _first.upper()):
        for _b in _seconds + _seconds.upper():
            _RARE_CODES[ord(_a) << 8 | ord(_b)] = True
SOUP_CHUNK_BYTES = 1 << 18  # what `SoupCounter` gathers before it counts: numpy's cost per call, spread over many lines


def is_letter_soup(line: str) -> bool:
    """Whether `line` is random letters rather than words (see the module docstring)."""
    pairs = sum(len(word) - 1 for word in _WORD.findall(line))
    if pairs < SOUP_MIN_PAIRS:
        return False
    rare = len(_RARE.findall(line))
    return rare >= SOUP_MIN_RARE and rare >= SOUP_MIN_SHARE * pairs


def letter_soup_lines(raw: bytes) -> int:
    """How many lines of UTF-8 `raw` are letter soup (`is_letter_soup`). Every byte pair is looked up at C speed; only
    a line holding `SOUP_MIN_RARE` rare pairs is decoded and judged (ordinary text has one rare pair in ~15 KB)."""
    data = np.frombuffer(raw, dtype=np.uint8)
    if len(data) <= SOUP_MIN_PAIRS:
        return 0
    hits = np.flatnonzero(_RARE_CODES[(data[:-1].astype(np.uint16) << 8) | data[1:]])
    if len(hits) < SOUP_MIN_RARE:
        return 0
    breaks = np.flatnonzero(data == 10)
    lines, counts = np.unique(np.searchsorted(breaks, hits), return_counts=True)
    soup = 0
    for line in lines[counts >= SOUP_MIN_RARE].tolist():
        start = int(breaks[line - 1]) + 1 if line > 0 else 0
        end = int(breaks[line]) if line < len(breaks) else len(raw)
        soup += is_letter_soup(raw[start:end].decode("utf-8", "replace"))
    return soup


class SoupCounter:
    """Lines of letter soup per file, over the documents of a read: gathered per file and counted a chunk at a time
    (numpy's cost per call is ~10 us, the size of a paragraph's whole check); `flush` counts what is left."""

    def __init__(self) -> None:
        self.path: str | None = None
        self.parts: list[bytes] = []
        self.size = 0
        self.counts: dict[str, int] = {}

    def add(self, path: str, raw: bytes) -> None:
        if path != self.path:
            self.flush()
            self.path = path
        self.parts.append(raw)
        self.size += len(raw) + 1
        if self.size >= SOUP_CHUNK_BYTES:
            self.flush()

    def flush(self) -> dict[str, int]:
        """Count the gathered documents; returns the counts so far (files with soup only)."""
        if self.parts and (soup := letter_soup_lines(b"\n".join(self.parts))):
            self.counts[self.path] = self.counts.get(self.path, 0) + soup
        self.parts, self.size = [], 0
        return self.counts
