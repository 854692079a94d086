"""`python -m pretrain {train,export,build-index,check-config,convert-universal}` (console script:
`elasticbert-pretrain`).

Exit codes: 0 done; 2 bad input (config, data, run directory, incompatible checkpoint: any `common.errors.UserError`)
printed as `pretrain: error: MESSAGE`, no traceback; 75 (EX_TEMPFAIL) after a preemption-triggered checkpoint
(requeue and rerun the same command). Each command imports what it needs when it runs, so `--help` and
`check-config` start without torch or DeepSpeed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from itertools import zip_longest
from pathlib import Path

from common.cli import add_debug, add_output, config_argument, run_command

from .config import CheckpointConfig, load_config


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="run config YAML (configs/*.yaml)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set optim.lr=1e-4 (repeatable; values parsed as YAML)",
    )


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m pretrain", description="ElasticBERT multi-exit pre-training")
    # the deepspeed launcher inserts --local_rank=N before the subcommand (LOCAL_RANK is read from the environment)
    ap.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    add_debug(ap)
    sub = ap.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train (resumes from OUTPUT/checkpoints/latest when there is one)")
    _config_args(t)
    add_output(
        t,
        "the run directory: checkpoints/, metrics.jsonl, tensorboard/ ...; a run directory that holds "
        "checkpoints is resumed from",
        metavar="RUN",
    )
    t.add_argument("--ds-config", default=None, help="DeepSpeed JSON (default: train.ds_config of the run config)")
    config_argument(
        t, CheckpointConfig, "force_resume", help="resume even if the checkpoint was written under a different config"
    )
    t.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)

    e = sub.add_parser("export", help="DeepSpeed checkpoint -> Hugging Face directory (safetensors + tokenizer)")
    e.add_argument("--checkpoint", required=True, help="RUN/checkpoints")
    e.add_argument("--tag", default="latest")
    add_output(e, "the Hugging Face directory to write", metavar="DIR")
    e.add_argument(
        "--overwrite",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="replace an existing non-empty OUTPUT (default: %(default)s)",
    )

    b = sub.add_parser("build-index", help="verify the data and cache the sample indexes offline (no process group)")
    _config_args(b)
    add_output(
        b,
        "run directory whose index_cache/ is the fallback when a data directory is read-only "
        "(default: the current directory)",
        required=False,
        metavar="RUN",
    )

    c = sub.add_parser("check-config", help="validate a run config (+ DeepSpeed JSON) and print the resolved form")
    _config_args(c)
    c.add_argument("--ds-config", default=None)
    c.add_argument("--world-size", type=int, default=1)

    u = sub.add_parser("convert-universal", help="convert a checkpoint for a resume at another world size")
    u.add_argument("--checkpoint", required=True, help="RUN/checkpoints")
    u.add_argument("--tag", default="latest")
    return ap


def cmd_train(args: argparse.Namespace) -> int:
    from .trainer import train

    cfg = load_config(args.config, args.overrides)
    return train(cfg, Path(args.output), args.ds_config, args.force_resume)


def cmd_export(args: argparse.Namespace) -> int:
    from .export import export

    out = export(Path(args.checkpoint), args.tag, Path(args.output), args.overwrite)
    print(f"exported {args.checkpoint} ({args.tag}) -> {out}")
    return 0


def cmd_build_index(args: argparse.Namespace) -> int:
    from .corpora import open_data

    cfg = load_config(args.config, args.overrides + ["data.verify=true"])  # offline: verify and stamp
    bundle = open_data(cfg, Path(args.output) if args.output else Path.cwd(), need_valid=True)
    datasets = [d for pair in zip_longest(bundle.train, bundle.valid) for d in pair if d is not None]
    for path, d in zip(bundle.index_paths, datasets):  # index_paths: per corpus, train then valid
        print(f"{len(d):>10} samples  {path}")
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    from .config import validate
    from .ds_config import fill_ds_config, load_ds_json

    cfg = load_config(args.config, args.overrides)
    validate(cfg, world_size=args.world_size)
    ds, layout = fill_ds_config(
        load_ds_json(args.ds_config or cfg.train.ds_config),
        cfg,
        args.world_size,
        "cuda" if os.environ.get("CUDA_VISIBLE_DEVICES") else "cpu",
    )
    print(
        json.dumps(
            {
                "config": cfg.to_dict(),
                "exit_groups": cfg.exit_groups(),
                "deepspeed": ds,
                "layout": str(layout),
                "config_hash": cfg.semantic_hash(),
            },
            indent=2,
        )
    )
    return 0


def cmd_convert_universal(args: argparse.Namespace) -> int:
    from .checkpoint import convert_to_universal, resolve_tag

    ckpt = Path(args.checkpoint)
    tag = convert_to_universal(ckpt, resolve_tag(ckpt, args.tag))
    print(f"universal checkpoint: {ckpt / tag}")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "train": cmd_train,
    "export": cmd_export,
    "build-index": cmd_build_index,
    "check-config": cmd_check_config,
    "convert-universal": cmd_convert_universal,
}


def main(argv: list[str] | None = None) -> int:
    """Parse and run one command; user errors exit 2 with `pretrain: error: ...` (common.cli.run_command)."""
    args = _parser().parse_args(argv)
    return run_command("pretrain", lambda: COMMANDS[args.command](args), debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
