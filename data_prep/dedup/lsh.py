"""Stage 2 of `data_prep.dedup` (`clusters`): from the units' sorted band keys to each document's keeper.

Global document ids: documents are numbered by (corpus priority, source path, byte offset / row) — the order of the
keeper rule — so the keeper of a cluster is its smallest id. `Layout` maps a unit's local document index to its id
and back.

Candidates: two documents are candidates when one of their band keys (or their exact hashes: one more "band") is
equal. The work is cut into items (band, key range): an item reads, from every unit, the slice of that band's sorted
keys that falls into its range (a binary search in a memory-mapped file), sorts them, and writes one edge per
document of a group of equal keys to the group's smallest id. The number of key ranges is the power of two that
keeps the items the workers hold at once under `--lsh-memory` (16 bytes per entry, times the sort's working copies),
so the memory of this stage does not grow with the corpus beyond the union-find's 8 bytes per document. Measured
(docs/dedup/scale.md): 162 MB at 1.2 M documents with 2 workers (two items of 1.2 M entries each and the
union-find); at 160 GB (~40 M documents) on 64 workers the default 2 GB budget (32 MB each) cuts every band into
128 key ranges, and the union-find holds 0.3 GB.

Union-find: `parent[i] <= i` always; per band, the roots of each edge's two ends are hooked, larger onto smaller
(`np.minimum.at`), and the forest is compressed by pointer jumping until every edge's ends share a root. At the end
`roots[i]` is the smallest id of i's cluster: its keeper. Everything is vectorised numpy; nothing here depends on the
number of workers or on the order items finish in.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.integrity import sha256_file
from common.io import atomic_path, atomic_write_json, peek_object

from ..errors import DataPrepError
from ..util import CANONICAL
from .plan import DedupRun
from .stages import DedupContext, finished_sig_units, remove_temporaries, run_items, sig_arrays

log = logging.getLogger("data_prep")

ENTRY_BYTES = 16 * 4  # key + id, times the concatenation, lexsort and gathers of an item


@dataclass
class Layout:
    """Global ids of the documents of every (unit, segment): `base[u][k]` is the id of segment k's first document."""

    base: list[np.ndarray]
    seg_start: list[np.ndarray]  # local index of segment k's first document in unit u
    total: int
    # for the way back (id -> unit, local index): segments sorted by their first id
    sorted_first: np.ndarray
    sorted_unit: np.ndarray
    sorted_local: np.ndarray

    def ids(self, u: int, seg: np.ndarray, local: np.ndarray) -> np.ndarray:
        """Global ids of unit u's documents `local` (of segments `seg`)."""
        return self.base[u][seg] + (local.astype(np.int64) - self.seg_start[u][seg])

    def locate(self, gid: int) -> tuple[int, int]:
        """(unit, local index) of global id `gid`."""
        i = int(np.searchsorted(self.sorted_first, gid, "right")) - 1
        return int(self.sorted_unit[i]), int(self.sorted_local[i] + (gid - self.sorted_first[i]))


def build_layout(plan: dict[str, Any], infos: list[dict[str, Any]]) -> Layout:
    """Number every document by (corpus priority, source index, start of its segment, position)."""
    rows = []  # (corpus rank, source index, segment start, unit, segment k, count, local start)
    for u, info in enumerate(infos):
        local = 0
        for k, ((si, a, _), n) in enumerate(zip(plan["units"][u], info["seg_docs"], strict=True)):
            rows.append((plan["source_corpus"][si], si, a, u, k, n, local))
            local += n
    table = np.array(rows, dtype=np.int64).reshape(-1, 7)
    order = np.lexsort((table[:, 2], table[:, 1], table[:, 0]))
    counts = table[order, 5]
    first = np.zeros(len(order), np.int64)
    np.cumsum(counts[:-1], out=first[1:])
    base = [np.zeros(len(plan["units"][u]), np.int64) for u in range(len(infos))]
    seg_start = [np.zeros(len(plan["units"][u]), np.int64) for u in range(len(infos))]
    for pos, row in enumerate(order):
        _, _, _, u, k, _, local = table[row]
        base[u][k] = first[pos]
        seg_start[u][k] = local
    keep = counts > 0
    return Layout(base, seg_start, int(counts.sum()), first[keep], table[order, 3][keep], table[order, 6][keep])


