"""What is not text in a corpus: U+FFFD after decoding (an undecodable byte sequence replaced - Latin-1 read as UTF-8 -
or one the input already held) and control characters. `sources.ReadStats` counts them per file as documents are
read (`sources.nontext_counts`); unit records carry the counts, the manifest and the dedup report sum them
(`merge_text_faults`) and the commands say them per file (`describe_text_faults`). A file most of whose first MiB is
neither letters nor text (an executable, an archive, a wrong path) is refused before any work (`check_text_sources`,
`--max-nontext-fraction`; executables measured 65-86 % of their characters U+FFFD or control characters, text in
another encoding a few %)."""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence

from .errors import DataPrepError
from .sources import iter_blocks, nontext_counts

SNIFF_BYTES = 1 << 20  # what `check_text_sources` reads of each file (its start)
DEFAULT_MAX_NONTEXT_FRACTION = 0.3


def nontext_problem(src: dict, max_fraction: float) -> str | None:
    """Why the file of `src` is not text (more than `max_fraction` of the characters of its first `SNIFF_BYTES` are
    U+FFFD after decoding, or control characters), or None. Hub and dataset sources hold text columns: not judged."""
    if src.get("kind") not in ("text", "jsonl") or max_fraction >= 1:
        return None
    sample = b"".join(data for _, data in iter_blocks(src["path"], src.get("compression", ""), 0, SNIFF_BYTES))
    text = codecs.getincrementaldecoder("utf-8")("replace").decode(sample)  # a character cut at the end: not counted
    if not text:
        return None
    replaced, control = nontext_counts(text, sample)
    share = (replaced + control) / len(text)
    if share <= max_fraction:
        return None
    return (
        f"{src['path']}: not text: {share:.0%} of the {len(text):,} characters of its first {len(sample):,} bytes are "
        f"undecodable (U+FFFD after decoding: {replaced:,}) or control characters ({control:,}), more than "
        f"--max-nontext-fraction {max_fraction:g} (a binary file, or another encoding?); remove it from the inputs, "
        "or pass --max-nontext-fraction 1 to read it anyway"
    )


def check_text_sources(sources: Sequence[dict], max_fraction: float) -> None:
    """Refuse (DataPrepError) the first source that is mostly not text (`nontext_problem`)."""
    if not 0 <= max_fraction <= 1:
        raise DataPrepError(f"--max-nontext-fraction must be within [0, 1] (1 accepts anything), got {max_fraction}")
    for src in sources:
        if problem := nontext_problem(src, max_fraction):
            raise DataPrepError(problem)


def describe_text_faults(faults: dict[str, list[int]], most: int = 5) -> list[str]:
    """One line per file with U+FFFD or control characters (the `most` largest, then how many more), for the log."""
    ranked = sorted(faults.items(), key=lambda item: -sum(item[1]))
    lines = [
        f"{path}: {replaced:,} characters U+FFFD after decoding (undecodable bytes: another encoding such as "
        f"Latin-1?) and {control:,} control characters"
        for path, (replaced, control) in ranked[:most]
    ]
    if len(ranked) > most:
        lines.append(f"... and {len(ranked) - most} more files with U+FFFD or control characters (see the report)")
    return lines


def merge_text_faults(records: Iterable[dict]) -> dict[str, list[int]]:
    """The per-file counts of several unit records (`text_faults`), summed."""
    total: dict[str, list[int]] = {}
    for record in records:
        for path, (replaced, control) in (record.get("text_faults") or {}).items():
            now = total.setdefault(path, [0, 0])
            now[0], now[1] = now[0] + replaced, now[1] + control
    return dict(sorted(total.items()))
