"""What is not text in a corpus: U+FFFD after decoding (an undecodable byte sequence replaced - Latin-1 read as UTF-8 -
or one the input already held), control characters and lines of letter soup (random letters rather than words).
`sources.ReadStats` counts them per file as documents are read (`text_checks`: `nontext_counts`, `SoupCounter`); unit
records carry the counts (per file: [U+FFFD, control characters, soup lines]; records of an earlier release hold the
first two), the manifest and the dedup report sum them (`merge_text_faults`) and the commands say them per file
(`describe_text_faults`): flagged, not refused. A file most of whose first MiB is
neither letters nor text (an executable, an archive, a wrong path) is refused before any work (`check_text_sources`,
`--max-nontext-fraction`; executables measured 65-86 % of their characters U+FFFD or control characters, text in
another encoding a few %)."""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence

from .errors import DataPrepError
from .sources import iter_blocks
from .text_checks import nontext_counts

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
    if looks_utf16(sample):
        why = "it looks like UTF-16 text: convert it to UTF-8 first, e.g. `iconv -f UTF-16 -t UTF-8 FILE > FILE.txt`"
    else:
        why = "a binary file, or another encoding?"
    return (
        f"{src['path']}: not text: {share:.0%} of the {len(text):,} characters of its first {len(sample):,} bytes are "
        f"undecodable (U+FFFD after decoding: {replaced:,}) or control characters ({control:,}), more than "
        f"--max-nontext-fraction {max_fraction:g} ({why}); remove it from the inputs, or pass --max-nontext-fraction "
        "1 to read it anyway"
    )


def looks_utf16(sample: bytes) -> bool:
    """UTF-16's byte-order mark, or (without one) a NUL in most of the even or of the odd bytes: Latin-script text in
    UTF-16, whose every other byte is 0."""
    if sample[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return True
    half = len(sample) // 2
    return half > 0 and max(sample[0::2].count(0), sample[1::2].count(0)) > 0.8 * half


def check_text_sources(sources: Sequence[dict], max_fraction: float) -> None:
    """Refuse (DataPrepError) the first source that is mostly not text (`nontext_problem`)."""
    if not 0 <= max_fraction <= 1:
        raise DataPrepError(f"--max-nontext-fraction must be within [0, 1] (1 accepts anything), got {max_fraction}")
    for src in sources:
        if problem := nontext_problem(src, max_fraction):
            raise DataPrepError(problem)


def describe_text_faults(faults: dict[str, list[int]], most: int = 5) -> list[str]:
    """One line per file with U+FFFD, control characters or letter soup (the `most` largest, then how many more),
    for the log."""
    ranked = sorted(faults.items(), key=lambda item: -sum(item[1]))
    lines = []
    for path, counts in ranked[:most]:
        replaced, control, soup = (*counts, 0)[:3]
        said = []
        if replaced or control:
            said.append(
                f"{replaced:,} characters U+FFFD after decoding (undecodable bytes: another encoding such as "
                f"Latin-1?) and {control:,} control characters"
            )
        if soup:
            said.append(f"{soup:,} line{'s' if soup > 1 else ''} of letter soup (random letters, not words)")
        lines.append(f"{path}: {'; '.join(said)}")
    if len(ranked) > most:
        lines.append(f"... and {len(ranked) - most} more files with text faults (see the report)")
    return lines


def merge_text_faults(records: Iterable[dict]) -> dict[str, list[int]]:
    """The per-file counts of several unit records (`text_faults`), summed ([U+FFFD, control, soup lines]; an
    earlier release's records, without the soup count, add none)."""
    total: dict[str, list[int]] = {}
    for record in records:
        for path, counts in (record.get("text_faults") or {}).items():
            now = total.setdefault(path, [0, 0, 0])
            for i, value in enumerate(counts[:3]):
                now[i] += value
    return dict(sorted(total.items()))
