"""Every figure fine-tuning draws: the per-exit layer curve, the ACL gradient angles, the exit embeddings and the
early-exit Pareto plot. Matplotlib (and scikit-learn for the projections) are imported only when a figure is drawn.

- `plot_layer_curve`: main metric per exit layer (`finetune train` and `evaluate` write it as layer_curve.png);
- `plot_angles`: histogram and per-step trace of the angle between the CE and contrastive gradients from a run's
  acl_diagnostics.json (batches ACL-Grad dropped in red);
- `plot_embeddings`: exit l's L2-normalised representations h^e and its K label embeddings (classifier rows),
  projected together by t-SNE or PCA, as the paper's visualisation; the raw arrays go to an .npz beside the PNG;
- `plot_pareto`: score vs mean FLOPs of every early-exit strategy beside the static per-layer curve.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from common.io import atomic_path, make_dirs, read_object
from elasticbert.exit_setting import rule_names

from .tasks import DataError, TaskSpec


def _pyplot():  # noqa: ANN202 - matplotlib's module
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: object, path: Path) -> Path:
    """Written atomically (never a truncated PNG left looking complete); an OS error names `path`."""
    try:
        make_dirs(path.parent)
        with atomic_path(path, keep_suffix=True) as tmp:
            fig.savefig(tmp, dpi=120)
    finally:
        _pyplot().close(fig)
    return path


def plot_layer_curve(task: TaskSpec, scores: dict[int, dict[str, float]], path: Path, title: str | None = None) -> Path:
    """Main metric per exit layer (and the task's individual metrics when it has several), as a PNG."""
    plt = _pyplot()
    layers = sorted(scores)
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.plot(layers, [scores[k][task.main_metric] for k in layers], "o-", label=f"{task.main_metric}")
    if len(task.metrics) > 1:
        for metric in task.metrics:
            ax.plot(layers, [scores[k][metric] for k in layers], ".--", alpha=0.6, label=metric)
    ax.set_xlabel("exit layer")
    ax.set_ylabel("dev score (%)")
    ax.set_xticks(layers)
    ax.set_title(title or task.name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, Path(path))


def read_angles(run_dir: str | Path) -> tuple[Path, dict]:
    """(the file, its content): RUN/acl_diagnostics.json, or the file itself when given one."""
    run_dir = Path(run_dir)
    source = run_dir / "acl_diagnostics.json" if run_dir.is_dir() else run_dir
    if not source.is_file():
        raise DataError(f"{source}: no ACL diagnostics (train with a contrastive --objective to record angles)")
    diag = read_object(source, DataError, "an ACL diagnostics file")
    missing = [k for k in ("records", "threshold", "scope", "acl_grad") if k not in diag]
    if missing or not isinstance(diag["records"], list):
        raise DataError(f"{source}: not an ACL diagnostics file (lacks {missing or ['a records list']})")
    if any(not isinstance(r, dict) or "angle" not in r or "dropped" not in r for r in diag["records"]):
        raise DataError(f"{source}: a record lacks 'angle' or 'dropped'")
    return source, diag


def plot_angles(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Angle histogram + trace (PNG) from a run's acl_diagnostics.json (default output: beside it, angles.png)."""
    source, diag = read_angles(run_dir)
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
    trace.set_title(f"ACL-Grad {'on' if diag['acl_grad'] else 'off'}, drop rate {100 * (rate or 0):.1f}%", fontsize=9)
    fig.tight_layout()
    return _save(fig, Path(output) if output else (source.parent / "angles.png"))


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
    path = _save(fig, Path(output))
    with atomic_path(path.with_suffix(".npz"), keep_suffix=True) as tmp:  # never a truncated .npz left behind
        np.savez(tmp, **arrays)
    return path


def plot_pareto(results: dict, path: str | Path) -> Path:
    """Left: score vs mean FLOPs for every strategy (static per-layer curve dashed, for reference). Right: the static
    per-layer curve (score and measured wall-time speed-up per exit layer)."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    _pareto_panel(left, results)
    static = results.get("static", [])
    metric = results.get("metric_name", "score")
    if static:
        layers = [p["layer"] for p in static]
        right.plot(layers, [p["score"] for p in static], "k-o", markersize=4)
        right.set_xlabel("exit layer (static truncation)")
        right.set_ylabel(metric)
        right.set_title("Static per-layer curve")
        right.grid(alpha=0.3)
        twin = right.twinx()
        twin.plot(layers, [p["wall_speedup"] for p in static], "g:s", markersize=3, label="wall speed-up")
        twin.plot(layers, [p["flops_speedup"] for p in static], "b:^", markersize=3, label="FLOPs speed-up")
        twin.set_ylabel("speed-up vs full model")
        twin.legend(fontsize=8, loc="upper right")
    fig.suptitle(f"{results.get('model', '')}  (batch {results.get('batch_size')})", fontsize=9)
    fig.tight_layout()
    return _save(fig, Path(path))


def _pareto_panel(ax: object, results: dict) -> None:
    """Score vs mean FLOPs (millions): the static curve dashed, one line per strategy."""
    scale = 1e6
    static = results.get("static", [])
    if static:
        ax.plot(
            [p["mean_flops"] / scale for p in static],
            [p["score"] for p in static],
            "k--o",
            label="static (per exit layer)",
            markersize=4,
        )
    markers = dict(zip(rule_names(swept=True), "sD^vPX*"))  # the rule table's order: entropy s, maxprob D, ...
    for name, entry in results.get("strategies", {}).items():
        pts = sorted(entry["points"], key=lambda p: p["mean_flops"])
        ax.plot(
            [p["mean_flops"] / scale for p in pts],
            [p["score"] for p in pts],
            marker=markers.get(name, "o"),
            label=name,
            markersize=4,
        )
    ax.set_xlabel("mean FLOPs per sample (M, ELUE conventions)")
    ax.set_ylabel(f"{results.get('task', '')} {results.get('split', '')} {results.get('metric_name', 'score')}")
    ax.set_title("Early exit: score vs FLOPs")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
