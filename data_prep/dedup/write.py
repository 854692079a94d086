"""Stage 3 of `data_prep.dedup` (`write`): per work unit, read the documents again, skip those whose keeper is
another document, find their evaluation-set n-grams and cut or drop them, and write the rest as JSON lines
(`{"text", "corpus", "source", "offset"}`; tokenize reads `text`) to `text/<corpus>/part_<unit>.jsonl.zst`.

A unit's files are written to temporaries, renamed into place, and then its record (`.work/write/<key>.json`: every
file's size and sha256, and the unit's counts for the report) is written: a unit without a record is redone, with
the same bytes. The documents read here are checked against those of stage 1 (count and offsets), so an input
changed in between is reported instead of silently mixing two versions.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from common.integrity import sha256_bytes, sha256_file
from common.io import atomic_path, atomic_write_json, peek_object, temporary_sibling

from .. import sources as S
from ..errors import DataPrepError, with_path
from ..util import CANONICAL, canonical_json
from . import text as T
from .evalsets import CutRule, EvalTable, cut_document, fingerprint
from .lsh import Layout, build_layout, load_roots
from .manifest import TEXT_DIR
from .plan import DedupRun
from .stages import (
    DedupContext,
    batches,
    finished_sig_units,
    remove_temporaries,
    run_items,
    sig_arrays,
    stage_result,
    task_units,
    unit_documents,
)

log = logging.getLogger("data_prep")

EXAMPLES_PER_UNIT = 3
SNIPPET = 160


def write_dir(out: Path) -> Path:
    return out / ".work" / "write"


def part_name(plan: dict[str, Any], corpus: int, u: int, compress: str) -> str:
    return f"{TEXT_DIR}/{plan['corpora'][corpus]}/part_{u:05d}.jsonl" + (".zst" if compress == "zst" else "")


@dataclass
class WriteState:
    """What the write stage shares across units (inherited by forked workers)."""

    ctx: DedupContext
    layout: Layout
    roots: np.ndarray
    table: EvalTable | None
    write_keys: list[str]
    rule: CutRule


@dataclass
class UnitCounts:
    """A unit's counts for the report, by corpus name."""

    corpora: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    cross: dict[str, dict[str, list[int]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(lambda: [0, 0]))
    )
    contamination: dict[str, dict[str, dict[str, int]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(int)))
    )
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))

    def as_json(self) -> dict[str, Any]:
        return json.loads(
            json.dumps(
                {
                    "corpora": self.corpora,
                    "cross": self.cross,
                    "contamination": self.contamination,
                    "examples": self.examples,
                }
            )
        )

    def example(self, kind: str, item: dict[str, Any]) -> None:
        if len(self.examples[kind]) < EXAMPLES_PER_UNIT:
            self.examples[kind].append(item)


