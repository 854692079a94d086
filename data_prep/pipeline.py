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
`.<key>.tmp<pid>` and renamed when complete (`common.io.atomic_path`), so a killed run leaves complete units or temp
dirs that the next run deletes. A rerun re-hashes finished units and skips those that match; after an input file is
fixed or added, only units whose key changed are redone. A run refuses a directory whose tokenizer or settings
differ, and never touches a finished one (manifest present) prepared from anything else.
`finalize` packs the units' parts, in unit order, into shards of at most `shard_tokens` (a part alone is
hard-linked, several are concatenated) and writes the manifest. Nothing here depends on the number of workers or
tasks, so 1 vs 2 workers and 1 vs 3 array tasks produce byte-identical shards and manifests.

Sanity and failures: every unit counts its [UNK] tokens (per split; the manifest has `splits.<split>.unk_tokens` and
`totals.unk_tokens`). `tokenize` stops once the running [UNK] rate of its units is above `max_unk_fraction` (after
`stats.UNK_CHECK_MIN_TOKENS` tokens: the first megabytes, not hours in), and `finalize` refuses the whole corpus on
the same test, before writing any shard: the finished units stay, no manifest is written, and a rerun with
`--max-unk-fraction` continues where it stopped. The threshold is not a `PrepConfig` setting: it changes no byte of
the output, so it is in no hash and a rerun with another value resumes the same run. A failed write (disk full,
read-only, no permission) is a DataPrepError naming the file and saying that the output is incomplete (no
manifest.json) and resumable.

Planning and the unit store are in `data_prep.plan`; tokenizing units (the worker pool) in `data_prep.workers`.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.claims import Part
from common.io import atomic_path, atomic_write_json, fsync_dir, read_object
from common.outputs import CORPUS, Output, check_output
from common.vocab import DEFAULT_MAX_UNK_FRACTION

from . import sources as S
from . import text_faults as TF
from .dedup.manifest import dedup_manifest_entry
from .errors import DataPrepError, output_errors
from .plan import (
    FORMAT_VERSION,
    SPLITS,
    PrepConfig,
    build_plan,
    load_unit,
    make_config,
    manifest_as_plan,
    plan_difference,
    plan_hash,
    recorded_task_counts,
    settings_hash,
    task_record_path,
    unit_dir,
    unit_keys,
    unit_temp_dirs,
    units_dir,
)
from .shard_format import FORMAT, concat_shards, read_idx_header
from .stats import UnkGuard, unk_fraction_problem
from .tokenizer import check_tokenizer_dir, load_meta, recorded_identity, resolve_tokenizer, tokenizer_file
from .util import CANONICAL
from .workers import Progress, UnitContext, run_units, unit_size

__all__ = ["PrepConfig", "finalize_dir", "iter_corpus_texts", "slurm_task", "tokenize_corpus"]

log = logging.getLogger("data_prep")

SHARD_FIELDS = ("docs", "sentences", "tokens", "bin_sha256", "idx_sha256", "bin_bytes", "idx_bytes")


# ---------------------------------------------------------------------------------------------- tokenize


TOKENIZE_OUTPUT = Output("tokenize", "a prepared corpus", folder=True, accepts=(CORPUS,))


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
    max_unk_fraction: float = DEFAULT_MAX_UNK_FRACTION,
    max_nontext_fraction: float = TF.DEFAULT_MAX_NONTEXT_FRACTION,
    **settings: Any,
) -> dict[str, Any]:
    """Tokenize `inputs` into shards under `out_dir`; see the module docstring for the layout.

    `tokenizer`: a vocab.txt, a folder holding one, a WordPiece tokenizer.json, an spm .model, a data_prep tokenizer
    dir or a Hugging Face hub name (None: use `out_dir/tokenizer`). `settings` override `PrepConfig` fields. Runs
    the units of array task `task_index` of `num_tasks` (default: from SLURM_ARRAY_*, else all). Stops (DataPrepError)
    when more than `max_unk_fraction` of the tokens are [UNK]. Returns the manifest when finalized (by default when
    there is a single task), else this task's record.
    """
    out = Path(out_dir)
    cfg = make_config(config, **settings).resolved()
    run = RunOptions(
        workers, threads_per_worker, progress, finalize, allow_empty, rehash, max_unk_fraction, max_nontext_fraction
    )
    problems = run.problems()
    if problems:
        raise DataPrepError("; ".join(problems))
    task = _array_task(num_tasks, task_index)  # the tasks of one array write `out` together (common.claims)
    read = [*(("", str(i)) for i in inputs), ("--tokenizer", tokenizer)]
    check_output(out, TOKENIZE_OUTPUT, read, part=Part.task(task[1], task[0]))
    with output_errors(out):
        out.mkdir(parents=True, exist_ok=True)
        return _tokenize([str(i) for i in inputs], out, tokenizer, cfg, task, run)


