"""Issue 29: the ACL paper's λ sensitivity grid (its Table 3), on SST-2 at the ACL ladder's budget.

The paper says ACL is *not* sensitive to λ while CE+SCL is (λ ∈ {0.005, 0.01, 0.02, 0.1, 0.5, 1.0}). Our ladder
(docs/results/acl_ladder) ran λ = 0.02 with the contrastive term **sum**-reduced over the anchors (the formula's Σ_i)
while CE is a mean, so at batch 32 λ = 0.02 weighs like 0.64 of a mean. This grid runs both objectives at the six
λ values with each reduction, against plain 2ST with MHA exits, at the ladder's budget (2,000 × 1 epoch per 2ST
stage, MiniLM, MHA exits, the same dev rows, seeds 1-3); `--phase budget` then runs 2ST-MHA vs the full ACL recipe
at 3 epochs per stage at one setting, and `--phase exit-lr` runs both at the ladder's budget with the exit heads (and
ACL's label embeddings) at the backbone's learning rate instead of our 1e-3 (`--exit-lr same`).

    python experiments/acl_lambda.py                         # the grid, resumable run by run (~130 CPU-s each)
    python experiments/acl_lambda.py --reductions mean --lambdas 0.005 0.02 0.1    # a part of the grid
    python experiments/acl_lambda.py --phase budget --lam 0.02 --reduction mean
    python experiments/acl_lambda.py --phase exit-lr --lam 0.02 --reduction mean
    python experiments/acl_lambda.py --scale smoke           # seconds; what CI runs

Runs: --work-dir/<arm>/seed<k> (a run whose dev_scores.json exists is not trained again). Results (results.json,
section.md, lambda_grid.png) are rewritten after every run, so partial results are always on disk.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import json  # noqa: E402

from experiments.acl_ladder import RUNGS, SCALES, Rung, Scale, run_one, train_args  # noqa: E402
from experiments.common import GLUE_DIR, RESULTS_DIR, mean_std, write_json  # noqa: E402

TASK = "SST-2"
LAMBDAS = (0.005, 0.01, 0.02, 0.1, 0.5, 1.0)  # the ACL paper's Table 3
REDUCTIONS = ("mean", "sum")
BY_NAME = {rung.name: rung for rung in RUNGS}
BASELINE = BY_NAME["2ST-MHA"]
OBJECTIVES = {"CE+SCL": BY_NAME["CE+SCL"], "ACL": BY_NAME["+ACL-CL"]}  # ACL: ACL-Embed + ACL-Grad + ACL-CL


@dataclasses.dataclass(frozen=True)
class Arm:
    """One line of the grid: an objective at one λ and reduction (or the baseline), and its budget."""

    objective: str  # "2ST-MHA", "CE+SCL" or "ACL"
    lam: float | None
    reduction: str | None
    epochs: float
    exit_lr: str | None = None  # None: the scale's exit-head learning rate; "same": the backbone's

    @property
    def name(self) -> str:
        budget = ("" if self.epochs == 1 else f"_ep{self.epochs:g}") + (
            f"_exitlr-{self.exit_lr}" if self.exit_lr else ""
        )
        if self.lam is None:
            return f"2ST-MHA{budget}"
        return f"{self.objective}_{self.reduction}_lam{self.lam:g}{budget}"

    def rung(self) -> Rung:
        base = BASELINE if self.lam is None else OBJECTIVES[self.objective]
        return dataclasses.replace(base, name=self.name)

    def scale(self, base: Scale) -> Scale:
        changes: dict = {"epochs": {TASK: self.epochs}}
        if self.exit_lr is not None:
            changes.update(exit_lr=self.exit_lr)
        if self.lam is not None:
            changes.update(lam=self.lam, contrastive_reduction=self.reduction)
        return dataclasses.replace(base, **changes)


def grid_arms(reductions: tuple[str, ...] = REDUCTIONS, lambdas: tuple[float, ...] = LAMBDAS) -> list[Arm]:
    """The baseline first, then each reduction's grid: every objective at every λ (the seeds of an arm run
    together, so each finished arm is a complete table row)."""
    arms = [Arm("2ST-MHA", None, None, 1)]
    for reduction in reductions:
        arms += [Arm(objective, lam, reduction, 1) for lam in lambdas for objective in OBJECTIVES]
    return arms


def budget_arms(lam: float, reduction: str, epochs: float, exit_lr: str | None = None) -> list[Arm]:
    return [Arm("2ST-MHA", None, None, epochs, exit_lr), Arm("ACL", lam, reduction, epochs, exit_lr)]


def exit_lr_arms(lam: float, reduction: str) -> list[Arm]:
    """Both exit learning rates at the ladder's budget, so the effect on ACL is read against the effect on 2ST-MHA."""
    return budget_arms(lam, reduction, 1) + budget_arms(lam, reduction, 1, "same")