class _Parts:
    """The unit's output files, one per corpus, opened on first use (zstd streams into temporaries)."""

    def __init__(self, state: WriteState, u: int, tmp_dir: Path) -> None:
        self.state, self.u, self.tmp_dir = state, u, tmp_dir
        self.files: dict[int, tuple[BinaryIO, Any, Path]] = {}

    def write(self, corpus: int, record: dict[str, Any]) -> None:
        if corpus not in self.files:
            tmp = self.tmp_dir / f"{corpus}.part"
            raw = open(tmp, "wb")
            stream: Any = raw
            if self.state.ctx.plan["dedup"]["compress"] == "zst":
                import zstandard

                stream = zstandard.ZstdCompressor(level=3).stream_writer(raw, closefd=False)
            self.files[corpus] = (raw, stream, tmp)
        _, stream, tmp = self.files[corpus]
        try:
            stream.write(json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n")
        except OSError as err:  # a failed write() names no file by itself
            raise with_path(err, tmp) from None

    def close(self) -> dict[int, Path]:
        done = {}
        for corpus, (raw, stream, tmp) in self.files.items():
            try:
                if stream is not raw:
                    stream.close()
                raw.close()
            except OSError as err:
                raise with_path(err, tmp) from None
            done[corpus] = tmp
        return done


def _doc_source(plan: dict[str, Any], u: int, seg: int) -> tuple[int, dict[str, Any]]:
    si = plan["units"][u][seg][0]
    return plan["source_corpus"][si], plan["sources"][si]


def _keeper(state: WriteState, gid: int, cache: dict[int, Any]) -> tuple[int, dict[str, Any], np.void]:
    """(corpus, source, document record) of the document with global id `gid`."""
    u, local = state.layout.locate(gid)
    if u not in cache:
        cache[u] = sig_arrays(state.ctx.out, state.ctx.sig_keys[u])["docs"]
    rec = cache[u][local]
    corpus, src = _doc_source(state.ctx.plan, u, int(rec["seg"]))
    return corpus, src, rec


def _removed(state: WriteState, counts: UnitCounts, doc: dict[str, Any], keeper_gid: int, cache: dict) -> None:
    """Count a duplicate: exact (same normalised text as its keeper) or near, and its keeper's corpus."""
    k_corpus, k_src, k_rec = _keeper(state, keeper_gid, cache)
    kind = "exact" if int(k_rec["exact"]) == doc["exact"] else "near"
    names = state.ctx.plan["corpora"]
    c = counts.corpora[names[doc["corpus"]]]
    c[f"{kind}_docs"] += 1
    c[f"{kind}_bytes"] += doc["nbytes"]
    cell = counts.cross[names[doc["corpus"]]][names[k_corpus]]
    cell[0] += 1
    cell[1] += doc["nbytes"]
    counts.example(
        kind,
        {
            "corpus": names[doc["corpus"]],
            "source": doc["source"],
            "offset": doc["offset"],
            "keeper": {"corpus": names[k_corpus], "source": k_src["key"], "offset": int(k_rec["offset"])},
            "text": doc["text"][:SNIPPET],
        },
    )


def _decontaminate(state: WriteState, counts: UnitCounts, doc: dict[str, Any], hashes: np.ndarray) -> list[str]:
    """The pieces of a document with evaluation-set hits that are kept (all of it in "report" mode)."""
    assert state.table is not None
    matches = state.table.matches(hashes)
    name = state.ctx.plan["corpora"][doc["corpus"]]
    per_set: dict[int, int] = defaultdict(int)
    for _, _, sid, _ in matches:
        per_set[sid] += 1
    for sid, grams in per_set.items():
        cell = counts.contamination[name][state.table.sets[sid].name]
        cell["docs"] += 1
        cell["grams"] += grams
    first, n, sid, row = matches[0]
    spans = T.word_spans(doc["text"])
    where = spans[first][0] if spans else 0
    counts.example(
        "contamination",
        {
            "corpus": name,
            "source": doc["source"],
            "offset": doc["offset"],
            "eval_set": state.table.sets[sid].name,
            "eval_row": row,
            "n": n,
            "text": doc["text"][max(0, where - 80) : where + SNIPPET],
        },
    )
    mode = state.ctx.plan["dedup"]["decontaminate"]
    c = counts.corpora[name]
    c["contaminated_docs"] += 1
    if mode == "report":
        return [doc["text"]]
    pieces = [] if mode == "drop" else cut_document(doc["text"], matches, spans, state.rule)
    c["decontam_dropped_docs" if not pieces else "decontam_cut_docs"] += 1
    c["decontam_removed_bytes"] += doc["nbytes"] - sum(len(p.encode("utf-8", "surrogatepass")) for p in pieces)
    return pieces


def _write_batch(
    state: WriteState, u: int, batch: list, recs: np.ndarray, first: int, parts: _Parts, counts: UnitCounts, cache: dict
) -> None:
    """Handle one batch of documents (with their stage-1 records) of unit u."""
    plan = state.ctx.plan
    if len(batch) != len(recs) or any(d != int(r["offset"]) for (_, d, _), r in zip(batch, recs, strict=True)):
        raise DataPrepError(
            f"unit {u} ({plan['sources'][plan['units'][u][0][0]]['path']}): its documents differ from "
            "those signed in stage 1 (input changed during the run?); delete OUT/.work and rerun"
        )
    gids = state.layout.ids(u, recs["seg"].astype(np.int64), np.arange(first, first + len(recs)))
    keepers = np.asarray(state.roots[gids])
    hits = np.zeros(len(batch), np.int64)
    flat, offsets = np.zeros(0, np.uint64), np.zeros(len(batch) + 1, np.int64)
    if state.table is not None:
        flat, offsets = T.hash_words([T.normalized_words(t) for _, _, t in batch])
        hits = state.table.doc_hits(flat, offsets)
    for i, (seg, offset, text) in enumerate(batch):
        corpus, src = _doc_source(plan, u, seg)
        doc = {
            "corpus": corpus,
            "source": src["key"],
            "offset": int(offset),
            "text": text,
            "nbytes": int(recs["nbytes"][i]),
            "exact": int(recs["exact"][i]),
        }
        c = counts.corpora[plan["corpora"][corpus]]
        c["docs_in"] += 1
        c["bytes_in"] += doc["nbytes"]
        c["short_docs"] += int(recs["nwords"][i] < plan["dedup"]["min_words"])
        if keepers[i] != gids[i]:
            _removed(state, counts, doc, int(keepers[i]), cache)
            continue
        pieces = [text] if hits[i] == 0 else _decontaminate(state, counts, doc, flat[offsets[i] : offsets[i + 1]])
        for piece in pieces:
            parts.write(
                corpus, {"text": piece, "corpus": plan["corpora"][corpus], "source": src["key"], "offset": int(offset)}
            )
            c["bytes_kept"] += len(piece.encode("utf-8", "surrogatepass"))
        c["docs_kept"] += int(bool(pieces))
        c["pieces_kept"] += len(pieces)


def write_unit(state: WriteState, u: int) -> dict[str, Any]:
    """Stage 3 for unit u: its output files (written in a temporary folder, then each renamed into place), then its
    record."""
    ctx = state.ctx
    recs = np.asarray(sig_arrays(ctx.out, ctx.sig_keys[u])["docs"])
    counts, cache, pos = UnitCounts(), {}, 0
    key = state.write_keys[u][:32]
    tmp_dir = temporary_sibling(write_dir(ctx.out) / key)
    shutil.rmtree(tmp_dir, ignore_errors=True)
    tmp_dir.mkdir(parents=True)
    files = {}
    try:
        parts, stats = _Parts(state, u, tmp_dir), S.ReadStats()
        for batch in batches(unit_documents(ctx.plan, u, stats)):
            _write_batch(state, u, batch, recs[pos : pos + len(batch)], pos, parts, counts, cache)
            pos += len(batch)
        if pos != len(recs):
            raise DataPrepError(f"unit {u}: fewer documents than in stage 1 (input changed?); delete OUT/.work")
        for corpus, tmp in parts.close().items():
            name = part_name(ctx.plan, corpus, u, ctx.plan["dedup"]["compress"])
            files[name] = {"size": tmp.stat().st_size, "sha256": sha256_file(tmp)}
            dest = ctx.out / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(dest) as final_tmp:
                os.replace(tmp, final_tmp)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    record = {"unit": u, "write_key": state.write_keys[u], "files": files, **counts.as_json()}
    record["text_faults"] = dict(sorted(stats.text_faults.items()))  # U+FFFD and control characters per file
    atomic_write_json(write_dir(ctx.out) / f"{key}.json", record, **CANONICAL)
    return record


def load_write_record(out: Path, key: str, rehash: bool) -> dict[str, Any] | None:
    """A unit's write record when its files are all in place (sha256 re-checked when `rehash`), else None."""
    try:
        rec = peek_object(write_dir(out) / f"{key[:32]}.json") or {}
        if rec.get("write_key") != key:
            return None
        for name, f in rec["files"].items():
            path = out / name
            if path.stat().st_size != f["size"] or (rehash and sha256_file(path) != f["sha256"]):
                return None
        return rec
    except (OSError, ValueError, KeyError, AttributeError):
        return None


def write_keys(ctx: DedupContext, roots_sha256: str, eval_fingerprint: list[dict[str, Any]]) -> list[str]:
    """Each unit's write key: its signature key plus what its output depends on besides its signatures (the
    clusters, the evaluation sets, the cut rule)."""
    d = ctx.plan["dedup"]
    keep = (
        "ngram",
        "ngram_min",
        "decontaminate",
        "eval_splits",
        "cut_margin",
        "cut_min_piece",
        "cut_max_pieces",
        "compress",
    )
    settings = {
        "roots": roots_sha256,
        "eval": eval_fingerprint,
        "corpora": ctx.plan["corpora"],
        **{k: d[k] for k in keep},
    }
    base = sha256_bytes(canonical_json(settings).encode())
    return [sha256_bytes(f"{base}\0{k}".encode()) for k in ctx.sig_keys]


def prepare_write(ctx: DedupContext) -> WriteState:
    """Everything stage 3 reads once: layout, roots; records the evaluation sets for the report."""
    d = ctx.plan["dedup"]
    roots, summary = load_roots(ctx)
    layout = build_layout(ctx.plan, finished_sig_units(ctx, rehash=False))
    sets = ctx.table.sets if ctx.table else []
    eval_info = [
        {
            "name": s.name,
            "path": s.path,
            "sha256": s.sha256,
            "n": s.n,
            "examples": s.examples,
            "texts": len(s.texts),
            "too_short": s.too_short,
        }
        for s in sets
    ]
    write_dir(ctx.out).mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        write_dir(ctx.out) / "eval_sets.json", {"roots": summary["roots_sha256"], "sets": eval_info}, **CANONICAL
    )
    keys = write_keys(ctx, summary["roots_sha256"], fingerprint(ctx.table) if ctx.table else [])
    rule = CutRule(d["cut_margin"], d["cut_min_piece"], d["cut_max_pieces"])
    return WriteState(ctx, layout, roots, ctx.table, keys, rule)


def _remove_unit_temporaries(state: WriteState, units: list[int]) -> None:
    """The temporaries killed workers left for `units` (this task's: other array tasks may be writing theirs now)."""
    plan, out = state.ctx.plan, state.ctx.out
    remove_temporaries(write_dir(out), [state.write_keys[u][:32] for u in units])
    for c, name in enumerate(plan["corpora"]):
        parts = [Path(part_name(plan, c, u, plan["dedup"]["compress"])).name for u in units]
        remove_temporaries(out / TEXT_DIR / name, parts)


def stage_write(ctx: DedupContext, run: DedupRun) -> dict[str, Any]:
    """Stage 3 for this task's share of the units (unit u is task u mod J's)."""
    state = prepare_write(ctx)
    mine = task_units(ctx, run)
    _remove_unit_temporaries(state, mine)
    todo = [u for u in mine if load_write_record(ctx.out, state.write_keys[u], run.rehash) is None]
    log.info("write: task %d/%d has %d units (%d to do)", run.task_index, run.num_tasks, len(mine), len(todo))
    run_items(todo, lambda u: write_unit(state, u), run.workers, "write", lambda: _remove_unit_temporaries(state, mine))
    return stage_result("write", run, mine, todo)
