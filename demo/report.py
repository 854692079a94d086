"""The demo's report folder: the pictures that explain the run, and `summary.md` with the numbers."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path

import matplotlib

from common.io import read_object
from demo.data import HOW_TO_GET_REAL_DATA

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def pretrain_loss_plot(records: list[dict], path: Path) -> dict[int, tuple[float, float]]:
    """Per-exit MLM loss over steps (each exit is trained only on its group's steps); returns first/last per exit."""
    per_exit: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for r in records:
        for layer, loss in zip(r["active_exits"], r["mlm_loss"]):
            per_exit[layer].append((r["step"], loss))
    fig, ax = plt.subplots(figsize=(7, 4))
    for layer in sorted(per_exit):
        steps, losses = zip(*sorted(per_exit[layer]))
        ax.plot(steps, losses, marker=".", label=f"exit {layer}")
    resumed = [r["step"] for r in records if r.get("attempt", 1) > 1]
    if resumed:
        ax.axvline(min(resumed) - 0.5, color="grey", ls="--", lw=1)
        ax.text(min(resumed) - 0.4, ax.get_ylim()[1], " resumed after preemption", va="top", fontsize=8)
    ax.set(xlabel="optimizer step", ylabel="MLM loss (masked tokens)", title="Pre-training: MLM loss per exit")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return {layer: (pts[0][1], pts[-1][1]) for layer, pts in sorted(per_exit.items())}


def layer_score_plot(dev_scores: dict, path: Path) -> dict[int, float]:
    exits = dev_scores["best"]["exits"]
    metric = dev_scores.get("main_metric", "score")
    layers = sorted(int(k) for k in exits)
    scores = [exits[str(k)][metric] for k in layers]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(layers, scores, marker="o")
    ax.set(
        xlabel="exit layer",
        ylabel=f"dev {metric}",
        title=f"{dev_scores['task']}: dev score at every exit "
        f"({dev_scores['method']}, {dev_scores['exit_type']} exits, {dev_scores['objective']})",
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return dict(zip(layers, scores))


def early_exit_lines(early_exit_dir: Path, elue: dict) -> list[str]:
    """One table row per operating point (threshold, score, exit layer, speed-ups) and each rule's ELUE score."""
    lines = []
    for path in sorted(early_exit_dir.glob("early_exit_*.json")):
        sweep = read_object(path)
        full = sweep["full_model"]
        lines += [
            f"{sweep['num_samples']} dev samples, batch {sweep['batch_size']}: the full model scores "
            f"{full['score']:.2f} at {full['mean_flops'] / 1e6:.0f} MFLOPs per sample.",
            "",
            "| rule | threshold | score | mean exit layer | FLOPs speed-up | wall-time speed-up |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for rule, result in sweep["strategies"].items():
            lines += [
                f"| {rule} | {pt['threshold']:g} | {pt['score']:.2f} | {pt['mean_exit_layer']:.2f} | "
                f"{pt['flops_speedup']:.2f}× | {pt['wall_speedup']:.2f}× |"
                for pt in result["points"]
            ]
    lines += [
        "",
        "ELUE score (mean score difference to the static curve at equal FLOPs; > 0 beats static truncation):",
        "",
    ]
    lines += [
        f"- {rule}: {result['score']:+.2f}"
        for rule, result in elue.items()
        if isinstance(result, dict) and "score" in result
    ]
    return lines


def _copy_figures(out: Path, report: Path) -> None:
    """The early-exit plots and both TensorBoard logs, into the report folder."""
    for png in sorted((out / "early_exit").glob("*.png")):
        shutil.copy(png, report / png.name)
    for name in ("pretrain/tensorboard", "finetune/tensorboard"):
        if (out / name).is_dir():
            shutil.copytree(out / name, report / "tensorboard" / name.split("/")[0], dirs_exist_ok=True)


def _opening_lines(summary: dict, seconds: float) -> list[str]:
    """The title, the toy-data warning when the run had no real data, the scale, and section 1 (data)."""
    toy = summary.get("data_origin") == "toy"
    return [
        "# ElasticBERT demo report",
        "",
        *(
            [
                "> **TOY DATA.** No real corpus or GLUE task was available, so this run used installed packages' "
                "descriptions and template sentences: every stage ran, but no score here means anything. "
                f"To get the real demo, {HOW_TO_GET_REAL_DATA}.",
                "",
            ]
            if toy
            else []
        ),
        f"Scale `{summary['scale']}`, {seconds / 60:.1f} minutes on this machine.",
        "",
        "## 1. Data",
        f"{summary['data']['source']}: "
        + ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in (summary["data"]["totals"] or {}).items()),
        "",
    ]


def write_report(out: Path, records: list[dict], summary: dict, seconds: float) -> Path:
    report = out / "report"
    report.mkdir(exist_ok=True)
    losses = pretrain_loss_plot(records, report / "pretrain_losses.png")
    curve = layer_score_plot(summary["finetune"], report / "layer_scores.png")
    _copy_figures(out, report)

    ft = summary["finetune"]
    elue = summary["early_exit"]
    lines = [
        *_opening_lines(summary, seconds),
        "## 2. Pre-training (DeepSpeed, 2 processes, grouped exits, gradient equilibrium)",
        f"{summary['pretrain']['steps']} optimizer steps; preempted by SIGUSR1 after step "
        f"{summary['pretrain']['preempted_after_step']} (checkpoint, exit 75) and resumed from `latest`.",
        "",
        "| exit | MLM loss, first step | MLM loss, last step |",
        "|---:|---:|---:|",
        *[f"| {layer} | {a:.3f} | {b:.3f} |" for layer, (a, b) in losses.items()],
        "",
        "The MiniLM package ships no MLM or SOP heads, so every exit's heads start random (MLM loss ≈ ln 30522 ≈ 10.3) "
        "and the first steps mostly train them; each exit is updated on its group's steps only.",
        "",
        "![](pretrain_losses.png)",
        "",
        f"## 3-4. Fine-tuning on {ft['task']} ({ft['method']}, {ft['exit_type']} exits, objective {ft['objective']})",
        f"{ft.get('train_examples')} training examples, {ft.get('dev_examples')} dev examples.",
        "",
        "| exit | dev score |",
        "|---:|---:|",
        *[f"| {layer} | {score:.2f} |" for layer, score in curve.items()],
        "",
        "![](layer_scores.png)",
        "",
        "## 5. Early exit and ELUE score (baseline: this model's static per-layer curve)",
        *early_exit_lines(out / "early_exit", elue),
        "",
        *[
            f"![]({p.name})"
            for p in sorted(report.glob("*.png"))
            if p.name not in ("pretrain_losses.png", "layer_scores.png")
        ],
        "",
        "TensorBoard: `tensorboard --logdir " + str(report / "tensorboard") + "`",
    ]
    (report / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (report / "summary.json").write_text(json.dumps(summary, indent=1, default=str), encoding="utf-8")
    return report
