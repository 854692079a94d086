"""Quality of the near-duplicate detector of `data_prep dedup`: recall per kind of copy and the false positives, for
several shingle sizes and band x row settings, measured with the pipeline's own functions (`data_prep.dedup.text`:
normalisation, rensa R-MinHash signatures, band keys). The defaults of `DedupConfig` are chosen from its table.

    python bench/data/dedup_quality.py --output docs/dedup          # ~5 min on one core

The set (`bench/data/dedup_data.py`, seeded): 3,000 distinct documents of real text (sentences drawn at random from 106
Gutenberg books and WikiText, 3-8 paragraphs of 3-8 sentences); for each kind of copy, 300 of them copied with: 1 %,
5 %, 10 %, 20 % of the words replaced; the paragraphs shuffled; a web template (navigation, cookie banner, footer)
around the same text. Negatives: the 3,000 distinct documents among themselves (4.5 M pairs), and 300 pairs of
distinct documents of 3 paragraphs wrapped in the *same* template (boilerplate-only similarity must not make them
duplicates).

Per setting: recall = the fraction of copies that share at least one band key with their original (they land in
its cluster); theory = the mean over copies of 1 - (1 - J^rows)^bands at the copy's exact Jaccard. False positives,
counted: the fraction of distinct documents that share a band with another distinct document whose exact Jaccard
with it is below 0.5, and of the same-template pairs that share a band. False positives at the users' scale,
computed: the mean over all 4.5 M distinct pairs (every pair's exact Jaccard from one sparse product) of
1 - (1 - J^rows)^bands, times the documents 160 GB holds at this set's mean size (~40 M) = the expected chance
candidates of one document there. A count on 4.5 M pairs cannot show rates of 1e-10 per pair that 160 GB turns into
thousands of wrongly removed documents; the computed figure is dominated by the few most similar pairs (documents
sharing several sentences, J up to 0.22), so it is an estimate to an order of magnitude.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: bench.harness and the packages

from bench.data import dedup_data as D  # noqa: E402
from bench.harness import REPO, write_result  # noqa: E402
from data_prep.dedup import text as T  # noqa: E402

KINDS = ("edit 1%", "edit 5%", "edit 10%", "edit 20%", "shuffled paragraphs", "boilerplate only")
SETTINGS = [(5, 14, 8), (5, 20, 5), (5, 9, 13), (5, 28, 4), (7, 14, 8), (4, 20, 5), (3, 14, 8), (3, 16, 7), (3, 20, 5)]


def build_set(n_distinct: int, n_copies: int, n_template: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    distinct = [D.distinct_document(rng) for _ in range(n_distinct)]
    copies: dict[str, list[tuple[int, str]]] = {}
    for kind in KINDS:
        picks = rng.sample(range(n_distinct), n_copies)
        if kind.startswith("edit"):
            frac = float(kind.split()[1].rstrip("%")) / 100
            copies[kind] = [(i, D.edit_words(distinct[i], frac, rng)) for i in picks]
        elif kind.startswith("shuffled"):
            copies[kind] = [(i, D.shuffle_paragraphs(distinct[i], rng)) for i in picks]
        else:
            copies[kind] = [(i, D.boilerplate(distinct[i], rng)) for i in picks]
    template_pairs = []
    for _ in range(n_template):
        nav, banner, foot = rng.choice(D.NAVIGATION), rng.choice(D.BANNERS), rng.choice(D.FOOTERS)
        a, b = ("\n\n".join(D.paragraphs()[rng.randrange(len(D.paragraphs()))] for _ in range(3)) for _ in range(2))
        template_pairs.append(tuple("\n\n".join([nav, banner, x, foot]) for x in (a, b)))
    return {"distinct": distinct, "copies": copies, "template_pairs": template_pairs}


def shingle_set(text: str, k: int) -> set[tuple[str, ...]]:
    w = T.normalized_words(text)
    return {tuple(w[i : i + k]) for i in range(len(w) - k + 1)}


def jaccard(a: str, b: str, k: int) -> float:
    x, y = shingle_set(a, k), shingle_set(b, k)
    return len(x & y) / max(1, len(x | y))


def pairwise_jaccard(texts: list[str], k: int) -> np.ndarray:
    """Exact Jaccard of the k-word shingle sets of every pair of `texts` (upper triangle), by one sparse product."""
    from scipy.sparse import csr_matrix

    ids: dict[tuple[str, ...], int] = {}
    rows, cols = [], []
    for r, text in enumerate(texts):
        for sh in shingle_set(text, k):
            rows.append(r)
            cols.append(ids.setdefault(sh, len(ids)))
    x = csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(len(texts), len(ids)))
    inter = (x @ x.T).toarray()
    sizes = np.asarray(x.sum(axis=1)).ravel()
    iu = np.triu_indices(len(texts), 1)
    return inter[iu] / (sizes[iu[0]] + sizes[iu[1]] - inter[iu])


def keys_of(texts: list[str], params: T.MinHashParams) -> np.ndarray:
    """Band keys [bands, n] of the texts (in batches, as the pipeline computes them)."""
    out = []
    for i in range(0, len(texts), 500):
        flat, offsets = T.hash_words([T.normalized_words(t) for t in texts[i : i + 500]])
        out.append(T.band_keys(T.signatures(flat, offsets, params), params))
    return np.concatenate(out, axis=1)


def flagged_pairs(keys: np.ndarray) -> set[tuple[int, int]]:
    """Pairs of documents that share some band key."""
    pairs: set[tuple[int, int]] = set()
    for band in keys:
        order = np.argsort(band, kind="stable")
        b = band[order]
        for start in np.flatnonzero((b[1:] == b[:-1]) & np.r_[True, b[1:-1] != b[:-2]]):
            end = start + 1
            while end < len(b) and b[end] == b[start]:
                end += 1
            members = sorted(order[start:end].tolist())
            pairs |= {(x, y) for i, x in enumerate(members) for y in members[i + 1 :]}
    return pairs


def evaluate(
    data: dict, shingle: int, bands: int, rows: int, jaccards: dict, pair_j: np.ndarray, n_real: float
) -> dict:
    params = T.MinHashParams(shingle, bands, rows, 1)
    t0 = time.perf_counter()
    base = keys_of(data["distinct"], params)
    row = {"shingle": shingle, "bands": bands, "rows": rows, "threshold": round((1 / bands) ** (1 / rows), 3)}
    for kind, pairs in data["copies"].items():
        ck = keys_of([t for _, t in pairs], params)
        orig = base[:, [i for i, _ in pairs]]
        row[f"recall {kind}"] = round(float((ck == orig).any(axis=0).mean()), 4)
        row[f"theory {kind}"] = round(float(np.mean(T.candidate_probability(np.array(jaccards[kind]), bands, rows))), 4)
    pairs = flagged_pairs(base)
    js = {p: jaccard(data["distinct"][p[0]], data["distinct"][p[1]], shingle) for p in pairs}
    similar = {p for p, j in js.items() if j >= 0.5}
    wrong = {d for p in pairs - similar for d in p}
    row["flagged distinct pairs: exact Jaccard"] = sorted(round(j, 3) for j in js.values())
    row["FP distinct docs"] = round(len(wrong) / len(data["distinct"]), 5)
    row["distinct pairs flagged (J >= 0.5: true near duplicates in the real text)"] = [len(pairs), len(similar)]
    a = keys_of([p[0] for p in data["template_pairs"]], params)
    b = keys_of([p[1] for p in data["template_pairs"]], params)
    row["FP same template"] = round(float((a == b).any(axis=0).mean()), 4)
    # every distinct pair's chance of sharing a band at its exact Jaccard, times the documents of 160 GB: the
    # expected chance candidates of one document there (what counting among 4.5 M pairs cannot show)
    row["chance candidates per doc at 160 GB"] = float(np.mean(T.candidate_probability(pair_j, bands, rows)) * n_real)
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def markdown(result: dict) -> str:
    kinds = list(KINDS)
    lines = [
        f"Set: {result['set']}",
        "",
        "Mean exact Jaccard of each kind of copy with its original:",
        "",
        "| shingle | " + " | ".join(kinds) + " |",
        "|---|" + "---|" * len(kinds),
    ]
    for k, js in result["mean_jaccard"].items():
        lines.append(f"| {k} words | " + " | ".join(f"{js[x]:.3f}" for x in kinds) + " |")
    lines += [
        "",
        "Recall (measured / theory at the copies' exact Jaccard) and false positives:",
        "",
        "| shingle, bands x rows (threshold) | "
        + " | ".join(kinds)
        + " | FP: distinct docs | FP: same template | chance candidates per document at 160 GB |",
        "|---|" + "---|" * (len(kinds) + 3),
    ]
    for r in result["rows"]:
        cells = [f"{r[f'recall {k}']:.3f} / {r[f'theory {k}']:.3f}" for k in kinds]
        lines.append(
            f"| {r['shingle']}, {r['bands']} x {r['rows']} ({r['threshold']}) | "
            + " | ".join(cells)
            + f" | {r['FP distinct docs']:.5f} | {r['FP same template']:.3f} | "
            + f"{r['chance candidates per doc at 160 GB']:.2g} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", type=Path, default=REPO / "docs" / "dedup")
    ap.add_argument("--distinct", type=int, default=3000)
    ap.add_argument("--copies", type=int, default=300)
    args = ap.parse_args()
    data = build_set(args.distinct, args.copies, args.copies)
    mean_j, per_copy = {}, {}
    for k in sorted({s for s, _, _ in SETTINGS}):
        per_copy[k] = {
            kind: [jaccard(data["distinct"][i], t, k) for i, t in pairs] for kind, pairs in data["copies"].items()
        }
        mean_j[k] = {kind: round(float(np.mean(v)), 4) for kind, v in per_copy[k].items()}
    rows = []
    n_real = 160e9 / np.mean([len(t.encode()) for t in data["distinct"]])
    pair_j = {k: pairwise_jaccard(data["distinct"], k) for k in per_copy}
    for shingle, bands, rows_ in SETTINGS:
        rows.append(evaluate(data, shingle, bands, rows_, per_copy[shingle], pair_j[shingle], n_real))
        print(json.dumps(rows[-1]), flush=True)
    n_pairs = args.distinct * (args.distinct - 1) // 2
    result = {
        "set": f"{args.distinct} distinct documents ({n_pairs:,} pairs), {args.copies} copies of each kind, "
        f"{args.copies} same-template pairs; signatures: {T.SIGNATURE_ALGORITHM}",
        "mean_jaccard": mean_j,
        "rows": rows,
        "documents_in_160_gb": int(n_real),
        "distinct_pairs_jaccard": {
            k: {"mean": float(v.mean()), "p99.9": float(np.percentile(v, 99.9)), "max": float(v.max())}
            for k, v in pair_j.items()
        },
    }
    args.output.mkdir(parents=True, exist_ok=True)
    write_result(args.output / "quality.json", result)
    (args.output / "quality.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
