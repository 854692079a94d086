"""`python -m pretrain {train,export,build-index,check-config,convert-universal}` (console script:
`elasticbert-pretrain`).

Exit codes: 0 done; 2 bad input (config, data, run directory, incompatible checkpoint) with a one-paragraph message
and no traceback; 75 (EX_TEMPFAIL) after a preemption-triggered checkpoint (requeue and rerun the same command).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

EXIT_USAGE = 2


def _user_errors() -> tuple[type[BaseException], ...]:
    from .checkpoint import ResumeError
    from .config import ConfigError
    from .trainer import RunDirError

    errors: list[type[BaseException]] = [ConfigError, ResumeError, RunDirError]
    try:
        from data_prep.errors import DataPrepError

        errors.append(DataPrepError)
    except ImportError:
        pass
    try:
        from elasticbert import CheckpointError

        errors.append(CheckpointError)
    except ImportError:
        pass
    return tuple(errors)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m pretrain", description="ElasticBERT multi-exit pre-training")
    # the deepspeed launcher inserts --local_rank=N before the subcommand (LOCAL_RANK is read from the environment)
    ap.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    sub = ap.add_subparsers(dest="command", required=True)

    def config_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", required=True, help="run config YAML (configs/*.yaml)")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config value, e.g. --set optim.lr=1e-4 (repeatable; values parsed as YAML)")

    t = sub.add_parser("train", help="train (auto-resumes from RUN/checkpoints/latest)")
    config_args(t)
    t.add_argument("--run-dir", required=True, help="run directory: checkpoints, metrics.jsonl, tensorboard/")
    t.add_argument("--ds-config", default=None, help="DeepSpeed JSON (default: train.ds_config of the run config)")
    t.add_argument("--force-resume", action="store_true",
                   help="resume even if the checkpoint was written under a different config")
    t.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)

    e = sub.add_parser("export", help="DeepSpeed checkpoint -> Hugging Face directory (safetensors + tokenizer)")
    e.add_argument("--checkpoint", required=True, help="RUN/checkpoints")
    e.add_argument("--tag", default="latest")
    e.add_argument("--output", required=True)
    e.add_argument("--overwrite", action="store_true")

    b = sub.add_parser("build-index", help="build and cache the sample indexes offline (no process group)")
    config_args(b)
    b.add_argument("--run-dir", default=None, help="fallback cache location when the data dir is read-only")

    c = sub.add_parser("check-config", help="validate a run config (+ DeepSpeed JSON) and print the resolved form")
    config_args(c)
    c.add_argument("--ds-config", default=None)
    c.add_argument("--world-size", type=int, default=1)

    u = sub.add_parser("convert-universal", help="convert a checkpoint for a resume at another world size")
    u.add_argument("--checkpoint", required=True, help="RUN/checkpoints")
    u.add_argument("--tag", default="latest")
    return ap


def _run(args: argparse.Namespace) -> int:
    from .config import load_config

    if args.command == "train":
        from .trainer import train

        cfg = load_config(args.config, args.overrides)
        return train(cfg, Path(args.run_dir), args.ds_config, args.force_resume)

    if args.command == "export":
        from .export import export

        out = export(Path(args.checkpoint), args.tag, Path(args.output), args.overwrite)
        print(f"exported {args.checkpoint} ({args.tag}) -> {out}")
        return 0

    if args.command == "build-index":
        from .trainer import open_data

        cfg = load_config(args.config, args.overrides + ["data.verify=true"])  # offline: verify and stamp
        run_dir = Path(args.run_dir) if args.run_dir else Path.cwd()
        bundle = open_data(cfg, run_dir, need_valid=True)
        for path, d in zip(bundle.index_paths, bundle.train + bundle.valid):
            print(f"{len(d):>10} samples  {path}")
        return 0

    if args.command == "check-config":
        import json

        from .config import validate
        from .ds_config import fill_ds_config, load_ds_json

        cfg = load_config(args.config, args.overrides)
        validate(cfg, world_size=args.world_size)
        ds, layout = fill_ds_config(load_ds_json(args.ds_config or cfg.train.ds_config), cfg, args.world_size,
                                    "cuda" if os.environ.get("CUDA_VISIBLE_DEVICES") else "cpu")
        print(json.dumps({"config": cfg.to_dict(), "exit_groups": cfg.exit_groups(), "deepspeed": ds,
                          "layout": str(layout), "config_hash": cfg.semantic_hash()}, indent=2))
        return 0

    if args.command == "convert-universal":
        from .checkpoint import convert_to_universal, resolve_tag

        ckpt = Path(args.checkpoint)
        tag = convert_to_universal(ckpt, resolve_tag(ckpt, args.tag))
        print(f"universal checkpoint: {ckpt / tag}")
        return 0
    raise AssertionError(args.command)


def main(argv: list[str] | None = None) -> int:
    """Parse, run, map user errors to exit code 2 with a readable message."""
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except _user_errors() as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
