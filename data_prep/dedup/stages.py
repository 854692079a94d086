"""The stages of `data_prep.dedup` run in order, the process pool they share, and stage 1 (`signatures`): per work
unit, each document's exact hash and LSH band keys, sorted per band, into `.work/sig/<unit key>/`.

A unit directory is written under a temporary name and renamed when complete (`common.io.atomic_path`); its
`unit.json` records the size and sha256 of every file, re-checked before a later stage uses it. So a killed run keeps
its finished units, and a rerun (any number of workers or tasks) does only the rest.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import multiprocessing as mp
import os
import shutil
import signal
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.integrity import sha256_file
from common.io import atomic_path, atomic_write_json, peek_object

from .. import sources as S
from ..errors import DataPrepError, with_path
from ..util import CANONICAL
from ..workers import _die_with_parent, _kill_workers, release_freed_memory
from . import text as T
from .evalsets import EvalTable
from .plan import DedupRun

log = logging.getLogger("data_prep")

BATCH_CHARS = 1 << 20  # characters of text per vectorised batch (word hashing, signatures, n-gram lookups)
DOC_FIELDS = [("seg", "<u4"), ("offset", "<i8"), ("nbytes", "<i8"), ("nwords", "<i4"), ("exact", "<u8")]
SIG_FILES = ("docs.npy", "keys.npy", "order.npy")


@dataclass
class DedupContext:
    """What every stage needs (inherited by forked workers)."""

    out: Path
    plan: dict[str, Any]
    phash: str
    sig_keys: list[str]
    table: EvalTable | None  # the evaluation sets' n-grams (None: no decontamination, or a stage without them)


# ------------------------------------------------------------------------------------------------ documents


def unit_documents(plan: dict[str, Any], u: int, stats: S.ReadStats) -> Iterator[tuple[int, int, str]]:
    """(segment index within the unit, document id, text) of every document of unit `u`, in order. In "file" mode
    a document arrives paragraph by paragraph (pieces with one id): they are joined by a blank line."""
    cfg = plan["config"]
    for k, (si, a, b) in enumerate(plan["units"][u]):
        reader = S.DocumentReader(
            plan["sources"][si], cfg["on_decode_error"], cfg["text_field"], cfg["max_doc_bytes"], stats
        )
        doc_id, parts = None, []
        for piece_id, text in reader.documents(a, b):
            if piece_id != doc_id and parts:
                yield k, doc_id, "\n\n".join(parts)
                parts = []
            doc_id = piece_id
            parts.append(text)
        if parts:
            yield k, doc_id, "\n\n".join(parts)


def batches(docs: Iterator[tuple[int, int, str]]) -> Iterator[list[tuple[int, int, str]]]:
    """Documents in batches of about BATCH_CHARS characters."""
    batch: list[tuple[int, int, str]] = []
    chars = 0
    for doc in docs:
        batch.append(doc)
        chars += len(doc[2])
        if chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


# --------------------------------------------------------------------------------------------- signatures


def sig_dir(out: Path, key: str) -> Path:
    return out / ".work" / "sig" / key[:32]


def _sign_batch(batch: list[tuple[int, int, str]], params: T.MinHashParams, min_words: int) -> tuple[Any, Any]:
    """(per-document records, band keys [bands, eligible documents]) of one batch."""
    words = [T.normalized_words(text) for _, _, text in batch]
    recs = np.zeros(len(batch), dtype=DOC_FIELDS)
    recs["seg"] = [k for k, _, _ in batch]
    recs["offset"] = [d for _, d, _ in batch]
    recs["nbytes"] = [len(text.encode("utf-8", "surrogatepass")) for _, _, text in batch]
    recs["nwords"] = [len(w) for w in words]
    eligible = np.flatnonzero(recs["nwords"] >= min_words)
    recs["exact"][eligible] = [T.exact_hash(words[i]) for i in eligible]
    if len(eligible) == 0:
        return recs, np.zeros((params.bands, 0), np.uint64)
    flat, offsets = T.hash_words([words[i] for i in eligible])
    return recs, T.band_keys(T.signatures(flat, offsets, params), params)


def sign_unit(ctx: DedupContext, u: int) -> dict[str, Any]:
    """Stage 1 for unit `u`: write its directory (docs, sorted band keys + exact hashes, order) and record."""
    plan, key = ctx.plan, ctx.sig_keys[u]
    d = plan["dedup"]
    params = T.MinHashParams(d["shingle"], d["bands"], d["rows"], d["seed"])
    stats = S.ReadStats()
    recs, keys = [], []
    for batch in batches(unit_documents(plan, u, stats)):
        r, k = _sign_batch(batch, params, d["min_words"])
        recs.append(r)
        keys.append(k)
    docs = np.concatenate(recs) if recs else np.zeros(0, dtype=DOC_FIELDS)
    eligible = np.flatnonzero(docs["nwords"] >= d["min_words"]).astype(np.uint32)
    rows = np.concatenate(
        [
            np.concatenate(keys, axis=1) if keys else np.zeros((params.bands, 0), np.uint64),
            docs["exact"][eligible][None, :],
        ]
    )
    order = np.argsort(rows, axis=1, kind="stable")
    sorted_keys = np.take_along_axis(rows, order, axis=1)
    local = eligible[order]
    seg_docs = np.bincount(docs["seg"].astype(np.int64), minlength=len(plan["units"][u])).tolist()
    final = sig_dir(ctx.out, key)
    with atomic_path(final) as tmp:
        tmp.mkdir(parents=True)
        for name, arr in zip(SIG_FILES, (docs, sorted_keys, local), strict=True):
            _save(tmp / name, arr)
        info = {
            "unit": u,
            "unit_key": key,
            "segments": plan["units"][u],
            "seg_docs": seg_docs,
            "docs": len(docs),
            "eligible": len(eligible),
            "input_bytes": stats.bytes_read,
            "decode_errors": stats.decode_errors,
            "files": {n: {"size": (tmp / n).stat().st_size, "sha256": sha256_file(tmp / n)} for n in SIG_FILES},
        }
        atomic_write_json(tmp / "unit.json", info, **CANONICAL)
    return info


def _save(path: Path, arr: np.ndarray) -> None:
    try:
        np.save(path, arr, allow_pickle=False)
    except OSError as err:
        raise with_path(err, path) from None


def load_sig_unit(out: Path, key: str, rehash: bool) -> dict[str, Any] | None:
    """A finished unit's record when complete and intact (sha256 re-checked when `rehash`), else None."""
    d = sig_dir(out, key)
    info = peek_object(d / "unit.json")
    if info is None or info.get("unit_key") != key:
        return None
    for name, rec in info.get("files", {}).items():
        path = d / name
        try:
            if path.stat().st_size != rec["size"] or (rehash and sha256_file(path) != rec["sha256"]):
                log.warning("%s: differs from its unit.json: the unit is redone", path)
                return None
        except OSError:
            return None
    return info


