"""Doing the work units of a plan: tokenize one unit into its directory (`process_unit`), in this process or in a
pool of forked workers (`run_units`), with a progress bar fed by the workers.

A unit is written into a temporary sibling of its directory and renamed into place when complete
(`common.io.atomic_path`), so a killed run leaves finished units or temporary directories, never half a unit.
What a unit contains depends on its bytes and the settings only, never on which worker or task made it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import hashlib
import logging
import multiprocessing as mp
import os
import queue
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.io import atomic_path

from . import sources as S
from .errors import DataPrepError, with_path
from .plan import SPLITS, load_unit, unit_dir, unit_temp_dirs
from .shard_format import SplitWriter
from .tokenizer import Encoder
from .util import canonical_json

log = logging.getLogger("data_prep")

# characters of text per tokenizer call: its encodings (~35 bytes per char) are most of a worker's memory; 256 K
# costs no measurable speed against 1 M and lowers the peak by 20 MB (bench/data/prep_scale.py)
BATCH_CHARS = 1 << 18

ProgressFn = Callable[[int, int, int, int], None]  # (bytes read, documents, tokens, [UNK] tokens) since the last call


@dataclass
class UnitContext:
    """What a worker needs to process units (inherited by forked workers)."""

    out: Path
    plan: dict[str, Any]
    keys: list[str]
    tokenizer_dir: Path


def _is_valid_doc(key: str, offset: int, seed: int, fraction: float) -> bool:
    """The held-out split: a hash of the document's stable id (source key, offset), so it depends neither on the
    unit cutting nor on the worker count."""
    if fraction <= 0.0:
        return False
    digest = hashlib.blake2b(f"{seed}\0{key}\0{offset}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") < fraction * 18446744073709551616.0


class _Batch:
    """Text pieces waiting to be tokenized, grouped into documents; between batches it carries the encoded
    arrays (not the text) of a document that may continue, so a batch never needs a whole long document."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.piece_doc: list[int] = []
        self.valid: list[bool] = []
        self.doc_id: Any = None
        self.chars = 0
        self.carry: tuple[np.ndarray, np.ndarray, int] | None = None  # ids, lens, sentences of document 0

    def add(self, doc_id: Any, text: str, src_key: str, cfg: dict[str, Any]) -> int:
        if doc_id != self.doc_id:
            self.doc_id = doc_id
            self.valid.append(_is_valid_doc(src_key, doc_id[1], cfg["split_seed"], cfg["valid_fraction"]))
        self.texts.append(text)
        self.piece_doc.append(len(self.valid) - 1)
        self.chars += len(text)
        return self.chars

    def encode(self, encoder: Encoder, final: bool) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Tokenize the pieces; return the documents that are complete: (n, ids, sentence lengths,
        sentences per document, valid mask). Without `final`, the last document is held back."""
        n_docs = len(self.valid)
        if n_docs == 0:
            return 0, np.zeros(0), np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, bool)
        if self.texts:
            ids, lens, counts = encoder.encode_docs(self.texts)
        else:
            ids, lens, counts = np.zeros(0, encoder.dtype), np.zeros(0, np.int32), np.zeros(0, np.int64)
        doc_counts = np.bincount(np.asarray(self.piece_doc, dtype=np.int64), weights=counts, minlength=n_docs).astype(
            np.int64
        )
        if self.carry is not None:
            c_ids, c_lens, c_count = self.carry
            ids, lens = np.concatenate([c_ids, ids]), np.concatenate([c_lens, lens])
            doc_counts[0] += c_count
        valid = np.asarray(self.valid, dtype=bool)
        keep_docs = n_docs if final else n_docs - 1
        s_cut = int(doc_counts[:keep_docs].sum())
        t_cut = int(lens[:s_cut].sum(dtype=np.int64))
        if final:
            self.carry, self.valid, self.doc_id = None, [], None
        else:
            self.carry = (ids[t_cut:], lens[s_cut:], int(doc_counts[-1]))
            self.valid = [bool(valid[-1])]
        self.texts, self.piece_doc, self.chars = [], [], 0
        return keep_docs, ids[:t_cut], lens[:s_cut], doc_counts[:keep_docs], valid[:keep_docs]


class _UnitWriter:
    """The train/valid parts of one unit being written, its running totals ([UNK]s per split too), and its progress
    reports."""

    def __init__(
        self, directory: Path, encoder: Encoder, shard_tokens: int, stats: S.ReadStats, progress: ProgressFn | None
    ) -> None:
        self.writers = {s: SplitWriter(directory, s, encoder.dtype, shard_tokens) for s in SPLITS}
        self.unk_id = encoder.meta["special_ids"]["unk"]
        self.stats = stats
        self.progress = progress
        self.docs = 0
        self.tokens = 0
        self.unk = dict.fromkeys(SPLITS, 0)
        self._reported = 0

    def _write(self, split: str, ids: np.ndarray, lens: np.ndarray, counts: np.ndarray) -> int:
        """Write documents to one split; returns their [UNK] count."""
        self.writers[split].add(ids, lens, counts)
        unk = int(np.count_nonzero(ids == self.unk_id))
        self.unk[split] += unk
        return unk

    def add(self, encoded: tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> None:
        """Write the complete documents of one `_Batch.encode` (empty documents are dropped)."""
        n_docs, ids, lens, counts, valid = encoded
        if n_docs == 0:
            return
        kept = counts > 0
        if not valid.any():
            unk = self._write("train", ids, lens, counts[kept])
        elif valid.all():
            unk = self._write("valid", ids, lens, counts[kept])
        else:
            doc_of = np.repeat(np.arange(len(counts)), counts)
            doc_tokens = np.bincount(doc_of, weights=lens, minlength=len(counts)).astype(np.int64)
            tok_mask = np.repeat(valid, doc_tokens)
            sent_mask = np.repeat(valid, counts)
            unk = self._write("valid", ids[tok_mask], lens[sent_mask], counts[valid & kept])
            unk += self._write("train", ids[~tok_mask], lens[~sent_mask], counts[~valid & kept])
        docs = int(kept.sum())
        self.docs += docs
        self.tokens += len(ids)
        if self.progress is not None:
            self.progress(self.stats.bytes_read - self._reported, docs, len(ids), unk)
            self._reported = self.stats.bytes_read

    def close(self) -> dict[str, list[dict[str, Any]]]:
        return {s: w.close() for s, w in self.writers.items()}


def _unit_documents(plan: dict[str, Any], u: int, stats: S.ReadStats) -> Iterator[tuple[Any, str, str]]:
    """(document id, text, source key) of every document piece of unit `u`, in order."""
    cfg = plan["config"]
    for si, a, b in plan["units"][u]:
        src = plan["sources"][si]
        reader = S.DocumentReader(src, cfg["on_decode_error"], cfg["text_field"], cfg["max_doc_bytes"], stats)
        for doc, text in reader.documents(a, b):
            yield (si, doc), text, src["key"]


def _write_unit(
    u: int, ctx: UnitContext, encoder: Encoder, directory: Path, progress: ProgressFn | None
) -> dict[str, Any]:
    """Tokenize unit `u` into `directory`: its train/valid parts and `unit.json` (its record)."""
    plan, cfg = ctx.plan, ctx.plan["config"]
    stats = S.ReadStats(hasher=hashlib.sha256())
    writer = _UnitWriter(directory, encoder, cfg["shard_tokens"], stats, progress)
    batch = _Batch()
    for doc_id, text, src_key in _unit_documents(plan, u, stats):
        if batch.add(doc_id, text, src_key, cfg) >= BATCH_CHARS:
            writer.add(batch.encode(encoder, final=False))
    writer.add(batch.encode(encoder, final=True))
    info = {
        "unit": u,
        "unit_key": ctx.keys[u],
        "segments": plan["units"][u],
        "input_bytes": stats.bytes_read,
        "input_sha256": stats.hasher.hexdigest(),
        "decode_errors": stats.decode_errors,
        "text_faults": dict(sorted(stats.text_faults.items())),
        "docs": writer.docs,
        "tokens": writer.tokens,
        "unk_tokens": writer.unk,
        "parts": writer.close(),
    }
    if stats.decode_errors:
        log.warning("unit %d: %d undecodable byte sequences replaced by U+FFFD", u, stats.decode_errors)
    record = directory / "unit.json"
    try:
        record.write_text(canonical_json(info), encoding="utf-8")  # re-hashed on resume: no fsync
    except OSError as err:
        raise with_path(err, record) from None
    return info


def process_unit(u: int, ctx: UnitContext, encoder: Encoder, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Tokenize unit `u` into a temporary directory and rename it into place when complete; returns its record."""
    key = ctx.keys[u]
    final = unit_dir(ctx.out, key)
    try:
        with atomic_path(final, replace=False) as tmp:
            tmp.mkdir(parents=True)
            return _write_unit(u, ctx, encoder, tmp, progress)
    except FileExistsError:
        finished = load_unit(ctx.out, key, rehash=False)
        if finished is not None:  # a concurrent run of the same task finished it first (the same bytes): keep it
            return finished
        shutil.rmtree(final, ignore_errors=True)  # a broken copy is in the way: replace it
        return process_unit(u, ctx, encoder, progress)


