"""`python -m finetune hashee-score`: a HashEE model's score, FLOPs, ELUE points and submission files
(`hashee_report.py`; training is `finetune train --method hashee`)."""

from __future__ import annotations

import argparse

from common.cli import (
    add_command,
    add_data_dir,
    add_device,
    add_max_examples,
    add_output,
    add_switch,
    call_with_options,
)

from . import hashee_report
from .config import TrainConfig

HELP = "HashEE (token-level exit): score, FLOPs per sample, ELUE points and submission files of a trained model"


def add_subparser(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "hashee-score", main, HELP, description=hashee_report.__doc__)
    p.add_argument("--model", required=True, help="a HashEE run's model directory (RUN_DIR/best)")
    p.add_argument("--task", help="task name (default: the one the model was fine-tuned on)")
    add_data_dir(p)
    add_output(p, "directory for hashee_scores.json, elue_points.json and submission/")
    p.add_argument("--split", default="dev")
    add_max_examples(p, help="score a seeded random subset of the split")
    p.add_argument("--max-length", type=int, help="default: the training run's, else 128")
    p.add_argument("--batch-size", type=int, default=64)
    add_switch(p, "--submission", False, "also write ELUE submission files for the test split (OUTPUT/submission/)")
    add_switch(p, "--overwrite", False, "replace the HashEE scores of another model or configuration in --output")
    add_device(p, TrainConfig)


def main(args: argparse.Namespace) -> int:
    report = call_with_options(hashee_report.hashee_score, args)
    entry = report[args.split]
    score = f"{entry['score']:.2f}, " if "score" in entry else ""
    print(
        f"{report['task']} {args.split} ({entry['examples']} examples): score {score}mean FLOPs "
        f"{entry['mean_flops'] / 1e6:.1f} M ({entry['flops_speedup']:.2f}x fewer than every token at every layer); "
        f"wrote {args.output}"
    )
    return 0
