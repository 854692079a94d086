"""Which MinHash library `data_prep dedup` uses: datasketch vs rensa (vs datatrove's signature block where it is
installed) on the same documents, for speed and for agreement with the exact Jaccard, and the memory of their
in-memory LSH indexes.

    python bench/data/dedup_libraries.py --output docs/dedup [--datatrove-python /tmp/dt_venv/bin/python]

Documents: `bench/data/dedup_data.py` (real text, seeded): 1,500 distinct documents and, for agreement, 200 copies each
with 1 %, 5 %, 10 %, 20 % of the words replaced and 200 pairs of distinct documents. Every library gets the same
input: the 3-word shingles of the normalised words, 112 permutations (14 x 8, the defaults), one core
(RAYON_NUM_THREADS=1). Speed = input MB / seconds of signature computation (shingling included, one Python process);
agreement = mean |estimated - exact Jaccard| over the pairs (estimated: the fraction of equal signature slots).
Index memory: bytes per document of datasketch's `MinHashLSH` (tracemalloc) and rensa's `RMinHashLSH` (RSS growth),
both holding 14 x 8 bands in RAM; data_prep's banding holds none: its band keys are on disk (bytes per document in
`docs/dedup/scale.md`) and stage 2 reads one key range at a time.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

os.environ["RAYON_NUM_THREADS"] = "1"
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

from bench.data import dedup_data as D  # noqa: E402
from bench.harness import REPO, write_result  # noqa: E402
from data_prep.dedup import text as T  # noqa: E402

PERM, BANDS, ROWS, K = 112, 14, 8, 3  # the defaults of data_prep dedup

DATATROVE = r"""
import json, sys, time, numpy as np
from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupSignature
docs = json.load(open(sys.argv[1]))
step = MinhashDedupSignature(output_folder="/tmp/eb_dt_unused", config=MinhashConfig(n_grams=3, num_buckets=14,
                             hashes_per_bucket=8))
t = time.perf_counter()
sigs = [np.concatenate(step.get_signature(step.get_shingles(d))) for d in docs]
dt = time.perf_counter() - t
pairs = json.load(open(sys.argv[2]))
est = [float(np.mean(np.concatenate(step.get_signature(step.get_shingles(a))) ==
                     np.concatenate(step.get_signature(step.get_shingles(b))))) for a, b in pairs]
print(json.dumps({"seconds": dt, "estimates": est}))
"""


def shingles(text: str) -> list[str]:
    w = T.normalized_words(text)
    return [" ".join(w[i : i + K]) for i in range(len(w) - K + 1)]


def exact_jaccard(a: str, b: str) -> float:
    x, y = set(shingles(a)), set(shingles(b))
    return len(x & y) / max(1, len(x | y))


def timed(fn, *args) -> tuple[float, object]:
    gc.collect()
    t = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t, out


def rensa_pipeline(texts: list[str]) -> np.ndarray:
    """data_prep's path: rensa word hashes, shingle folds, one batched rensa signature call per 500 documents."""
    out = []
    params = T.MinHashParams(K, BANDS, ROWS, 1)
    for i in range(0, len(texts), 500):
        flat, offsets = T.hash_words([T.normalized_words(t) for t in texts[i : i + 500]])
        out.append(T.signatures(flat, offsets, params))
    return np.concatenate(out)


def rensa_strings(texts: list[str]) -> np.ndarray:
    import rensa

    hs = rensa.RMinHash.from_token_sets([shingles(t) for t in texts], PERM, 1)
    return np.array([h.digest() for h in hs], dtype=np.uint32)


def datasketch_sha1(texts: list[str]) -> np.ndarray:
    import datasketch

    ms = datasketch.MinHash.bulk([[s.encode() for s in shingles(t)] for t in texts], num_perm=PERM, seed=1)
    return np.array([m.hashvalues for m in ms])


def datasketch_prehashed(texts: list[str]) -> np.ndarray:
    """datasketch fed 64-bit shingle hashes (its fastest input: no sha1 per shingle)."""
    import datasketch

    out = []
    for t in texts:
        flat, offsets = T.hash_words([T.normalized_words(t)])
        grams, _ = T.doc_ngrams(flat, offsets, K)
        m = datasketch.MinHash(num_perm=PERM, seed=1, hashfunc=int, scheme="affine64")
        m.update_batch(grams.tolist())
        out.append(m.hashvalues)
    return np.array(out)


