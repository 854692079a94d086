"""`finetune train`: argparse front end of `TrainConfig` + `run_training`."""

from __future__ import annotations

import argparse
import json
from functools import partial

from common.cli import add_max_examples, add_output, config_argument

from .config import TrainConfig, parse_exits
from .data import add_data_dir
from .trainer import run_training

EPILOG = """examples:
  # plain fine-tuning (one exit at the top), then static truncation to 3 layers
  python -m finetune train --model MODEL --task RTE --data-dir GLUE --output runs/rte
  python -m finetune train --model MODEL --task RTE --data-dir GLUE --layers 3 --output runs/rte-l3
  # multi-exit: all layers, MHA exits, two-stage training with ACL and ACL-Grad
  python -m finetune train --model MODEL --task SST-2 --data-dir GLUE --exits all --exit-type mha \\
      --method 2st --objective acl --acl-grad --output runs/sst2-2st-acl
The model lands in OUTPUT/best (load with elasticbert.load_pretrained(ElasticBertForSequenceClassification, dir)).
"""


def add_subparser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="fine-tune on a GLUE/ELUE task (static truncation, multi-exit JT/2ST/ALT, CE/SCL/ACL objectives)",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _data_arguments(p.add_argument_group("data and model"))
    _exit_arguments(p.add_argument_group("exits and method"))
    _objective_arguments(p.add_argument_group("objective"))
    _optimisation_arguments(p.add_argument_group("optimisation"))
    p.set_defaults(func=_main)


def _data_arguments(g: argparse._ArgumentGroup) -> None:
    option = partial(config_argument, g, TrainConfig)
    option("model", required=True, help="HF dir: our export, a fine-tuned run, a BERT checkpoint, fnlp")
    option("task", required=True, help="GLUE task (CoLA, SST-2, ...) or elue/NAME")
    add_data_dir(g)
    add_output(g, "run directory")
    option("tokenizer", help="tokenizer dir (default: --model)")
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
    option("exit_lr", help="learning rate of the exit heads (default: --lr)")
    option("batch_size", help="training batch size")
    option("eval_batch_size", help="dev batch size")
    option("max_steps", help="steps per phase (overrides --epochs)")
    option("eval_every", help="evaluate every N steps (default: every epoch)")
    option("deepspeed", help="DeepSpeed JSON config (optional)")
    option("progress", help="progress bar")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    fields = TrainConfig.__dataclass_fields__
    values = {k: v for k, v in vars(args).items() if k in fields and k != "extra"}
    values["exits"] = parse_exits(args.exits)
    return TrainConfig(**values)


def _main(args: argparse.Namespace) -> int:
    summary = run_training(config_from_args(args))
    best = summary["best"]
    curve = ", ".join(f"L{k}: {v[summary['main_metric']]:.2f}" for k, v in best["exits"].items())
    print(
        f"{summary['task']}: best ({best['phase']}, step {best['step']}) dev {summary['main_metric']} per exit: {curve}"
    )
    print(json.dumps({"output": args.output, "seconds": summary["seconds"]}))
    return 0