# ------------------------------------------------------------------------------------------------ edges


def lsh_dir(out: Path) -> Path:
    return out / ".work" / "lsh"


def partition_bits(entries_per_band: int, lsh_memory: int) -> int:
    """log2 of the number of key ranges per band that keeps one item under `lsh_memory`."""
    need = entries_per_band * ENTRY_BYTES / lsh_memory
    return max(0, math.ceil(math.log2(need))) if need > 1 else 0


def _key_range(p: int, bits: int) -> tuple[np.uint64, np.uint64 | None]:
    if bits == 0:
        return np.uint64(0), None
    shift = 64 - bits
    lo = np.uint64(p << shift)
    hi = np.uint64((p + 1) << shift) if p + 1 < (1 << bits) else None
    return lo, hi


def group_edges(keys: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """int64 [2, E]: (id, smallest id of its group) for every document in a group of equal keys but the smallest."""
    order = np.lexsort((ids, keys))
    keys, ids = keys[order], ids[order]
    starts = np.ones(len(keys), bool)
    starts[1:] = keys[1:] != keys[:-1]
    group_first = ids[np.flatnonzero(starts)]
    group_of = np.cumsum(starts) - 1
    members = ~starts
    return np.stack([ids[members], group_first[group_of[members]]])


def band_item(ctx: DedupContext, layout: Layout, band: int, part: int, bits: int) -> dict[str, Any]:
    """Edges of one (band, key range); band == bands is the exact hash."""
    lo, hi = _key_range(part, bits)
    keys, ids = [], []
    for u, key in enumerate(ctx.sig_keys):
        arrays = sig_arrays(ctx.out, key)
        row = arrays["keys"][band]
        a = int(np.searchsorted(row, lo, "left"))
        b = len(row) if hi is None else int(np.searchsorted(row, hi, "left"))
        if b > a:
            local = np.asarray(arrays["order"][band, a:b])
            keys.append(np.asarray(row[a:b]))
            ids.append(layout.ids(u, np.asarray(arrays["docs"]["seg"][local]).astype(np.int64), local))
    edges = group_edges(np.concatenate(keys), np.concatenate(ids)) if keys else np.zeros((2, 0), np.int64)
    path = lsh_dir(ctx.out) / "edges" / f"b{band:03d}_p{part:05d}.npy"
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, edges, allow_pickle=False)
    rec = {"band": band, "part": part, "bits": bits, "edges": int(edges.shape[1]), "sha256": sha256_file(path)}
    atomic_write_json(path.with_suffix(".json"), rec, **CANONICAL)
    return rec


def _item_done(path: Path, bits: int, rehash: bool) -> dict[str, Any] | None:
    try:
        rec = peek_object(path.with_suffix(".json")) or {}
        if rec.get("bits") != bits or (rehash and sha256_file(path) != rec["sha256"]):
            return None
        return rec
    except (OSError, ValueError, KeyError, AttributeError):
        return None


# ------------------------------------------------------------------------------------------- union-find


def _compress(parent: np.ndarray) -> np.ndarray:
    """Pointer jumping until every node points at its root."""
    while True:
        grand = parent[parent]
        if np.array_equal(grand, parent):
            return parent
        parent = grand


