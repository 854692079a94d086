"""Experiment 2 (issue #10): does grouping exits (G=2) cost nothing in quality and save time, against G=1?

Both continue pre-training MiniLM on Gutenberg with gradient equilibrium; G=1 trains all 6 exits every step, G=2
alternates {1,3,5,6} and {2,4,6}. Compared at equal steps, and at equal wall time (G=1 gets the steps it can do in
G=2's training time, measured per seed from the two equal-steps runs' median step times, with its own complete lr
schedule). Quality: per-exit MLM loss on the same masked samples of Gutenberg books never trained on. The G=2
equal-steps arm is exactly experiment 1's arm (a) (same settings, same work dir): it is reused, not rerun.

    python -m experiments.grouping --scale report      # resumable
    python -m experiments.grouping --scale smoke
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path

from experiments.common import SEEDS, fmt_mean_std, mean_std, write_json
from experiments.pretrain_lab import (
    MULTI_EXIT_G2,
    SCALES,
    Arm,
    all_finite,
    data_available,
    heldout_mlm_loss,
    limit_threads,
    md_table,
    prepare_corpus,
    pretrain,
    resolve_out,
    verdict,
)

ARMS = ("G2_equal_steps", "G1_equal_steps", "G1_equal_time")
ARM_LABELS = {
    "G2_equal_steps": "G=2 (equal steps = reference)",
    "G1_equal_steps": "G=1, equal steps",
    "G1_equal_time": "G=1, equal wall time",
}


def run(scale_name: str, work: Path, out: Path, seeds: list[int]) -> dict:
    scale = SCALES[scale_name]
    limit_threads()
    started = time.perf_counter()
    data = prepare_corpus(work, "train", scale.train_books)
    heldout = prepare_corpus(work, "heldout", scale.heldout_books)
    runs: dict[str, dict[str, dict]] = {arm: {} for arm in ARMS}
    for seed in seeds:
        g2 = pretrain(work, scale, MULTI_EXIT_G2, seed, data)
        g1 = pretrain(work, scale, Arm("grouped", num_groups=1, gradient_equilibrium=True), seed, data)
        equal_time_steps = max(1, round(scale.pretrain_steps * g2["median_step_s"] / g1["median_step_s"]))
        g1_time = pretrain(
            work, scale, Arm("grouped", num_groups=1, gradient_equilibrium=True, steps=equal_time_steps), seed, data
        )
        for arm, r in zip(ARMS, (g2, g1, g1_time)):
            evaluation = heldout_mlm_loss(work, scale, f"{arm}_seed{seed}", Path(r["hf_dir"]), heldout)
            runs[arm][str(seed)] = {
                "pretrain": {k: v for k, v in r.items() if k != "hf_dir"},
                "steps": len(r["step_time_s"]),
                "heldout": evaluation,
            }
    results = {
        "experiment": "grouping",
        "scale": scale_name,
        "settings": asdict(scale),
        "seeds": seeds,
        "runs": runs,
        "summary": summarise(runs, seeds),
        "wall_s_this_invocation": time.perf_counter() - started,
    }
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", results)
    plot(results, out / "heldout_mlm_loss.png", out / "step_time.png")
    (out / "section.md").write_text(section(results, verdict(out)), encoding="utf-8")
    return results


def summarise(runs: dict, seeds: list[int]) -> dict:
    """Per arm: held-out MLM loss per exit (mean, std, every seed), steps, median step time, training time."""
    summary: dict = {}
    for arm in ARMS:
        by_seed = [runs[arm][str(s)] for s in seeds]
        exits = by_seed[0]["heldout"]["exits"]
        summary[arm] = {
            "mlm_loss": {
                str(e): dict(
                    zip(("mean", "std"), mean_std([r["heldout"]["mlm_loss"][i] for r in by_seed])),
                    values=[r["heldout"]["mlm_loss"][i] for r in by_seed],
                )
                for i, e in enumerate(exits)
            },
            "mlm_accuracy": {str(e): [r["heldout"]["mlm_accuracy"][i] for r in by_seed] for i, e in enumerate(exits)},
            "steps": [r["steps"] for r in by_seed],
            "median_step_s": [r["pretrain"]["median_step_s"] for r in by_seed],
            "train_s": [r["pretrain"]["train_s"] for r in by_seed],
        }
    g1_steps, g2_steps = summary["G1_equal_steps"]["median_step_s"], summary["G2_equal_steps"]["median_step_s"]
    summary["speedup_G2_over_G1_per_step"] = [g1 / g2 for g1, g2 in zip(g1_steps, g2_steps)]
    return summary


def plot(results: dict, loss_path: Path, time_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for arm in ARMS:
        rows = results["summary"][arm]["mlm_loss"]
        exits = [int(e) for e in rows]
        ax.errorbar(
            exits,
            [rows[e]["mean"] for e in rows],
            yerr=[rows[e]["std"] for e in rows],
            marker="o",
            capsize=3,
            label=ARM_LABELS[arm],
        )
    ax.set_xlabel("exit (layer)")
    ax.set_ylabel("held-out MLM loss (mean ± std over seeds)")
    ax.set_title("Per-exit MLM loss on held-out Gutenberg books")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(loss_path, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 4))
    arms = ("G2_equal_steps", "G1_equal_steps")
    means = [mean_std(results["summary"][a]["median_step_s"])[0] for a in arms]
    stds = [mean_std(results["summary"][a]["median_step_s"])[1] for a in arms]
    ax.bar(["G=2", "G=1"], means, yerr=stds, capsize=4, color=["tab:blue", "tab:orange"])
    ax.set_ylabel("median seconds per optimizer step (1 thread)")
    ax.set_title("Time per pre-training step")
    fig.tight_layout()
    fig.savefig(time_path, dpi=110)
    plt.close(fig)


def section(results: dict, verdict_md: str) -> str:
    s, summary, seeds = results["settings"], results["summary"], results["seeds"]
    exits = list(summary["G2_equal_steps"]["mlm_loss"])
    parts = [
        "## Experiment 2 — grouped exits (G=2) vs all exits every step (G=1)",
        "",
        f"Scale `{results['scale']}`, seeds {seeds}.",
        "",
        "```",
        "python -m experiments.grouping --scale " + results["scale"],
        "```",
        "",
        f"Both from MiniLM, gradient equilibrium on, {len(s['train_books'])} Gutenberg training books, seq "
        f"{s['seq_len']}, global batch {s['global_batch']}, AdamW lr {s['lr']}, linear decay, fp32, 1 process, "
        f"1 thread. Equal steps: {s['pretrain_steps']} each. Equal wall time: G=1 gets round({s['pretrain_steps']} "
        "× median G=2 step ÷ median G=1 step) steps (per seed, from that seed's two equal-steps runs). Held-out: "
        f"{s['heldout_samples']} samples of seq {s['seq_len']} spread evenly over {', '.join(s['heldout_books'])} "
        "(never trained on), masking seeded identically for every model.",
        "",
        "### Held-out MLM loss per exit, mean ± std over seeds (lower is better)",
        "",
    ]
    rows = [
        [ARM_LABELS[a], fmt_mean_std(summary[a]["steps"], 0)]
        + [fmt_mean_std(summary[a]["mlm_loss"][e]["values"], 3) for e in exits]
        for a in ARMS
    ]
    parts += [md_table(["arm", "steps"] + [f"exit {e}" for e in exits], rows), "", "Every run:", ""]
    rows = []
    for a in ARMS:
        for seed in seeds:
            r = results["runs"][a][str(seed)]
            rows.append(
                [ARM_LABELS[a], str(seed), str(r["steps"]), f"{r['pretrain']['train_s']:.0f}"]
                + [f"{x:.3f}" for x in r["heldout"]["mlm_loss"]]
            )
    parts += [md_table(["arm", "seed", "steps", "train s"] + [f"exit {e}" for e in exits], rows), ""]
    parts += ["### Time per step", ""]
    rows = [
        [
            ARM_LABELS[a],
            " ".join(f"{x:.2f}" for x in summary[a]["median_step_s"]),
            fmt_mean_std(summary[a]["median_step_s"], 2),
            fmt_mean_std(summary[a]["train_s"], 0),
        ]
        for a in ARMS
    ]
    parts += [
        md_table(["arm", "median s/step per seed", "mean ± std", "training s (sum of steps)"], rows),
        "",
        f"G=1 ÷ G=2 seconds per step: {' '.join(f'{x:.2f}' for x in summary['speedup_G2_over_G1_per_step'])}"
        f" (mean {fmt_mean_std(summary['speedup_G2_over_G1_per_step'], 2)}).",
        "",
        f"Compute: {pretrain_minutes(results):.1f} min of `pretrain train` processes (start-up included; the "
        "G=2 runs are shared with experiment 1), 1 thread each. Timings come from a 2-core machine shared with "
        "other jobs (load 2–4), so step times carry about ±15 % noise.",
        "",
        "![held-out MLM loss](heldout_mlm_loss.png) ![time per step](step_time.png)",
        "",
        verdict_md,
        "",
    ]
    return "\n".join(parts)


def pretrain_minutes(results: dict) -> float:
    """Distinct pre-training runs only: the equal-time arm reuses the equal-steps run when the step counts match."""
    walls = {
        (r["pretrain"]["command"]): r["pretrain"]["process_wall_s"]
        for by_seed in results["runs"].values()
        for r in by_seed.values()
    }
    return sum(walls.values()) / 60


def check(results: dict) -> list[str]:
    problems = []
    for arm in ARMS:
        for seed in results["seeds"]:
            r = results["runs"][arm][str(seed)]
            values = r["heldout"]["mlm_loss"] + [r["pretrain"]["median_step_s"]]
            if not all_finite(values):
                problems.append(f"{arm} seed {seed}: {values}")
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
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    args = parser.parse_args(argv)
    missing = data_available()
    if missing:
        raise SystemExit(f"grouping: {missing}")
    results = run(args.scale, Path(args.work_dir) / args.scale, resolve_out(args.output, "grouping"), args.seeds)
    problems = check(results)
    if problems:
        raise SystemExit("grouping: non-finite or missing results:\n" + "\n".join(problems))
    print(f"grouping: done in {results['wall_s_this_invocation'] / 60:.1f} min")


if __name__ == "__main__":
    main()
