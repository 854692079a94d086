"""ACL diagnostics: the CE/contrastive gradient-angle plot and a t-SNE/PCA view of one exit's representations.

- `python -m finetune plot-angles RUN [--output PNG]`: histogram and per-step trace of the angle between the CE and
  contrastive gradients from RUN/acl_diagnostics.json (batches ACL-Grad dropped in red).
- `python -m finetune plot-embeddings --model RUN/best --task T --data-dir D --layer l [--method tsne|pca]`:
  exit l's L2-normalised representations h^e of dev examples and its K label embeddings (classifier rows), projected
  together, as the paper's visualisation; the raw arrays go to an .npz beside the PNG.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from .data import encode_examples, load_tokenizer, subsample
from .tasks import DataError, load_split


def _pyplot():  # noqa: ANN202 - matplotlib's module
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_angles(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Angle histogram + trace (PNG) from a run's acl_diagnostics.json."""
    run_dir = Path(run_dir)
    source = run_dir / "acl_diagnostics.json" if run_dir.is_dir() else run_dir
    if not source.is_file():
        raise DataError(f"{source}: no ACL diagnostics (train with a contrastive --objective to record angles)")
    diag = json.loads(source.read_text(encoding="utf-8"))
    records = [r for r in diag["records"] if r["angle"] is not None]
    if not records:
        raise DataError(f"{source}: no measured angles")
    angles = np.array([r["angle"] for r in records])
    dropped = np.array([bool(r["dropped"]) for r in records])
    plt = _pyplot()
    fig, (hist, trace) = plt.subplots(1, 2, figsize=(10, 3.6))
    hist.hist(angles, bins=min(36, max(5, len(angles) // 3)), range=(0, 180), color="tab:blue", alpha=0.8)
    hist.axvline(90, color="k", ls="--", lw=1)
    hist.axvline(diag["threshold"], color="tab:red", ls=":", lw=1, label=f"threshold {diag['threshold']:g}°")
    hist.set_xlabel("angle between ∇CE and ∇contrastive (degrees)")
    hist.set_ylabel("batches")
    over = diag.get("fraction_over_90")
    hist.set_title(f"{len(angles)} batches, {100 * (over or 0):.1f}% > 90°, scope {diag['scope']}", fontsize=9)
    hist.legend(fontsize=8)
    x = np.arange(1, len(angles) + 1)
    trace.plot(x, angles, lw=0.8, color="tab:blue")
    if dropped.any():
        trace.scatter(x[dropped], angles[dropped], s=10, color="tab:red", label="dropped by ACL-Grad", zorder=3)
        trace.legend(fontsize=8)
    trace.axhline(90, color="k", ls="--", lw=1)
    trace.set_xlabel("training step (all phases)")
    trace.set_ylabel("angle (degrees)")
    rate = diag.get("drop_rate")
    trace.set_title(f"ACL-Grad {'on' if diag['acl_grad'] else 'off'}, drop rate {100 * (rate or 0):.1f}%",
                    fontsize=9)
    fig.tight_layout()
    path = Path(output) if output else (source.parent / "angles.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


@torch.inference_mode()
def exit_embeddings(
    model_dir: str | Path, task_name: str | None, data_dir: str | None, layer: int | None, split: str = "dev",
    max_examples: int | None = 500, max_length: int = 128, batch_size: int = 64,
) -> dict[str, np.ndarray]:
    """Exit `layer`'s representations, labels and label embeddings (both L2-normalised) for a split's examples."""
    from .evaluation import task_for
    from .model import label_embeddings, load_finetuned

    model = load_finetuned(model_dir).eval()
    task = task_for(model, task_name)
    if task.is_regression:
        raise DataError(f"task {task.name} is regression: it has no label embeddings to plot")
    layer = layer or model.exit_layers[-1]
    if layer not in model.exit_layers:
        raise DataError(f"--layer {layer}: the model's exits are {list(model.exit_layers)}")
    tokenizer = load_tokenizer(model_dir)
    examples = subsample(load_split(task, data_dir, split), max_examples)
    reps = []
    for start in range(0, len(examples), batch_size):
        batch = encode_examples(tokenizer, examples[start : start + batch_size], max_length)
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], exit_layers=[layer])
        reps.append(out.representations[0].float())
    z = torch.nn.functional.normalize(torch.cat(reps), dim=-1).numpy()
    emb = torch.nn.functional.normalize(label_embeddings(model, layer).detach().float(), dim=-1).numpy()
    return {
        "representations": z,
        "labels": np.asarray([e.label for e in examples]),
        "label_embeddings": emb,
        "label_names": np.asarray(task.label_names),
        "layer": np.asarray(layer),
    }


def project(points: np.ndarray, method: str, seed: int = 0) -> np.ndarray:
    """2-D projection of [M, d] points: PCA or t-SNE (perplexity adapted to small M)."""
    if method == "pca":
        from sklearn.decomposition import PCA

        return PCA(n_components=2, random_state=seed).fit_transform(points)
    if method == "tsne":
        from sklearn.manifold import TSNE

        perplexity = float(min(30, max(2, (len(points) - 1) // 3)))
        return TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(points)
    raise ValueError(f"projection must be 'pca' or 'tsne', not {method!r}")


def plot_embeddings(arrays: dict[str, np.ndarray], output: str | Path, method: str = "tsne") -> Path:
    """Scatter of the projected representations coloured by label, label embeddings as stars; writes PNG + .npz."""
    z, labels, emb = arrays["representations"], arrays["labels"], arrays["label_embeddings"]
    xy = project(np.concatenate([z, emb]), method)
    points, anchors = xy[: len(z)], xy[len(z) :]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 4.5))
    colours = plt.get_cmap("tab10")
    for k, name in enumerate(arrays["label_names"]):
        mask = labels == k
        ax.scatter(points[mask, 0], points[mask, 1], s=8, alpha=0.6, color=colours(k), label=str(name))
        ax.scatter(anchors[k, 0], anchors[k, 1], s=260, marker="*", color=colours(k), edgecolors="k", zorder=3)
    ax.set_title(f"exit {int(arrays['layer'])}: h^e and label embeddings (★), {method.upper()}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    np.savez(path.with_suffix(".npz"), **arrays)
    return path


def add_subparser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plot-angles", help="histogram/trace of CE vs contrastive gradient angles of a run")
    p.add_argument("run", help="run directory (or its acl_diagnostics.json)")
    p.add_argument("--output", help="PNG path (default: RUN/angles.png)")
    p.set_defaults(func=lambda a: print(f"wrote {plot_angles(a.run, a.output)}") or 0)

    p = subparsers.add_parser("plot-embeddings", help="t-SNE/PCA of one exit's representations + label embeddings")
    p.add_argument("--model", required=True, help="fine-tuned model dir (RUN/best)")
    p.add_argument("--task", help="default: the model's fine-tuning task")
    p.add_argument("--data-dir")
    p.add_argument("--layer", type=int, help="exit layer (default: last)")
    p.add_argument("--split", default="dev")
    p.add_argument("--max-examples", type=int, default=500)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--method", choices=("tsne", "pca"), default="tsne")
    p.add_argument("--output", required=True, help="PNG path (arrays go to the same name with .npz)")
    p.set_defaults(func=_embeddings_main)


def _embeddings_main(args: argparse.Namespace) -> int:
    arrays = exit_embeddings(args.model, args.task, args.data_dir, args.layer, args.split, args.max_examples,
                             args.max_length)
    print(f"wrote {plot_embeddings(arrays, args.output, args.method)}")
    return 0
