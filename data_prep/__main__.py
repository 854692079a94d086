"""CLI: `python -m data_prep {train-tokenizer,tokenize,finalize,verify,stats} ...` (also `elasticbert-data`).

Exit codes: 0 success; 1 `verify` found problems (all listed); 2 a user error (one line on stderr, no traceback);
130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import DataPrepError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.I)


def parse_size(text: str) -> int:
    """'4096', '64K', '16M', '1.5G' -> an int (powers of 1024)."""
    m = _SIZE.match(str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 4096, 64K, 16M, 1G)")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def default_workers() -> int:
    """CPUs this process may use (Slurm's allocation when inside a job)."""
    if os.environ.get("SLURM_CPUS_PER_TASK"):
        return max(1, int(os.environ["SLURM_CPUS_PER_TASK"]))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def _input_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("input reading")
    g.add_argument("--doc-boundary", choices=("auto", "blank", "line", "file"), default="auto",
                   help="plain text: a document ends at a blank line, at every line, or is the whole file (cut "
                        "every --max-doc-bytes at a paragraph break; e.g. books). auto: blank if the file has "
                        "blank lines, else line")
    g.add_argument("--no-strip-gutenberg", dest="strip_gutenberg", action="store_false",
                   help="keep Project Gutenberg headers/license footers")
    g.add_argument("--on-decode-error", choices=("replace", "fail"), default="replace",
                   help="invalid UTF-8: replace with U+FFFD and count (default) or stop with an error")
    g.add_argument("--text-field", default="text", help="JSONL field / dataset column holding the text")
    g.add_argument("--hf-split", default="train", help="split of a Hugging Face DatasetDict / hub dataset")
    g.add_argument("--max-doc-bytes", type=parse_size, default=8 << 20,
                   help="cut documents longer than this (bounded memory; default 8M)")
    g.add_argument("--allow-empty", action="store_true", help="skip empty input files instead of failing")


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k) for k in ("doc_boundary", "strip_gutenberg", "on_decode_error", "text_field",
                                          "hf_split", "max_doc_bytes")}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m data_prep",
        description="Corpus -> tokenizer -> sharded memory-mapped token files (.bin/.idx) -> manifest.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("train-tokenizer", help="train a tokenizer on a corpus, or adopt a vocab.txt (--vocab)")
    p.add_argument("inputs", nargs="*", help="files, folders, globs, dataset dirs, hf:NAME[:CONFIG]")
    p.add_argument("--out", required=True, help="prepared-data directory; the tokenizer is saved to OUT/tokenizer")
    p.add_argument("--vocab", help="adopt this vocab.txt (or a folder holding one) instead of training")
    p.add_argument("--kind", choices=("wordpiece", "unigram", "bpe"), default="wordpiece",
                   help="wordpiece (tokenizers) or sentencepiece unigram/bpe")
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--cased", action="store_true", help="keep case (default: lower-case)")
    p.add_argument("--max-bytes", type=parse_size, default=1 << 30,
                   help="train on at most this much text, in input order (default 1G)")
    p.add_argument("--threads", type=int, default=default_workers())
    _input_options(p)

    p = sub.add_parser("tokenize", help="tokenize a corpus into train/valid shards")
    p.add_argument("inputs", nargs="+", help="files, folders, globs (.txt/.jsonl, .gz/.zst), dataset dirs, "
                                             "hf:NAME[:CONFIG]")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--tokenizer", help="vocab.txt, folder with vocab.txt, spm .model or data_prep tokenizer dir "
                                       "(default: OUT/tokenizer from train-tokenizer)")
    p.add_argument("--workers", type=int, default=default_workers(), help="worker processes (default: CPUs)")
    p.add_argument("--threads-per-worker", type=int, default=1, help="tokenizer threads per worker (default 1)")
    p.add_argument("--num-tasks", type=int, default=None, help="Slurm array size J (default SLURM_ARRAY_TASK_COUNT)")
    p.add_argument("--task-index", type=int, default=None, help="this task j (default from SLURM_ARRAY_TASK_ID)")
    p.add_argument("--shard-tokens", type=parse_size, default=1 << 24, help="shard size target in tokens (16M)")
    p.add_argument("--unit-size", type=parse_size, default=0,
                   help="work-unit size in bytes of text (default: shard-tokens x 4)")
    p.add_argument("--valid-fraction", type=float, default=0.01, help="held-out fraction of documents (0.01)")
    p.add_argument("--split-seed", type=int, default=0, help="seed of the document -> split hash")
    p.add_argument("--max-sentence-tokens", type=int, default=0, help="cut longer sentences (0 = never)")
    p.add_argument("--no-finalize", action="store_true", help="do not write the manifest after a single task")
    p.add_argument("--no-rehash", dest="rehash", action="store_false",
                   help="on resume, trust finished units' sizes instead of re-hashing them")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    _input_options(p)

    p = sub.add_parser("finalize", help="merge the units of all array tasks into shards + manifest.json")
    p.add_argument("out")

    p = sub.add_parser("verify", help="re-hash every shard and check indexes, dtype, ids and totals")
    p.add_argument("out")
    p.add_argument("--workers", type=int, default=1)

    p = sub.add_parser("stats", help="docs, sentences, tokens, length histograms (PNG)")
    p.add_argument("out")
    p.add_argument("--plots", default=None, help="where to write stats.json and PNGs (default OUT/stats)")
    return parser