def ladder_runs(model: str, base: Scale, seeds: tuple[int, ...], work_dir: Path, ladder: Path) -> dict:
    """The ladder's SST-2 runs that *are* grid runs (CE+SCL and +ACL-CL at λ 0.02, sum): each is taken when its
    recorded command equals the grid arm's command but for `--output` (training is deterministic per seed: the
    grid's 2ST-MHA reproduces the ladder's to the last digit), so the grid does not train them again."""
    if not ladder.is_file():
        return {}
    ladder_rung = {"CE+SCL": "CE+SCL", "ACL": "+ACL-CL"}
    repo = RESULTS_DIR.parents[1]
    shown = ladder.relative_to(repo) if ladder.is_relative_to(repo) else ladder
    found = {}
    for record in json.loads(ladder.read_text(encoding="utf-8"))["runs"]:
        if record["task"] != TASK or record["status"] != "ok" or record["seed"] not in seeds:
            continue
        for objective, rung in ladder_rung.items():
            arm = Arm(objective, 0.02, "sum", 1)
            if record["rung"] != rung:
                continue
            run_dir = work_dir / TASK / arm.name / f"seed{record['seed']}"
            wanted = train_args(model, TASK, arm.rung(), record["seed"], arm.scale(base), run_dir)
            recorded = record["command"].split()[3:]  # after "python -m finetune"
            output = wanted.index("--output") + 1
            if len(recorded) == len(wanted) and recorded[:output] + recorded[output + 1 :] == (
                wanted[:output] + wanted[output + 1 :]
            ):
                found[(arm.name, record["seed"])] = {
                    **record,
                    "rung": arm.name,
                    "source": f"{shown} ({rung}: the same command)",
                }
    return found


def summarise(arms: list[Arm], runs: list[dict], seeds: tuple[int, ...]) -> dict:
    """Per arm: cross-layer average mean ± std, per-exit means, paired per-seed differences against the baseline of
    the same budget; per objective and reduction: the spread over λ (the paper's sensitivity claim)."""
    ok = {(r["rung"], r["seed"]): r for r in runs if r["status"] == "ok"}
    rows = {}
    for arm in arms:
        mine = [ok[(arm.name, s)] for s in seeds if (arm.name, s) in ok]
        if not mine:
            continue
        baseline = Arm("2ST-MHA", None, None, arm.epochs, arm.exit_lr).name
        diffs = [
            ok[(arm.name, s)]["cross_layer_avg"] - ok[(baseline, s)]["cross_layer_avg"]
            for s in seeds
            if arm.lam is not None and (arm.name, s) in ok and (baseline, s) in ok
        ]
        layers = sorted({layer for r in mine for layer in r["per_exit"]}, key=int)
        rows[arm.name] = {
            **dataclasses.asdict(arm),
            "n": len(mine),
            "cross_layer_avg": mean_std([r["cross_layer_avg"] for r in mine]),
            "per_exit": {layer: mean_std([r["per_exit"][layer] for r in mine])[0] for layer in layers},
            "paired_diffs_vs_2st_mha": diffs,
            "beats_2st_mha_on_every_seed": len(diffs) == len(seeds) and all(d > 0 for d in diffs),
        }
    spread = {}
    for objective in OBJECTIVES:
        for reduction in REDUCTIONS:
            means = {
                row["lam"]: row["cross_layer_avg"][0]
                for row in rows.values()
                if row["objective"] == objective
                and row["reduction"] == reduction
                and row["epochs"] == 1
                and row["exit_lr"] is None
            }
            if len(means) >= 2:
                spread[f"{objective}/{reduction}"] = {
                    "means": {f"{lam:g}": means[lam] for lam in sorted(means)},
                    "lambdas": sorted(means),
                    "range": max(means.values()) - min(means.values()),
                    "best_lam": max(means, key=means.get),
                }
    return {"rows": rows, "spread_over_lambda": spread}