@dataclass(frozen=True)
class RunOptions:
    """How a tokenize run goes about its work. None of it changes a byte of the output, so none of it is hashed
    (a rerun with other values resumes the same run)."""

    workers: int = 1
    threads_per_worker: int = 1
    progress: bool = False
    finalize: bool | None = None
    allow_empty: bool = False
    rehash: bool = True
    max_unk_fraction: float = DEFAULT_MAX_UNK_FRACTION
    max_nontext_fraction: float = TF.DEFAULT_MAX_NONTEXT_FRACTION

    def problems(self) -> list[str]:
        """Out-of-range values, named by their command-line flags."""
        problems = [unk_fraction_problem(self.max_unk_fraction)]
        if not 0 <= self.max_nontext_fraction <= 1:
            problems.append(f"--max-nontext-fraction must be within [0, 1] (got {self.max_nontext_fraction})")
        if self.workers < 1:
            problems.append(f"--workers must be >= 1 (got {self.workers})")
        if self.threads_per_worker < 1:
            problems.append(f"--threads-per-worker must be >= 1 (got {self.threads_per_worker})")
        return [p for p in problems if p]


def _tokenize(
    inputs: list[str],
    out: Path,
    tokenizer: str | os.PathLike | None,
    cfg: dict[str, Any],
    task: tuple[int, int],
    run: RunOptions,
) -> dict[str, Any]:
    """`tokenize_corpus` once its options are checked (write errors are turned into DataPrepErrors around it)."""
    J, j = task
    meta = _setup_tokenizer(out, tokenizer)
    plan = build_plan(inputs, cfg, meta["sha256"], out, run.allow_empty)
    phash = plan_hash(plan)
    finished = _finished_manifest(out, plan, phash)
    if finished is not None:
        return finished
    _record_plan(out, plan, phash)

    keys = unit_keys(plan)
    mine = list(range(j, len(plan["units"]), J))
    todo = _units_to_do(out, keys, mine, run.rehash)
    read = sorted({si for u in todo for si, _, _ in plan["units"][u]})  # the files this task reads: judged first
    TF.check_text_sources([plan["sources"][si] for si in read], run.max_nontext_fraction)
    log.info(
        "%s: %d units planned, task %d/%d has %d (%d already done, %d to do)",
        out,
        len(plan["units"]),
        j,
        J,
        len(mine),
        len(mine) - len(todo),
        len(todo),
    )
    ctx = UnitContext(out, plan, keys, out / "tokenizer")
    guard = _unk_guard(out, tokenizer, run.max_unk_fraction)
    for u in sorted(set(mine) - set(todo)):  # finished before (a resumed run): the running rate includes them
        info = load_unit(out, keys[u], rehash=False) or {}
        guard.add(info.get("tokens", 0), sum(info.get("unk_tokens", {}).values()))
    guard.check()
    desc = f"tokenize[{j}/{J}]" if J > 1 else "tokenize"
    bar = Progress(sum(unit_size(plan, u) for u in todo), run.progress, desc)

    def report(nbytes: int, docs: int, tokens: int, unk: int) -> None:
        bar.update(nbytes, docs, tokens, unk)
        guard.add(tokens, unk)
        guard.check()

    t0 = time.perf_counter()
    try:
        run_units(todo, ctx, run.workers, run.threads_per_worker, report)
    finally:
        bar.close()
    record = _task_record(ctx, phash, mine, todo, (j, J), time.perf_counter() - t0, run.workers)
    atomic_write_json(task_record_path(out, j, J), record, **CANONICAL)
    if run.finalize or (run.finalize is None and J == 1):
        return finalize_dir(out, max_unk_fraction=run.max_unk_fraction)
    return record


