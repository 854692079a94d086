"""ACL diagnostics: one exit's representations and label embeddings, what `plot-embeddings` projects (the command
line is `cli.py`; the figures are in `finetune/plots.py`)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from common.errors import ConfigError
from common.hub import resolve_pretrained

from ..data import EncodedSplit, forward_in_order, load_tokenizer, subsample
from ..model import check_max_length, label_embeddings, load_finetuned, model_device, resolve_device
from ..task_check import check_data_fits, check_task_fits
from ..tasks import DataError, load_split
from .evaluation import task_for


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
    if note := check_task_fits(model.config, task, model_dir):  # another task's rows through this head: refused
        print(f"finetune: note: {note}", file=sys.stderr, flush=True)
    if note := check_data_fits(task, data_dir, [split], task_given=task_name is not None):
        print(f"finetune: note: {note}", file=sys.stderr, flush=True)
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
