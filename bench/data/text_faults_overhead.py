"""What counting U+FFFD and control characters per file costs `data_prep tokenize` (issue 47): the same corpus
tokenized with the count (`sources.ReadStats.count_faults`) and with it replaced by a no-op, alternated in one process
(the machine is shared: the ratio of the two, measured side by side, is the figure).

    python bench/data/text_faults_overhead.py --books 20 --rounds 3
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

from bench.harness import GUTENBERG  # noqa: E402
from data_prep import minilm_vocab, tokenize_corpus  # noqa: E402
from data_prep import sources as S  # noqa: E402


def timed(inputs: list[str], out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    tokenize_corpus(inputs, out, tokenizer=minilm_vocab(), workers=1, unit_bytes=8 << 20)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--books", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    books = sorted(str(p) for p in GUTENBERG.glob("*.txt"))[: args.books]
    size = sum(Path(b).stat().st_size for b in books) / 1e6
    counting = S.ReadStats.count_faults
    times: dict[str, list[float]] = {"counted": [], "not counted": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for name in times:
                S.ReadStats.count_faults = counting if name == "counted" else (lambda self, *a, **k: None)
                times[name].append(timed(books, Path(tmp) / "out"))
    S.ReadStats.count_faults = counting
    best = {name: min(values) for name, values in times.items()}
    print(f"{len(books)} books, {size:.1f} MB, 1 worker, best of {args.rounds}:")
    for name, seconds in best.items():
        print(f"  {name:12s} {seconds:6.2f} s  ({size / seconds:.2f} MB/s)")
    print(f"counting costs x{best['counted'] / best['not counted']:.3f} of the tokenize time")


if __name__ == "__main__":
    main()