def sig_arrays(out: Path, key: str) -> dict[str, np.ndarray]:
    """A unit's arrays, memory-mapped (read-only)."""
    d = sig_dir(out, key)
    return {name[:-4]: np.load(d / name, mmap_mode="r", allow_pickle=False) for name in SIG_FILES}


# ----------------------------------------------------------------------------------------------- the pool

_POOL: dict[str, Any] = {}


def _pool_init(fn: Callable[[Any], Any], parent: int) -> None:
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["RAYON_NUM_THREADS"] = "1"
    _POOL["fn"] = fn


def _pool_call(item: Any) -> Any:
    try:
        return _POOL["fn"](item)
    finally:
        release_freed_memory()


def run_items(items: list[Any], fn: Callable[[Any], Any], workers: int, what: str, cleanup: Callable[[], None]) -> None:
    """Run `fn(item)` for every item: in this process for one worker or item, else in a pool of forked workers (they
    inherit `fn`'s context). A worker's error is re-raised here; a worker that dies (the OOM killer) stops the run
    with a DataPrepError instead of a hang; on any error the workers are killed and `cleanup()` removes their
    temporaries. Finished items stay, for the resume."""
    if workers <= 1 or len(items) <= 1:
        for item in items:
            fn(item)
            release_freed_memory()
        return
    mctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    pool = ProcessPoolExecutor(
        min(workers, len(items)), mp_context=mctx, initializer=_pool_init, initargs=(fn, os.getpid())
    )
    try:
        for future in [pool.submit(_pool_call, item) for item in items]:
            future.result()
        pool.shutdown()
    except BaseException as err:
        _kill_workers(pool)
        pool.shutdown(wait=True, cancel_futures=True)
        cleanup()
        if isinstance(err, BrokenProcessPool):
            raise DataPrepError(
                f"a dedup worker process died during {what} ({err}); the usual cause is the out-of-memory killer: "
                "lower --workers (or --lsh-memory). Finished items are kept: rerun the same command to resume"
            ) from None
        raise


