"""Claim 2 (issue #20): grouped exits (G=2) save time at comparable quality, against all exits every step (G=1).

Both continue pre-training MiniLM on the claim-1 corpus with gradient equilibrium, under the claim-1 budget rule
(every arm >= 3 M tokens). G=1 trains all 6 exits every step; G=2 alternates {1,3,5,6} and {2,4,6}.
- Equal steps: G=2 and G=1 both `steps` steps (the G=2 run is claim 1's arm (a): same settings, same work dir,
  reused, not rerun).
- Equal wall time: G=2 gets the steps it can do in the time G=1 needs for `steps`: round(steps x t(G=1) / t(G=2))
  with the per-step times measured interleaved in one process (`step_timing`), with its own complete lr schedule.
Quality: per-exit MLM loss on the same masked samples of the held-out books, and the claim-1 linear probes.
Speed: the same interleaved timing at MiniLM size and at base size (hidden 768, 12 layers), with the heads' share
of a G=1 step (the upper bound on what grouping can save).

    python -m experiments.grouping --scale report      # resumable; share --work-dir with pretrain_exits
    python -m experiments.grouping --scale smoke
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

from experiments.common import fmt_mean_std, write_json
from experiments.pretrain_exits import precision_check
from experiments.pretrain_lab import (
    MULTI_EXIT_G1,
    MULTI_EXIT_G2,
    SCALES,
    Arm,
    Scale,
    all_finite,
    data_available,
    heldout_mlm_loss,
    limit_threads,
    majority_baseline,
    md_table,
    model_name,
    prepare_corpus,
    pretrain_arm,
    resolve_out,
    run_summary,
    verdict,
    work_totals,
)
from experiments.probes import FEATURES, TASKS, probe_model
from experiments.step_timing import step_timing

ARMS = ("G2_equal_steps", "G1", "G2_equal_time")
ARM_LABELS = {
    "G2_equal_steps": "G=2, equal steps (claim 1's arm (a))",
    "G1": "G=1 (reference)",
    "G2_equal_time": "G=2, equal wall time",
}


def equal_time_arm(scale: Scale, timing: dict) -> tuple[Arm, float]:
    """G=2 with the steps it fits in G=1's time for `steps`, from the interleaved CPU-time ratio at this size."""
    precision = "bf16" if scale.precision == "bf16-autocast" else "fp32"
    ratio = timing["shapes"]["minilm"]["ratios"][precision]["g1_over_g2_cpu_min"]
    return Arm("G2_ge", num_groups=2, gradient_equilibrium=True, steps=round(scale.steps * ratio)), ratio


def run(scale_name: str, work: Path, out: Path, only: list[str], report: bool) -> dict | None:
    scale = SCALES[scale_name]
    limit_threads()
    started = time.perf_counter()
    data = prepare_corpus(work, scale)
    seed = scale.seeds[0]
    timing = step_timing(work, scale, data)
    g2_time, ratio = equal_time_arm(scale, timing)
    arms = {"G2_equal_steps": MULTI_EXIT_G2, "G1": MULTI_EXIT_G1, "G2_equal_time": g2_time}
    exports = {}
    for name in ARMS:
        if name not in only:
            continue
        if name == "G2_equal_steps":
            precision_check(work, scale, data, seed)  # arm (a)'s first chunk, as in pretrain_exits
        exports[name] = pretrain_arm(work, scale, arms[name], seed, data)
        final = max(exports[name])
        for step, path in exports[name].items():
            model = model_name(arms[name], scale, step)
            heldout_mlm_loss(work, scale, model, path, data)
            if step == final:
                for task in TASKS:
                    probe_model(work, scale.probe, model, path, task, scale.seeds)
    if not report or set(only) != set(ARMS):
        print(f"grouping: units done for {only}; the report needs every arm (run without --only)")
        return None
    results = collect(work, scale, scale_name, arms, exports, timing, ratio)
    results["wall_s_this_invocation"] = time.perf_counter() - started
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", results)
    plot(results, out / "heldout_mlm_loss.png", out / "step_time.png")
    (out / "section.md").write_text(section(results, verdict(out)), encoding="utf-8")
    return results