def _unk_guard(out: Path, tokenizer: str | os.PathLike | None, max_unk_fraction: float) -> UnkGuard:
    """The [UNK]-rate guard of a run, naming the tokenizer file (and what --tokenizer it came from)."""
    named = str(tokenizer_file(out / "tokenizer")) + (f" (from --tokenizer {tokenizer})" if tokenizer else "")
    return UnkGuard(max_unk_fraction, named, out)


def slurm_task() -> tuple[int, int]:
    """(num_tasks, task_index) from a Slurm job array (1, 0 outside one); array ids need not start at 0."""
    count = os.environ.get("SLURM_ARRAY_TASK_COUNT")
    tid = os.environ.get("SLURM_ARRAY_TASK_ID")
    if not count or tid is None:
        return 1, 0
    lo = int(os.environ.get("SLURM_ARRAY_TASK_MIN", "0"))
    step = int(os.environ.get("SLURM_ARRAY_TASK_STEP", "1") or 1)
    return int(count), (int(tid) - lo) // step


def _array_task(num_tasks: int | None, task_index: int | None) -> tuple[int, int]:
    """(J, j): the arguments where given, else the Slurm array's (an explicit J without j means task 0)."""
    env_tasks, env_index = slurm_task()
    J = num_tasks if num_tasks is not None else env_tasks
    j = task_index if task_index is not None else (env_index if num_tasks is None else 0)
    if J < 1:
        raise DataPrepError(f"--num-tasks must be >= 1 (got {J})")
    if not 0 <= j < J:
        raise DataPrepError(f"task index {j} is outside 0..{J - 1} (--num-tasks {J})")
    return J, j


def _setup_tokenizer(out: Path, tokenizer: str | os.PathLike | None) -> dict[str, Any]:
    """Install `tokenizer` as OUT/tokenizer (or use the one there) and check its files against their hashes."""
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


def _finished_manifest(out: Path, plan: dict[str, Any], phash: str) -> dict[str, Any] | None:
    """The manifest when `out` is already finished from this very plan; a finished corpus of anything else is
    refused (never overwritten); None when `out` is not finished."""
    manifest_path = out / "manifest.json"
    if not manifest_path.is_file():
        return None
    old = read_object(manifest_path, DataPrepError, hint="this directory holds a damaged corpus: use a new --output")
    if old.get("plan_hash") == phash:
        log.info("%s: already complete (manifest matches inputs, settings and tokenizer)", out)
        return old
    raise DataPrepError(
        f"{manifest_path}: this directory already holds a finished corpus prepared with "
        f"{plan_difference(manifest_as_plan(old), plan)}; nothing was changed: use a new output directory"
    )


def _record_plan(out: Path, plan: dict[str, Any], phash: str) -> None:
    """Write OUT/.work/plan.json; an unfinished run with other settings or tokenizer is refused, one with changed
    inputs is continued (its units whose bytes changed are redone)."""
    work = out / ".work"
    units_dir(out).mkdir(parents=True, exist_ok=True)
    (work / "tasks").mkdir(parents=True, exist_ok=True)
    plan_path = work / "plan.json"
    if plan_path.is_file():
        old = _read_plan(plan_path)
        if settings_hash(old["plan"]) != settings_hash(plan):
            raise DataPrepError(
                f"{plan_path}: an unfinished run in this directory used {plan_difference(old['plan'], plan)}; "
                f"nothing was changed: use a new output directory (or delete {work} to start over)"
            )
        if old.get("plan_hash") == phash:
            return
        log.warning(
            "%s: inputs changed since the last run (%s): units whose bytes changed will be redone",
            out,
            plan_difference(old["plan"], plan),
        )
    atomic_write_json(plan_path, {"plan_hash": phash, "plan": plan}, **CANONICAL)


