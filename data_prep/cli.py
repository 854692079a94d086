"""CLI: `python -m data_prep {train-tokenizer,dedup,tokenize,finalize,verify,stats} ...` (also `elasticbert-data`).

The conventions of `common.cli`: `--output PATH` where a command writes (train-tokenizer, tokenize, stats); the
prepared directory is positional for the commands that act on one (finalize, verify, stats); booleans are
`--x/--no-x`; defaults and choices come from `PrepConfig`, `RunOptions` and `TokenizerTraining`.

Exit codes: 0 success; 1 `verify` found problems (all listed); 2 a user error (one line on stderr, no traceback:
bad input, a damaged file, a failed write such as a full disk, a vocabulary that does not fit the text), 130
interrupted. Every numeric option is range-checked before anything is read or written.

Sanity checks: `tokenize` and `finalize` refuse a corpus whose [UNK] rate is above `--max-unk-fraction` (default
`common.vocab.DEFAULT_MAX_UNK_FRACTION`, measured: see there); `tokenize`, `finalize` and `stats` print the rate.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import Any

from common.cli import (
    add_command,
    add_debug,
    add_output,
    add_switch,
    add_threads,
    call_with_options,
    config_argument,
    dispatch,
)
from common.errors import UserError, os_error_of
from common.outputs import CORPUS, Output, check_output
from common.vocab import describe_unk

from .errors import DataPrepError, output_errors
from .pipeline import RunOptions, finalize_dir, iter_corpus_texts, tokenize_corpus
from .plan import PrepConfig
from .stats import corpus_stats
from .text_faults import describe_text_faults
from .tokenizer import TokenizerTraining, adopt_vocab, train_tokenizer
from .verify import summary, verify_dir

PROG = "data_prep"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.I)


def parse_size(text: str) -> int:
    """'4096', '64K', '16M', '1.5G' -> an int (powers of 1024)."""
    m = _SIZE.match(str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 4096, 64K, 16M, 1G)")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def size_argument(parser: argparse.ArgumentParser | Any, cls: type, name: str, *flags: str, help: str) -> None:
    """A config field in bytes or tokens, given as a size (`parse_size`: 64K, 16M, 1G)."""
    config_argument(parser, cls, name, *flags, type=parse_size, metavar="SIZE", help=help)


def default_workers() -> int:
    """CPUs this process may use (Slurm's allocation when inside a job)."""
    if os.environ.get("SLURM_CPUS_PER_TASK"):
        return max(1, int(os.environ["SLURM_CPUS_PER_TASK"]))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


# ------------------------------------------------------------------------------------------------ parser


def _input_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("input reading")
    config_argument(
        g,
        PrepConfig,
        "doc_boundary",
        help="plain text: a document ends at a blank line, at every line, or is the whole file (cut "
        "every --max-doc-bytes at a paragraph break; e.g. books). auto: blank if the file has "
        "blank lines, else line",
    )
    config_argument(
        g,
        PrepConfig,
        "strip_gutenberg",
        help="remove Project Gutenberg headers/license footers (--no-strip-gutenberg keeps them)",
    )
    config_argument(
        g,
        PrepConfig,
        "on_decode_error",
        help="invalid UTF-8: replace with U+FFFD and count, or stop with an error naming file and line",
    )
    config_argument(g, PrepConfig, "text_field", help="JSONL field / dataset column holding the text")
    config_argument(g, PrepConfig, "hf_split", help="split of a Hugging Face DatasetDict / hub dataset")
    size_argument(g, PrepConfig, "max_doc_bytes", help="cut documents longer than this many bytes (bounded memory)")
    config_argument(g, RunOptions, "allow_empty", help="skip empty input files instead of failing")


TRAIN_TOKENIZER_HELP = "train a tokenizer on a corpus, or adopt a vocab.txt (--vocab)"
TOKENIZE_HELP = "tokenize a corpus into train/valid shards"
FINALIZE_HELP = "merge the units of all array tasks into shards + manifest.json"
VERIFY_HELP = "re-hash every shard and check indexes, dtype, ids and totals"
STATS_HELP = "docs, sentences, tokens, length histograms (PNG)"
DEDUP_HELP = "remove exact and near duplicates across corpora and evaluation-set text, before tokenize"


def _add_train_tokenizer(sub: Any) -> None:
    p = add_command(sub, "train-tokenizer", partial(_one_line_errors, _cmd_train_tokenizer), TRAIN_TOKENIZER_HELP)
    p.add_argument("inputs", nargs="*", help="files, folders, globs, dataset dirs, hf:NAME[:CONFIG]")
    add_output(p, help="prepared-data directory; the tokenizer is saved to OUTPUT/tokenizer")
    p.add_argument("--vocab", help="adopt this vocab.txt (or a folder holding one) instead of training")
    config_argument(p, TokenizerTraining, "kind", help="wordpiece (tokenizers) or sentencepiece unigram/bpe")
    config_argument(p, TokenizerTraining, "vocab_size", help="vocabulary size to train")
    add_switch(
        p,
        "--cased",
        None,
        "keep case (--no-cased: lower-case; default: lower-case when training, and for --vocab the "
        "do_lower_case of a tokenizer_config.json beside it, else a guess from the vocab)",
    )
    p.add_argument(
        "--max-bytes",
        type=parse_size,
        default=1 << 30,
        metavar="SIZE",
        help="train on at most this much text, in input order (default 1G)",
    )
    add_threads(p, default=default_workers(), help="training threads (default: CPUs)")
    _input_options(p)


def _add_max_nontext_fraction(p: argparse.ArgumentParser | Any, cls: type) -> None:
    config_argument(
        p,
        cls,
        "max_nontext_fraction",
        metavar="F",
        help="refuse an input file more than this fraction of whose first MiB is undecodable bytes (U+FFFD after "
        "decoding) or control characters: not text (an executable, an archive); 1 accepts anything; every file's "
        "counts are reported either way",
    )


def _add_max_unk_fraction(p: argparse.ArgumentParser) -> None:
    config_argument(
        p,
        RunOptions,
        "max_unk_fraction",
        metavar="F",
        help="refuse the corpus when more than this fraction of its tokens are [UNK] (a vocabulary that does not fit "
        "the text); 1 accepts anything; changes no output byte",
    )


def _add_tokenize(sub: Any) -> None:
    p = add_command(sub, "tokenize", partial(_one_line_errors, _cmd_tokenize), TOKENIZE_HELP)
    p.add_argument(
        "inputs", nargs="+", help="files, folders, globs (.txt/.jsonl, .gz/.zst), dataset dirs, hf:NAME[:CONFIG]"
    )
    add_output(p, help="the prepared-corpus directory")
    p.add_argument(
        "--tokenizer",
        help="vocab.txt, WordPiece tokenizer.json, spm .model, a folder holding one, a data_prep tokenizer dir, or a "
        "Hugging Face hub name such as bert-base-uncased (default: OUTPUT/tokenizer from train-tokenizer)",
    )
    config_argument(
        p,
        RunOptions,
        "workers",
        default=default_workers(),
        help="worker processes (default: one per CPU, here %(default)s)",
    )
    config_argument(p, RunOptions, "threads_per_worker", help="tokenizer threads per worker")
    p.add_argument("--num-tasks", type=int, default=None, help="Slurm array size J (default SLURM_ARRAY_TASK_COUNT)")
    p.add_argument("--task-index", type=int, default=None, help="this task j (default from SLURM_ARRAY_TASK_ID)")
    size_argument(p, PrepConfig, "shard_tokens", help="shard size target in tokens")
    size_argument(
        p, PrepConfig, "unit_bytes", "--unit-size", help="work-unit size in bytes of text; 0 = shard-tokens x 4"
    )
    config_argument(p, PrepConfig, "valid_fraction", help="held-out fraction of documents")
    config_argument(p, PrepConfig, "split_seed", help="seed of the document -> split hash")
    config_argument(p, PrepConfig, "max_sentence_tokens", help="cut longer sentences (0 = never)")
    config_argument(
        p,
        RunOptions,
        "finalize",
        help="write the shards and manifest when this task is done (default: when it is the only task)",
    )
    config_argument(p, RunOptions, "rehash", help="on resume, re-hash finished units (--no-rehash trusts their sizes)")
    config_argument(p, RunOptions, "progress", default=True, help="show a progress bar")
    _add_max_unk_fraction(p)
    _add_max_nontext_fraction(p, RunOptions)
    _input_options(p)


def default_eval_sets() -> list[str]:
    """The shared GLUE sets beside the checkout ($ELASTICBERT_SHARED_DATA/glue, else ../shared/data/glue), if any."""
    shared = os.environ.get("ELASTICBERT_SHARED_DATA")
    root = Path(shared) if shared else Path(__file__).resolve().parents[2] / "shared" / "data"
    return [str(root / "glue")] if (root / "glue").is_dir() else []


def _add_dedup(sub: Any) -> None:
    from .dedup_plan import DedupConfig, DedupRun

    p = add_command(sub, "dedup", partial(_one_line_errors, _cmd_dedup), DEDUP_HELP, description=DEDUP_DESCRIPTION)
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
    _add_max_nontext_fraction(g, DedupRun)
    _input_options(p)


DEDUP_DESCRIPTION = """Exact and near-duplicate removal across the corpora of a run, and decontamination against
evaluation sets, before tokenize. Then: python -m data_prep tokenize OUT/text --output TOK ...
(or one corpus: OUT/text/NAME). One job: --stage all. An array: --stage signatures (array), clusters (one job),
write (array), report (one job); slurm/dedup_data.sh submits the four."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m data_prep",
        description="Corpus -> tokenizer -> sharded memory-mapped token files (.bin/.idx) -> manifest.",
    )
    add_debug(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_train_tokenizer(sub)
    _add_dedup(sub)
    _add_tokenize(sub)

    p = add_command(sub, "finalize", partial(_one_line_errors, _cmd_finalize), FINALIZE_HELP)
    p.add_argument("directory", metavar="DIR", help="the prepared-corpus directory (tokenize --output)")
    _add_max_unk_fraction(p)

    p = add_command(sub, "verify", partial(_one_line_errors, _cmd_verify), VERIFY_HELP)
    p.add_argument("directory", metavar="DIR", help="the prepared-corpus directory")
    p.add_argument("--workers", type=int, default=1, help="processes re-hashing shards (default 1)")

    p = add_command(sub, "stats", partial(_one_line_errors, _cmd_stats), STATS_HELP)
    p.add_argument("directory", metavar="DIR", help="the prepared-corpus directory")
    add_output(p, help="where to write stats.json and PNGs (default: DIR/stats)", required=False, default=None)
    return parser


def _given_fields(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The fields of config dataclass `cls` this command has flags for (declared with `config_argument`)."""
    return {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}


# ---------------------------------------------------------------------------------------------- commands


TRAIN_TOKENIZER_OUTPUT = Output(
    "train-tokenizer", "a prepared-data folder (OUTPUT/tokenizer)", folder=True, accepts=(CORPUS,)
)


def _cmd_train_tokenizer(args: argparse.Namespace) -> int:
    read = [*(("", source) for source in args.inputs), ("--vocab", args.vocab)]
    check_output(args.output, TRAIN_TOKENIZER_OUTPUT, read)
    final = Path(args.output) / "tokenizer"
    with output_errors(final, after="no tokenizer was installed: {todo} and rerun"):
        if args.vocab:
            lowercase = None if args.cased is None else not args.cased
            meta = adopt_vocab(args.vocab, final, lowercase=lowercase)
        else:
            if not args.inputs:
                raise DataPrepError("train-tokenizer needs inputs (or --vocab VOCAB.txt to adopt a vocabulary)")
            if final.exists():
                raise DataPrepError(f"{final}: a tokenizer already exists; use another --output or delete it first")
            if args.max_bytes < 1:
                raise DataPrepError(f"--max-bytes must be > 0 (got {args.max_bytes})")
            texts = iter_corpus_texts(args.inputs, max_bytes=args.max_bytes, **_given_fields(PrepConfig, args))
            meta = call_with_options(
                train_tokenizer, args, texts=texts, out_dir=final, lowercase=args.cased is not True
            )
    print(f"{final}: {meta['kind']} tokenizer, vocab {meta['vocab_size']}, sha256 {meta['sha256']}")
    return 0


def _cmd_tokenize(args: argparse.Namespace) -> int:
    res = tokenize_corpus(
        args.inputs,
        args.output,
        tokenizer=args.tokenizer,
        num_tasks=args.num_tasks,
        task_index=args.task_index,
        **_given_fields(RunOptions, args),
        **_given_fields(PrepConfig, args),
    )
    if "splits" in res:
        _print_manifest(args.output, res)
    else:
        units = res["units"].values()
        unk = describe_unk(sum(sum(u["unk_tokens"].values()) for u in units), sum(u["tokens"] for u in units))
        print(
            f"task {res['task']}/{res['num_tasks']}: {len(res['units'])} units complete "
            f"({len(res['units_done_now'])} now), {unk}; when every task is done: "
            f"python -m data_prep finalize {args.output}"
        )
    return 0


def _cmd_dedup(args: argparse.Namespace) -> int:
    from .dedup import dedup_corpus
    from .dedup_plan import DedupRun, given_settings
    from .pipeline import _array_task

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


def _print_manifest(out: str, m: dict[str, Any]) -> None:
    parts = []
    for split, info in m["splits"].items():
        parts.append(
            f"{split}: {len(info['shards'])} shards, {info['docs']:,} docs, {info['sentences']:,} sentences, "
            f"{info['tokens']:,} tokens"
        )
    print(f"{out}: " + "; ".join(parts) + f" -> {Path(out) / 'manifest.json'}")
    if "unk_tokens" in m["totals"]:
        print(f"{out}: {describe_unk(m['totals']['unk_tokens'], m['totals']['tokens'])}")
    if m["totals"].get("decode_errors"):
        print(f"{out}: {m['totals']['decode_errors']} undecodable byte sequences were replaced by U+FFFD")
    for line in describe_text_faults(m.get("text_faults") or {}):
        print(f"{out}: note: {line}")


def _cmd_finalize(args: argparse.Namespace) -> int:
    _print_manifest(args.directory, finalize_dir(args.directory, max_unk_fraction=args.max_unk_fraction))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    problems = verify_dir(args.directory, workers=args.workers)
    if problems:
        print(f"{args.directory}: verification FAILED, {len(problems)} problem(s):", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    print(f"{args.directory}: OK ({summary(args.directory)})")
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    stats = corpus_stats(args.directory, args.output)
    print(json.dumps(stats, indent=1))
    unk = stats["unk"]
    print(f"{args.directory}: {describe_unk(unk['unk_tokens'], unk['tokens'])}", file=sys.stderr)
    return 0


def _one_line_errors(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run `command`; a user error whose message spans lines is re-raised as one line (one line on stderr is the
    CLI's contract: scripts and Slurm logs grep it), and an OSError that no layer below named (an I/O error, a
    permission) becomes one naming its file."""
    try:
        return command(args)
    except OSError as err:
        mapped = os_error_of(err)  # (numpy's short write on a full disk carries no errno: it gets one here)
        reason = mapped.strerror or (str(mapped.args[0]) if mapped.args else "") or type(mapped).__name__
        raise DataPrepError(f"{mapped.filename or args.command}: {reason}") from err
    except UserError as err:
        text = str(err)
        if "\n" not in text:
            raise
        one_line = DataPrepError(" ".join(text.split("\n")))
        one_line.exit_code = err.exit_code
        raise one_line from err


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m data_prep` and the `elasticbert-data` console script."""

    def prepare(args: argparse.Namespace) -> None:
        logging.basicConfig(level=logging.INFO, format="data_prep: %(message)s", stream=sys.stderr)

    return dispatch(build_parser(), argv, prog=PROG, prepare=prepare)


if __name__ == "__main__":
    sys.exit(main())
