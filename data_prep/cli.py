"""The tokenizer pipeline's commands: `python -m data_prep {train-tokenizer,tokenize,finalize,verify,stats}` (the
parsers and what each command runs), and the option helpers the `dedup` command (`data_prep.dedup.cli`) shares with
them; `data_prep.__main__` assembles the commands. Conventions, exit codes and sanity checks: `data_prep.__main__`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import Any

from common.cli import (
    add_command,
    add_output,
    add_switch,
    add_threads,
    call_with_options,
    config_argument,
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


def add_input_options(p: argparse.ArgumentParser) -> None:
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


def add_train_tokenizer(sub: Any) -> None:
    p = add_command(sub, "train-tokenizer", partial(one_line_errors, _cmd_train_tokenizer), TRAIN_TOKENIZER_HELP)
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
    add_max_nontext_fraction(p, RunOptions)
    add_input_options(p)


def add_max_nontext_fraction(p: argparse.ArgumentParser | Any, cls: type) -> None:
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


def add_tokenize(sub: Any) -> None:
    p = add_command(sub, "tokenize", partial(one_line_errors, _cmd_tokenize), TOKENIZE_HELP)
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
    add_max_nontext_fraction(p, RunOptions)
    add_input_options(p)


def add_finalize(sub: Any) -> None:
    p = add_command(sub, "finalize", partial(one_line_errors, _cmd_finalize), FINALIZE_HELP)
    p.add_argument("directory", metavar="DIR", help="the prepared-corpus directory (tokenize --output)")
    _add_max_unk_fraction(p)


def add_verify(sub: Any) -> None:
    p = add_command(sub, "verify", partial(one_line_errors, _cmd_verify), VERIFY_HELP)
    p.add_argument("directory", metavar="DIR", help="the prepared-corpus directory")
    p.add_argument("--workers", type=int, default=1, help="processes re-hashing shards (default 1)")


def add_stats(sub: Any) -> None:
    p = add_command(sub, "stats", partial(one_line_errors, _cmd_stats), STATS_HELP)
    p.add_argument("directory", metavar="DIR", help="the prepared-corpus directory")
    add_output(p, help="where to write stats.json and PNGs (default: DIR/stats)", required=False, default=None)


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
            texts = iter_corpus_texts(
                args.inputs,
                max_bytes=args.max_bytes,
                max_nontext_fraction=args.max_nontext_fraction,
                **_given_fields(PrepConfig, args),
            )
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


def one_line_errors(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
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
