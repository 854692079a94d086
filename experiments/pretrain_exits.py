"""Experiment 1 (issue #10): does multi-exit pre-training make shallow layers better?

Continue pre-training MiniLM on Gutenberg for the same number of steps (same data, order, masking, lr schedule) in
two arms: (a) multi-exit MLM+SOP, grouped exits G=2 + gradient equilibrium; (b) MLM+SOP at the last layer only.
Then fine-tune every prefix of 1..6 layers statically (`finetune train --layers l`) on SST-2 and MRPC subsets, for
(a), (b) and the untouched MiniLM. Seeds seed both pre-training and fine-tuning.

    python -m experiments.pretrain_exits --scale report      # ~35 min on one thread; resumable
    python -m experiments.pretrain_exits --scale smoke       # ~1-2 min, what CI runs
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from experiments.common import SEEDS, fmt_mean_std, mean_std, write_json
from experiments.pretrain_lab import (
    LAST_LAYER_ONLY,
    MULTI_EXIT_G2,
    SCALES,
    Scale,
    all_finite,
    data_available,
    finetune_args,
    finetune_static,
    limit_threads,
    majority_baseline,
    md_table,
    minilm_path,
    prepare_corpus,
    pretrain,
    resolve_out,
    verdict,
)

TASKS = ("SST-2", "MRPC")
MODELS = ("multi_exit_G2", "last_layer_only", "minilm")
MODEL_LABELS = {
    "multi_exit_G2": "(a) multi-exit G=2 + GE",
    "last_layer_only": "(b) last layer only",
    "minilm": "MiniLM, untouched",
}
MAJORITY_NOTE = (
    "The row 'majority class' is the best constant prediction's score on the same dev subset "
    "(full dev sets: SST-2 50.9; MRPC always-paraphrase acc 68.4, F1 81.2, score 74.8)"
)


def run(scale_name: str, work: Path, out: Path, seeds: list[int]) -> dict:
    scale = SCALES[scale_name]
    limit_threads()
    started = time.perf_counter()
    data = prepare_corpus(work, "train", scale.train_books)
    pretrained: dict[str, dict[int, dict]] = {"multi_exit_G2": {}, "last_layer_only": {}}
    for seed in seeds:
        pretrained["multi_exit_G2"][seed] = pretrain(work, scale, MULTI_EXIT_G2, seed, data)
        pretrained["last_layer_only"][seed] = pretrain(work, scale, LAST_LAYER_ONLY, seed, data)
    finetunes = []
    for seed in seeds:
        for model in MODELS:
            model_dir = minilm_path() if model == "minilm" else Path(pretrained[model][seed]["hf_dir"])
            for task in TASKS:
                for layers in scale.layers:
                    finetunes.append(
                        finetune_static(
                            work,
                            scale,
                            f"{model}_seed{seed}" if model != "minilm" else "minilm",
                            model_dir,
                            task,
                            layers,
                            seed,
                        )
                    )
    for r in finetunes:  # one name per arm in the tables, whatever the seed of its pre-training
        r["model"] = r["model"].split("_seed")[0]
    results = {
        "experiment": "pretrain_exits",
        "scale": scale_name,
        "settings": scale_settings(scale),
        "seeds": seeds,
        "pretrain": {m: {str(s): strip_pretrain(r) for s, r in by_seed.items()} for m, by_seed in pretrained.items()},
        "finetune": finetunes,
        "summary": summarise(finetunes, scale, seeds),
        "majority_baseline": {
            task: {str(seed): majority_baseline(scale, task, seed) for seed in seeds} for task in TASKS
        },
        "wall_s_this_invocation": time.perf_counter() - started,
        "commands": {
            "pretrain_a": pretrained["multi_exit_G2"][seeds[0]]["command"].replace(str(work), "$WORK"),
            "pretrain_b": pretrained["last_layer_only"][seeds[0]]["command"].replace(str(work), "$WORK"),
            "finetune_example": "python -m finetune "
            + " ".join(finetune_args(scale, Path("MODEL"), "SST-2", 3, seeds[0], Path("OUT"))),
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", results)
    plot(results, out / "per_layer_dev.png")
    (out / "section.md").write_text(section(results, verdict(out)), encoding="utf-8")
    return results


def scale_settings(scale: Scale) -> dict:
    from dataclasses import asdict

    return asdict(scale)


def strip_pretrain(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "hf_dir"}


def summarise(finetunes: list[dict], scale: Scale, seeds: list[int]) -> dict:
    """summary[task][model][layer] = {mean, std, runs}: every run listed, nothing dropped."""
    summary: dict = {}
    for task in TASKS:
        summary[task] = {}
        for model in MODELS:
            summary[task][model] = {}
            for layers in scale.layers:
                runs = sorted(
                    (r for r in finetunes if r["task"] == task and r["model"] == model and r["layers"] == layers),
                    key=lambda r: r["seed"],
                )
                scores = [r["score"] for r in runs]
                mean, std = mean_std(scores)
                summary[task][model][str(layers)] = {
                    "mean": mean,
                    "std": std,
                    "scores": scores,
                    "seeds": [r["seed"] for r in runs],
                }
    return summary


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(TASKS), figsize=(11, 4))
    for ax, task in zip(axes, TASKS):
        for model in MODELS:
            rows = results["summary"][task][model]
            layers = [int(k) for k in rows]
            means = [rows[k]["mean"] for k in rows]
            stds = [rows[k]["std"] for k in rows]
            ax.errorbar(layers, means, yerr=stds, marker="o", capsize=3, label=MODEL_LABELS[model])
        ax.set_title(f"{task}: static fine-tune of the first l layers")
        ax.set_xlabel("layers kept (l)")
        ax.set_ylabel("dev score (mean ± std over seeds)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def section(results: dict, verdict_md: str) -> str:
    """Draft of the report section; the verdict paragraph is written from the numbers by a person."""
    s = results["settings"]
    layers = [str(x) for x in s["layers"]]
    parts = [
        "## Experiment 1 — does multi-exit pre-training make shallow layers better?",
        "",
        f"Scale `{results['scale']}`, seeds {results['seeds']} (each seed seeds pre-training and fine-tuning).",
        "",
        "```",
        "python -m experiments.pretrain_exits --scale " + results["scale"],
        "```",
        "",
        f"Pre-training from MiniLM (6 layers, hidden 384) on {len(s['train_books'])} Gutenberg books "
        f"({', '.join(s['train_books'])}), seq {s['seq_len']}, global batch {s['global_batch']}, "
        f"{s['pretrain_steps']} steps, AdamW lr {s['lr']} (warm-up {s['warmup_steps']}, linear decay), fp32, "
        "1 process, 1 thread. Same data order and masking in both arms (same seed).",
        "",
        f"Fine-tuning: `--layers l` for l in {', '.join(layers)}; SST-2 {s['sst2_train']} train examples "
        f"(seeded subset), dev {s['sst2_dev'] or 'full (872)'}, max length {s['sst2_max_length']}; MRPC "
        f"{s['mrpc_train']} train, dev {s['mrpc_dev'] or 'full (408)'}, max length {s['mrpc_max_length']}; "
        f"{s['ft_epochs']} epoch, lr {s['ft_lr']}, batch {s['ft_batch']}; score at the end of training (one "
        f"evaluation, no checkpoint selection). {MAJORITY_NOTE}.",
        "",
        "Example commands (`$WORK` = `--work-dir`/`--scale`):",
        "",
        "```",
        results["commands"]["pretrain_a"],
        results["commands"]["pretrain_b"],
        results["commands"]["finetune_example"],
        "```",
        "",
    ]
    for task in TASKS:
        metric = "accuracy" if task == "SST-2" else "mean of F1 and accuracy"
        parts += [f"### {task} dev score ({metric}), mean ± std over seeds", ""]
        rows = [
            [MODEL_LABELS[m]] + [fmt_mean_std(results["summary"][task][m][x]["scores"]) for x in layers] for m in MODELS
        ]
        floor = [results["majority_baseline"][task][str(seed)]["score"] for seed in results["seeds"]]
        rows.append(["majority class (same dev subset)"] + [fmt_mean_std(floor)] * len(layers))
        parts += [md_table(["model"] + [f"L{x}" for x in layers], rows), ""]
        parts += ["Every run:", ""]
        rows = []
        for m in MODELS:
            for seed in results["seeds"]:
                runs = {
                    str(r["layers"]): r
                    for r in results["finetune"]
                    if r["task"] == task and r["model"] == m and r["seed"] == seed
                }
                rows.append([MODEL_LABELS[m], str(seed)] + [f"{runs[x]['score']:.1f}" for x in layers])
        parts += [md_table(["model", "seed"] + [f"L{x}" for x in layers], rows), ""]
    parts += ["### Pre-training runs", ""]
    rows = []
    for m, by_seed in results["pretrain"].items():
        for seed, r in by_seed.items():
            rows.append(
                [
                    MODEL_LABELS[m],
                    seed,
                    f"{r['train_s']:.0f}",
                    f"{r['median_step_s']:.2f}",
                    f"{r['process_wall_s']:.0f}",
                    " ".join(f"{x:.2f}" for x in r["final_train_mlm_loss"]),
                ]
            )
    parts += [
        md_table(
            ["arm", "seed", "train s", "median step s", "process wall s", "last-step train MLM loss (active exits)"],
            rows,
        ),
        "",
    ]
    ft_seconds = sum(r["seconds"] for r in results["finetune"])
    pt_seconds = sum(r["process_wall_s"] for by_seed in results["pretrain"].values() for r in by_seed.values())
    parts += [
        f"Compute: pre-training {pt_seconds / 60:.1f} min ({sum(map(len, results['pretrain'].values()))} "
        f"`pretrain train` processes, start-up included, export not), fine-tuning {ft_seconds / 60:.1f} min "
        f"({len(results['finetune'])} runs), 1 thread each. Each unit is timed once, when it runs; a rerun "
        "reuses finished units.",
        "",
        "![per-layer dev scores](per_layer_dev.png)",
        "",
        verdict_md,
        "",
    ]
    return "\n".join(parts)


def check(results: dict) -> list[str]:
    """Problems that make results.json unusable (the smoke test asserts there are none)."""
    problems = []
    for task in TASKS:
        for model in MODELS:
            for layers, row in results["summary"][task][model].items():
                if len(row["scores"]) != len(results["seeds"]) or not all_finite(row["scores"]):
                    problems.append(f"{task} {model} L{layers}: {row['scores']}")
    return problems


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="report")
    parser.add_argument("--work-dir", default="/tmp/exp_pretrain", help="runs, checkpoints, tokenised corpus")
    parser.add_argument("--output", default=None, help="default: docs/results/pretrain_exits")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    args = parser.parse_args(argv)
    missing = data_available()
    if missing:
        raise SystemExit(f"pretrain_exits: {missing}")
    work = Path(args.work_dir) / args.scale
    results = run(args.scale, work, resolve_out(args.output, "pretrain_exits"), args.seeds)
    problems = check(results)
    if problems:
        raise SystemExit("pretrain_exits: non-finite or missing results:\n" + "\n".join(problems))
    print(f"pretrain_exits: done in {results['wall_s_this_invocation'] / 60:.1f} min")


if __name__ == "__main__":
    main()
