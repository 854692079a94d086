"""tokenize + finalize: plan work units, process them (worker pool / Slurm array), merge into shards + manifest.

Output directory:

    OUT/tokenizer/                  the tokenizer (+ data_prep_tokenizer.json with its sha256)
    OUT/.work/plan.json             sources, config, units (identical for every worker count / array task)
    OUT/.work/units/<unit key>/     one finished unit: train_NNN.{bin,idx}, valid_NNN.{bin,idx}, unit.json
    OUT/.work/tasks/task_j_of_J.json  what array task j did
    OUT/train/shard_XXXXX.{bin,idx}, OUT/valid/shard_XXXXX.{bin,idx}   (made by finalize)
    OUT/manifest.json               written last, atomically

Unit u of the plan is done by array task u mod J. Its directory is named by its key: a hash of the settings, the
tokenizer and exactly the source bytes it covers (path, size, mtime, range). It is written under
`<key>.tmp<pid>` and renamed when complete, so a killed run leaves complete units or temp dirs that the next run
deletes. A rerun re-hashes finished units and skips those that match; after an input file is fixed or added, only
units whose key changed are redone. A run refuses a directory whose tokenizer or settings differ, and never
touches a finished one (manifest present) prepared from anything else.
`finalize` packs the units' parts, in unit order, into shards of at most `shard_tokens` (a part alone is
hard-linked, several are concatenated) and writes the manifest. Nothing here depends on the number of workers or
tasks, so 1 vs 2 workers and 1 vs 3 array tasks produce byte-identical shards and manifests.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import multiprocessing as mp
import os
import queue
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from . import sources as S
from .errors import DataPrepError
from .shard_format import SplitWriter, concat_shards, read_idx_header
from .tokenizer import Encoder, check_tokenizer_dir, load_meta, resolve_tokenizer
from .util import atomic_write_json, canonical_json, fsync_dir, read_json, sha256_bytes, sha256_file

log = logging.getLogger("data_prep")

FORMAT = "elasticbert-data_prep"
FORMAT_VERSION = 1
SPLITTER = "rules-1"
BATCH_CHARS = 1 << 20
SPLITS = ("train", "valid")
BYTES_PER_TOKEN = 4  # English WordPiece: ~4.2 bytes of text per token; sizes units so a unit fills ~one shard


@dataclass
class PrepConfig:
    """Settings that change the output (all recorded in the plan and the manifest)."""

    shard_tokens: int = 1 << 24
    unit_bytes: int = 0  # 0: shard_tokens * BYTES_PER_TOKEN
    valid_fraction: float = 0.01
    split_seed: int = 0
    doc_boundary: str = "auto"  # auto | blank | line | file
    strip_gutenberg: bool = True
    on_decode_error: str = "replace"  # replace (and count) | fail
    text_field: str = "text"
    hf_split: str = "train"
    max_doc_bytes: int = 8 << 20
    max_sentence_tokens: int = 0  # 0: keep sentences whole

    def resolved(self) -> dict[str, Any]:
        """Validated settings as a dict (unit_bytes filled in)."""
        if self.shard_tokens < 1:
            raise DataPrepError(f"--shard-tokens must be >= 1 (got {self.shard_tokens})")
        if not 0.0 <= self.valid_fraction < 1.0:
            raise DataPrepError(f"--valid-fraction must be in [0, 1) (got {self.valid_fraction})")
        if self.doc_boundary not in ("auto", "blank", "line", "file"):
            raise DataPrepError(f"--doc-boundary must be auto, blank, line or file (got {self.doc_boundary!r})")
        if self.on_decode_error not in ("replace", "fail"):
            raise DataPrepError(f"--on-decode-error must be replace or fail (got {self.on_decode_error!r})")
        if self.max_sentence_tokens < 0:
            raise DataPrepError("--max-sentence-tokens must be >= 0")
        d = asdict(self)
        d["unit_bytes"] = int(self.unit_bytes or self.shard_tokens * BYTES_PER_TOKEN)
        if d["unit_bytes"] < 1024:
            raise DataPrepError(f"unit size must be >= 1 KiB (got {d['unit_bytes']} bytes)")
        return d


def make_config(config: PrepConfig | None = None, **overrides: Any) -> PrepConfig:
    cfg = config or PrepConfig()
    names = {f.name for f in fields(PrepConfig)}
    for k, v in overrides.items():
        if k not in names:
            raise TypeError(f"unknown setting {k!r}")
        setattr(cfg, k, v)
    return cfg


# ------------------------------------------------------------------------------------------------ planning


def build_plan(inputs: Sequence[str], cfg: dict[str, Any], tokenizer_sha256: str, out_dir: Path | None,
               allow_empty: bool = False) -> dict[str, Any]:
    """Sources (described, sorted) + units. Depends on the inputs and settings only."""
    specs = S.discover(inputs, exclude=out_dir)
    described = []
    for spec in specs:
        rec = S.describe(spec, cfg["doc_boundary"], cfg["strip_gutenberg"], cfg["hf_split"], cfg["text_field"])
        if rec["size"] == 0 or (rec["kind"] in ("hf", "hub") and rec["end"] == 0):
            if allow_empty:
                log.warning("%s: empty input, skipped", rec["path"])
                continue
            raise DataPrepError(f"{rec['path']}: empty input file; pass --allow-empty to skip empty inputs")
        described.append(rec)
    units = S.plan_units(described, cfg["unit_bytes"], cfg["max_doc_bytes"])
    if not units:
        raise DataPrepError(f"no input data in {', '.join(map(str, inputs))}")
    return {
        "format_version": FORMAT_VERSION,
        "tokenizer_sha256": tokenizer_sha256,
        "config": cfg,
        "splitter": SPLITTER,
        "sources": described,
        "units": units,
    }


def plan_hash(plan: dict[str, Any]) -> str:
    return sha256_bytes(canonical_json(plan).encode())


def settings_hash(plan: dict[str, Any]) -> str:
    """Everything but the inputs: format, tokenizer, settings, splitter."""
    keys = ("format_version", "tokenizer_sha256", "config", "splitter")
    return sha256_bytes(canonical_json({k: plan[k] for k in keys}).encode())


def unit_keys(plan: dict[str, Any]) -> list[str]:
    """A unit's identity: the settings plus exactly the bytes it covers (source identity + range).

    Unit directories are named by it, so after an input file is fixed or added, a rerun redoes only the units
    whose key changed and keeps every other finished unit."""
    base = settings_hash(plan)
    keys = []
    for unit in plan["units"]:
        segs = [[plan["sources"][si], a, b] for si, a, b in unit]
        keys.append(sha256_bytes(canonical_json([base, segs]).encode()))
    return keys


def _plan_difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    """A short human description of why two plans differ."""
    if old.get("tokenizer_sha256") != new.get("tokenizer_sha256"):
        return "another tokenizer/vocab"
    oc, nc = old.get("config", {}), new.get("config", {})
    changed = sorted(k for k in set(oc) | set(nc) if oc.get(k) != nc.get(k))
    if changed:
        return "other settings (" + ", ".join(f"{k}: {oc.get(k)!r} -> {nc.get(k)!r}" for k in changed[:4]) + ")"
    op = {s["path"]: s for s in old.get("sources", [])}
    np_ = {s["path"]: s for s in new.get("sources", [])}
    added, removed = sorted(set(np_) - set(op)), sorted(set(op) - set(np_))
    if added or removed:
        return f"other inputs (added: {added[:3]}, removed: {removed[:3]})"
    for p in sorted(op):
        if op[p] != np_[p]:
            return f"changed input {p} (size/mtime differ)"
    return "a different plan"


def _manifest_as_plan(manifest: dict[str, Any]) -> dict[str, Any]:
    return {
        "tokenizer_sha256": manifest.get("tokenizer", {}).get("sha256"),
        "config": manifest.get("config", {}),
        "sources": manifest.get("sources", []),
    }


# ---------------------------------------------------------------------------------------------- unit work


def _is_valid_doc(key: str, offset: int, seed: int, fraction: float) -> bool:
    if fraction <= 0.0:
        return False
    digest = hashlib.blake2b(f"{seed}\0{key}\0{offset}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") < fraction * 18446744073709551616.0


@dataclass
class UnitContext:
    """What a worker needs to process units (inherited by forked workers)."""

    out: Path
    plan: dict[str, Any]
    keys: list[str]
    tokenizer_dir: Path


def _units_dir(out: Path) -> Path:
    return out / ".work" / "units"


def _unit_dir(out: Path, key: str) -> Path:
    return _units_dir(out) / key[:32]


def load_unit(out: Path, key: str, rehash: bool) -> dict[str, Any] | None:
    """A finished unit's record if it is complete and intact (hashes re-checked when `rehash`), else None."""
    d = _unit_dir(out, key)
    try:
        info = read_json(d / "unit.json")
    except (OSError, ValueError):
        return None
    if info.get("unit_key") != key:
        return None
    for split in SPLITS:
        for part in info["parts"].get(split, []):
            for ext in ("bin", "idx"):
                p = d / f"{part['name']}.{ext}"
                try:
                    if p.stat().st_size != part[f"{ext}_bytes"]:
                        return None
                except OSError:
                    return None
                if rehash and sha256_file(p) != part[f"{ext}_sha256"]:
                    log.warning("%s: sha256 differs from unit.json: the unit will be redone", p)
                    return None
    return info


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
        doc_counts = np.bincount(np.asarray(self.piece_doc, dtype=np.int64), weights=counts,
                                 minlength=n_docs).astype(np.int64)
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