def _read_plan(plan_path: Path) -> dict[str, Any]:
    """OUT/.work/plan.json ({plan_hash, plan}); a damaged one names the file and the way out (the units are keyed by
    their settings and bytes, so deleting the plan loses nothing)."""
    todo = "delete it and rerun tokenize with the same inputs and settings (the finished units are kept)"
    stored = read_object(plan_path, DataPrepError, hint=todo)
    if not isinstance(stored.get("plan"), dict) or "plan_hash" not in stored:
        raise DataPrepError(f"{plan_path}: damaged (no plan / plan_hash); {todo}")
    return stored


def _units_to_do(out: Path, keys: list[str], mine: list[int], rehash: bool) -> list[int]:
    """This task's units that are not finished and intact; their leftovers (temp dirs of a killed run,
    incomplete or corrupt unit dirs) are removed."""
    for u in mine:
        for t in unit_temp_dirs(out, keys[u]):
            shutil.rmtree(t, ignore_errors=True)
    todo = [u for u in mine if load_unit(out, keys[u], rehash) is None]
    for u in todo:
        shutil.rmtree(unit_dir(out, keys[u]), ignore_errors=True)
    return todo


def _unit_record(info: dict[str, Any], u: int, plan: dict[str, Any]) -> dict[str, Any]:
    """A finished unit's record under this plan (a reused unit may have had another index in an earlier plan)."""
    return {**info, "unit": u, "segments": plan["units"][u]}


def _task_record(
    ctx: UnitContext, phash: str, mine: list[int], todo: list[int], task: tuple[int, int], seconds: float, workers: int
) -> dict[str, Any]:
    """What array task j of J did: its units (without their parts), those done now, time and workers."""
    j, J = task
    units = {u: load_unit(ctx.out, ctx.keys[u], rehash=False) for u in mine}
    return {
        "task": j,
        "num_tasks": J,
        "plan_hash": phash,
        "units": {
            str(u): {k: v for k, v in _unit_record(info, u, ctx.plan).items() if k != "parts"}
            for u, info in units.items()
            if info
        },
        "units_done_now": todo,
        "seconds": round(seconds, 3),
        "workers": workers,
    }


# ----------------------------------------------------------------------------------------------- finalize


def finalize_dir(out_dir: str | os.PathLike, max_unk_fraction: float = DEFAULT_MAX_UNK_FRACTION) -> dict[str, Any]:
    """Merge all units into `train/`, `valid/` shards and write `manifest.json` (atomic); refuse if any unit is
    missing, or when more than `max_unk_fraction` of all tokens are [UNK] (before any shard is written).
    Idempotent: a finished directory is returned as is."""
    out = Path(out_dir)
    problem = unk_fraction_problem(max_unk_fraction)
    if problem:
        raise DataPrepError(problem)
    with output_errors(out):
        return _finalize(out, max_unk_fraction)


