"""Experiment 5 of issue #10: early-exit Pareto curves (dev score vs FLOPs per sample) of entropy, patience, PCEE and
learned exits (LTE) on the best model of the ACL ladder, and each strategy's ELUE score against that model's own
static per-layer curve (truncating the model at exit l, for every l).

Model choice (stated so it cannot be tuned after the fact): per task, the ladder rung with the highest mean
cross-layer average over seeds, and of that rung the seed with the highest cross-layer average; or `--model DIR`
for one task.

    python experiments/early_exit_pareto.py --scale report   # after experiments/acl_ladder.py --scale report
    python experiments/early_exit_pareto.py --scale smoke --ladder-results OUT/acl_ladder/results.json

Every number comes from `python -m finetune early-exit` and `python -m finetune elue-score` run as subprocesses.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.io import read_object  # noqa: E402
from experiments.common import GLUE_DIR, RESULTS_DIR, mean_std, run_cli, write_json  # noqa: E402
from finetune.serve.early_exit.operating_point import load_result  # noqa: E402

STRATEGIES = ("entropy", "patience", "pcee", "lte")


@dataclass(frozen=True)
class Scale:
    """Evaluation budget: dev subset, tokenised length, the LTE head's training data."""

    dev_limit: int
    max_length: int
    lte_samples: int
    lte_epochs: int
    tasks: tuple[str, ...]


SCALES = {
    "smoke": Scale(dev_limit=32, max_length=32, lte_samples=32, lte_epochs=2, tasks=("MRPC",)),
    "report": Scale(dev_limit=200, max_length=64, lte_samples=400, lte_epochs=30, tasks=("MRPC", "SST-2")),
}


def pick_models(ladder: dict, tasks: tuple[str, ...]) -> dict[str, dict]:
    """Per task: best rung by mean cross-layer average over seeds, then that rung's best seed. Ties go to the
    earlier rung of the ladder and the lower seed (max() keeps the first maximum)."""
    order = [r["name"] for r in ladder["rungs"]]
    picked = {}
    for task in tasks:
        rungs = ladder["summary"]["table"].get(task, {})
        if not rungs:
            raise SystemExit(f"early_exit_pareto: the ladder results have no successful run for {task}")
        rung = max((name for name in order if name in rungs), key=lambda name: rungs[name]["cross_layer_avg"][0])
        runs = sorted(
            (r for r in ladder["runs"] if r["task"] == task and r["rung"] == rung and r["status"] == "ok"),
            key=lambda r: r["seed"],
        )
        best = max(runs, key=lambda r: r["cross_layer_avg"])
        picked[task] = {
            "rung": rung,
            "seed": best["seed"],
            "cross_layer_avg": best["cross_layer_avg"],
            "rung_mean": rungs[rung]["cross_layer_avg"],
            "model": str(Path(best["run_dir"]) / "best"),
        }
    return picked


def early_exit(task: str, model: str, scale: Scale, work_dir: Path) -> tuple[Path, float]:
    """Sweep the four strategies on one model; returns (early-exit JSON, wall seconds)."""
    out = work_dir / task
    args = [
        "early-exit",
        "--model",
        model,
        "--task",
        task,
        "--data-dir",
        str(GLUE_DIR),
        "--strategy",
        ",".join(STRATEGIES),
        "--max-examples",
        str(scale.dev_limit),
        "--max-length",
        str(scale.max_length),
        "--threads",
        "1",
        "--output",
        str(out),
        "--no-merge",
        "--train-lte",
        "--max-lte-examples",
        str(scale.lte_samples),
        "--lte-epochs",
        str(scale.lte_epochs),
    ]
    wall = run_cli("finetune", args, work_dir / "logs" / f"early_exit_{task}.log")
    return next(out.glob("early_exit_*_dev_bs*.json")), wall


