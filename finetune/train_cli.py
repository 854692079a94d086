"""`finetune train`: argparse front end of `TrainConfig` + `run_training`.

Values resolve as TrainConfig defaults < `--recipe` preset < options given on the command line (see `recipes.py`);
which options were given is read by parsing the command line a second time with every default suppressed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from functools import partial

from common.cli import add_max_examples, add_output, config_argument
from common.errors import ConfigError

from .config import TrainConfig, parse_exits
from .data import add_data_dir
from .recipes import load_recipe, recipe_names, resolve
from .trainer import run_training

EPILOG = """examples:
  # plain fine-tuning (one exit at the top), then static truncation to 3 layers
  python -m finetune train --model MODEL --task RTE --data-dir GLUE --output runs/rte
  python -m finetune train --model MODEL --task RTE --data-dir GLUE --layers 3 --output runs/rte-l3
  # multi-exit: all layers, MHA exits, two-stage training with ACL and ACL-Grad
  python -m finetune train --model MODEL --task SST-2 --data-dir GLUE --exits all --exit-type mha \\
      --method 2st --objective acl --acl-grad --output runs/sst2-2st-acl
  # a paper's recipe, with one value changed
  python -m finetune train --model MODEL --task RTE --data-dir GLUE --recipe elasticbert-static --lr 3e-5 \\
      --output runs/rte-static
