"""The `dedup` command: `python -m data_prep dedup ...` (its parser and what it runs; the run itself:
`data_prep.dedup.run`). It shares the tokenizer pipeline's input and size options (`data_prep.cli`), and
`data_prep.__main__` assembles it with them.
"""

from __future__ import annotations

import argparse
import os
from functools import partial
from pathlib import Path
from typing import Any

from common.cli import add_command, add_output, config_argument

from ..cli import add_input_options, add_max_nontext_fraction, default_workers, one_line_errors, size_argument
from ..errors import DataPrepError
from ..text_faults import describe_text_faults
from .plan import DedupConfig, DedupRun, given_settings

DEDUP_HELP = "remove exact and near duplicates across corpora and evaluation-set text, before tokenize"


def default_eval_sets() -> list[str]:
    """The shared GLUE sets beside the checkout ($ELASTICBERT_SHARED_DATA/glue, else ../shared/data/glue), if any."""
    shared = os.environ.get("ELASTICBERT_SHARED_DATA")
    root = Path(shared) if shared else Path(__file__).resolve().parents[3] / "shared" / "data"
    return [str(root / "glue")] if (root / "glue").is_dir() else []


def add_dedup(sub: Any) -> None:
    p = add_command(sub, "dedup", partial(one_line_errors, _cmd_dedup), DEDUP_HELP, description=DEDUP_DESCRIPTION)
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="[NAME=]INPUT",
        help="one corpus per input, in priority order (the first wins a duplicate): NAME=PATH or PATH "
        "(files, folders, globs, dataset dirs, as tokenize)",
    )
    add_output(p, help="the dedup output: text/<corpus>/*.jsonl.zst (tokenize's input), dedup_report.json/.md")
    g = p.add_argument_group("deduplication")
    config_argument(g, DedupConfig, "shingle", help="words per MinHash shingle")
    config_argument(g, DedupConfig, "bands", help="LSH bands")
    config_argument(g, DedupConfig, "rows", help="signature values per band")
    config_argument(g, DedupConfig, "seed", help="seed of the MinHash hash family")
    config_argument(g, DedupConfig, "min_words", help="documents with fewer words are kept, never compared")
    size_argument(g, DedupConfig, "unit_bytes", "--unit-size", help="work-unit size in bytes of text")
    config_argument(g, DedupConfig, "compress", help="output JSONL compression")
    g = p.add_argument_group("decontamination")
    g.add_argument(
        "--eval-sets",
        nargs="+",
        metavar="DIR",
        default=None,
        help="folders of evaluation files (TSV, JSONL, TXT; default: the shared GLUE sets "
        f"{default_eval_sets() or '(not found here)'})",
    )
    g.add_argument("--no-eval-sets", action="store_true", help="no decontamination (no evaluation sets)")
    config_argument(g, DedupConfig, "eval_splits", help="evaluation files whose names start with these (or all)")
    config_argument(
        g,
        DedupConfig,
        "decontaminate",
        help="documents with evaluation n-grams: cut the matches (GPT-3's rule), drop the document, or only report",
    )
    config_argument(g, DedupConfig, "ngram", help="n-gram length (a set of short texts gets less, down to --ngram-min)")
    config_argument(g, DedupConfig, "ngram_min", help="the shortest n-gram used")
    config_argument(g, DedupConfig, "cut_margin", help="characters removed each side of a match")
    config_argument(g, DedupConfig, "cut_min_piece", help="pieces shorter than this are dropped")
    config_argument(g, DedupConfig, "cut_max_pieces", help="a document cut into more pieces is dropped")
    g = p.add_argument_group("running")
    config_argument(g, DedupRun, "workers", default=default_workers(), help="worker processes (default: one per CPU)")
    p.add_argument("--num-tasks", type=int, default=None, help="Slurm array size J (default SLURM_ARRAY_TASK_COUNT)")
    p.add_argument("--task-index", type=int, default=None, help="this task j (default from SLURM_ARRAY_TASK_ID)")
    config_argument(g, DedupRun, "stage", help="all (one task), or one stage: signatures and write run as arrays")
    size_argument(g, DedupRun, "lsh_memory", help="memory of --stage clusters, its workers together")
    config_argument(g, DedupRun, "rehash", help="re-hash finished work items before using them")
    add_max_nontext_fraction(g, DedupRun)
    add_input_options(p)


DEDUP_DESCRIPTION = """Exact and near-duplicate removal across the corpora of a run, and decontamination against
evaluation sets, before tokenize. Then: python -m data_prep tokenize OUT/text --output TOK ...
(or one corpus: OUT/text/NAME). One job: --stage all. An array: --stage signatures (array), clusters (one job),
write (array), report (one job); slurm/dedup_data.sh submits the four."""


def _cmd_dedup(args: argparse.Namespace) -> int:
    from ..pipeline import _array_task
    from .run import dedup_corpus  # the MinHash library (rensa) only when the command runs

    num_tasks, task_index = _array_task(args.num_tasks, args.task_index)
    eval_sets: list[str] = []
    if not args.no_eval_sets:
        eval_sets = args.eval_sets if args.eval_sets is not None else default_eval_sets()
        if not eval_sets:
            raise DataPrepError(
                "no evaluation sets to decontaminate against: pass --eval-sets DIR (TSV/JSONL files) or "
                "--no-eval-sets (the shared GLUE sets are not beside this checkout)"
            )
    cfg, settings = given_settings(args)
    run = DedupRun(
        args.workers,
        num_tasks,
        task_index,
        args.stage,
        args.lsh_memory,
        allow_empty=args.allow_empty,
        rehash=args.rehash,
        max_nontext_fraction=args.max_nontext_fraction,
    )
    res = dedup_corpus(args.inputs, args.output, eval_sets, cfg, run, **settings)
    if "totals" in res:
        t = res["totals"]
        print(
            f"{args.output}: {t['docs_in']:,} documents in, {t['exact_docs']:,} exact and {t['near_docs']:,} near "
            f"duplicates removed, {t['contaminated_docs']:,} with evaluation-set n-grams; {t['docs_kept']:,} "
            f"documents ({t['bytes_kept'] / 1e6:,.1f} MB) kept -> {Path(args.output) / 'text'}; report: "
            f"{Path(args.output) / 'dedup_report.md'}"
        )
        for line in describe_text_faults(res.get("text_faults") or {}):
            print(f"{args.output}: note: {line}")
    else:
        print(
            f"{args.output}: stage {res['stage']}: task {res.get('task', 0)}/{res.get('num_tasks', 1)} done "
            f"({len(res.get('units_done_now', []))} units now)"
            if "units" in res
            else f"{args.output}: stage clusters done: {res['clusters']:,} clusters, {res['documents']:,} documents"
        )
    return 0