def _finalize(out: Path, max_unk_fraction: float) -> dict[str, Any]:
    manifest_path = out / "manifest.json"
    plan_path = out / ".work" / "plan.json"
    damaged = "this directory holds a damaged corpus: use a new --output"
    if not plan_path.is_file():
        if manifest_path.is_file():
            return read_object(manifest_path, DataPrepError, hint=damaged)
        raise DataPrepError(f"{out}: nothing to finalize (no {Path('.work', 'plan.json')}; run tokenize first)")
    stored = _read_plan(plan_path)
    plan, phash = stored["plan"], stored["plan_hash"]
    if (
        manifest_path.is_file()
        and (old := read_object(manifest_path, DataPrepError, hint=damaged)).get("plan_hash") == phash
    ):
        return old
    keys = unit_keys(plan)
    infos = _finished_units(out, plan, keys)
    meta = load_meta(out / "tokenizer")
    if meta["sha256"] != plan["tokenizer_sha256"]:
        raise DataPrepError(f"{out / 'tokenizer'}: tokenizer differs from the one the units were made with")
    guard = _unk_guard(out, None, max_unk_fraction)
    guard.add(sum(i["tokens"] for i in infos), sum(sum(i["unk_tokens"].values()) for i in infos))
    guard.check(complete=True)
    _remove_finalize_leftovers(out)
    splits = {
        split: _write_split(out, split, infos, keys, np.dtype(meta["dtype"]), plan["config"]["shard_tokens"])
        for split in SPLITS
    }
    meta["identity"] = recorded_identity(meta, out / "tokenizer").to_dict()  # a tokenizer installed before identities
    manifest = _manifest(plan, phash, meta, infos, splits)
    _check_totals(out, manifest)
    atomic_write_json(manifest_path, manifest, **CANONICAL)
    _prune_units(out, keys)
    log.info(
        "%s: finalized: %d train + %d valid shards, %d tokens",
        out,
        len(splits["train"]["shards"]),
        len(splits["valid"]["shards"]),
        manifest["totals"]["tokens"],
    )
    return manifest


def _remove_finalize_leftovers(out: Path) -> None:
    """Temporary shard and manifest files of a finalize that was killed (they would hold disk space forever)."""
    for leftover in [*out.glob(".manifest.json.tmp*"), *(p for s in SPLITS for p in out.glob(f"{s}/.shard_*.tmp*"))]:
        leftover.unlink(missing_ok=True)


def _finished_units(out: Path, plan: dict[str, Any], keys: list[str]) -> list[dict[str, Any]]:
    """The record of every unit of the plan, in order; missing units are an error naming the tasks to rerun."""
    infos: list[dict[str, Any]] = []
    missing: list[int] = []
    for u, key in enumerate(keys):
        info = load_unit(out, key, rehash=False)
        if info is None:
            missing.append(u)
        else:
            infos.append(_unit_record(info, u, plan))
    if missing:
        hint = "".join(
            f"; with --num-tasks {J}: rerun task(s) {sorted({u % J for u in missing})[:20]}"
            for J in recorded_task_counts(out)
        )
        shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
        raise DataPrepError(
            f"{out}: {len(missing)} of {len(keys)} work units missing or incomplete (units {shown}){hint}"
        )
    return infos


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


def _write_split(
    out: Path, split: str, infos: list[dict[str, Any]], keys: list[str], dtype: np.dtype, limit: int
) -> dict[str, Any]:
    """The shards of one split from the units' parts, and the split's manifest entry."""
    sdir = out / split
    sdir.mkdir(exist_ok=True)
    parts = [(info["unit"], p) for info in infos for p in info["parts"][split]]
    shards = [
        _write_shard(sdir / f"shard_{k:05d}", group, out, keys, dtype) for k, group in enumerate(_pack(parts, limit))
    ]
    unk = sum(info["unk_tokens"][split] for info in infos)
    # shard files of an earlier, different layout would be picked up by nobody: remove strays
    names = {s["name"] for s in shards}
    for f in sdir.glob("shard_*"):
        if f.name.split(".")[0] not in names:
            f.unlink()
    fsync_dir(sdir)
    return {
        "docs": sum(s["docs"] for s in shards),
        "sentences": sum(s["sentences"] for s in shards),
        "tokens": sum(s["tokens"] for s in shards),
        "unk_tokens": unk,
        "shards": shards,
    }


def _write_shard(
    stem: Path, group: list[tuple[int, dict[str, Any]]], out: Path, keys: list[str], dtype: np.dtype
) -> dict[str, Any]:
    """`stem`.bin/.idx from a group of unit parts: a lone part is hard-linked, several are concatenated."""
    bin_path, idx_path = stem.with_suffix(".bin"), stem.with_suffix(".idx")
    part_stems = [unit_dir(out, keys[u]) / p["name"] for u, p in group]
    if len(group) == 1:
        _place(part_stems[0].with_suffix(".bin"), bin_path)
        _place(part_stems[0].with_suffix(".idx"), idx_path)
        rec = {k: group[0][1][k] for k in SHARD_FIELDS}
    else:
        with atomic_path(bin_path) as tmp_bin, atomic_path(idx_path) as tmp_idx:
            rec = concat_shards(part_stems, (tmp_bin, tmp_idx), dtype)
    header = read_idx_header(idx_path)
    if header.bin_sha256 != rec["bin_sha256"] or header.num_tokens != rec["tokens"]:
        raise DataPrepError(f"{stem}.idx: does not match its unit part (changed during finalize?)")
    return {"name": stem.name, "units": sorted({u for u, _ in group}), **rec}