def elue(paths: list[Path], work_dir: Path) -> dict:
    """ELUE score of every strategy against the model's own static curve (the early-exit JSON's static points)."""
    report = work_dir / "elue_score.json"
    files = [str(p) for p in paths]
    run_cli(
        "finetune",
        ["elue-score", "--baseline", *files, "--points", *files, "--output", str(report), "--overwrite"],
        work_dir / "logs" / "elue_score.log",
    )
    return read_object(report, what="an elue-score report")


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not dominated by a cheaper-or-equal point with a higher-or-equal score."""
    front, best = [], -math.inf
    for f, s in sorted(points, key=lambda p: (p[0], -p[1])):
        if s > best:
            front.append((f, s))
            best = s
    return front


def plot_pareto(curves: dict[str, dict], path: Path) -> None:
    """Score vs MFLOPs per task: the static curve and every strategy's operating points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(curves)
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        data = curves[task]
        static = data["static"]
        ax.plot(
            [p["mean_flops"] / 1e6 for p in static],
            [p["score"] for p in static],
            "k-o",
            ms=3,
            label="static (truncate at l)",
        )
        for name in STRATEGIES:
            pts = sorted(data["strategies"].get(name, {}).get("points", []), key=lambda p: p["mean_flops"])
            pts = [p for p in pts if p["score"] is not None]
            if pts:
                ax.plot(
                    [p["mean_flops"] / 1e6 for p in pts],
                    [p["score"] for p in pts],
                    "-^",
                    ms=4,
                    lw=1,
                    alpha=0.8,
                    label=name,
                )
        ax.set_title(f"{task} ({data['num_samples']} dev samples)")
        ax.set_xlabel("mean MFLOPs per sample")
        ax.set_ylabel("dev score")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_section(results: dict, path: Path) -> None:
    """A draft report section with every number taken from results.json."""
    s = results["settings"]
    lines = [
        "## Claim 5 — early exit: Pareto curves and ELUE score",
        "",
        "**Claim.** Dynamic early exit (entropy, patience/PABEE, PCEE, learned exits) on a multi-exit model reaches "
        "a better score at equal FLOPs than truncating the model statically (ELUE score > 0 against the model's "
        "own static curve).",
        "",
        f"**Command.** `python experiments/early_exit_pareto.py --scale {results['scale']}` (after the ladder).",
        "",
        f"**Settings.** Model per task: {results['model_rule']} Dev subset: {s['dev_limit']} examples (seed 0 "
        f"subset of `early-exit --max-examples`), max length {s['max_length']}, batch 32, 1 thread. LTE head trained "
        f"on {s['lte_samples']} training rows for {s['lte_epochs']} epochs (backbone and exits frozen). Default "
        "threshold sweeps of `finetune early-exit` (entropy 7, patience k = 0…5, PCEE 7 with patience 2, LTE the "
        "head's own quantiles). ELUE score = mean over a strategy's operating points of (score − static curve "
        "interpolated at the point's FLOPs), clamped outside the static range; the benchmark column is the mean "
        "over tasks.",
        "",
        "| task | model (rung, seed) | cross-layer avg | full model score | full MFLOPs |",
        "|---|---|---|---|---|",
    ]
    for task, m in results["models"].items():
        full = results["curves"][task]["full_model"]
        lines.append(
            f"| {task} | {m['rung']}, seed {m['seed']} | {m['cross_layer_avg']:.2f} | "
            f"{full['score']:.2f} | {full['mean_flops'] / 1e6:.1f} |"
        )
    tasks = list(results["models"])
    lines += [
        "",
        "### ELUE score vs the model's own static curve",
        "",
        "| strategy | " + " | ".join(tasks) + " | mean |",
        "|---|" + "---|" * (len(tasks) + 1),
    ]
    for name in STRATEGIES:
        entry = results["elue"].get(name)
        if entry is None:
            lines.append(f"| {name} | " + " | ".join(["n/a"] * (len(tasks) + 1)) + " |")
            continue
        cells = [
            f"{entry['tasks'][t]['score']:+.2f}"
            if t in entry["tasks"] and entry["tasks"][t]["score"] is not None
            else "n/a"
            for t in tasks
        ]
        mean = entry["score"]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'n/a' if mean is None else f'{mean:+.2f}'} |")
    lines += ["", "### Every operating point", ""]
    for task in tasks:
        data = results["curves"][task]
        lines += [
            f"**{task}**",
            "",
            "| strategy | threshold | score | MFLOPs | FLOPs speed-up | exit histogram |",
            "|---|---|---|---|---|---|",
        ]
        for p in data["static"]:
            lines.append(
                f"| static | layer {p['layer']} | {p['score']:.2f} | {p['mean_flops'] / 1e6:.1f} | "
                f"{p['flops_speedup']:.2f} | |"
            )
        for name in STRATEGIES:
            for p in data["strategies"].get(name, {}).get("points", []):
                hist = " ".join(str(v) for v in p.get("exit_histogram", {}).values())
                score = "n/a" if p["score"] is None else f"{p['score']:.2f}"
                lines.append(
                    f"| {name} | {p['threshold']:g} | {score} | {p['mean_flops'] / 1e6:.1f} | "
                    f"{p['flops_speedup']:.2f} | {hist} |"
                )
        lines.append("")
    notes = path.with_name("notes.md")
    if notes.is_file():  # the analysis written after the run, kept across regenerations of the tables
        lines += ["### Discussion (written after the run)", "", notes.read_text(encoding="utf-8").strip(), ""]
    lines += [
        f"Wall time: {results['total_wall_s'] / 60:.1f} min at 1 thread (early-exit sweeps incl. LTE training, "
        "and elue-score).",
        "",
        "Plot: `pareto.png`.",
        "",
    ]
    path.write_text("\n".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="report")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/exp_finetune/early_exit"))
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "early_exit")
    parser.add_argument("--ladder-results", type=Path, default=RESULTS_DIR / "acl_ladder" / "results.json")
    parser.add_argument("--model", default=None, help="a fine-tuned multi-exit model dir (needs exactly one --tasks)")
    parser.add_argument("--tasks", nargs="+", default=None, help="default: the scale's")
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help="accepted for symmetry with the other scripts; the model choice fixes the seed",
    )
    args = parser.parse_args(argv)
    base = SCALES[args.scale]
    scale = Scale(**{**asdict(base), "tasks": tuple(args.tasks or base.tasks)})
    if not GLUE_DIR.is_dir():
        sys.exit(f"early_exit_pareto: GLUE data not found at {GLUE_DIR}")
    if args.model:
        if len(scale.tasks) != 1:
            sys.exit("early_exit_pareto: --model needs exactly one --tasks")
        rule = f"given on the command line (`--model {args.model}`)."
        models = {scale.tasks[0]: {"rung": "given", "seed": None, "cross_layer_avg": math.nan, "model": args.model}}
    else:
        ladder = read_object(args.ladder_results, what="an ACL-ladder results file")
        rule = (
            "the ACL-ladder rung with the highest mean cross-layer dev average over seeds, and of that rung the "
            "seed with the highest cross-layer average (selection on the same dev subsets; stated before the "
            "sweeps ran)."
        )
        models = pick_models(ladder, scale.tasks)
    curves, walls, paths = {}, {}, []
    for task, m in models.items():
        path, walls[task] = early_exit(task, m["model"], scale, args.work_dir)
        curves[task] = load_result(path)
        paths.append(path)
        print(f"{task}: {m['rung']} seed {m['seed']}: early exit done in {walls[task]:.0f}s", flush=True)
    report = elue(paths, args.work_dir)
    fronts = {
        task: {
            name: pareto_front([(p["mean_flops"], p["score"]) for p in entry["points"] if p["score"] is not None])
            for name, entry in data["strategies"].items()
        }
        for task, data in curves.items()
    }
    results = {
        "experiment": "early_exit_pareto",
        "scale": args.scale,
        "settings": asdict(scale),
        "model_rule": rule,
        "models": models,
        "strategies": list(STRATEGIES),
        "curves": curves,
        "pareto_fronts": fronts,
        "elue": report,
        "wall_s": walls,
        "total_wall_s": sum(walls.values()),
        "elue_mean_over_strategies": mean_std([v["score"] for v in report.values() if v["score"] is not None])
        if report
        else None,
    }
    args.output.mkdir(parents=True, exist_ok=True)
    write_json(args.output / "results.json", results)
    plot_pareto(curves, args.output / "pareto.png")
    write_section(results, args.output / "section.md")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
