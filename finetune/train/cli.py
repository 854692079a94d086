"""`finetune train`: the command line of `FinetuneConfig` + `run_training`.

Values resolve as the config's defaults < `--config FILE` (or `--recipe NAME`, a preset) < the shortcut flags
(`--lr`, `--exits`, ... each one config key) < `--set section.key=value`; the command line is parsed once (a
shortcut is in the namespace only when given, `common.cli.config_argument(shortcut=True)`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common.cli import add_command, add_output, add_switch, config_argument, given_config_keys
from common.config import RENAMED_KEYS
from common.preemption import Preempted

from ..config import (
    DEPRECATED_FLAGS,
    FinetuneConfig,
    flag,
    load_config_file,
    parse_exit_lr,
    recipe_names,
    resolve_config,
)
from .run_dir import check_run_dir
from .trainer import run_training

EPILOG = """examples:
  # plain fine-tuning (one exit at the top), then static truncation to 3 layers
  python -m finetune train --model MODEL --task RTE --data-dir GLUE --output runs/rte
  python -m finetune train --model MODEL --task RTE --data-dir GLUE --layers 3 --output runs/rte-l3
  # multi-exit: all layers, MHA exits, two-stage training with ACL and ACL-Grad
  python -m finetune train --model MODEL --task SST-2 --data-dir GLUE --exits all --exit-type mha \\
      --method 2st --objective acl --acl-grad --output runs/sst2-2st-acl
  # a paper's recipe, with one value changed (a flag, or any key with --set)
  python -m finetune train --model MODEL --task RTE --data-dir GLUE --recipe elasticbert-static --lr 3e-5 \\
      --set train.eval_every=100 --output runs/rte-static
  # everything in a file of the presets' shape (finetune/presets/*.yaml)
  python -m finetune train --config my_run.yaml --output runs/mine
