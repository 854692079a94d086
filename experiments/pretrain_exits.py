"""Claim 1 (issue #20): does multi-exit pre-training make shallow layers better?

Continued pre-training from the MiniLM weights (`model.init_from=minilm`) on Gutenberg + WikiText, the same tokens,
order, masking and schedule in every arm: (a) multi-exit MLM + SOP, grouped exits G=2 + gradient equilibrium;
(b) the control, MLM + SOP at the last layer only (`exits.last_layer_only=true`), so that (a) vs (b) separates
"multi-exit" from "more pre-training"; (c) the untouched MiniLM. Then, per layer: linear probes on frozen features
(SST-2, MRPC; 3 seeds of the probe's training subset) and static fine-tunes (`finetune train --layers l`, linear
exit; 3 seeds), plus per-exit held-out MLM loss. Before the arms, a precision check: arm (a)'s first steps in fp32
vs bf16 autocast (same batches, dropout seeds), and the per-step time ratio measured interleaved.

    python -m experiments.pretrain_exits --scale report      # resumable unit by unit
    python -m experiments.pretrain_exits --scale smoke       # ~1 min, what CI runs

`--models` restricts a run to some models (e.g. two processes, `--models G2_ge` and `--models last_only minilm`, on a
2-core machine); the report is written by a run over every model, once every unit it needs is done.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path

from experiments.common import fmt_mean_std, mean_std, write_json
from experiments.pretrain_lab import (
    LAST_LAYER_ONLY,
    MULTI_EXIT_G2,
    SCALES,
    Scale,
    all_finite,
    arm_of,
    data_available,
    finetune_args,
    finetune_static,
    finetune_unit_name,
    heldout_mlm_loss,
    limit_threads,
    majority_baseline,
    md_table,
    minilm_path,
    model_name,
    prepare_corpus,
    pretrain_arm,
    pretrain_chunk,
    resolve_out,
    run_summary,
    unit,
    verdict,
    work_totals,
)
from experiments.probes import FEATURES, TASKS, probe_model
from experiments.step_timing import step_timing

ARMS = {"G2_ge": MULTI_EXIT_G2, "last_only": LAST_LAYER_ONLY}
MODELS = ("G2_ge", "last_only", "minilm")
MODEL_LABELS = {
    "G2_ge": "(a) multi-exit G=2 + GE",
    "last_only": "(b) last layer only",
    "minilm": "(c) MiniLM, untouched",
}
BF16_TOLERANCE = 0.01  # bf16 "trains as well" when its losses are within 1 % of fp32's


# --------------------------------------------------------------------------------------------- precision check


def precision_check(work: Path, scale: Scale, data: Path, seed: int) -> dict:
    """Arm (a) over its first `precision_check_steps` steps in fp32 and in bf16 autocast (the bf16 run is the start
    of the real arm): training loss step by step, and the per-exit validation loss at the end."""
    k = scale.precision_check_steps
    pretrain_chunk(work, scale, MULTI_EXIT_G2, seed, data, k, precision="fp32")
    pretrain_chunk(work, scale, MULTI_EXIT_G2, seed, data, k, precision="bf16-autocast")

    def compute() -> dict:
        runs = {p: run_summary(work, scale, MULTI_EXIT_G2, seed, precision=p) for p in ("fp32", "bf16-autocast")}
        tail = max(k // 4, 1)
        out = {}
        for p, r in runs.items():
            val = r["validation"][str(k)]["mlm_loss"]
            out[p] = {
                "loss": r["loss"][:k],
                "tail_mean_loss": sum(r["loss"][k - tail : k]) / tail,
                "validation_mlm_loss": val,
                "median_step_s": r["median_step_s"],
            }
        f32, b16 = out["fp32"], out["bf16-autocast"]
        gap_train = (b16["tail_mean_loss"] - f32["tail_mean_loss"]) / f32["tail_mean_loss"]
        gaps_val = [(b - f) / f for b, f in zip(b16["validation_mlm_loss"], f32["validation_mlm_loss"])]
        return {
            "steps": k,
            "tail_steps": tail,
            "runs": out,
            "relative_gap_train_tail": gap_train,
            "relative_gap_validation_per_exit": gaps_val,
            "as_well": gap_train <= BF16_TOLERANCE and max(gaps_val) <= BF16_TOLERANCE,
            "tolerance": BF16_TOLERANCE,
        }

    return unit(work, "precision_check", compute)


# ----------------------------------------------------------------------------------------------------- the run


def model_dirs(scale: Scale, exports: dict[str, dict[int, Path]]) -> dict[str, Path]:
    """Every model that gets probes: each arm at each export point, and MiniLM (= step 0 of every arm)."""
    dirs = {"minilm": minilm_path()}
    for arm, by_step in exports.items():
        for step, path in by_step.items():
            dirs[model_name(ARMS[arm], scale, step)] = path
    return dirs


def run(
    scale_name: str, work: Path, out: Path, models: list[str], report: bool, pretrain_only: bool = False
) -> dict | None:
    """Pre-train the arms among `models`, evaluate `models`; write the report when every model is done."""
    scale = SCALES[scale_name]
    limit_threads()
    started = time.perf_counter()
    data = prepare_corpus(work, scale)
    seed = scale.seeds[0]  # one pre-training run per arm; the seeds are the probes' and fine-tunes'
    exports: dict[str, dict[int, Path]] = {}
    if "G2_ge" in models:
        check = precision_check(work, scale, data, seed)
        if scale.precision == "bf16-autocast" and not check["as_well"]:
            raise SystemExit(
                "pretrain_exits: bf16 autocast did not train as well as fp32 in the precision check "
                f"({work}/units/precision_check.json): set the scale's precision to fp32"
            )
    for name in ARMS:
        if name in models:
            exports[name] = pretrain_arm(work, scale, ARMS[name], seed, data)
    if pretrain_only:
        print(f"pretrain_exits: pre-training done for {models}")
        return None
    dirs = model_dirs(scale, exports)
    evaluate(work, scale, dirs, models)
    if not report or set(models) != set(MODELS):
        print(f"pretrain_exits: units done for {models}; the report needs every model (run without --models)")
        return None
    timing = step_timing(work, scale, data)
    results = collect(work, scale, scale_name, dirs, timing)
    results["wall_s_this_invocation"] = time.perf_counter() - started
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", results)
    plot_layers(results, out / "per_layer.png")
    plot_curves(results, out / "pretraining_curves.png")
    (out / "section.md").write_text(section(results, verdict(out)), encoding="utf-8")
    return results


def evaluate(work: Path, scale: Scale, dirs: dict[str, Path], models: list[str]) -> None:
    """Held-out MLM loss and probes for every export of `models`; fine-tunes of their final weights."""
    data = work / "data" / "corpus"
    for name, path in dirs.items():
        if arm_of(name) not in models:
            continue
        if name != "minilm":
            heldout_mlm_loss(work, scale, name, path, data)
        for task in TASKS:
            probe_model(work, scale.probe, name, path, task, scale.seeds)
    for model in models:
        path = dirs[final_name(model, scale.steps)]
        for task in scale.ft_tasks:
            for layers in scale.ft_layers:
                for s in scale.seeds:
                    finetune_static(work, scale.finetune[task], model, path, task, layers, s)


def collect(work: Path, scale: Scale, scale_name: str, dirs: dict[str, Path], timing: dict) -> dict:
    """Everything the tables need, from the cached units."""
    import json

    seed = scale.seeds[0]
    units = work / "units"
    probes = {
        name: {task: json.loads((units / f"probe_{name}_{task}.json").read_text()) for task in TASKS} for name in dirs
    }
    heldout = {name: json.loads((units / f"heldout_{name}.json").read_text()) for name in dirs if name != "minilm"}
    finetunes = [
        json.loads((units / f"{finetune_unit_name(scale.finetune[t], m, t, layer, s)}.json").read_text())
        for m in MODELS
        for t in scale.ft_tasks
        for layer in scale.ft_layers
        for s in scale.seeds
    ]
    return {
        "experiment": "pretrain_exits",
        "scale": scale_name,
        "settings": asdict(scale),
        "corpus": json.loads((units / "corpus.json").read_text()),
        "precision_check": json.loads((units / "precision_check.json").read_text()),
        "step_timing": timing,
        "pretrain": {name: run_summary(work, scale, arm, seed) for name, arm in ARMS.items()},
        "heldout": heldout,
        "probes": probes,
        "probe_summary": summarise_probes(probes),
        "finetune": finetunes,
        "finetune_summary": summarise_finetunes(finetunes, scale),
        "majority_baseline": {
            "finetune": {t: majority_baseline(t, scale.finetune[t].dev_examples) for t in scale.ft_tasks},
            "probe": {t: majority_baseline(t, scale.probe.dev_examples) for t in TASKS},
        },
        "compute": work_totals(work),
        "commands": {
            "pretrain_a": run_summary(work, scale, MULTI_EXIT_G2, seed)["commands"][-1].replace(str(work), "$WORK"),
            "pretrain_b": run_summary(work, scale, LAST_LAYER_ONLY, seed)["commands"][-1].replace(str(work), "$WORK"),
            "finetune_example": "python -m finetune "
            + " ".join(map(str, finetune_args(scale.finetune["SST-2"], Path("MODEL"), "SST-2", 3, 1, Path("OUT")))),
        },
    }


def summarise_probes(probes: dict) -> dict:
    """summary[model][task][feature][layer] = {mean, std, scores, C}: every seed listed."""
    summary: dict = {}
    for name, by_task in probes.items():
        for task, result in by_task.items():
            for kind in FEATURES:
                rows = [r for r in result["runs"] if r["feature"] == kind]
                for layer in sorted({r["layer"] for r in rows}):
                    mine = sorted((r for r in rows if r["layer"] == layer), key=lambda r: r["seed"])
                    scores = [r["score"] for r in mine]
                    mean, std = mean_std(scores)
                    summary.setdefault(name, {}).setdefault(task, {}).setdefault(kind, {})[str(layer)] = {
                        "mean": mean,
                        "std": std,
                        "scores": scores,
                        "C": [r["C"] for r in mine],
                    }
    return summary


def summarise_finetunes(finetunes: list[dict], scale: Scale) -> dict:
    summary: dict = {}
    for task in scale.ft_tasks:
        for model in MODELS:
            for layers in scale.ft_layers:
                runs = sorted(
                    (r for r in finetunes if r["task"] == task and r["model"] == model and r["layers"] == layers),
                    key=lambda r: r["seed"],
                )
                scores = [r["score"] for r in runs]
                mean, std = mean_std(scores)
                summary.setdefault(task, {}).setdefault(model, {})[str(layers)] = {
                    "mean": mean,
                    "std": std,
                    "scores": scores,
                }
    return summary


# ---------------------------------------------------------------------------------------------------- plotting


def _pyplot():  # noqa: ANN202 - matplotlib's module
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


COLOURS = {"G2_ge": "tab:blue", "last_only": "tab:orange", "minilm": "tab:green"}


def at_step(model: str, steps: int, step: int) -> str:
    """Name of claim-1 arm `model` (a run of `steps` steps) exported at `step`; MiniLM is itself."""
    return "minilm" if model == "minilm" or step == 0 else f"{model}_s{steps}@{step}"


def final_name(model: str, steps: int) -> str:
    return at_step(model, steps, steps)


def _per_layer_errorbar(ax: object, rows: dict, model: str) -> None:
    """One model's mean ± std per layer (`rows`: layer -> {"mean", "std"})."""
    ax.errorbar(
        [int(k) for k in rows],
        [rows[k]["mean"] for k in rows],
        yerr=[rows[k]["std"] for k in rows],
        marker="o",
        capsize=3,
        color=COLOURS[model],
        label=MODEL_LABELS[model],
    )