# ----------------------------------------------------------------------------------------------- the pool

_W: dict[str, Any] = {}  # a worker's context, encoder and progress queue (set by _worker_init)


def _set_threads(threads: int) -> None:
    """One tokenizer thread per worker by default: processes scale better than rayon threads here."""
    if threads <= 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    else:
        os.environ["TOKENIZERS_PARALLELISM"] = "true"
        os.environ["RAYON_NUM_THREADS"] = str(threads)


@contextlib.contextmanager
def _tokenizer_threads(threads: int) -> Iterator[None]:
    """`_set_threads` for the duration of an in-process run; the caller's environment is restored after."""
    saved = {k: os.environ.get(k) for k in ("TOKENIZERS_PARALLELISM", "RAYON_NUM_THREADS")}
    _set_threads(threads)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this worker when its parent dies, so a killed job leaves no orphan writing units."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _worker_init(ctx: UnitContext, q: Any, threads: int, parent: int) -> None:
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _set_threads(threads)
    _W["ctx"] = ctx
    _W["q"] = q
    _W["enc"] = Encoder(ctx.tokenizer_dir, ctx.plan["config"]["max_sentence_tokens"])


def _worker_run(u: int) -> dict[str, Any]:
    q = _W["q"]
    try:
        return process_unit(u, _W["ctx"], _W["enc"], lambda b, d, t, k: q.put((b, d, t, k)))
    finally:
        release_freed_memory()


