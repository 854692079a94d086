"""The commands of `python -m pretrain` (train, preflight, export, build-index, check-config, convert-universal): their
parsers and what each runs; `pretrain.__main__` assembles them and dispatches (exit codes: there). Each command
imports what it needs when it runs, so `--help` starts without torch or DeepSpeed (`check-config --precision-for
detect` imports torch to look at the GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from itertools import zip_longest
from pathlib import Path
from typing import Any

from common.cli import add_command, add_output, add_switch, config_argument
from common.outputs import PRETRAIN_RUN, Output, check_output

from .config import CheckpointConfig, ConfigError, load_config
from .precision import DeviceCaps

# check-config --precision-for: the device to resolve the precision for (a login node has no GPU to detect)
PRECISION_FOR: dict[str, Callable[[], DeviceCaps]] = {
    "detect": DeviceCaps.detect,
    "cpu": DeviceCaps.cpu,
    "gpu-bf16": lambda: DeviceCaps("cuda", "a GPU with native bf16 (e.g. A100)", True, "8.0"),
    "gpu-no-bf16": lambda: DeviceCaps("cuda", "a GPU without native bf16 (e.g. V100)", False, "7.0"),
}


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


TRAIN_HELP = "train (resumes from OUTPUT/checkpoints/latest when there is one)"
EXPORT_HELP = "DeepSpeed checkpoint -> Hugging Face directory (safetensors + tokenizer)"
BUILD_INDEX_HELP = "verify the data and cache the sample indexes offline (no process group)"
CHECK_CONFIG_HELP = "validate a run config (+ DeepSpeed JSON) and print the resolved form"
CONVERT_UNIVERSAL_HELP = "convert a checkpoint for a resume at another world size"
PREFLIGHT_HELP = (
    "check this node before training (GPUs, torch build, precision, data, run directory, versions alike on every "
    "node): once per node, with the train command's arguments (slurm/pretrain_base.sh runs it; EB_PREFLIGHT=0 skips)"
)


def add_commands(sub: Any) -> None:
    """The six commands, on the subparsers of `pretrain.__main__`'s parser."""
    t = add_command(sub, "train", cmd_train, TRAIN_HELP)
    _config_args(t)
    add_output(
        t,
        "the run directory: checkpoints/, metrics.jsonl, tensorboard/ ...; a run directory that holds "
        "checkpoints is resumed from",
        metavar="RUN",
    )
    t.add_argument("--ds-config", default=None, help="DeepSpeed JSON (default: train.ds_config of the run config)")
    _resume_arguments(t)
    _verify_argument(t, "resuming")
    t.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)

    f = add_command(sub, "preflight", cmd_preflight, PREFLIGHT_HELP)
    _config_args(f)
    add_output(f, "the run directory the training will use", metavar="RUN")
    f.add_argument("--ds-config", default=None, help="DeepSpeed JSON (default: train.ds_config of the run config)")
    _resume_arguments(f)  # the batch scripts pass train's arguments to both: accepted here, used by train

    e = add_command(sub, "export", cmd_export, EXPORT_HELP)
    e.add_argument("--checkpoint", required=True, help="RUN/checkpoints")
    e.add_argument("--tag", default="latest")
    add_output(e, "the Hugging Face directory to write", metavar="DIR")
    e.add_argument(
        "--layout",
        choices=("ours", "fnlp"),
        default="ours",
        help="ours: model.safetensors with the MLM/SOP heads (finetune, AutoModel); fnlp: the released "
        "fnlp/elasticbert-base layout for the official ElasticBERT code (encoder and every pooler under "
        "elasticbert., no MLM/SOP heads), written twice: pytorch_model.bin for its transformers 4.x and "
        "model.safetensors (default: %(default)s)",
    )
    add_switch(e, "--overwrite", False, "replace an existing non-empty OUTPUT")
    _verify_argument(e, "exporting")

    b = add_command(sub, "build-index", cmd_build_index, BUILD_INDEX_HELP)
    _config_args(b)
    add_output(
        b,
        "run directory whose index_cache/ is the fallback when a data directory is read-only "
        "(default: the current directory)",
        required=False,
        metavar="RUN",
    )

    c = add_command(sub, "check-config", cmd_check_config, CHECK_CONFIG_HELP)
    _config_args(c)
    c.add_argument("--ds-config", default=None)
    c.add_argument("--world-size", type=int, default=1)
    c.add_argument(
        "--precision-for",
        choices=sorted(PRECISION_FOR),
        default="detect",
        help="resolve the precision for this device: this machine's (detect), a CPU, a GPU with native bf16 "
        "(A100, H100: gpu-bf16) or one without (V100: gpu-no-bf16) (default: %(default)s)",
    )

    u = add_command(sub, "convert-universal", cmd_convert_universal, CONVERT_UNIVERSAL_HELP)
    u.add_argument("--checkpoint", required=True, help="RUN/checkpoints")
    u.add_argument("--tag", default="latest")
    _verify_argument(u, "converting")


def _resume_arguments(p: argparse.ArgumentParser) -> None:
    config_argument(
        p, CheckpointConfig, "force_resume", help="resume even if the checkpoint was written under a different config"
    )
    config_argument(
        p,
        CheckpointConfig,
        "resume_on_new_data",
        help="resume even if a corpus is not the data the checkpoint was trained on (its fingerprint differs: rebuilt "
        "or replaced in place); the sample order starts over on it, and the run's events say so",
    )


