"""`python -m finetune export`: a fine-tuned model (RUN/best, or any model directory we saved) in another checkpoint
layout.

`--layout fnlp`: the released ElasticBERT layout, for the official fine-tuning and inference code (fastnlp/ElasticBERT
on transformers 4.x). A model with one linear exit becomes its static ElasticBertForSequenceClassification
(`classifier`, num_output_layers 1, num_hidden_layers = the exit's layer); one with a linear exit on every layer
from 1 up its dynamic (entropy / patience) one (`classifiers.{i}`, num_output_layers = num_hidden_layers). Other
exit sets and MHA exits are refused, saying why. Weights are written twice, `pytorch_model.bin` (what that code's
transformers reads) and `model.safetensors`; config.json carries the official fields; the tokenizer files are
copied. The directory is written beside OUTPUT and renamed when complete. See `elasticbert.fnlp_export`.
"""

from __future__ import annotations

import argparse

from common.cli import add_command, add_output, add_switch
from elasticbert.fnlp_export import export_fnlp

EPILOG = """example:
  python -m finetune export --model runs/sst2/best --output exports/sst2_fnlp --layout fnlp
"""


EXPORT_HELP = (
    "write a fine-tuned model in the official ElasticBERT layout (--layout fnlp: pytorch_model.bin + safetensors)"
)


def add_subparser(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "export", main, EXPORT_HELP, description=__doc__, epilog=EPILOG)
    p.add_argument("--model", required=True, help="fine-tuned model directory (RUN/best) or hub name")
    add_output(p, "the directory to write (whole, or nothing on an error)", metavar="DIR")
    p.add_argument(
        "--layout",
        choices=("fnlp",),
        default="fnlp",
        help="fnlp: the official ElasticBERT code's layout (our own is what train already writes) (default: fnlp)",
    )
    add_switch(p, "--overwrite", False, "replace an existing non-empty --output")


def main(args: argparse.Namespace) -> int:
    """`python -m finetune export ...`"""
    layout = export_fnlp(args.model, args.output, overwrite=args.overwrite)
    print(f"exported {args.model} -> {args.output} ({layout.describe()})")
    return 0
