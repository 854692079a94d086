"""`python -m finetune export`: a fine-tuned model (RUN/best, or any model directory we saved) in another checkpoint
layout.

`--layout fnlp`: the released ElasticBERT layout, for the official fine-tuning and inference code (fastnlp/ElasticBERT
on transformers 4.x). A model with one linear exit becomes its static ElasticBertForSequenceClassification
(`classifier`, num_output_layers 1, num_hidden_layers = the exit's layer); one with a linear exit on every layer
from 1 up its dynamic (entropy / patience) one (`classifiers.{i}`, num_output_layers = num_hidden_layers). Other
exit sets and MHA exits are refused, saying why. Weights are written twice, `pytorch_model.bin` (what that code's
transformers reads) and `model.safetensors`; config.json carries the official fields; the tokenizer files are
copied. The directory is written beside OUTPUT and renamed when complete. See `elasticbert.fnlp_export`.

`--layout onnx` (or `--format onnx`): the model as ONNX pieces early exit can stop between — one per layer, its exit
head fused in and the embeddings ahead of the first (fp32 and int8: per-channel weights, one activation scale per
token) — with its tokenizer, its saved early-exit setting
(`save-early-exit` first) and checksums, one directory to copy to a server; `predict --runtime onnxruntime` and
`EarlyExitClassifier.from_pretrained(DIR, runtime="onnxruntime")` serve it with the same engine and rules. Needs
`pip install '.[export]'` (onnx, onnxruntime). See `finetune.onnx_export`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common.cli import add_command, add_output, add_switch
from common.errors import ConfigError
from common.hub import resolve_pretrained
from elasticbert.fnlp_export import export_fnlp
from elasticbert.loading import read_config

from .onnx_export import export_onnx
from .predict import trained_max_length


def check_max_length_of_config(directory: Path, max_length: int) -> None:
    """`--max-length` within what the model embeds (1..max_position_embeddings), before any export work."""
    config = read_config(directory)
    limit = int(config.get("max_sequence_length") or config.get("max_position_embeddings") or 512)
    if not 1 <= max_length <= limit:
        raise ConfigError(f"--max-length {max_length}: {directory} embeds 1..{limit} positions")


EPILOG = """examples:
  python -m finetune export --model runs/sst2/best --output exports/sst2_fnlp --layout fnlp
  python -m finetune save-early-exit --model runs/sst2/best --operating-point runs/ee/early_exit_SST-2_dev_bs32.json
  python -m finetune export --model runs/sst2/best --output exports/sst2_onnx --format onnx
  python -m finetune predict --model exports/sst2_onnx --runtime onnxruntime --input reviews.txt
"""


EXPORT_HELP = (
    "write a fine-tuned model in the official ElasticBERT layout (--layout fnlp) or as ONNX pieces for early exit "
    "on ONNX Runtime (--layout onnx)"
)


def add_subparser(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "export", main, EXPORT_HELP, description=__doc__, epilog=EPILOG)
    p.add_argument("--model", required=True, help="fine-tuned model directory (RUN/best) or hub name")
    add_output(p, "the directory to write (whole, or nothing on an error)", metavar="DIR")
    p.add_argument(
        "--layout",
        "--format",
        dest="layout",
        choices=("fnlp", "onnx"),
        default="fnlp",
        help="fnlp: the official ElasticBERT code's layout (our own is what train already writes); onnx: ONNX "
        "pieces (embeddings, layers fp32+int8, exits) for `predict --runtime onnxruntime` (default: fnlp)",
    )
    p.add_argument(
        "--max-length",
        type=int,
        default=None,
        metavar="N",
        help="onnx: the tokens per input its predictions use (default: the training run's, else 128)",
    )
    add_switch(p, "--overwrite", False, "replace an existing non-empty --output")


def main(args: argparse.Namespace) -> int:
    """`python -m finetune export ...`"""
    if args.layout == "onnx":
        directory = resolve_pretrained(args.model, what="--model")
        max_length = args.max_length or trained_max_length(Path(directory))
        check_max_length_of_config(directory, max_length)
        manifest = export_onnx(directory, args.output, max_length=max_length, overwrite=args.overwrite)
        steps = manifest["pieces"]["steps"]["fp32"]
        print(
            f"exported {args.model} -> {args.output} (ONNX: {len(steps)} steps - layer, its exit, the embeddings "
            f"ahead of the first - in fp32 and int8, exits {manifest['exit_layers']}, max_length {max_length})"
        )
        return 0
    if args.max_length is not None:
        raise ConfigError("--max-length is an option of --layout onnx")
    layout = export_fnlp(args.model, args.output, overwrite=args.overwrite)
    print(f"exported {args.model} -> {args.output} ({layout.describe()})")
    return 0