def _verify_argument(p: argparse.ArgumentParser, when: str) -> None:
    config_argument(
        p,
        CheckpointConfig,
        "verify_checksums",
        help=f"check the checkpoint's checksums.json before {when} (--no-verify-checksums: use a checkpoint that "
        "fails it; truncated files are still refused)",
    )


# what a run writes at the top of RUN (never a file of these names that no run wrote: common.run_dir)
RUN_FILES = ("config.yaml", "ds_config.json", "metrics.jsonl", "events.jsonl", "eval.jsonl", "tensorboard")
RUN_FILES += ("checkpoints", "samples_rank*.jsonl", "final_weights.safetensors")
RUN_OUTPUT = Output(
    "pretrain", "a pre-training run directory", folder=True, exclusive=True, accepts=(PRETRAIN_RUN,), writes=RUN_FILES
)


INDEX_OUTPUT = Output("build-index", "a run directory's index_cache/", folder=True, accepts=(PRETRAIN_RUN,))


def check_run_output(args: argparse.Namespace, cfg: object, spec: Output = RUN_OUTPUT, claim: bool = True) -> None:
    """The run directory is not one of the run's inputs (its config, corpora, `init_from` model), not inside one,
    does not hold one, and is not another command's folder (a model directory, a prepared corpus, a fine-tuning
    run): `common.outputs`. (`build-index` writes only index_cache/ there: it may hold the inputs.)"""
    inputs = [("--config", args.config), ("model.init_from", cfg.model.init_from)]
    inputs += [("--ds-config", getattr(args, "ds_config", None) or cfg.train.ds_config)]
    inputs += [(f"data.corpora[{i}].path", corpus.path) for i, corpus in enumerate(cfg.data.corpora)]
    check_output(args.output, spec, inputs, claim=claim)


def cmd_train(args: argparse.Namespace) -> int:
    from elasticbert.verification import set_checksum_verification

    from .trainer import train

    set_checksum_verification(args.verify_checksums)  # init_from is loaded under the same flag as the checkpoints
    cfg = load_config(args.config, args.overrides)
    check_run_output(args, cfg)
    resume = {"force_resume": args.force_resume, "resume_on_new_data": args.resume_on_new_data}
    return train(cfg, Path(args.output), args.ds_config, verify_checksums=args.verify_checksums, **resume)


def cmd_preflight(args: argparse.Namespace) -> int:
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")  # torch's store retries print C++ traces; we say why
    from .preflight import preflight

    cfg = load_config(args.config, args.overrides)
    check_run_output(args, cfg, claim=False)  # every node's preflight checks the one run directory side by side
    return preflight(cfg, Path(args.output), args.ds_config)


def cmd_export(args: argparse.Namespace) -> int:
    from .export import export

    out = export(Path(args.checkpoint), args.tag, Path(args.output), args.overwrite, args.verify_checksums, args.layout)
    print(f"exported {args.checkpoint} ({args.tag}) -> {out} ({args.layout} layout)")
    return 0


def cmd_build_index(args: argparse.Namespace) -> int:
    from .corpora import open_data

    cfg = load_config(args.config, args.overrides + ["data.verify=true"])  # offline: verify and stamp
    if args.output:
        check_run_output(args, cfg, INDEX_OUTPUT)
    bundle = open_data(cfg, Path(args.output) if args.output else Path.cwd(), need_valid=True)
    datasets = [d for pair in zip_longest(bundle.train, bundle.valid) for d in pair if d is not None]
    for path, d in zip(bundle.index_paths, datasets):  # index_paths: per corpus, train then valid
        print(f"{len(d):>10} samples  {path}")
    for note in bundle.notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    from .config import validate
    from .ds_config import fill_ds_config, load_ds_json
    from .precision import choose_precision, describe_precision

    if args.world_size < 1:
        raise ConfigError(f"--world-size={args.world_size} must be >= 1")
    cfg = load_config(args.config, args.overrides)
    validate(cfg, world_size=args.world_size)
    caps = PRECISION_FOR[args.precision_for]()
    raw = load_ds_json(args.ds_config or cfg.train.ds_config)
    ds, layout = fill_ds_config(raw, cfg, args.world_size, caps)
    resolved = {
        "config": cfg.to_dict(),
        "exit_groups": cfg.exit_groups(),
        "warmup_steps": cfg.optim.warmup_for(cfg.train.train_steps),
        "device": caps.describe(),
        "precision": describe_precision(choose_precision(cfg.train.precision, raw, caps), ds),
        "deepspeed": ds,
        "layout": str(layout),
        "config_hash": cfg.semantic_hash(),
    }
    print(json.dumps(resolved, indent=2))
    return 0


def cmd_convert_universal(args: argparse.Namespace) -> int:
    from .checkpoint import convert_to_universal, resolve_tag, verify_checkpoint

    ckpt = Path(args.checkpoint)
    source = resolve_tag(ckpt, args.tag)
    verify_checkpoint(ckpt, source, args.verify_checksums, what="convert")
    tag = convert_to_universal(ckpt, source)
    print(f"universal checkpoint: {ckpt / tag}")
    return 0