def _cmd_train_tokenizer(args: argparse.Namespace) -> int:
    from .pipeline import iter_corpus_texts
    from .tokenizer import adopt_vocab, train_tokenizer

    final = Path(args.out) / "tokenizer"
    if args.vocab:
        meta = adopt_vocab(args.vocab, final, lowercase=None)
    else:
        if not args.inputs:
            raise DataPrepError("train-tokenizer needs inputs (or --vocab VOCAB.txt to adopt a vocabulary)")
        if final.exists():
            raise DataPrepError(f"{final}: a tokenizer already exists; use another --out or delete it first")
        texts = iter_corpus_texts(args.inputs, max_bytes=args.max_bytes, **_settings(args))
        meta = train_tokenizer(texts, final, kind=args.kind, vocab_size=args.vocab_size, lowercase=not args.cased,
                               threads=args.threads)
    print(f"{final}: {meta['kind']} tokenizer, vocab {meta['vocab_size']}, sha256 {meta['sha256']}")
    return 0


def _cmd_tokenize(args: argparse.Namespace) -> int:
    from .pipeline import tokenize_corpus

    res = tokenize_corpus(
        args.inputs, args.out, tokenizer=args.tokenizer, workers=args.workers, num_tasks=args.num_tasks,
        task_index=args.task_index, threads_per_worker=args.threads_per_worker, progress=args.progress,
        finalize=False if args.no_finalize else None, allow_empty=args.allow_empty, rehash=args.rehash,
        shard_tokens=args.shard_tokens, unit_bytes=args.unit_size, valid_fraction=args.valid_fraction,
        split_seed=args.split_seed, max_sentence_tokens=args.max_sentence_tokens, **_settings(args),
    )
    if "splits" in res:
        _print_manifest(args.out, res)
    else:
        print(f"task {res['task']}/{res['num_tasks']}: {len(res['units'])} units complete "
              f"({len(res['units_done_now'])} now); when every task is done: python -m data_prep finalize {args.out}")
    return 0


def _print_manifest(out: str, m: dict[str, Any]) -> None:
    parts = []
    for split, info in m["splits"].items():
        parts.append(f"{split}: {len(info['shards'])} shards, {info['docs']:,} docs, {info['sentences']:,} sentences, "
                     f"{info['tokens']:,} tokens")
    print(f"{out}: " + "; ".join(parts) + f" -> {Path(out) / 'manifest.json'}")
    if m["totals"].get("decode_errors"):
        print(f"{out}: {m['totals']['decode_errors']} undecodable byte sequences were replaced by U+FFFD")


def _cmd_finalize(args: argparse.Namespace) -> int:
    from .pipeline import finalize_dir

    _print_manifest(args.out, finalize_dir(args.out))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from .verify import summary, verify_dir

    problems = verify_dir(args.out, workers=args.workers)
    if problems:
        print(f"{args.out}: verification FAILED, {len(problems)} problem(s):", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    print(f"{args.out}: OK ({summary(args.out)})")
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    from .stats import corpus_stats

    res = corpus_stats(args.out, args.plots)
    print(json.dumps(res, indent=1))
    return 0


COMMANDS = {"train-tokenizer": _cmd_train_tokenizer, "tokenize": _cmd_tokenize, "finalize": _cmd_finalize,
            "verify": _cmd_verify, "stats": _cmd_stats}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m data_prep` and the `elasticbert-data` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="data_prep: %(message)s", stream=sys.stderr)
    try:
        return COMMANDS[args.command](args)
    except DataPrepError as e:
        msg = " ".join(str(e).split("\n"))
        print(f"data_prep: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("data_prep: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