The model lands in OUTPUT/best (load with elasticbert.load_pretrained(ElasticBertForSequenceClassification, dir)).
SIGTERM / SIGUSR1 (Slurm's preemption and time-limit signals) save a resume checkpoint in OUTPUT/resume before the
next step and exit 75; the same command resumes the run, which ends as an uninterrupted one would have.
"""


TRAIN_HELP = "fine-tune on a GLUE/ELUE task (static truncation, multi-exit JT/2ST/ALT, CE/SCL/ACL objectives)"


def add_subparser(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "train", _main, TRAIN_HELP, epilog=EPILOG)
    _run_arguments(p.add_argument_group("run"))
    for title, rows in OPTIONS.items():
        group = p.add_argument_group(title)
        for key, help in rows:
            config_argument(
                group, FinetuneConfig, key, flag(key), shortcut=True, help=help, **ARGPARSE_EXTRA.get(key, {})
            )
    old = p.add_argument_group("renamed (accepted until the next release, with a deprecation line)")
    for key, new in RENAMED_KEYS["finetune"].items():  # typed as the new key; the old key as dest, renamed on load
        config_argument(old, FinetuneConfig, new, flag(key), shortcut=True, help=DEPRECATED_FLAGS[key], dest=key,
                        **ARGPARSE_EXTRA.get(new, {}))  # fmt: skip


def _run_arguments(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--config",
        "--recipe",
        dest="config",
        metavar="FILE|NAME",
        help=f"a config file (YAML, the presets' shape) or a shipped preset by name ({', '.join(recipe_names())}; "
        "finetune/presets/NAME.yaml); flags and --set override it",
    )
    g.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set any config key, e.g. --set optim.warmup_fraction=0.06 (repeatable; values parsed as YAML)",
    )
    add_output(
        g,
        "run directory (a finished or running run there is refused, see --overwrite; a preempted one is resumed)",
    )
    add_switch(
        g,
        "--overwrite",
        False,
        "replace a finished run in --output, or start a preempted one over (a running one is never replaced)",
    )


# One shortcut flag per config key (`config.flag(key)` spells it), by help group.
OPTIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "model": (
        ("model.path", "model dir or hub name: our export, a fine-tuned run, a BERT/RoBERTa checkpoint, "
         "fnlp/elasticbert-base"),
        ("model.tokenizer", "tokenizer dir or hub name (default: --model's)"),
        ("model.layers", "static truncation: keep the first l layers (one exit at l)"),
        ("model.exits", "multi-exit: 'all' (default if bare) or e.g. 1,3,6"),
        ("model.exit_type", "exit head"),
        ("model.mha_dim", "MHA exit width d_e"),
        ("model.mha_heads", "MHA exit heads"),
        ("model.dropout", "dropout of the backbone and the exits"),
    ),
    "data": (
        ("data.task", "GLUE task (CoLA, SST-2, ...) or elue/NAME"),
        ("data.dir", "GLUE/ELUE data root or one task's folder; hf:NAME reads GLUE from the Hugging Face hub "
         "(default: $GLUE_DIR when set, else the hub)"),
        ("data.max_length", "tokens per example"),
        ("data.max_train_examples", "a seeded random subset of N training examples"),
        ("data.max_dev_examples", "a seeded random subset of N dev examples"),
        ("data.max_unk_fraction", "refuse a tokenizer that makes more of the training text [UNK] (1: never)"),
        ("data.dev_subset_seed", "seed of that subset (the same rows for every --seed, and for early-exit "
         "--max-examples)"),
        ("data.group_by_length", "training batches of similar-length examples (less padding; other batches)"),
    ),
    "method": (
        ("method.name", "multi-exit training method"),
        ("method.jt_weights", "JT loss weights per exit"),
        ("method.gradient_equilibrium", "ElasticBERT's gradient equilibrium: rescale the gradients the exits send "
         "into the shared layers"),
        ("method.stage2_epochs", "2ST stage-2 epochs (default: --epochs)"),
    ),
    "objective": (
        ("objective.name", "per-exit loss"),
        ("objective.lam", "contrastive weight λ"),
        ("objective.tau", "contrastive temperature τ"),
        ("objective.contrastive_reduction", "mean (default) or sum (the formula's Σ) over the anchors"),
        ("objective.kd_weight", "β in (1−β)·CE + β·KD (default 0.5 in 2ST stage 2, else 0)"),
        ("objective.kd_temperature", "KD temperature"),
        ("objective.acl_grad", "drop the contrastive term when its gradient opposes the task's (ACL-Grad)"),
        ("objective.acl_grad_scope", "tensors the gradient angle is measured over"),
        ("objective.acl_grad_threshold", "degrees"),
        ("objective.acl_grad_granularity", "gate per batch or per exit"),
        ("objective.log_angles", "measure CE/contrastive gradient angles even with ACL-Grad off"),
    ),
    "optimisation": (
        ("optim.lr", "learning rate (AdamW)"),
        ("optim.exit_lr", "learning rate of the exit heads, or 'same' for --lr (the papers'); the default departs "
         "from the papers so that fresh (MHA) exits learn in short runs"),
        ("optim.weight_decay", "AdamW weight decay (none on biases and LayerNorm)"),
        ("optim.warmup_fraction", "linear warm-up over this fraction of the phase's steps ('null' with "
         "--warmup-steps)"),
        ("optim.warmup_steps", "linear warm-up over this many steps of each phase (instead of --warmup-fraction)"),
        ("optim.grad_clip", "gradient-norm clip (0: off)"),
    ),
    "training": (
        ("train.seed", "seed of the exit heads, dropout, data order and training subset"),
        ("train.epochs", "epochs per phase"),
        ("train.train_steps", "steps per phase (overrides --epochs)"),
        ("train.batch_size", "training batch size"),
        ("train.eval_batch_size", "dev batch size"),
        ("train.eval_every", "evaluate every N steps (default: every epoch)"),
        ("train.early_stopping_patience", "stop a phase after N evaluations in a row without a better dev score "
         "(default: never)"),
        ("train.device", "where the model trains (auto: CUDA when available; a DeepSpeed engine places it itself)"),
        ("train.ds_config", "DeepSpeed JSON config (optional)"),
        ("train.progress", "progress bar"),
    ),
}  # fmt: skip


def _exit_lr(text: str) -> float | None:
    """`--exit-lr`: a number, or 'same' (the backbone's --lr, the papers' single learning rate)."""
    value = parse_exit_lr(text)
    try:
        return None if value is None else float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'same', got {text!r}") from None


def _fraction(text: str) -> float | None:
    """`--warmup-fraction`: a number, or 'null' / 'none' (a warm-up in --warmup-steps instead)."""
    if text.strip().lower() in ("null", "none"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'null', got {text!r}") from None


ARGPARSE_EXTRA: dict[str, dict] = {
    "model.exits": {"nargs": "?", "const": "all", "type": str},
    "optim.exit_lr": {"type": _exit_lr},
    "optim.warmup_fraction": {"type": _fraction},
    "data.max_train_examples": {"metavar": "N"},
    "data.max_dev_examples": {"metavar": "N"},
}


def config_from_args(args: argparse.Namespace) -> tuple[FinetuneConfig, dict[str, str]]:
    """The run's config and the source of every value (see the module docstring for the order)."""
    file = load_config_file(args.config) if args.config else None
    return resolve_config(file, given_config_keys(args), args.overrides)


def _main(args: argparse.Namespace) -> int:
    cfg, sources = config_from_args(args)
    if args.config:
        changed = sorted(k for k, v in sources.items() if v.startswith("-"))
        print(f"{args.config}: overridden on the command line: {', '.join(changed) or 'nothing'}", file=sys.stderr)
    read = [("--model", cfg.model.path), ("--tokenizer", cfg.model.tokenizer), ("--data-dir", cfg.data.dir)]
    read += [("--ds-config", cfg.train.ds_config)]
    check_run_dir(Path(args.output), args.overwrite, [*read, ("--config", args.config)])
    try:
        summary = run_training(cfg, args.output, args.overwrite, sources)
    except Preempted as stop:  # saved (or nothing to save yet): one line, and the requeue code
        if str(stop):
            print(f"finetune: {stop} (exit {stop.exit_code})", file=sys.stderr, flush=True)
        return stop.exit_code
    best = summary["best"]
    curve = ", ".join(f"L{k}: {v[summary['main_metric']]:.2f}" for k, v in best["exits"].items())
    print(
        f"{summary['task']}: best ({best['phase']}, step {best['step']}) dev {summary['main_metric']} per exit: {curve}"
    )
    print(json.dumps({"output": args.output, "seconds": summary["seconds"]}))
    return 0