def union_edges(parent: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Merge the clusters joined by `edges` (int64 [2, E]) into the compressed forest `parent`."""
    a, b = edges[0], edges[1]
    while len(a):
        ra, rb = parent[a], parent[b]
        differ = ra != rb
        if not differ.any():
            break
        a, b, ra, rb = a[differ], b[differ], ra[differ], rb[differ]
        np.minimum.at(parent, np.maximum(ra, rb), np.minimum(ra, rb))
        parent = _compress(parent)
    return parent


def clusters_summary(roots: np.ndarray) -> dict[str, Any]:
    """Cluster counts and sizes (clusters of two or more documents)."""
    sizes = np.bincount(roots)
    sizes = sizes[sizes > 1]
    hist = np.bincount(np.minimum(sizes, 11))[2:] if len(sizes) else np.zeros(0, np.int64)
    return {
        "clusters": len(sizes),
        "documents_in_clusters": int(sizes.sum()),
        "largest": int(sizes.max()) if len(sizes) else 0,
        "size_histogram": {(str(i + 2) if i + 2 <= 10 else "11+"): int(c) for i, c in enumerate(hist)},
    }


# ---------------------------------------------------------------------------------------------- the stage


def stage_clusters(ctx: DedupContext, run: DedupRun) -> dict[str, Any]:
    """Stage 2: edges per (band, key range) in parallel, then the union-find; writes roots.npy + clusters.json."""
    folder = lsh_dir(ctx.out)
    done = _finished_clusters(ctx)
    if done is not None:
        return done
    infos = finished_sig_units(ctx, run.rehash)
    layout = build_layout(ctx.plan, infos)
    bands = ctx.plan["dedup"]["bands"] + 1
    # the budget is the stage's: its workers each hold one item at a time
    bits = partition_bits(sum(i["eligible"] for i in infos), run.lsh_memory // run.workers)
    (folder / "edges").mkdir(parents=True, exist_ok=True)
    remove_temporaries(folder / "edges")
    items = [(b, p) for b in range(bands) for p in range(1 << bits)]
    todo = [it for it in items if _item_done(_edge_path(ctx, *it), bits, run.rehash) is None]
    log.info("clusters: %d documents, %d bands x %d key ranges (%d to do)", layout.total, bands, 1 << bits, len(todo))
    run_items(
        todo,
        lambda it: band_item(ctx, layout, it[0], it[1], bits),
        run.workers,
        "clusters",
        lambda: remove_temporaries(folder / "edges"),
    )
    parent = np.arange(layout.total, dtype=np.int64)
    edges_total = 0
    for it in items:
        path = _edge_path(ctx, *it)
        if _item_done(path, bits, rehash=True) is None:
            raise DataPrepError(f"{path}: missing or damaged after it was written; rerun the same command")
        edges = np.load(path, allow_pickle=False)
        edges_total += edges.shape[1]
        parent = union_edges(parent, edges)
    with atomic_path(folder / "roots.npy") as tmp:
        with open(tmp, "wb") as f:
            np.save(f, parent, allow_pickle=False)
    summary = {
        "plan_hash": ctx.phash,
        "documents": layout.total,
        "key_range_bits": bits,
        "edges": edges_total,
        "roots_sha256": sha256_file(folder / "roots.npy"),
        **clusters_summary(parent),
    }
    atomic_write_json(folder / "clusters.json", summary, **CANONICAL)
    return summary


def _edge_path(ctx: DedupContext, band: int, part: int) -> Path:
    return lsh_dir(ctx.out) / "edges" / f"b{band:03d}_p{part:05d}.npy"


def _finished_clusters(ctx: DedupContext) -> dict[str, Any] | None:
    try:
        summary = peek_object(lsh_dir(ctx.out) / "clusters.json") or {}
        if (
            summary.get("plan_hash") == ctx.phash
            and sha256_file(lsh_dir(ctx.out) / "roots.npy") == summary["roots_sha256"]
        ):
            return summary
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    return None


def load_roots(ctx: DedupContext) -> tuple[np.ndarray, dict[str, Any]]:
    """roots.npy (memory-mapped) and the clusters summary; an error naming the stage to run when absent."""
    summary = _finished_clusters(ctx)
    if summary is None:
        raise DataPrepError(f"{lsh_dir(ctx.out)}: no clusters for these inputs yet: run --stage clusters first")
    return np.load(lsh_dir(ctx.out) / "roots.npy", mmap_mode="r", allow_pickle=False), summary