def collect(work: Path, scale: Scale, scale_name: str, arms: dict, exports: dict, timing: dict, ratio: float) -> dict:
    units = work / "units"
    runs = {}
    for name, arm in arms.items():
        final = max(exports[name])
        models = {step: model_name(arm, scale, step) for step in exports[name]}
        runs[name] = {
            "pretrain": run_summary(work, scale, arm, scale.seeds[0]),
            "heldout": {str(step): json.loads((units / f"heldout_{m}.json").read_text()) for step, m in models.items()},
            "probes": {task: json.loads((units / f"probe_{models[final]}_{task}.json").read_text()) for task in TASKS},
        }
    return {
        "experiment": "grouping",
        "scale": scale_name,
        "settings": asdict(scale),
        "equal_time_ratio_g1_over_g2": ratio,
        "runs": runs,
        "probe_summary": {name: summarise_probe(r["probes"]) for name, r in runs.items()},
        "step_timing": timing,
        "analytic_heads_share": analytic_heads_share(timing),
        "majority_baseline": {t: majority_baseline(t, scale.probe.dev_examples) for t in TASKS},
        "compute": work_totals(work),
    }


def analytic_heads_share(timing: dict) -> dict:
    """The heads' share of a G=1 step by the FLOPs model (elasticbert.flops), at seq 128 and at the paper's 512,
    and the bound it puts on G=1 ÷ G=2: what the measured share should be compared with, and how it moves with seq."""
    from elasticbert import ElasticBertConfig
    from elasticbert.flops import layer_flops, training_flops_per_token
    from experiments.step_timing import exit_count_share_removed

    out = {}
    for name, t in timing["shapes"].items():
        cfg = ElasticBertConfig(vocab_size=30522, max_position_embeddings=512, **t["shape"])
        layers = cfg.num_hidden_layers
        for seq in (128, 512):
            total = training_flops_per_token(cfg, range(1, layers + 1), seq)
            encoder = 3 * layer_flops(cfg, seq).matmul * layers / seq
            share = 1 - encoder / total
            out[f"{name}_seq{seq}"] = {
                "heads_share_g1": share,
                "bound_g1_over_g2": 1 / (1 - share * exit_count_share_removed(layers)),
            }
    return out


def summarise_probe(by_task: dict) -> dict:
    from experiments.common import mean_std

    summary: dict = {}
    for task, result in by_task.items():
        for kind in FEATURES:
            for layer in range(1, 7):
                scores = [r["score"] for r in result["runs"] if r["feature"] == kind and r["layer"] == layer]
                mean, std = mean_std(scores)
                summary.setdefault(task, {}).setdefault(kind, {})[str(layer)] = {
                    "mean": mean,
                    "std": std,
                    "scores": scores,
                }
    return summary


def _pyplot():  # noqa: ANN202 - matplotlib's module
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


COLOURS = {"G2_equal_steps": "tab:blue", "G1": "tab:orange", "G2_equal_time": "tab:purple"}


