"""`python -m data_prep dedup`: exact and near-duplicate removal across the corpora of a run, and decontamination
against evaluation sets, before tokenization. `tokenize` then reads `OUT/text` (JSONL.zst, one record per kept
document) like any other input.

Corpora and the keeper: each input is one corpus (`NAME=PATH`, or PATH named after its last component); inputs come
in priority order. Of a cluster of duplicates the document kept is the one of the highest-priority corpus, then the
first by (source path, byte offset / row) — the smallest global document id, ids being numbered in that order.

Stages (each resumable, every output written atomically, nothing depending on the worker or task count):

1. `signatures` (per work unit of `data_prep.plan`, parallel over workers and Slurm array tasks): for every
   document of at least `min_words` words, the exact hash of its normalised text and the LSH keys of the MinHash
   signature of its word shingles (`data_prep.dedup.text`), sorted per band -> `.work/sig/<unit key>/`.
2. `clusters` (one node; `data_prep.dedup.lsh`): per (band, key range) the documents with equal keys, as edges to
   the group's smallest id; a union-find over all edges -> `roots.npy` (each document's keeper). Memory: 4-8 bytes
   per document for the union-find, plus one (band, key range) of 16 bytes per document at a time, the number of
   key ranges chosen from `--lsh-memory`.
3. `write` (per unit, parallel): the documents read again, duplicates skipped, evaluation-set n-grams found and cut
   or dropped (`data_prep.dedup.evalsets`) -> `text/<corpus>/part_<unit>.jsonl.zst` + a unit record.
4. `report`: `dedup_report.json` + `dedup_report.md`, then `checksums.json` (sha256 of every output file, written
   last: its presence means the output is complete); `.work` is removed.

`--stage all` (the default, one task) runs them in turn; an array job runs `signatures` and `write` as arrays and
`clusters` and `report` as single jobs (`slurm/dedup_data.sh`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common.claims import Part
from common.outputs import DEDUP_OUTPUT as DEDUP_KIND
from common.outputs import Output, check_output

from .. import text_faults as TF
from ..errors import DataPrepError, output_errors
from ..plan import plan_hash
from .evalsets import EvalTable, load_eval_table
from .lsh import stage_clusters
from .plan import (
    INPUT_SETTINGS,
    DedupConfig,
    DedupRun,
    finished_report,
    make_dedup_plan,
    record_plan,
    signature_settings,
    unit_keys,
)
from .report import stage_report
from .stages import DedupContext, stage_signatures
from .write import stage_write

__all__ = ["DedupConfig", "DedupRun", "dedup_corpus"]


# ------------------------------------------------------------------------------------------------ the run


DEDUP_OUTPUT = Output("dedup", "a dedup output", folder=True, accepts=(DEDUP_KIND,))


def dedup_corpus(
    inputs: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    eval_sets: Sequence[str | os.PathLike] = (),
    config: DedupConfig | None = None,
    run: DedupRun | None = None,
    **input_settings: Any,
) -> dict[str, Any]:
    """Deduplicate and decontaminate `inputs` into `out_dir` (see the module docstring). `eval_sets`: folders of
    evaluation files (empty: no decontamination). `input_settings`: how inputs are read (`PrepConfig`'s
    doc_boundary, strip_gutenberg, on_decode_error, text_field, hf_split, max_doc_bytes). Returns the report when
    the run is complete, else the record of what this task did."""
    cfg = config or DedupConfig()
    run = run or DedupRun()
    unknown = sorted(set(input_settings) - set(INPUT_SETTINGS))
    if unknown:
        raise TypeError(f"unknown input settings {unknown}")
    out = Path(out_dir)
    problems = cfg.problems() + run.problems()
    if not 0 <= run.task_index < max(1, run.num_tasks):
        problems.append(f"task index {run.task_index} is outside 0..{run.num_tasks - 1} (--num-tasks {run.num_tasks})")
    if problems:
        raise DataPrepError("; ".join(problems))
    read = [("", str(i).partition("=")[2] or str(i)) for i in inputs] + [("--eval-sets", e) for e in eval_sets]
    check_output(out, DEDUP_OUTPUT, read, part=Part.task(run.task_index, run.num_tasks))  # an array's tasks share it
    table = None
    if eval_sets and run.stage in ("all", "signatures", "write"):  # bad evaluation files fail now, not hours in
        table = load_eval_table(eval_sets, cfg.splits(), cfg.ngram, cfg.ngram_min)
    with output_errors(out, after="{out} is incomplete (no checksums.json) and resumable: {todo} and rerun"):
        out.mkdir(parents=True, exist_ok=True)
        plan = make_dedup_plan([str(i) for i in inputs], cfg, input_settings, out, run.allow_empty)
        phash = plan_hash(plan)
        done = finished_report(out, phash)
        if done is not None:
            return done
        if run.stage in ("all", "signatures"):  # the files this task reads, judged before any work
            mine = range(run.task_index, len(plan["units"]), max(1, run.num_tasks))
            read = sorted({si for u in mine for si, _, _ in plan["units"][u]})
            TF.check_text_sources([plan["sources"][si] for si in read], run.max_nontext_fraction)
        record_plan(out, plan)
        return run_stages(out, plan, phash, table, run)


def run_stages(out: Path, plan: dict[str, Any], phash: str, table: EvalTable | None, run: DedupRun) -> dict[str, Any]:
    """Run the stage `run.stage` asks for (all four in turn for "all"); returns the last one's result."""
    ctx = DedupContext(out, plan, phash, unit_keys(plan, signature_settings(plan)), table)
    stages = {
        "signatures": stage_signatures,
        "clusters": stage_clusters,
        "write": stage_write,
        "report": stage_report,
    }
    result: dict[str, Any] = {}
    for name in list(stages) if run.stage == "all" else [run.stage]:
        result = stages[name](ctx, run)
    return result