def verdict(summary: dict) -> str:
    """The paper's claim ("ACL is not sensitive to λ, CE+SCL is") against the spreads measured, per reduction."""
    lines = []
    for reduction in REDUCTIONS:
        acl, scl = (
            summary["spread_over_lambda"].get(f"ACL/{reduction}"),
            summary["spread_over_lambda"].get(f"CE+SCL/{reduction}"),
        )
        if not acl or not scl:
            lines.append(f"{reduction}: not run (fewer than two λ for an objective)")
            continue
        common = [lam for lam in acl["means"] if lam in scl["means"]]
        if len(common) < 2:
            lines.append(f"{reduction}: not run (fewer than two λ shared by both objectives)")
            continue
        acl_range, scl_range = (
            max(m[lam] for lam in common) - min(m[lam] for lam in common) for m in (acl["means"], scl["means"])
        )
        over = "the six λ" if len(common) == len(LAMBDAS) else "λ ∈ {" + ", ".join(common) + "} only"
        held = acl_range < scl_range
        lines.append(
            f"{reduction}: spread of the cross-layer average over {over}: ACL {acl_range:.1f} points, CE+SCL "
            f"{scl_range:.1f} — the claim {'holds' if held else 'does not hold'} at this budget"
        )
    return "\n".join(lines)