def plot(results: dict, loss_path: Path, time_path: Path) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.3))
    ax = axes[0]
    for name in ARMS:
        r = results["runs"][name]
        final = max(r["heldout"], key=int)
        loss = r["heldout"][final]["mlm_loss"]
        ax.plot(range(1, 7), loss, marker="o", color=COLOURS[name], label=f"{ARM_LABELS[name]}, {final} steps")
    ax.set_xlabel("exit (layer)")
    ax.set_ylabel("held-out MLM loss (lower is better)")
    ax.set_title("Per-exit MLM loss on the held-out books")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    for ax, task in zip(axes[1:], TASKS):
        for name in ARMS:
            rows = results["probe_summary"][name][task]["pooled"]
            ax.errorbar(
                range(1, 7),
                [rows[str(x)]["mean"] for x in range(1, 7)],
                yerr=[rows[str(x)]["std"] for x in range(1, 7)],
                marker="o",
                capsize=3,
                color=COLOURS[name],
                label=ARM_LABELS[name],
            )
        ax.axhline(results["majority_baseline"][task]["score"], color="k", ls=":", lw=1, label="majority class")
        ax.set_xlabel("layer l")
        ax.set_ylabel("dev score (probe, mean ± std, 3 seeds)")
        ax.set_title(f"{task}: linear probe on the pooled [CLS]")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(loss_path, dpi=100)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, shape in zip(axes, ("minilm", "base")):
        t = results["step_timing"]["shapes"][shape]
        names = list(t["step_s"])
        ax.bar(names, [t["step_s"][n]["cpu_min"] for n in names], color="tab:gray")
        for i, n in enumerate(names):
            ax.text(i, t["step_s"][n]["cpu_min"], f"{t['step_s'][n]['cpu_min']:.2f}", ha="center", va="bottom")
        s = t["shape"]
        ax.set_title(f"hidden {s['hidden_size']}, {s['num_hidden_layers']} layers, batch {t['batch']} x 128")
        ax.set_ylabel("CPU s per optimizer step (fastest round)")
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle("Per-step time, variants interleaved in one process (1 thread)")
    fig.tight_layout()
    fig.savefig(time_path, dpi=100)
    plt.close(fig)