def plot_layers(results: dict, path: Path) -> None:
    """Rows: probe on pooled [CLS], probe on mean-pooled tokens, static fine-tune; columns: SST-2, MRPC."""
    plt = _pyplot()
    steps = results["settings"]["steps"]
    fig, axes = plt.subplots(3, 2, figsize=(11, 11))
    for col, task in enumerate(TASKS):
        for row, kind in enumerate(FEATURES):
            ax = axes[row][col]
            for model in MODELS:
                _per_layer_errorbar(ax, results["probe_summary"][final_name(model, steps)][task][kind], model)
            floor = results["majority_baseline"]["probe"][task]["score"]
            ax.axhline(floor, color="k", ls=":", lw=1, label="majority class")
            what = "pooled [CLS] (the exit's pooler)" if kind == "pooled" else "mean of the layer's token states"
            ax.set_title(f"{task}: linear probe on {what}", fontsize=10)
        ax = axes[2][col]
        if task not in results["finetune_summary"]:
            ax.text(
                0.5,
                0.5,
                f"{task}: no static fine-tunes\n(MiniLM's layer 6 does not clear the majority\n"
                "class at a budget that fits; see the text)",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
            ax.set_axis_off()
            continue
        for model in MODELS:
            _per_layer_errorbar(ax, results["finetune_summary"][task][model], model)
        ax.axhline(results["majority_baseline"]["finetune"][task]["score"], color="k", ls=":", lw=1, label="majority")
        ax.set_title(f"{task}: static fine-tune of the first l layers (linear exit)", fontsize=10)
    for ax in axes.flat:
        ax.set_xlabel("layer l")
        ax.set_ylabel(f"dev score (mean ± std, {len(results['settings']['seeds'])} seeds)")
        ax.set_xticks(range(1, 7))
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8, loc="lower right")
    fig.suptitle("Claim 1: per-layer quality after continued pre-training (MRPC score = mean of F1 and accuracy)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_curves(results: dict, path: Path) -> None:
    """Left: validation MLM loss per exit during pre-training. Right: SST-2 pooled probe per layer at each step."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    for model, style in (("G2_ge", "-"), ("last_only", "--")):
        val = results["pretrain"][model]["validation"]
        steps = [int(s) for s in val]
        exits = range(1, 7) if model == "G2_ge" else [6]
        for e in exits:
            colour = plt.cm.viridis((e - 1) / 5)
            ax.plot(
                steps,
                [val[str(s)]["mlm_loss"][e - 1] for s in steps],
                style,
                marker=".",
                color=colour,
                label=f"{MODEL_LABELS[model].split(' ')[0]} exit {e}",
            )
    ax.set_xlabel("pre-training step")
    ax.set_ylabel("held-out MLM loss (trainer validation)")
    ax.set_title("Per-exit MLM loss during pre-training; (b): only exit 6 trains")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax = axes[1]
    summary = results["probe_summary"]
    points = sorted({int(n.split("@")[1]) for n in summary if "@" in n})
    for model in ("G2_ge", "last_only"):
        for i, step in enumerate([0, *points]):
            name = at_step(model, results["settings"]["steps"], step)
            rows = summary[name]["SST-2"]["pooled"]
            if step == 0 and model == "last_only":
                continue
            ax.plot(
                [int(k) for k in rows],
                [rows[k]["mean"] for k in rows],
                marker="o",
                color=COLOURS["minilm" if step == 0 else model],
                alpha=0.35 + 0.65 * i / max(len(points), 1),
                label="MiniLM (step 0)" if step == 0 else f"{MODEL_LABELS[model].split(' ')[0]} step {step}",
            )
    ax.axhline(results["majority_baseline"]["probe"]["SST-2"]["score"], color="k", ls=":", lw=1, label="majority")
    ax.set_xlabel("layer l")
    ax.set_ylabel("SST-2 dev accuracy (probe, mean of 3 seeds)")
    ax.set_title("SST-2 linear probe on the pooled [CLS] as pre-training goes on")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------------ report


def section(results: dict, verdict_md: str) -> str:
    """The report section: settings, every table, compute; the verdict paragraph is written from the numbers."""
    s = results["settings"]
    steps = s["steps"]
    layers_ft = [str(x) for x in s["ft_layers"]]
    corpus = results["corpus"]
    pc = results["precision_check"]
    t = results["step_timing"]["shapes"]["minilm"]["ratios"]
    parts = [
        "## Claim 1: does multi-exit pre-training make shallow layers better?",
        "",
        f"Scale `{results['scale']}`. Command: `python -m experiments.pretrain_exits --scale {results['scale']}` "
        "(resumable unit by unit; `--models G2_ge` and `--models last_only minilm` let two processes share "
        "the work).",
        "",
        "### Setup",
        "",
        f"- **Corpus.** {', '.join(s['corpus_inputs'])} from `../shared/data/corpus`, tokenised once by `data_prep` "
        f"(`--doc-boundary file`: one book = one document), {corpus['splits']['train']['tokens']:,} training "
        f"tokens in {corpus['splits']['train']['docs']} documents; {corpus['splits']['valid']['docs']} whole "
        f"documents ({corpus['splits']['valid']['tokens']:,} tokens: "
        f"{', '.join(d.split('/')[-1] for d in corpus['heldout_documents'])}) held out and never trained on.",
        f"- **Pre-training.** From the MiniLM weights (`model.init_from=minilm`: 6 layers, hidden 384; its MLM and "
        f"SOP heads do not exist and start fresh), seq {s['seq_len']}, batch {s['global_batch']}, {steps} steps "
        f"({s['global_batch'] * s['seq_len'] * steps:,} token slots), AdamW lr {s['lr']:g}, β {tuple(s['betas'])}, "
        f"weight decay {s['weight_decay']}, warm-up {s['warmup_steps']} steps then linear decay, clip 1.0, "
        f"{s['precision']}, 1 process, 1 thread. Same seed, so the same samples, masking and dropout in both arms.",
        f"- **Precision check.** Arm (a), first {pc['steps']} steps, fp32 vs bf16 autocast: mean training loss "
        f"over the last {pc['tail_steps']} steps {pc['runs']['fp32']['tail_mean_loss']:.3f} vs "
        f"{pc['runs']['bf16-autocast']['tail_mean_loss']:.3f} ({100 * pc['relative_gap_train_tail']:+.2f} %); "
        "held-out MLM loss per exit at that step, relative gap "
        + ", ".join(f"{100 * g:+.2f} %" for g in pc["relative_gap_validation_per_exit"])
        + f" → bf16 {'trains as well' if pc['as_well'] else 'does NOT train as well'} (tolerance "
        f"{100 * pc['tolerance']:.0f} %). Per-step time fp32 ÷ bf16 (G=2, interleaved): "
        f"{t['fp32_over_bf16_G2']['cpu_min']:.2f}× in CPU time, {t['fp32_over_bf16_G2']['wall_min']:.2f}× wall.",
        f"- **Linear probes.** Frozen features of every layer: the exit's pooled [CLS] and the mean of the layer's "
        f"token states. scikit-learn logistic regression (standardised features, C ∈ {list(s['probe']['cs'])} by "
        f"{s['probe']['cv_folds']}-fold CV on the training subset), trained on a seeded subset per seed (SST-2 "
        f"{s['probe']['train_examples']['SST-2']:,} sentences, MRPC {s['probe']['train_examples']['MRPC']:,} "
        "pairs), scored on "
        + (
            "the full dev sets (SST-2 872, MRPC 408)."
            if s["probe"]["dev_examples"] is None
            else f"{s['probe']['dev_examples']} dev rows."
        ),
        f"- **Static fine-tunes.** `finetune train --layers l --exit-type linear`, l ∈ {{{', '.join(layers_ft)}}}, "
        + "; ".join(
            f"{task}: {b['train_examples'] or 'all'} training examples, {b['epochs']:g} epoch(s), lr {b['lr']:g}, "
            f"batch {b['batch_size']}, max length {b['max_length']}"
            for task, b in s["finetune"].items()
            if task in s["ft_tasks"]
        )
        + "; warm-up 10 %, weight decay 0.01, dropout 0.1; score at the end of training (no checkpoint selection) "
        "on the full dev set. The budget is the one where MiniLM's layer 6 is clearly above the majority class "
        "(see the calibration note in the verdict).",
        "- **Scores.** SST-2: accuracy; MRPC: mean of F1 and accuracy (majority class: SST-2 50.9, MRPC 74.8 = "
        f"acc 68.4, F1 81.2, on the full dev sets). Mean ± std over {len(s['seeds'])} seed(s).",
        "",
        "Commands (`$WORK` = `--work-dir`/`--scale`):",
        "",
        "```",
        results["commands"]["pretrain_a"],
        results["commands"]["pretrain_b"],
        results["commands"]["finetune_example"],
        "```",
        "",
    ]
    parts += probe_tables(results, steps)
    parts += finetune_tables(results, layers_ft)
    parts += heldout_table(results, steps)
    parts += pretrain_table(results)
    parts += [
        "![per-layer scores](per_layer.png)",
        "",
        "![pre-training curves](pretraining_curves.png)",
        "",
        verdict_md,
        "",
    ]
    return "\n".join(parts)


def probe_tables(results: dict, steps: int) -> list[str]:
    parts = []
    for task in TASKS:
        for kind in FEATURES:
            what = "pooled [CLS]" if kind == "pooled" else "mean-pooled tokens"
            parts += [f"### {task}: linear probe on {what}, dev score per layer", ""]
            names = [final_name(m, steps) for m in MODELS]
            extra = [n for n in results["probe_summary"] if n not in names and n != "minilm"]
            rows = []
            for name in names + sorted(extra):
                arm = arm_of(name)
                label = MODEL_LABELS[arm] + (f" @ step {name.split('@')[1]}" if name in extra else "")
                row = results["probe_summary"][name][task][kind]
                rows.append([label] + [fmt_mean_std(row[str(layer)]["scores"]) for layer in range(1, 7)])
            floor = results["majority_baseline"]["probe"][task]["score"]
            rows.append(["majority class"] + [f"{floor:.1f}"] * 6)
            parts += [md_table(["model"] + [f"L{x}" for x in range(1, 7)], rows), ""]
    return parts


def finetune_tables(results: dict, layers: list[str]) -> list[str]:
    parts = []
    for task in results["finetune_summary"]:
        parts += [f"### {task}: static fine-tune of the first l layers, dev score", ""]
        rows = [
            [MODEL_LABELS[m]] + [fmt_mean_std(results["finetune_summary"][task][m][x]["scores"]) for x in layers]
            for m in MODELS
        ]
        floor = results["majority_baseline"]["finetune"][task]["score"]
        rows.append(["majority class"] + [f"{floor:.1f}"] * len(layers))
        parts += [md_table(["model"] + [f"L{x}" for x in layers], rows), "", "Every run:", ""]
        rows = []
        for m in MODELS:
            for seed in results["settings"]["seeds"]:
                runs = {
                    str(r["layers"]): r
                    for r in results["finetune"]
                    if r["task"] == task and r["model"] == m and r["seed"] == seed
                }
                rows.append([MODEL_LABELS[m], str(seed)] + [f"{runs[x]['score']:.1f}" for x in layers])
        parts += [md_table(["model", "seed"] + [f"L{x}" for x in layers], rows), ""]
    return parts


def heldout_table(results: dict, steps: int) -> list[str]:
    rows = []
    for name in sorted(results["heldout"]):
        arm, step = arm_of(name), name.split("@")[1]
        h = results["heldout"][name]
        rows.append([f"{MODEL_LABELS[arm]} @ step {step}"] + [f"{x:.3f}" for x in h["mlm_loss"]])
    n = next(iter(results["heldout"].values()))
    return [
        f"### Held-out MLM loss per exit ({n['samples']} samples, {n['masked_tokens']:,} masked tokens of the "
        "held-out books; lower is better)",
        "",
        "Arm (b) trains only exit 6's head: its exits 1–5 show untrained heads, not its layers' quality. MiniLM has "
        "no MLM heads.",
        "",
        md_table(["model"] + [f"exit {e}" for e in range(1, 7)], rows),
        "",
    ]


def pretrain_table(results: dict) -> list[str]:
    rows = []
    for name, r in results["pretrain"].items():
        rows.append(
            [
                MODEL_LABELS[name],
                str(r["steps"]),
                f"{r['tokens']:,}",
                f"{r['train_s'] / 60:.1f}",
                f"{r['process_wall_s'] / 60:.1f}",
                f"{r['process_cpu_s'] / 60:.1f}",
                f"{r['median_step_s']:.2f}",
            ]
        )
    c = results["compute"]
    timing = results["step_timing"]["shapes"]["minilm"]["ratios"]["bf16"]
    return [
        "### Pre-training runs and compute",
        "",
        md_table(
            [
                "arm",
                "steps",
                "real tokens (no padding)",
                "train min (sum of steps)",
                "process wall min",
                "process CPU min",
                "median s/step",
            ],
            rows,
        ),
        "",
        f"Per-step time at this size (bf16, interleaved, CPU time): G=1 ÷ G=2 {timing['g1_over_g2_cpu_min']:.2f}×; "
        f"G=1 ÷ last-layer-only {timing['g1_over_last_cpu_min']:.2f}×. Whole experiment so far: {c['units']} "
        f"units, {c['wall_s'] / 3600:.2f} h wall, {c['cpu_s'] / 3600:.2f} CPU-hours (1 thread per process, up to "
        "two processes at once, on a 2-core machine shared with other jobs; wall times are not comparable "
        "between runs).",
        "",
    ]


def check(results: dict) -> list[str]:
    """Problems that make results.json unusable (the smoke test asserts there are none)."""
    problems = []
    for task, by_model in results["finetune_summary"].items():
        for model, rows in by_model.items():
            for layers, row in rows.items():
                if len(row["scores"]) != len(results["settings"]["seeds"]) or not all_finite(row["scores"]):
                    problems.append(f"finetune {task} {model} L{layers}: {row['scores']}")
    for name, by_task in results["probe_summary"].items():
        for task, by_kind in by_task.items():
            for kind, rows in by_kind.items():
                if len(rows) != 6 or not all(all_finite(r["scores"]) for r in rows.values()):
                    problems.append(f"probe {name} {task} {kind}")
    return problems


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="report")
    parser.add_argument("--work-dir", default="/tmp/exp_pretrain", help="runs, checkpoints, tokenised corpus")
    parser.add_argument("--output", default=None, help="default: docs/results/pretrain_exits")
    parser.add_argument(
        "--models", nargs="+", choices=MODELS, default=list(MODELS), help="pre-train (arms) and evaluate these only"
    )
    parser.add_argument("--no-report", action="store_true", help="run the units only")
    parser.add_argument("--pretrain-only", action="store_true", help="pre-train the arms, evaluate nothing")
    args = parser.parse_args(argv)
    missing = data_available()
    if missing:
        raise SystemExit(f"pretrain_exits: {missing}")
    work = Path(args.work_dir) / args.scale
    results = run(
        args.scale,
        work,
        resolve_out(args.output, "pretrain_exits"),
        args.models,
        not args.no_report,
        args.pretrain_only,
    )
    if results is None:
        return
    problems = check(results)
    if problems:
        raise SystemExit("pretrain_exits: non-finite or missing results:\n" + "\n".join(problems))
    print(f"pretrain_exits: done in {results['wall_s_this_invocation'] / 60:.1f} min")


if __name__ == "__main__":
    main()
