"""The measurement behind `common.vocab.DEFAULT_MAX_UNK_FRACTION`: the [UNK] rate of matching and wrong
vocabularies on the real corpora (../shared/data/corpus, or $ELASTICBERT_CORPUS), documents read exactly as
`tokenize` reads them. ~5 minutes on one core:

    .venv/bin/python bench/data/unk_rates.py /tmp/unk_rates.json
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

import elasticbert  # noqa: E402
from bench.harness import CORPUS as SHARED_CORPUS  # noqa: E402
from bench.harness import write_result  # noqa: E402
from data_prep import sources as S  # noqa: E402
from data_prep.tokenizer import Encoder, adopt_vocab, train_tokenizer  # noqa: E402

CORPUS = Path(os.environ.get("ELASTICBERT_CORPUS", SHARED_CORPUS))
SPANISH = "pg24823.txt"


def docs_of(path: Path) -> list[str]:
    spec = S.discover([str(path)])[0]
    src = S.describe(spec, "auto", True, "train", "text")
    reader = S.DocumentReader(src, "replace", "text", 8 << 20, S.ReadStats())
    return [t for _, t in reader.documents(src["start"], src["end"])]


def rate(enc: Encoder, docs: list[str], transform=None) -> tuple[int, int]:
    unk = enc.meta["special_ids"]["unk"]
    tokens = n_unk = 0
    batch: list[str] = []
    size = 0
    for d in docs + [None]:
        if d is not None:
            batch.append(transform(d) if transform else d)
            size += len(d)
        if batch and (d is None or size >= 1 << 20):
            ids, _, _ = enc.encode_docs(batch)
            tokens += len(ids)
            n_unk += int(np.count_nonzero(ids == unk))
            batch, size = [], 0
    return n_unk, tokens


CYR = dict(zip("abcdefghijklmnopqrstuvwxyz", "абцдефгхийклмнопярстуввхыз"))


def to_cyrillic(text: str) -> str:
    return "".join(CYR.get(c, c) for c in text.lower())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", type=Path, help="the JSON file of rates to write")
    out = parser.parse_args().output
    books = sorted((CORPUS / "gutenberg").glob("*.txt"))
    english = [b for b in books if b.name != SPANISH]
    wiki = CORPUS / "wikitext-2-raw" / "wiki.test.raw"
    t0 = time.time()
    corpora = {b.name: docs_of(b) for b in books}
    corpora["wiki.test.raw"] = docs_of(wiki)
    print(f"read {len(corpora)} sources in {time.time() - t0:.0f}s", flush=True)
    tmp = Path(tempfile.mkdtemp())
    vocab = elasticbert.minilm_dir() / "vocab.txt"
    three = tmp / "three.txt"
    three.write_text("the\nof\nand\n")
    adopt_vocab(vocab, tmp / "uncased")
    adopt_vocab(vocab, tmp / "uncased_nolower", lowercase=False)
    adopt_vocab(three, tmp / "three")
    sample = [d for b in english[:20] for d in corpora[b.name]]
    train_tokenizer(iter(sample), tmp / "cased", kind="wordpiece", vocab_size=30522, lowercase=False)
    train_tokenizer(iter(corpora[SPANISH]), tmp / "spanish", kind="wordpiece", vocab_size=8000, lowercase=True)
    cyrillic = (to_cyrillic(d) for d in sample)
    train_tokenizer(cyrillic, tmp / "cyrillic", kind="wordpiece", vocab_size=30522, lowercase=True)
    tokenizers = {
        "bert-base-uncased": tmp / "uncased",
        "bert-base-uncased, lowercasing off (uncased vocab on cased text)": tmp / "uncased_nolower",
        "3-word vocab (the, of, and)": tmp / "three",
        "cased WordPiece 30k (trained on 20 English books), on lower-cased text": tmp / "cased",
        "Spanish WordPiece 8k (trained on the Spanish book)": tmp / "spanish",
        "Cyrillic-script WordPiece 30k (another script)": tmp / "cyrillic",
    }
    print(f"tokenizers ready at {time.time() - t0:.0f}s", flush=True)
    results = {}
    for name, tdir in tokenizers.items():
        enc = Encoder(tdir)
        lower = (lambda d: d.lower()) if name.startswith("cased") else None
        per = {src: rate(enc, docs, lower) for src, docs in corpora.items()}
        eng = [per[b.name] for b in english]
        row = {
            "gutenberg_english": sum(u for u, _ in eng) / sum(t for _, t in eng),
            "gutenberg_spanish": per[SPANISH][0] / per[SPANISH][1],
            "wikitext": per["wiki.test.raw"][0] / per["wiki.test.raw"][1],
            "max_english_book": max(u / t for u, t in eng),
            "max_english_book_name": max(english, key=lambda b: per[b.name][0] / per[b.name][1]).name,
            "min_english_book": min(u / t for u, t in eng),
            "tokens": sum(t for _, t in per.values()),
        }
        results[name] = row
        print(name, json.dumps(row), f"{time.time() - t0:.0f}s", flush=True)
    write_result(out, results)


if __name__ == "__main__":
    main()
