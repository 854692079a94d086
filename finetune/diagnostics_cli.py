"""`python -m finetune plot-angles` and `plot-embeddings`: the ACL diagnostics' figures (drawn by `plots.py`).

- `python -m finetune plot-angles RUN [--output PNG]`: histogram and per-step trace of the angle between the CE and
  contrastive gradients from RUN/acl_diagnostics.json (batches ACL-Grad dropped in red).
- `python -m finetune plot-embeddings --model RUN/best --task T --data-dir D --layer l [--method tsne|pca]`:
  exit l's L2-normalised representations h^e of dev examples and its K label embeddings (classifier rows), projected
  together, as the paper's visualisation; the raw arrays go to an .npz beside the PNG.
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
from common.outputs import Output, check_output

from .diagnostics import exit_embeddings
from .plots import plot_angles, plot_embeddings, read_angles


def _starts_with(magic: bytes) -> object:
    def own(path: Path) -> bool:
        try:
            with open(path, "rb") as handle:
                return handle.read(len(magic)) == magic
        except OSError:
            return False

    return own


PNG = Output("a plot command", "a PNG figure", own=_starts_with(b"\x89PNG\r\n\x1a\n"))
ARRAYS = Output("plot-embeddings", "the figure's arrays (.npz)", own=_starts_with(b"PK\x03\x04"))

PLOT_ANGLES_HELP = "histogram/trace of CE vs contrastive gradient angles of a run"
PLOT_EMBEDDINGS_HELP = "t-SNE/PCA of one exit's representations + label embeddings"


def add_subparser(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "plot-angles", angles_main, PLOT_ANGLES_HELP)
    p.add_argument("run", help="run directory (or its acl_diagnostics.json)")
    add_output(p, "PNG path (default: RUN/angles.png)", required=False)
    add_switch(p, "--overwrite", False, "replace an existing PNG these commands wrote (never another file)")

    p = add_command(subparsers, "plot-embeddings", embeddings_main, PLOT_EMBEDDINGS_HELP)
    p.add_argument("--model", required=True, help="fine-tuned model dir (RUN/best)")
    p.add_argument("--task", help="default: the model's fine-tuning task")
    add_data_dir(p)
    p.add_argument("--layer", type=int, help="exit layer (default: last)")
    p.add_argument("--split", default="dev")
    add_max_examples(p, default=500, help="a seeded random subset of N examples of the split (default: 500)")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--method", choices=("tsne", "pca"), default="tsne")
    add_device(p)
    add_output(p, "PNG path (arrays go to the same name with .npz)")
    add_switch(p, "--overwrite", False, "replace an existing PNG and .npz this command wrote (never another file)")


def angles_main(args: argparse.Namespace) -> int:
    """`python -m finetune plot-angles ...`"""
    source, _ = read_angles(args.run)
    check_output(args.output or source.parent / "angles.png", PNG, [("RUN", source)], args.overwrite)
    print(f"wrote {plot_angles(args.run, args.output)}")
    return 0


def embeddings_main(args: argparse.Namespace) -> int:
    """`python -m finetune plot-embeddings ...`"""
    read = [("--model", args.model), ("--data-dir", args.data_dir)]
    check_output(args.output, PNG, read, args.overwrite)
    check_output(Path(args.output).with_suffix(".npz"), ARRAYS, read, args.overwrite, flag="--output (.npz)")
    arrays = call_with_options(exit_embeddings, args, model_dir=args.model, task_name=args.task)
    print(f"wrote {plot_embeddings(arrays, args.output, args.method)}")
    return 0