def _place(src: Path, dest: Path) -> None:
    """Hard-link `src` to `dest` (copy where links are impossible), atomically."""
    with atomic_path(dest) as tmp:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)


def _manifest(
    plan: dict[str, Any], phash: str, meta: dict[str, Any], infos: list[dict[str, Any]], splits: dict[str, Any]
) -> dict[str, Any]:
    units = [{k: v for k, v in info.items() if k != "parts"} for info in infos]
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "plan_hash": phash,
        "tokenizer": {**meta, "dir": "tokenizer"},  # with its identity (what the ids mean), compared when they are used
        "dtype": meta["dtype"],
        "config": plan["config"],
        "splitter": plan["splitter"],
        "sources": plan["sources"],
        # the dedup run the inputs came from (parameters, report hash), None for other inputs (data_prep/dedup/run.py)
        "dedup": dedup_manifest_entry([s["path"] for s in plan["sources"]]),
        "units": units,
        "splits": splits,
        "totals": {
            "docs": sum(s["docs"] for s in splits.values()),
            "sentences": sum(s["sentences"] for s in splits.values()),
            "tokens": sum(s["tokens"] for s in splits.values()),
            "unk_tokens": sum(s["unk_tokens"] for s in splits.values()),
            "input_bytes": sum(u["input_bytes"] for u in units),
            "decode_errors": sum(u["decode_errors"] for u in units),
            "units": len(units),
        },
        # per input file: [U+FFFD after decoding, control characters] (files without either are not listed)
        "text_faults": TF.merge_text_faults(units),
    }


def _check_totals(out: Path, manifest: dict[str, Any]) -> None:
    """No documents at all is an error; an empty validation split (when one was asked for) a warning."""
    totals, config = manifest["totals"], manifest["config"]
    if totals["docs"] == 0:
        raise DataPrepError(f"{out}: the inputs produced no documents (all empty after stripping?)")
    if config["valid_fraction"] > 0 and manifest["splits"]["valid"]["docs"] == 0:
        log.warning(
            "%s: the validation split is empty (%d documents x valid_fraction %g): raise --valid-fraction",
            out,
            totals["docs"],
            config["valid_fraction"],
        )


def _prune_units(out: Path, keys: list[str]) -> None:
    """Remove the units of earlier plans (inputs changed since): no longer needed once the manifest is written."""
    live = {unit_dir(out, k).name for k in keys}
    for d in units_dir(out).iterdir():
        if d.name not in live:
            shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------------------------------ corpus reading


def iter_corpus_texts(
    inputs: Sequence[str | os.PathLike],
    max_bytes: int = 0,
    max_nontext_fraction: float = TF.DEFAULT_MAX_NONTEXT_FRACTION,
    **settings: Any,
) -> Iterator[str]:
    """Documents of `inputs` in plan order (for tokenizer training); stops after ~max_bytes (0 = all). A file that is
    mostly not text (a binary, UTF-16) is refused first, as `tokenize` refuses it (`text_faults.check_text_sources`):
    a vocabulary learnt from it would be made of its bytes. Checked when called, before the first document."""
    cfg = make_config(None, **settings).resolved()
    plan = build_plan([str(i) for i in inputs], cfg, "", None, allow_empty=True)
    TF.check_text_sources(plan["sources"], max_nontext_fraction)
    return _plan_texts(plan, cfg, max_bytes)


def _plan_texts(plan: dict, cfg: dict, max_bytes: int) -> Iterator[str]:
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