def section(results: dict, verdict_md: str) -> str:
    s = results["settings"]
    runs = results["runs"]
    timing = results["step_timing"]
    parts = [
        "## Claim 2: grouped exits (G=2) vs all exits every step (G=1)",
        "",
        f"Scale `{results['scale']}`. Command: `python -m experiments.grouping --scale {results['scale']}` "
        "(resumable; shares its work directory, corpus and G=2 run with `experiments.pretrain_exits`).",
        "",
        f"All arms: claim 1's setup (MiniLM weights, Gutenberg + WikiText, seq {s['seq_len']}, batch "
        f"{s['global_batch']}, lr {s['lr']:g}, {s['precision']}), gradient equilibrium on. Equal steps: "
        f"{s['steps']} each. Equal wall time: G=2 gets round({s['steps']} × t(G=1) ÷ t(G=2)) = "
        f"{runs['G2_equal_time']['pretrain']['steps']} steps, with t from the interleaved CPU-time measurement "
        f"below ({results['equal_time_ratio_g1_over_g2']:.3f}×), and its own complete lr schedule.",
        "",
        "### Held-out MLM loss per exit (lower is better)",
        "",
    ]
    rows = []
    for name in ARMS:
        r = runs[name]
        for step in sorted(r["heldout"], key=int):
            rows.append(
                [ARM_LABELS[name], step, f"{r['pretrain']['tokens']:,}" if step == max(r["heldout"], key=int) else ""]
                + [f"{x:.3f}" for x in r["heldout"][step]["mlm_loss"]]
            )
    h = runs["G1"]["heldout"][max(runs["G1"]["heldout"], key=int)]
    parts += [
        md_table(["arm", "step", "tokens (whole run)"] + [f"exit {e}" for e in range(1, 7)], rows),
        "",
        f"({h['samples']} samples of seq {s['seq_len']} evenly spaced over the held-out books, "
        f"{h['masked_tokens']:,} masked tokens, masking identical for every model.)",
        "",
    ]
    for task in TASKS:
        for kind in FEATURES:
            what = "pooled [CLS]" if kind == "pooled" else "mean-pooled tokens"
            rows = [
                [ARM_LABELS[n]]
                + [fmt_mean_std(results["probe_summary"][n][task][kind][str(x)]["scores"]) for x in range(1, 7)]
                for n in ARMS
            ]
            rows.append(["majority class"] + [f"{results['majority_baseline'][task]['score']:.1f}"] * 6)
            parts += [
                f"### {task}: linear probe on {what} (final weights)",
                "",
                md_table(["arm"] + [f"L{x}" for x in range(1, 7)], rows),
                "",
            ]
    parts += ["### Time per step (interleaved, one process, one thread)", ""]
    rows = []
    for shape, t in timing["shapes"].items():
        for n, v in t["step_s"].items():
            rows.append(
                [
                    shape,
                    n,
                    f"{v['cpu_min']:.3f}",
                    f"{v['wall_min']:.3f}",
                    " ".join(f"{x:.2f}" for x in v["cpu_per_round"]),
                ]
            )
    parts += [
        md_table(["shape", "variant", "CPU s (fastest round)", "wall s (fastest round)", "CPU s per round"], rows),
        "",
    ]
    for shape, t in timing["shapes"].items():
        for precision in ("bf16", "fp32"):
            r = t["ratios"].get(precision)
            if not r:
                continue
            line = (
                f"- {shape} ({t['shape']['hidden_size']} hidden, {t['shape']['num_hidden_layers']} layers), "
                f"{precision}: G=1 ÷ G=2 {r['g1_over_g2_cpu_min']:.2f}× (CPU), {r['g1_over_g2_wall_min']:.2f}× (wall)"
            )
            if "heads_share_g1_cpu_min" in r:
                line += (
                    f"; heads' share of a G=1 step {100 * r['heads_share_g1_cpu_min']:.0f} % → bound on "
                    f"G=1 ÷ G=2 {r['bound_g1_over_g2_cpu_min']:.2f}×"
                )
            parts.append(line + ".")
    parts.append(
        "- FLOPs model (`elasticbert.flops`), heads' share of a G=1 step and the bound on G=1 ÷ G=2: "
        + "; ".join(
            f"{k.replace('_seq', ', seq ')}: {100 * v['heads_share_g1']:.0f} % → {v['bound_g1_over_g2']:.2f}×"
            for k, v in results["analytic_heads_share"].items()
        )
        + "."
    )
    parts += [
        "",
        f"Load average {timing['loadavg_start']:.1f} at the start and {timing['loadavg_end']:.1f} at the end of the "
        f"timing ({timing['cpus']} cores; the machine is shared with other jobs), {timing['rounds']} rounds after "
        "a warm-up round; the fastest round is kept (other processes only ever add time).",
        "",
        "Whole runs (sum of step times from metrics.jsonl; not comparable between runs on a shared machine): "
        + "; ".join(
            f"{ARM_LABELS[n]} {runs[n]['pretrain']['steps']} steps, {runs[n]['pretrain']['train_s'] / 60:.1f} min, "
            f"process CPU {runs[n]['pretrain']['process_cpu_s'] / 60:.1f} min"
            for n in ARMS
        )
        + ".",
        "",
        "![held-out MLM loss and probes](heldout_mlm_loss.png)",
        "",
        "![time per step](step_time.png)",
        "",
        verdict_md,
        "",
    ]
    return "\n".join(parts)


def check(results: dict) -> list[str]:
    problems = []
    for name in ARMS:
        r = results["runs"][name]
        for step, h in r["heldout"].items():
            if not all_finite(h["mlm_loss"]):
                problems.append(f"{name} step {step}: {h['mlm_loss']}")
    return problems


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="report")
    parser.add_argument(
        "--work-dir",
        default="/tmp/exp_pretrain",
        help="runs, checkpoints, tokenised corpus (share it with pretrain_exits to reuse its G=2 arm)",
    )
    parser.add_argument("--output", default=None, help="default: docs/results/grouping")
    parser.add_argument("--only", nargs="+", choices=ARMS, default=list(ARMS), help="run these arms only")
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args(argv)
    missing = data_available()
    if missing:
        raise SystemExit(f"grouping: {missing}")
    results = run(
        args.scale,
        Path(args.work_dir) / args.scale,
        resolve_out(args.output, "grouping"),
        args.only,
        not args.no_report,
    )
    if results is None:
        return
    problems = check(results)
    if problems:
        raise SystemExit("grouping: non-finite or missing results:\n" + "\n".join(problems))
    print(f"grouping: done in {results['wall_s_this_invocation'] / 60:.1f} min")


if __name__ == "__main__":
    main()