def index_memory(n: int) -> dict:
    import datasketch
    import rensa

    rng = random.Random(5)
    texts = [D.distinct_document(rng) for _ in range(n)]
    ms = datasketch.MinHash.bulk([[s.encode() for s in shingles(t)] for t in texts], num_perm=PERM, seed=1)
    tracemalloc.start()
    lsh = datasketch.MinHashLSH(num_perm=PERM, params=(BANDS, ROWS))
    for i, m in enumerate(ms):
        lsh.insert(i, m)
    ds_bytes = tracemalloc.get_traced_memory()[0] / n
    tracemalloc.stop()
    hs = rensa.RMinHash.from_token_sets([shingles(t) for t in texts], PERM, 1)
    before = _rss()
    index = rensa.RMinHashLSH(0.72, PERM, BANDS)
    for i, h in enumerate(hs):
        index.insert(i, h)
    return {
        "documents": n,
        "datasketch_MinHashLSH_bytes_per_doc": round(ds_bytes),
        "rensa_RMinHashLSH_bytes_per_doc": round((_rss() - before) / n),
    }


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def signature_only(texts: list[str]) -> dict[str, float]:
    """Seconds of the MinHash step alone (shingles or their hashes prepared before the clock starts)."""
    import datasketch
    import rensa

    strings = [shingles(t) for t in texts]
    as_bytes = [[x.encode() for x in s] for s in strings]
    batches = []
    for i in range(0, len(texts), 500):
        flat, offsets = T.hash_words([T.normalized_words(t) for t in texts[i : i + 500]])
        batches.append(T.doc_ngrams(flat, offsets, K))
    hashed = [T.doc_ngrams(*T.hash_words([T.normalized_words(t)]), K)[0].tolist() for t in texts]

    def rensa_flat() -> None:
        for grams, offs in batches:
            m = rensa.RMinHash.digest_matrix_from_flat_token_hashes(grams, offs.astype(np.uint64), PERM, 1)
            np.fromiter((v for row in m.to_rows() for v in row), dtype=np.uint32)

    def ds_prehashed() -> None:
        for h in hashed:
            m = datasketch.MinHash(num_perm=PERM, seed=1, hashfunc=int, scheme="affine64")
            m.update_batch(h)

    return {
        "rensa (data_prep: batched, prehashed)": timed(rensa_flat)[0],
        "rensa (shingle strings)": timed(lambda: rensa.RMinHash.from_token_sets(strings, PERM, 1))[0],
        "datasketch (bulk, sha1 per shingle)": timed(lambda: datasketch.MinHash.bulk(as_bytes, num_perm=PERM))[0],
        "datasketch (prehashed 64-bit, affine64)": timed(ds_prehashed)[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", type=Path, default=REPO / "docs" / "dedup")
    ap.add_argument("--datatrove-python", help="a Python with datatrove installed (its own virtualenv)")
    ap.add_argument("--docs", type=int, default=1500)
    args = ap.parse_args()
    rng = random.Random(0)
    texts = [D.distinct_document(rng) for _ in range(args.docs)]
    mb = sum(len(t.encode()) for t in texts) / 1e6
    pairs = [(a, D.edit_words(a, f, rng)) for f in (0.01, 0.05, 0.10, 0.20) for a in rng.sample(texts, 200)]
    pairs += [tuple(rng.sample(texts, 2)) for _ in range(200)]
    exact = np.array([exact_jaccard(a, b) for a, b in pairs])
    libs = {
        "rensa (data_prep: batched, prehashed)": rensa_pipeline,
        "rensa (shingle strings)": rensa_strings,
        "datasketch (bulk, sha1 per shingle)": datasketch_sha1,
        "datasketch (prehashed 64-bit, affine64)": datasketch_prehashed,
    }
    only = signature_only(texts)
    rows = []
    for name, fn in libs.items():
        seconds, _ = timed(fn, texts)
        sig_a, sig_b = fn([a for a, _ in pairs]), fn([b for _, b in pairs])
        est = (sig_a == sig_b).mean(axis=1)
        rows.append(
            {
                "library": name,
                "mb_per_s": round(mb / seconds, 2),
                "seconds": round(seconds, 2),
                "signature_only_mb_per_s": round(mb / only[name], 2),
                "mae_vs_exact_jaccard": round(float(np.abs(est - exact).mean()), 4),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    if args.datatrove_python:
        tmp = Path("/tmp/eb_dt_bench")
        tmp.mkdir(exist_ok=True)
        write_result(tmp / "docs.json", texts, indent=None)
        write_result(tmp / "pairs.json", pairs, indent=None)
        res = subprocess.run(
            [args.datatrove_python, "-c", DATATROVE, str(tmp / "docs.json"), str(tmp / "pairs.json")],
            capture_output=True,
            text=True,
        )
        if res.returncode == 0:
            got = json.loads(res.stdout.strip().splitlines()[-1])
            est = np.array(got["estimates"])
            rows.append(
                {
                    "library": "datatrove 0.10.1 (MinhashDedupSignature)",
                    "mb_per_s": round(mb / got["seconds"], 2),
                    "seconds": round(got["seconds"], 2),
                    "mae_vs_exact_jaccard": round(float(np.abs(est - exact).mean()), 4),
                    "note": "its own normaliser and word tokenizer: the same documents, not the same shingles",
                }
            )
        else:
            rows.append({"library": "datatrove 0.10.1", "error": (res.stderr.strip().splitlines() or ["?"])[-1]})
        print(json.dumps(rows[-1]), flush=True)
    memory = index_memory(20_000)
    result = {"documents": args.docs, "mb": round(mb, 2), "pairs": len(pairs), "rows": rows, "index_memory": memory}
    args.output.mkdir(parents=True, exist_ok=True)
    write_result(args.output / "libraries.json", result)
    lines = [
        f"{args.docs} documents ({mb:.1f} MB of real text), 3-word shingles, 112 permutations (14 x 8), one core; "
        f"agreement over {len(pairs)} pairs (copies with 1-20 % of words replaced, distinct pairs).",
        "",
        "| library | MB/s from text | MB/s of the MinHash step alone | mean abs. error vs exact Jaccard |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['library']} | {r.get('mb_per_s', '-')} | {r.get('signature_only_mb_per_s', '-')} | "
        f"{r.get('mae_vs_exact_jaccard', r.get('error', '-'))} |"
        for r in rows
    ]
    lines += [
        "",
        f"In-memory LSH index (14 x 8 bands), {memory['documents']:,} documents: datasketch MinHashLSH "
        f"{memory['datasketch_MinHashLSH_bytes_per_doc']:,} B/doc, rensa RMinHashLSH "
        f"{memory['rensa_RMinHashLSH_bytes_per_doc']:,} B/doc.",
    ]
    (args.output / "libraries.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
