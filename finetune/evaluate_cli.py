"""Per-exit evaluation: the layer-score curve (JSON + PNG) and GLUE/ELUE test prediction files.

`python -m finetune evaluate --model RUN_DIR/best --task RTE --data-dir GLUE --output OUT` writes
OUT/dev_scores.json, OUT/layer_curve.png and OUT/predictions/{TASK}.tsv (`index\\tprediction`, label names) from
the chosen exit (default: the last); `--all-exits` adds OUT/predictions/layer_{l}/{TASK}.tsv for every exit.
For MNLI the mismatched dev/test sets are scored too (MNLI-m.tsv and MNLI-mm.tsv).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common.cli import (
    add_command,
    add_data_dir,
    add_device,
    add_max_examples,
    add_output,
    add_switch,
    call_with_options,
)

from .evaluation import evaluate_model

EVALUATE_HELP = "per-exit dev scores (JSON + PNG curve) and GLUE/ELUE test prediction files"


def add_subparser(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "evaluate", main, EVALUATE_HELP, description=__doc__)
    p.add_argument("--model", required=True, help="a fine-tuned run's model directory (RUN_DIR/best)")
    p.add_argument("--task", help="task name (default: the one the model was fine-tuned on)")
    add_data_dir(p)
    add_output(p, "directory for dev_scores.json, layer_curve.png and predictions/")
    p.add_argument("--split", default="dev")
    add_switch(p, "--test", True, "write the test prediction files")
    add_switch(p, "--overwrite", False, "replace the evaluation of another model or configuration in --output")
    p.add_argument("--predict-exit", type=int, help="exit whose predictions go into the submission (default: last)")
    add_switch(p, "--all-exits", False, "also write predictions of every exit")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-length", type=int, help="default: the training run's, else 128")
    add_max_examples(p, help="score a seeded random subset of the split")
    add_device(p)


def main(args: argparse.Namespace) -> int:
    """`python -m finetune evaluate ...`"""
    result = call_with_options(evaluate_model, args, model_dir=args.model, task_name=args.task)
    for name, entry in result["tasks"].items():
        curve = ", ".join(f"L{k}: {v[entry['main_metric']]:.2f}" for k, v in entry["exits"].items())
        print(f"{name} {entry['split']} ({entry['examples']} examples) {entry['main_metric']} per exit: {curve}")
    print(f"wrote {Path(args.output) / 'dev_scores.json'}")
    return 0