def release_freed_memory() -> None:
    """Give the heap a unit freed back to the OS, so that a long-lived worker's RSS stays one unit's: without it a
    worker crept from 86 to 100 MB over 1 -> 8 units (glibc keeps freed arenas; bench/data/prep_scale.py). Linux/glibc
    only; elsewhere a no-op."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _load_libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _load_libc()


class Progress:
    """A tqdm bar over the input bytes of the units to do, with documents, tokens, tokens/s and the [UNK] rate (a
    no-op when disabled)."""

    def __init__(self, total: int, enabled: bool, desc: str) -> None:
        self.bar = None
        self.docs = 0
        self.tokens = 0
        self.unk = 0
        self.t0 = time.perf_counter()
        if enabled:
            from tqdm import tqdm

            tqdm.monitor_interval = 0  # no monitor thread: worker processes are forked after this
            tty = sys.stderr.isatty()
            self.bar = tqdm(
                total=total,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=desc,
                mininterval=0.5 if tty else 30.0,
                dynamic_ncols=True,
                file=sys.stderr,
            )

    def update(self, nbytes: int, docs: int, tokens: int, unk: int) -> None:
        self.docs += docs
        self.tokens += tokens
        self.unk += unk
        if self.bar is not None:
            self.bar.update(nbytes)
            rate = self.tokens / max(1e-9, time.perf_counter() - self.t0)
            unk_pct = f"{100 * self.unk / max(1, self.tokens):.3g}%"
            self.bar.set_postfix(docs=self.docs, tokens=self.tokens, tok_s=f"{rate:,.0f}", unk=unk_pct, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def unit_size(plan: dict[str, Any], u: int) -> int:
    """Input bytes of unit `u` (the progress bar's measure)."""
    total = 0
    for si, a, b in plan["units"][u]:
        src = plan["sources"][si]
        total += (b - a) if b >= 0 and src["kind"] not in ("hf", "hub") else src["size"]
    return total


def run_units(todo: list[int], ctx: UnitContext, workers: int, threads: int, report: ProgressFn) -> None:
    """Process units `todo`: in this process for one worker or one unit, else in a pool of `workers` processes.
    `report` gets the progress of every batch (in this process); an exception it raises stops the run, as a
    worker's error does."""
    if not todo:
        return
    if workers <= 1 or len(todo) == 1:
        with _tokenizer_threads(threads):
            enc = Encoder(ctx.tokenizer_dir, ctx.plan["config"]["max_sentence_tokens"])
            for u in todo:
                process_unit(u, ctx, enc, report)
                release_freed_memory()
        return
    _run_in_pool(todo, ctx, min(workers, len(todo)), threads, report)


def _drain(q: Any, report: ProgressFn, timeout: float | None) -> None:
    """Pass every progress report waiting in `q` on to `report` (waiting up to `timeout` for the first)."""
    try:
        while True:
            report(*(q.get(timeout=timeout) if timeout else q.get_nowait()))
    except queue.Empty:
        pass


def _run_in_pool(todo: list[int], ctx: UnitContext, workers: int, threads: int, report: ProgressFn) -> None:
    """Forked workers (they inherit the plan). A worker's error, or one raised by `report`, is re-raised here. A
    worker that dies (the OOM killer's SIGKILL, a crash) or cannot start stops the run with a `DataPrepError`
    instead of hanging: `concurrent.futures` notices a dead worker, where `multiprocessing.Pool` would replace it and
    wait for the lost unit forever (until the Slurm time limit). On any error or Ctrl-C the workers are killed and
    their temporary unit directories removed; the units finished so far stay, for the resume."""
    mctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    q = mctx.Queue()
    pool = ProcessPoolExecutor(
        workers, mp_context=mctx, initializer=_worker_init, initargs=(ctx, q, threads, os.getpid())
    )
    try:
        pending = {pool.submit(_worker_run, u) for u in todo}
        while pending:
            _drain(q, report, timeout=0.1)
            finished = {f for f in pending if f.done()}
            for f in finished:
                f.result()  # re-raises a worker's error here
            pending -= finished
        pool.shutdown()
    except BaseException as err:
        _kill_workers(pool)
        pool.shutdown(wait=True, cancel_futures=True)
        for u in todo:  # temp dirs of the killed workers
            for t in unit_temp_dirs(ctx.out, ctx.keys[u]):
                shutil.rmtree(t, ignore_errors=True)
        if isinstance(err, BrokenProcessPool):
            done = sum(load_unit(ctx.out, ctx.keys[u], rehash=False) is not None for u in todo)
            raise DataPrepError(
                f"a tokenize worker process died ({err}); the usual cause is the out-of-memory killer: lower "
                f"--workers or --threads-per-worker. {done} of the {len(todo)} units of this run finished and are "
                "kept: rerun the same command to resume"
            ) from None
        raise
    _drain(q, report, timeout=None)


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    """SIGKILL the pool's workers now (a unit takes tens of seconds: Ctrl-C must not wait for it)."""
    if hasattr(pool, "kill_workers"):  # Python >= 3.14
        pool.kill_workers()
        return
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            proc.kill()