def process_unit(u: int, ctx: UnitContext, encoder: Encoder,
                 progress: Callable[[int, int, int], None] | None = None) -> dict[str, Any]:
    """Tokenize one unit into its temp dir and rename it into place when complete."""
    plan, cfg = ctx.plan, ctx.plan["config"]
    key = ctx.keys[u]
    final = _unit_dir(ctx.out, key)
    tmp = final.with_name(f"{final.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        writers = {s: SplitWriter(tmp, s, encoder.dtype, cfg["shard_tokens"]) for s in SPLITS}
        stats = S.ReadStats(hasher=hashlib.sha256())
        batch = _Batch()
        reported = [0]
        totals = {"docs": 0, "tokens": 0}

        def flush(final: bool) -> None:
            docs_done, ids, lens, counts, valid = batch.encode(encoder, final)
            if docs_done == 0:
                return
            kept = counts > 0
            if not valid.any():
                writers["train"].add(ids, lens, counts[kept])
            elif valid.all():
                writers["valid"].add(ids, lens, counts[kept])
            else:
                doc_of = np.repeat(np.arange(len(counts)), counts)
                doc_tokens = np.bincount(doc_of, weights=lens, minlength=len(counts)).astype(np.int64)
                tok_mask = np.repeat(valid, doc_tokens)
                sent_mask = np.repeat(valid, counts)
                writers["valid"].add(ids[tok_mask], lens[sent_mask], counts[valid & kept])
                writers["train"].add(ids[~tok_mask], lens[~sent_mask], counts[~valid & kept])
            totals["docs"] += int(kept.sum())
            totals["tokens"] += len(ids)
            if progress is not None:
                progress(stats.bytes_read - reported[0], int(kept.sum()), len(ids))
                reported[0] = stats.bytes_read

        for si, a, b in plan["units"][u]:
            src = plan["sources"][si]
            reader = S.DocumentReader(src, cfg["on_decode_error"], cfg["text_field"], cfg["max_doc_bytes"], stats)
            src_key = src["key"]
            for doc, text in reader.documents(a, b):
                if batch.add((si, doc), text, src_key, cfg) >= BATCH_CHARS:
                    flush(final=False)
        flush(final=True)
        parts = {s: w.close() for s, w in writers.items()}
        info = {
            "unit": u,
            "unit_key": key,
            "segments": plan["units"][u],
            "input_bytes": stats.bytes_read,
            "input_sha256": stats.hasher.hexdigest(),
            "decode_errors": stats.decode_errors,
            "docs": totals["docs"],
            "tokens": totals["tokens"],
            "parts": parts,
        }
        if stats.decode_errors:
            log.warning("unit %d: %d undecodable byte sequences replaced by U+FFFD", u, stats.decode_errors)
        (tmp / "unit.json").write_text(canonical_json(info), encoding="utf-8")  # re-hashed on resume: no fsync
        try:
            os.rename(tmp, final)
        except OSError:
            # the unit dir exists: a complete one (e.g. from a concurrent rerun) wins, a broken one is replaced
            if load_unit(ctx.out, key, rehash=False) is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
        return info
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ----------------------------------------------------------------------------------------------- the pool

_W: dict[str, Any] = {}


def _set_threads(threads: int) -> None:
    """One tokenizer thread per worker by default: processes scale better than rayon threads here."""
    if threads <= 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    else:
        os.environ["TOKENIZERS_PARALLELISM"] = "true"
        os.environ["RAYON_NUM_THREADS"] = str(threads)


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
    return process_unit(u, _W["ctx"], _W["enc"], lambda b, d, t: q.put((b, d, t)))


class _Progress:
    def __init__(self, total: int, enabled: bool, desc: str) -> None:
        self.bar = None
        self.docs = 0
        self.tokens = 0
        self.t0 = time.perf_counter()
        if enabled:
            from tqdm import tqdm

            tqdm.monitor_interval = 0  # no monitor thread: worker processes are forked after this
            tty = sys.stderr.isatty()
            self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                            mininterval=0.5 if tty else 30.0, dynamic_ncols=True, file=sys.stderr)

    def update(self, nbytes: int, docs: int, tokens: int) -> None:
        self.docs += docs
        self.tokens += tokens
        if self.bar is not None:
            self.bar.update(nbytes)
            rate = self.tokens / max(1e-9, time.perf_counter() - self.t0)
            self.bar.set_postfix(docs=self.docs, tokens=self.tokens, tok_s=f"{rate:,.0f}", refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _unit_size(plan: dict[str, Any], u: int) -> int:
    total = 0
    for si, a, b in plan["units"][u]:
        src = plan["sources"][si]
        total += (b - a) if b >= 0 and src["kind"] not in ("hf", "hub") else src["size"]
    return total


def _run_units(todo: list[int], ctx: UnitContext, workers: int, threads: int, bar: _Progress) -> None:
    if not todo:
        return
    if workers <= 1 or len(todo) == 1:
        saved = {k: os.environ.get(k) for k in ("TOKENIZERS_PARALLELISM", "RAYON_NUM_THREADS")}
        _set_threads(threads)
        try:
            enc = Encoder(ctx.tokenizer_dir, ctx.plan["config"]["max_sentence_tokens"])
            for u in todo:
                process_unit(u, ctx, enc, bar.update)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    mctx = mp.get_context(method)
    q = mctx.Queue()
    pool = mctx.Pool(min(workers, len(todo)), initializer=_worker_init, initargs=(ctx, q, threads, os.getpid()))
    try:
        results = [pool.apply_async(_worker_run, (u,)) for u in todo]
        pending = list(range(len(results)))
        while pending:
            try:
                while True:
                    bar.update(*q.get(timeout=0.1))
            except queue.Empty:
                pass
            still = []
            for i in pending:
                if results[i].ready():
                    results[i].get()  # re-raises a worker's error here
                else:
                    still.append(i)
            pending = still
        pool.close()
        pool.join()
    except BaseException:
        pool.terminate()
        pool.join()
        for u in todo:  # temp dirs of the killed workers
            for t in _units_dir(ctx.out).glob(f"{ctx.keys[u][:32]}.tmp*"):
                shutil.rmtree(t, ignore_errors=True)
        raise
    try:
        while True:
            bar.update(*q.get_nowait())
    except queue.Empty:
        pass


# ---------------------------------------------------------------------------------------------- tokenize


def slurm_task() -> tuple[int, int]:
    """(num_tasks, task_index) from a Slurm job array (1, 0 outside one); array ids need not start at 0."""
    count = os.environ.get("SLURM_ARRAY_TASK_COUNT")
    tid = os.environ.get("SLURM_ARRAY_TASK_ID")
    if not count or tid is None:
        return 1, 0
    lo = int(os.environ.get("SLURM_ARRAY_TASK_MIN", "0"))
    step = int(os.environ.get("SLURM_ARRAY_TASK_STEP", "1") or 1)
    return int(count), (int(tid) - lo) // step


def _setup_tokenizer(out: Path, tokenizer: str | os.PathLike | None) -> dict[str, Any]:
    tok_dir = out / "tokenizer"
    if tokenizer is not None:
        meta = resolve_tokenizer(tokenizer, tok_dir)
    elif (tok_dir / "data_prep_tokenizer.json").is_file():
        meta = load_meta(tok_dir)
    else:
        raise DataPrepError(
            f"{out}: no tokenizer; pass --tokenizer (a vocab.txt or tokenizer dir) or run train-tokenizer first"
        )
    problems = check_tokenizer_dir(tok_dir)
    if problems:
        raise DataPrepError(problems[0])
    return meta


def tokenize_corpus(
    inputs: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    tokenizer: str | os.PathLike | None = None,
    workers: int = 1,
    num_tasks: int | None = None,
    task_index: int | None = None,
    config: PrepConfig | None = None,
    threads_per_worker: int = 1,
    progress: bool = False,
    finalize: bool | None = None,
    allow_empty: bool = False,
    rehash: bool = True,
    **settings: Any,
) -> dict[str, Any]:
    """Tokenize `inputs` into shards under `out_dir`; see the module docstring for the layout.

    `tokenizer`: a vocab.txt, a folder holding one, an spm .model, or a data_prep tokenizer dir (None: use
    `out_dir/tokenizer`). `settings` override `PrepConfig` fields. Runs the units of array task
    `task_index` of `num_tasks` (default: from SLURM_ARRAY_*, else all). Returns the manifest when finalized
    (by default when there is a single task), else this task's record.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = make_config(config, **settings).resolved()
    env_tasks, env_index = slurm_task()
    J = num_tasks if num_tasks is not None else env_tasks
    j = task_index if task_index is not None else (env_index if num_tasks is None else 0)
    if J < 1 or not 0 <= j < J:
        raise DataPrepError(f"task index {j} is outside 0..{J - 1} (--num-tasks {J})")
    meta = _setup_tokenizer(out, tokenizer)
    plan = build_plan([str(i) for i in inputs], cfg, meta["sha256"], out, allow_empty)
    phash = plan_hash(plan)

    manifest_path = out / "manifest.json"
    if manifest_path.is_file():
        old = read_json(manifest_path)
        if old.get("plan_hash") == phash:
            log.info("%s: already complete (manifest matches inputs, settings and tokenizer)", out)
            return old
        raise DataPrepError(
            f"{manifest_path}: this directory already holds a finished corpus prepared with "
            f"{_plan_difference(_manifest_as_plan(old), plan)}; nothing was changed: use a new output directory"
        )
    work = out / ".work"
    _units_dir(out).mkdir(parents=True, exist_ok=True)
    (work / "tasks").mkdir(parents=True, exist_ok=True)
    plan_path = work / "plan.json"
    if plan_path.is_file():
        old = read_json(plan_path)
        if settings_hash(old["plan"]) != settings_hash(plan):
            raise DataPrepError(
                f"{plan_path}: an unfinished run in this directory used {_plan_difference(old['plan'], plan)}; "
                f"nothing was changed: use a new output directory (or delete {work} to start over)"
            )
        if old.get("plan_hash") != phash:
            log.warning("%s: inputs changed since the last run (%s): units whose bytes changed will be redone",
                        out, _plan_difference(old["plan"], plan))
            atomic_write_json(plan_path, {"plan_hash": phash, "plan": plan})
    else:
        atomic_write_json(plan_path, {"plan_hash": phash, "plan": plan})

    keys = unit_keys(plan)
    n_units = len(plan["units"])
    mine = list(range(j, n_units, J))
    for u in mine:  # temp dirs of this task's units left by a killed run
        for t in _units_dir(out).glob(f"{keys[u][:32]}.tmp*"):
            shutil.rmtree(t, ignore_errors=True)
    done = {u: info for u in mine if (info := load_unit(out, keys[u], rehash)) is not None}
    todo = [u for u in mine if u not in done]
    for u in todo:
        shutil.rmtree(_unit_dir(out, keys[u]), ignore_errors=True)  # incomplete or corrupt: redo
    log.info("%s: %d units planned, task %d/%d has %d (%d already done, %d to do)", out, n_units, j, J, len(mine),
             len(done), len(todo))
    ctx = UnitContext(out, plan, keys, out / "tokenizer")
    bar = _Progress(sum(_unit_size(plan, u) for u in todo), progress, f"tokenize[{j}/{J}]" if J > 1 else "tokenize")
    t0 = time.perf_counter()
    try:
        _run_units(todo, ctx, workers, threads_per_worker, bar)
    finally:
        bar.close()
    elapsed = time.perf_counter() - t0
    units = {u: load_unit(out, keys[u], rehash=False) for u in mine}
    units = {u: {**info, "unit": u, "segments": plan["units"][u]} for u, info in units.items() if info}
    record = {
        "task": j,
        "num_tasks": J,
        "plan_hash": phash,
        "units": {str(u): {k: v for k, v in info.items() if k != "parts"} for u, info in units.items() if info},
        "units_done_now": todo,
        "seconds": round(elapsed, 3),
        "workers": workers,
    }
    atomic_write_json(work / "tasks" / f"task_{j:05d}_of_{J:05d}.json", record)
    if finalize or (finalize is None and J == 1):
        return finalize_dir(out)
    return record


# ----------------------------------------------------------------------------------------------- finalize


def _place(src: Path, dest: Path) -> None:
    """Hard-link `src` to `dest` (copy where links are impossible), atomically."""
    tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}")
    if tmp.exists():
        tmp.unlink()
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dest)


def _pack(parts: list[tuple[int, dict[str, Any]]], limit: int) -> list[list[tuple[int, dict[str, Any]]]]:
    """Greedy, in order: consecutive parts into groups of at most `limit` tokens (a part alone always fits)."""
    groups: list[list[tuple[int, dict[str, Any]]]] = []
    cur: list[tuple[int, dict[str, Any]]] = []
    size = 0
    for item in parts:
        t = item[1]["tokens"]
        if cur and size + t > limit:
            groups.append(cur)
            cur, size = [], 0
        cur.append(item)
        size += t
    if cur:
        groups.append(cur)
    return groups


def finalize_dir(out_dir: str | os.PathLike) -> dict[str, Any]:
    """Merge all units into `train/`, `valid/` shards and write `manifest.json` (atomic); refuse if any unit is
    missing. Idempotent: a finished directory is returned as is."""
    out = Path(out_dir)
    manifest_path = out / "manifest.json"
    plan_path = out / ".work" / "plan.json"
    if not plan_path.is_file():
        if manifest_path.is_file():
            return read_json(manifest_path)
        raise DataPrepError(f"{out}: nothing to finalize (no {plan_path.relative_to(out)}; run tokenize first)")
    stored = read_json(plan_path)
    plan, phash = stored["plan"], stored["plan_hash"]
    if manifest_path.is_file():
        old = read_json(manifest_path)
        if old.get("plan_hash") == phash:
            return old
    n_units = len(plan["units"])
    keys = unit_keys(plan)
    infos: list[dict[str, Any]] = []
    missing: list[int] = []
    for u in range(n_units):
        info = load_unit(out, keys[u], rehash=False)
        if info is None:
            missing.append(u)
        else:  # a reused unit may have had another index in an earlier plan
            infos.append({**info, "unit": u, "segments": plan["units"][u]})
    if missing:
        task_files = (out / ".work" / "tasks").glob("task_*")
        task_counts = sorted({int(p.name.split("_of_")[1].split(".")[0]) for p in task_files})
        hint = ""
        for J in task_counts:
            hint += f"; with --num-tasks {J}: rerun task(s) {sorted({u % J for u in missing})[:20]}"
        shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
        raise DataPrepError(
            f"{out}: {len(missing)} of {n_units} work units missing or incomplete (units {shown}){hint}"
        )
    meta = load_meta(out / "tokenizer")
    if meta["sha256"] != plan["tokenizer_sha256"]:
        raise DataPrepError(f"{out / 'tokenizer'}: tokenizer differs from the one the units were made with")
    dtype = np.dtype(meta["dtype"])
    limit = plan["config"]["shard_tokens"]
    splits: dict[str, Any] = {}
    for split in SPLITS:
        sdir = out / split
        sdir.mkdir(exist_ok=True)
        parts = [(info["unit"], p) for info in infos for p in info["parts"][split]]
        shards = []
        for k, group in enumerate(_pack(parts, limit)):
            stem = sdir / f"shard_{k:05d}"
            stems = [_unit_dir(out, keys[u]) / p["name"] for u, p in group]
            if len(group) == 1:
                p = group[0][1]
                for ext in ("bin", "idx"):
                    _place(stems[0].with_suffix(f".{ext}"), stem.with_suffix(f".{ext}"))
                rec = {k2: p[k2] for k2 in ("docs", "sentences", "tokens", "bin_sha256", "idx_sha256",
                                             "bin_bytes", "idx_bytes")}
            else:
                tmp_stem = sdir / f".shard_{k:05d}.tmp{os.getpid()}"
                rec = concat_shards(stems, tmp_stem, dtype)
                for ext in ("bin", "idx"):
                    os.replace(tmp_stem.with_suffix(f".{ext}"), stem.with_suffix(f".{ext}"))
            header = read_idx_header(stem.with_suffix(".idx"))
            if header.bin_sha256 != rec["bin_sha256"] or header.num_tokens != rec["tokens"]:
                raise DataPrepError(f"{stem}.idx: does not match its unit part (changed during finalize?)")
            shards.append({"name": stem.name, "units": sorted({u for u, _ in group}), **rec})
        # shard files of an earlier, different layout would be picked up by nobody: remove strays
        names = {s["name"] for s in shards}
        for f in sdir.glob("shard_*"):
            if f.name.split(".")[0] not in names:
                f.unlink()
        fsync_dir(sdir)
        splits[split] = {
            "docs": sum(s["docs"] for s in shards),
            "sentences": sum(s["sentences"] for s in shards),
            "tokens": sum(s["tokens"] for s in shards),
            "shards": shards,
        }
    units = [{k: v for k, v in info.items() if k != "parts"} for info in infos]
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "plan_hash": phash,
        "tokenizer": {**meta, "dir": "tokenizer"},
        "dtype": meta["dtype"],
        "config": plan["config"],
        "splitter": plan["splitter"],
        "sources": plan["sources"],
        "units": units,
        "splits": splits,
        "totals": {
            "docs": sum(s["docs"] for s in splits.values()),
            "sentences": sum(s["sentences"] for s in splits.values()),
            "tokens": sum(s["tokens"] for s in splits.values()),
            "input_bytes": sum(u["input_bytes"] for u in units),
            "decode_errors": sum(u["decode_errors"] for u in units),
            "units": len(units),
        },
    }
    if manifest["totals"]["docs"] == 0:
        raise DataPrepError(f"{out}: the inputs produced no documents (all empty after stripping?)")
    if plan["config"]["valid_fraction"] > 0 and splits["valid"]["docs"] == 0:
        log.warning("%s: the validation split is empty (%d documents x valid_fraction %g): raise --valid-fraction",
                    out, manifest["totals"]["docs"], plan["config"]["valid_fraction"])
    atomic_write_json(manifest_path, manifest)
    live = {_unit_dir(out, k).name for k in keys}
    for d in _units_dir(out).iterdir():  # units of earlier plans (inputs changed since): no longer needed
        if d.name not in live:
            shutil.rmtree(d, ignore_errors=True)
    log.info("%s: finalized: %d train + %d valid shards, %d tokens", out, len(splits["train"]["shards"]),
             len(splits["valid"]["shards"]), manifest["totals"]["tokens"])
    return manifest


# ------------------------------------------------------------------------------------------ corpus reading


def iter_corpus_texts(inputs: Sequence[str | os.PathLike], max_bytes: int = 0, **settings: Any) -> Iterator[str]:
    """Documents of `inputs` in plan order (for tokenizer training); stops after ~max_bytes (0 = all)."""
    cfg = make_config(None, **settings).resolved()
    plan = build_plan([str(i) for i in inputs], cfg, "", None, allow_empty=True)
    seen = 0
    for unit in plan["units"]:
        for si, a, b in unit:
            src = plan["sources"][si]
            stats = S.ReadStats()
            reader = S.DocumentReader(src, cfg["on_decode_error"], cfg["text_field"], cfg["max_doc_bytes"], stats)
            for _, text in reader.documents(a, b):
                yield text
                seen += len(text)
                if max_bytes and seen >= max_bytes:
                    return