def remove_temporaries(folder: Path, names: Iterable[str] | None = None) -> None:
    """Temporary siblings (`.NAME.tmpPID`) left in `folder` by killed workers: of the outputs `names` only (the
    units of this task: other array tasks, on other nodes, may be writing theirs right now), or all (`names` None:
    a stage that runs as one job)."""
    patterns = [".*.tmp*"] if names is None else [f".{glob.escape(n)}.tmp*" for n in names]
    with contextlib.suppress(OSError):
        for pattern in patterns:
            for t in folder.glob(pattern):
                shutil.rmtree(t, ignore_errors=True) if t.is_dir() else t.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------- the stages


def stage_signatures(ctx: DedupContext, run: DedupRun) -> dict[str, Any]:
    """Stage 1 for this task's share of the units (unit u is task u mod J's)."""
    mine = task_units(ctx, run)
    folder = ctx.out / ".work" / "sig"
    folder.mkdir(parents=True, exist_ok=True)
    names = [sig_dir(ctx.out, ctx.sig_keys[u]).name for u in mine]
    remove_temporaries(folder, names)
    todo = [u for u in mine if load_sig_unit(ctx.out, ctx.sig_keys[u], run.rehash) is None]
    log.info(
        "signatures: %d units planned, task %d/%d has %d (%d to do)",
        len(ctx.plan["units"]),
        run.task_index,
        run.num_tasks,
        len(mine),
        len(todo),
    )
    run_items(todo, lambda u: sign_unit(ctx, u), run.workers, "signatures", lambda: remove_temporaries(folder, names))
    return stage_result("signatures", run, mine, todo)


def task_units(ctx: DedupContext, run: DedupRun) -> list[int]:
    """The units of an array stage this task does: unit u is task u mod J's."""
    return list(range(run.task_index, len(ctx.plan["units"]), run.num_tasks))


def stage_result(stage: str, run: DedupRun, mine: list[int], todo: list[int]) -> dict[str, Any]:
    """What an array stage returns (the command prints it): this task's units, and those it did now."""
    return {
        "stage": stage,
        "task": run.task_index,
        "num_tasks": run.num_tasks,
        "units": len(mine),
        "units_done_now": todo,
    }


def every_unit(
    ctx: DedupContext, records: list[dict[str, Any] | None], missing: str, todo: str
) -> list[dict[str, Any]]:
    """`records` (one per unit), when none is None; else a DataPrepError: how many units are `missing` (the first
    20 named) and what to run (`todo`)."""
    absent = [u for u, record in enumerate(records) if record is None]
    if absent:
        shown = ", ".join(map(str, absent[:20])) + (" ..." if len(absent) > 20 else "")
        raise DataPrepError(f"{ctx.out}: {len(absent)} of {len(records)} units {missing} (units {shown}): {todo}")
    return [record for record in records if record is not None]


def finished_sig_units(ctx: DedupContext, rehash: bool) -> list[dict[str, Any]]:
    """Every unit's stage-1 record; a missing one is an error naming the array tasks to rerun."""
    infos = [load_sig_unit(ctx.out, k, rehash) for k in ctx.sig_keys]
    todo = "run --stage signatures for them first (the same command; in an array, the tasks u mod J)"
    return every_unit(ctx, infos, "have no signatures yet", todo)
