"""ACL diagnostics: the `plot-angles` and `plot-embeddings` commands (the figures themselves are in `plots.py`).

- `python -m finetune plot-angles RUN [--output PNG]`: histogram and per-step trace of the angle between the CE and
  contrastive gradients from RUN/acl_diagnostics.json (batches ACL-Grad dropped in red).
- `python -m finetune plot-embeddings --model RUN/best --task T --data-dir D --layer l [--method tsne|pca]`:
  exit l's L2-normalised representations h^e of dev examples and its K label embeddings (classifier rows), projected
  together, as the paper's visualisation; the raw arrays go to an .npz beside the PNG.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from common.cli import add_max_examples, add_output
from common.errors import ConfigError
from common.hub import resolve_pretrained

from .data import EncodedSplit, add_data_dir, forward_in_order, load_tokenizer, subsample
from .evaluation import task_for
from .model import add_device, check_max_length, label_embeddings, load_finetuned, model_device, resolve_device
from .plots import plot_angles, plot_embeddings
from .tasks import DataError, load_split


@torch.inference_mode()
def exit_embeddings(
    model_dir: str | Path,
    task_name: str | None,
    data_dir: str | None,
    layer: int | None,
    split: str = "dev",
    max_examples: int | None = 500,
    max_length: int = 128,
    batch_size: int = 64,
    device: str = "auto",
) -> dict[str, np.ndarray]:
    """Exit `layer`'s representations, labels and label embeddings (both L2-normalised) for a split's examples."""
    if max_examples is not None and max_examples < 1:
        raise ConfigError(f"--max-examples must be >= 1, got {max_examples}")
    place = resolve_device(device)
    model_dir = resolve_pretrained(model_dir, what="--model")
    model = load_finetuned(model_dir, purpose="plotting them").eval().to(place)
    task = task_for(model, task_name)
    if task.is_regression:
        raise DataError(f"task {task.name} is regression: it has no label embeddings to plot")
    layer = layer or model.exit_layers[-1]
    if layer not in model.exit_layers:
        raise DataError(f"--layer {layer}: the model's exits are {list(model.exit_layers)}")
    if layer in model.untrained_exits:
        raise DataError(f"--layer {layer}: that exit of {model_dir} was never trained (its head is random)")
    check_max_length(model, max_length, model_dir)
    tokenizer = load_tokenizer(model_dir)
    examples = subsample(load_split(task, data_dir, split), max_examples)
    encoded = EncodedSplit.from_examples(tokenizer, examples, max_length)

    def forward(ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        return model(ids, mask, types, exit_layers=[layer]).representations[0].float()

    reps, _ = forward_in_order(forward, encoded.batches(batch_size, device=model_device(model)))
    z = torch.nn.functional.normalize(reps, dim=-1).numpy()
    emb = torch.nn.functional.normalize(label_embeddings(model, layer).detach().float().cpu(), dim=-1).numpy()
    return {
        "representations": z,
        "labels": np.asarray([e.label for e in examples]),
        "label_embeddings": emb,
        "label_names": np.asarray(task.label_names),
        "layer": np.asarray(layer),
    }


def add_subparser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plot-angles", help="histogram/trace of CE vs contrastive gradient angles of a run")
    p.add_argument("run", help="run directory (or its acl_diagnostics.json)")
    add_output(p, "PNG path (default: RUN/angles.png)", required=False)
    p.set_defaults(func=lambda a: print(f"wrote {plot_angles(a.run, a.output)}") or 0)

    p = subparsers.add_parser("plot-embeddings", help="t-SNE/PCA of one exit's representations + label embeddings")
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
    p.set_defaults(func=_embeddings_main)


def _embeddings_main(args: argparse.Namespace) -> int:
    arrays = exit_embeddings(
        args.model,
        args.task,
        args.data_dir,
        args.layer,
        args.split,
        args.max_examples,
        args.max_length,
        device=args.device,
    )
    print(f"wrote {plot_embeddings(arrays, args.output, args.method)}")
    return 0