def write_outputs(out: Path, arms: list[Arm], runs: list[dict], seeds: tuple[int, ...], meta: dict) -> None:
    summary = summarise(arms, runs, seeds)
    base_exit_lr = f"{meta['exit_lr']:g}" if isinstance(meta.get("exit_lr"), float) else str(meta.get("exit_lr"))
    write_json(out / "results.json", {**meta, "runs": runs, "summary": summary, "verdict": verdict(summary)})
    lines = [
        "| arm | λ | reduction | epochs/stage | exit lr | seeds | cross-layer avg | Δ vs 2ST-MHA per seed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in summary["rows"].values():
        mean, std = row["cross_layer_avg"]
        diffs = " / ".join(f"{d:+.1f}" for d in row["paired_diffs_vs_2st_mha"]) or "—"
        lam = "—" if row["lam"] is None else f"{row['lam']:g}"
        exit_lr = row["exit_lr"] or base_exit_lr
        lines.append(
            f"| {row['objective']} | {lam} | {row['reduction'] or '—'} | {row['epochs']:g} | {exit_lr} | {row['n']} | "
            f"{mean:.1f} ± {std:.1f} | {diffs} |"
        )
    if meta["experiment"].endswith("grid"):
        lines += ["", "Verdict:", "", *[f"- {line}" for line in verdict(summary).splitlines()]]
    lines += [
        "",
        "Every run (per-exit dev accuracy at the end of stage 2; the commands are in results.json):",
        "",
        "| arm | seed | cross-layer avg | L1 … L6 | wall s | note |",
        "|---|---|---|---|---|---|",
    ]
    for run in sorted(runs, key=lambda r: (r["rung"], r["seed"])):
        if run["status"] != "ok":
            lines.append(f"| {run['rung']} | {run['seed']} | failed | | | {run.get('error', '')[-80:]} |")
            continue
        exits = " · ".join(f"{v:.1f}" for v in run["per_exit"].values())
        note = "the ACL ladder's run (same command)" if run.get("source") else ""
        lines.append(
            f"| {run['rung']} | {run['seed']} | {run['cross_layer_avg']:.2f} | {exits} | {run['wall_s']:.0f} | {note} |"
        )
    notes = out / "notes.md"  # hand-written discussion, kept across regenerations
    if notes.is_file():
        lines += ["", notes.read_text(encoding="utf-8").rstrip()]
    (out / "section.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    plot(out / "lambda_grid.png", summary)


def plot(path: Path, summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    base = summary["rows"].get("2ST-MHA")
    if base:
        mean, std = base["cross_layer_avg"]
        ax.axhspan(mean - std, mean + std, color="grey", alpha=0.25, label=f"2ST-MHA {mean:.1f} ± {std:.1f}")
        ax.axhline(mean, color="grey", lw=1)
    for objective in OBJECTIVES:
        for reduction, style in zip(REDUCTIONS, ("-", "--")):
            rows = sorted(
                (r for r in summary["rows"].values() if r["objective"] == objective and r["reduction"] == reduction),
                key=lambda r: r["lam"],
            )
            rows = [r for r in rows if r["epochs"] == 1 and r["exit_lr"] is None]
            if rows:
                ax.errorbar(
                    [r["lam"] for r in rows],
                    [r["cross_layer_avg"][0] for r in rows],
                    yerr=[r["cross_layer_avg"][1] for r in rows],
                    ls=style,
                    marker="o",
                    capsize=3,
                    label=f"{objective} ({reduction} over anchors)",
                )
    ax.set_xscale("log")
    ax.set_xlabel("λ (contrastive weight)")
    ax.set_ylabel(f"{TASK} dev, cross-layer average (%)")
    ax.set_title("λ sensitivity, MiniLM, MHA exits, 2ST, 2,000 × 1 epoch per stage, 3 seeds")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="report")
    parser.add_argument("--phase", choices=("grid", "budget", "exit-lr"), default="grid")
    parser.add_argument("--reductions", nargs="+", choices=REDUCTIONS, default=list(REDUCTIONS))
    parser.add_argument("--lambdas", type=float, nargs="+", default=list(LAMBDAS), help="--phase grid: λ to train")
    parser.add_argument("--lam", type=float, default=0.02, help="--phase budget/exit-lr: the λ of the ACL arm")
    parser.add_argument("--reduction", choices=REDUCTIONS, default="mean", help="--phase budget/exit-lr: its reduction")
    parser.add_argument("--epochs", type=float, default=3, help="--phase budget: epochs per 2ST stage")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--work-dir", type=Path, default=Path("/work/exp_runs/acl_lambda"))
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "acl_lambda")
    args = parser.parse_args(argv)
    if not GLUE_DIR.is_dir():
        sys.exit(f"acl_lambda: GLUE data not found at {GLUE_DIR}")
    base = SCALES[args.scale]
    if TASK not in base.lr:  # the smoke scale trains MRPC rows: the same code path on 16 examples
        base = dataclasses.replace(
            base,
            **{f: {TASK: next(iter(getattr(base, f).values()))} for f in ("train_examples", "max_length", "lr")},
        )
    seeds = tuple(args.seeds or base.seeds)
    if args.phase == "grid":
        known, todo = grid_arms(), grid_arms(tuple(args.reductions), tuple(args.lambdas))
    elif args.phase == "budget":
        known = todo = budget_arms(args.lam, args.reduction, args.epochs)
    else:
        known = todo = exit_lr_arms(args.lam, args.reduction)
    if args.scale == "smoke":
        known = todo = todo[:3]
    from elasticbert import minilm_dir

    model, out = str(minilm_dir()), args.output / args.phase.replace("-", "_")
    out.mkdir(parents=True, exist_ok=True)
    meta = {"experiment": f"acl_lambda/{args.phase}", "scale": args.scale, "task": TASK, "seeds": list(seeds)}
    meta["exit_lr"] = base.exit_lr  # the exit heads' learning rate unless an arm says "same"
    records: dict[tuple[str, int], dict] = {}
    reused = ladder_runs(model, base, seeds, args.work_dir, RESULTS_DIR / "acl_ladder" / "results.json")

    def record(arm: Arm, seed: int) -> None:
        """Train one run unless its dev_scores.json exists (or the ladder ran it), then rewrite the tables (partial
        results on disk)."""
        done = reused.get((arm.name, seed))
        records[(arm.name, seed)] = done or run_one(model, TASK, arm.rung(), seed, arm.scale(base), args.work_dir)
        write_outputs(out, known, list(records.values()), seeds, meta)

    for arm in known:  # runs of earlier invocations (other reductions, other λ) stay in the table
        for seed in seeds:
            if (arm.name, seed) in reused or (
                args.work_dir / TASK / arm.name / f"seed{seed}" / "dev_scores.json"
            ).is_file():
                record(arm, seed)  # reads its dev_scores.json, trains nothing
    for arm in todo:
        for seed in seeds:
            record(arm, seed)
    runs = list(records.values())
    failed = [r for r in runs if r["status"] != "ok"]
    print(verdict(summarise(known, runs, seeds)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
