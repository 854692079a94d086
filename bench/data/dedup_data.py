"""Real text for the dedup benchmarks (`bench/data/dedup_scale.py`, `bench/data/dedup_quality.py`,
`bench/data/dedup_libraries.py`), built in a seeded way from ../shared/data (read in place, never copied into the
project).

The pool: every paragraph of at least 20 words of the 106 Project Gutenberg books (headers stripped by
`data_prep.sources`, blank-line paragraphs) and every WikiText-2 line of at least 20 words (~60 MB of real text),
cut into sentences by `data_prep.splitter` (~0.6 M sentences of 4+ words). A *distinct document* is 3-8 paragraphs
of 3-8 sentences each, every sentence drawn at random (seeded) from the whole pool: real sentences, mixed from
different books. Sentences, not whole paragraphs: at 5 GB every pool item is drawn ~80 times, and documents that
share a whole paragraph by chance are partial duplicates (a first version drawing paragraphs found 14 % more
"duplicates" than injected at 1 GB, all from such chance overlaps); two documents sharing a sentence or two stay
far below any threshold. The edits that make *near copies*:

- `edit_words(text, fraction)`: that fraction of the words replaced by words drawn from the pool's vocabulary;
- `shuffle_paragraphs`: the same paragraphs in another order;
- `boilerplate`: a cookie banner, a navigation line and a copyright footer (web templates) around the same text;
- `reformat`: upper-cased, with punctuation and spacing changed (an exact duplicate after normalisation).
"""

from __future__ import annotations

import random
import sys
from functools import lru_cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

from bench.harness import CORPUS as SHARED  # noqa: E402

MIN_WORDS = 20

NAVIGATION = ["Home | News | Sport | Culture | Contact", "Menu Search Subscribe Sign in", "Skip to main content"]
BANNERS = [
    "We use cookies to improve your experience on our site. By continuing you accept our use of cookies.",
    "This site uses cookies. Read our privacy policy to learn more about how we use your data.",
]
FOOTERS = [
    "Copyright 2021 The Daily Review. All rights reserved. Terms of use. Privacy policy. Contact us.",
    "Share this article: Facebook Twitter Email. Related stories. Most read. Sign up for our newsletter.",
]


@lru_cache(maxsize=1)
def paragraphs() -> tuple[str, ...]:
    """The pool of real paragraphs (see the module docstring), in a fixed order."""
    from data_prep import sources as S

    files = sorted((SHARED / "gutenberg").glob("*.txt")) + [SHARED / "wikitext-2-raw" / "wiki.test.raw"]
    if not files[0].is_file():
        raise SystemExit(f"{SHARED}: no corpus (../shared/data is needed)")
    out = []
    for path in files:
        boundary = "line" if path.suffix == ".raw" else "blank"
        src = S.describe(S.discover([str(path)])[0], boundary, True, "train", "text")
        reader = S.DocumentReader(src, "replace", "text", 8 << 20, S.ReadStats())
        for _, text in reader.documents(src["start"], src["end"]):
            text = " ".join(text.split())
            if len(text.split()) >= MIN_WORDS:
                out.append(text)
    return tuple(out)


@lru_cache(maxsize=1)
def sentences() -> tuple[str, ...]:
    """The pool's sentences of at least 4 words, in a fixed order."""
    from data_prep.splitter import sentences as split

    return tuple(x for p in paragraphs() for x in split(p) if len(x.split()) >= 4)


@lru_cache(maxsize=1)
def vocabulary() -> tuple[str, ...]:
    words = sorted({w for p in paragraphs()[::50] for w in p.split() if w.isalpha()})
    return tuple(words)


def distinct_document(rng: random.Random) -> str:
    pool = sentences()
    paras = (
        " ".join(pool[rng.randrange(len(pool))] for _ in range(rng.randint(3, 8))) for _ in range(rng.randint(3, 8))
    )
    return "\n\n".join(paras)


def edit_words(text: str, fraction: float, rng: random.Random) -> str:
    """`fraction` of the words (at least one) replaced by random words of the pool."""
    paras = [p.split(" ") for p in text.split("\n\n")]
    where = [(i, j) for i, p in enumerate(paras) for j in range(len(p))]
    vocab = vocabulary()
    for i, j in rng.sample(where, max(1, round(len(where) * fraction))):
        paras[i][j] = vocab[rng.randrange(len(vocab))]
    return "\n\n".join(" ".join(p) for p in paras)


def shuffle_paragraphs(text: str, rng: random.Random) -> str:
    paras = text.split("\n\n")
    order = list(range(len(paras)))
    while order == sorted(order):
        rng.shuffle(order)
    return "\n\n".join(paras[i] for i in order)


def boilerplate(text: str, rng: random.Random) -> str:
    return "\n\n".join([rng.choice(NAVIGATION), rng.choice(BANNERS), text, rng.choice(FOOTERS)])


def reformat(text: str) -> str:
    return text.upper().replace(", ", " ,  ").replace(". ", " ! ")