The model lands in OUTPUT/best (load with elasticbert.load_pretrained(ElasticBertForSequenceClassification, dir)).
"""


def add_subparser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="fine-tune on a GLUE/ELUE task (static truncation, multi-exit JT/2ST/ALT, CE/SCL/ACL objectives)",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_train_arguments(p)
    p.set_defaults(func=_main)


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    """Every `train` option (also used, defaults suppressed, to find the options a command line gave)."""
    _data_arguments(p.add_argument_group("data and model"))
    _exit_arguments(p.add_argument_group("exits and method"))
    _objective_arguments(p.add_argument_group("objective"))
    _optimisation_arguments(p.add_argument_group("optimisation"))


def _exit_lr(text: str) -> float | None:
    """`--exit-lr`: a number, or 'same' (the backbone's --lr, the papers' single learning rate)."""
    if text.strip().lower() == "same":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'same', got {text!r}") from None


def _data_arguments(g: argparse._ArgumentGroup) -> None:
    option = partial(config_argument, g, TrainConfig)
    option(
        "model",
        required=True,
        help="model dir or hub name: our export, a fine-tuned run, a BERT/RoBERTa checkpoint, fnlp/elasticbert-base",
    )
    option("task", required=True, help="GLUE task (CoLA, SST-2, ...) or elue/NAME")
    add_data_dir(g)
    add_output(g, "run directory (a finished or running run there is refused; see --overwrite)")
    option("overwrite", help="replace a finished run in --output (a running one is never replaced)")
    option(
        "recipe",
        type=str,
        help=f"start from a paper's preset ({', '.join(recipe_names())}; finetune/presets/NAME.yaml) or a YAML "
        "file; options given explicitly override it",
    )
    option("tokenizer", help="tokenizer dir or hub name (default: --model's)")
    option("seed", help="seed of the exit heads, dropout, data order and training subset")
    add_max_examples(g, "train", help="a seeded random subset of N training examples")
    add_max_examples(g, "dev", help="a seeded random subset of N dev examples")
    option(
        "dev_subset_seed",
        help="seed of that subset (the same rows for every --seed, and for early-exit --max-examples)",
    )
    option("max_length", help="tokens per example")


def _exit_arguments(g: argparse._ArgumentGroup) -> None:
    option = partial(config_argument, g, TrainConfig)
    option("layers", help="static truncation: keep the first l layers (one exit at l)")
    option("exits", nargs="?", const="all", help="multi-exit: 'all' (default if bare) or e.g. 1,3,6")
    option("exit_type", help="exit head")
    option("mha_dim", help="MHA exit width d_e")
    option("mha_heads", help="MHA exit heads")
    option("method", help="multi-exit training method")
    option("jt_weights", help="JT loss weights per exit")
    option("stage2_epochs", help="2ST stage-2 epochs (default: --epochs)")
    option(
        "gradient_equilibrium",
        help="ElasticBERT's gradient equilibrium: rescale the gradients the exits send into the shared layers",
    )


def _objective_arguments(g: argparse._ArgumentGroup) -> None:
    option = partial(config_argument, g, TrainConfig)
    option("objective", help="per-exit loss")
    option("lam", "--lambda", help="contrastive weight λ")
    option("tau", help="contrastive temperature τ")
    option("contrastive_reduction", help="sum or mean over the anchors")
    option("kd_weight", help="β in (1−β)·CE + β·KD (default 0.5 in 2ST stage 2, else 0)")
    option("kd_temperature", help="KD temperature")
    option("acl_grad", help="drop the contrastive term when its gradient opposes the task's (ACL-Grad)")
    option("acl_grad_scope", help="tensors the gradient angle is measured over")
    option("acl_grad_threshold", help="degrees")
    option("acl_grad_granularity", help="gate per batch or per exit")
    option("log_angles", help="measure CE/contrastive gradient angles even with ACL-Grad off")


def _optimisation_arguments(g: argparse._ArgumentGroup) -> None:
    option = partial(config_argument, g, TrainConfig)
    option("lr", help="learning rate (AdamW)")
    option("weight_decay", help="AdamW weight decay (none on biases and LayerNorm)")
    option("warmup", help="linear warmup, as a fraction of the phase's steps")
    option("dropout", help="dropout of the backbone and the exits")
    option("epochs", help="epochs per phase")
    option("grad_clip", help="gradient-norm clip (0: off)")
    option(
        "exit_lr",
        type=_exit_lr,
        help="learning rate of the exit heads, or 'same' for --lr (the papers'); the default departs from the "
        "papers so that fresh (MHA) exits learn in short runs",
    )
    option("batch_size", help="training batch size")
    option("eval_batch_size", help="dev batch size")
    option("max_steps", help="steps per phase (overrides --epochs)")
    option("eval_every", help="evaluate every N steps (default: every epoch)")
    option(
        "early_stopping_patience",
        help="stop a phase after N evaluations in a row without a better dev score (default: never)",
    )
    option("deepspeed", help="DeepSpeed JSON config (optional)")
    option("device", help="where the model trains (auto: CUDA when available; a DeepSpeed engine places it itself)")
    option("progress", help="progress bar")


CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name != "provenance")


def explicit_options(argv: Sequence[str]) -> dict:
    """The TrainConfig values the `train` command line `argv` gives explicitly (defaults suppressed)."""
    quiet = argparse.ArgumentParser(add_help=False)
    add_train_arguments(quiet)
    for action in quiet._actions:
        action.default = argparse.SUPPRESS
        action.required = False
    given, _ = quiet.parse_known_args(list(argv))
    return {k: v for k, v in vars(given).items() if k in CONFIG_FIELDS}


def train_argv(args: argparse.Namespace) -> list[str] | None:
    """The command line after `train`, when the namespace came from `finetune.__main__.main` (else None)."""
    argv = getattr(args, "argv", None)
    if argv is None or "train" not in argv:
        return None
    return list(argv[argv.index("train") + 1 :])


def config_from_args(args: argparse.Namespace, argv: Sequence[str] | None = None) -> TrainConfig:
    """The run's TrainConfig: defaults < --recipe < explicit options (`argv`: the `train` command line; without it,
    options whose value differs from the default count as explicit)."""
    values = {k: getattr(args, k) for k in CONFIG_FIELDS if hasattr(args, k)}
    argv = argv if argv is not None else train_argv(args)
    if argv is not None:
        explicit = explicit_options(argv)
    else:
        defaults = TrainConfig(model="", task="", output="")
        explicit = {k: v for k, v in values.items() if v != getattr(defaults, k)}
    explicit.pop("recipe", None)
    recipe = load_recipe(values["recipe"]) if values.get("recipe") else None
    resolved, provenance = resolve(values, explicit, recipe)
    if isinstance(resolved.get("exits"), str):
        resolved["exits"] = parse_exits(resolved["exits"])
    try:
        return TrainConfig(**resolved, provenance=provenance)
    except TypeError as err:  # pragma: no cover - the fields come from TrainConfig itself
        raise ConfigError(f"train options: {err}") from None


def _main(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if cfg.recipe:
        overridden = ", ".join(cfg.provenance.get("overridden_by_flags", {})) or "none"
        print(
            f"recipe {cfg.recipe} ({cfg.provenance['recipe_file']}); overridden by flags: {overridden}", file=sys.stderr
        )
    summary = run_training(cfg)
    best = summary["best"]
    curve = ", ".join(f"L{k}: {v[summary['main_metric']]:.2f}" for k, v in best["exits"].items())
    print(
        f"{summary['task']}: best ({best['phase']}, step {best['step']}) dev {summary['main_metric']} per exit: {curve}"
    )
    print(json.dumps({"output": args.output, "seconds": summary["seconds"]}))
    return 0
