"""Issue 61: HashEE (token-level exit by hashing) against sentence-level early exit (entropy, patience) at matched
FLOPs, on SST-2 and MRPC, with the MiniLM stand-in (6 layers, hidden 384) and the tiny ElasticBERT of the tests
(4 layers of width 32, random initialisation, MiniLM's vocabulary).

Per model and task, every arm is fine-tuned with `python -m finetune train` on the same training subset:
- `full`: one exit at the top (the full model);
- `jt`: an MHA exit at every layer, JT - the multi-exit model that `finetune early-exit` sweeps (entropy, patience);
- `hashee-b{N}`: `--method hashee`, the frequency map with N buckets (N = the layers: the official default where it
  fits; fewer buckets = fewer, shallower layers for the frequent tokens), and on MiniLM SST-2 the other maps;
- `minilm-8k`: MiniLM on SST-2 again with 4x the training rows (full, JT, HashEE): does the gap close with data?
Then `finetune hashee-score` (score and FLOPs per sample of each HashEE run) and `finetune early-exit` (the JT run's
Pareto curves) on the full dev set, and `finetune elue-score` of every system against the JT model's own static
curve. Each unit writes docs/results/hashee/units/NAME.json when it is done; a rerun skips finished units.

    python experiments/hashee.py --scale report            # resumable; runs under /tmp/hashee_exp
    python experiments/hashee.py --scale smoke             # ~ minutes: one model, one task, tiny budget

Every number comes from the project's commands run as subprocesses (experiments/common.run_cli).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.common import GLUE_DIR, RESULTS_DIR, run_cli, write_json  # noqa: E402

OUT = RESULTS_DIR / "hashee"


@dataclass(frozen=True)
class Budget:
    """One model's training budget on one task."""

    train_examples: int | None
    epochs: float
    max_length: int
    lr: float
    batch_size: int = 32


@dataclass(frozen=True)
class Scale:
    budgets: dict  # (model, task) -> Budget
    arms: dict  # (model, task) -> tuple of arms
    dev_examples: int | None


MINILM_ARMS = ("full", "jt", "hashee-b6", "hashee-b3")
TINY_ARMS = ("full", "jt", "hashee-b4", "hashee-b2")
OTHER_MAPS = ("hashee-b6-random-consistent", "hashee-b6-random-inconsistent", "hashee-b6-mi", "hashee-b6-cluster")
# Sized for a 2-core machine shared with other jobs (each MiniLM run a few CPU-minutes): training subsets, 1 epoch for
# MiniLM, length-grouped batches (less padding, the same examples).
SCALES = {
    "smoke": Scale({("minilm", "MRPC"): Budget(64, 1, 48, 1e-4, 16)}, {("minilm", "MRPC"): ("jt", "hashee-b6")}, 48),
    "report": Scale(
        {
            ("minilm", "SST-2"): Budget(2000, 1, 48, 1e-4),
            ("minilm", "MRPC"): Budget(2000, 1, 96, 1e-4),
            ("tiny", "SST-2"): Budget(8000, 2, 48, 1e-3),
            ("tiny", "MRPC"): Budget(None, 3, 96, 1e-3),
            ("minilm-8k", "SST-2"): Budget(8000, 1, 48, 1e-4),  # MiniLM again, 4x the training rows
        },
        {
            ("minilm", "SST-2"): MINILM_ARMS + OTHER_MAPS,
            ("minilm", "MRPC"): MINILM_ARMS,
            ("tiny", "SST-2"): TINY_ARMS,
            ("tiny", "MRPC"): TINY_ARMS,
            ("minilm-8k", "SST-2"): ("full", "jt", "hashee-b6"),
        },
        None,
    ),
}
UNIT_ORDER = ("full", "jt", "hashee-b6", "hashee-b4", "hashee-b3", "hashee-b2") + OTHER_MAPS


def tiny_model(work: Path) -> Path:
    """The tests' tiny ElasticBERT (tests/support/tiny_models.py: 4 layers of width 32) with MiniLM's vocabulary and
    positions for 128 tokens, randomly initialised (seed 0) and saved with MiniLM's tokenizer files."""
    directory = work / "tiny_elasticbert"
    if (directory / "config.json").is_file():
        return directory
    import torch

    from elasticbert import ElasticBertConfig, ElasticBertModel, minilm_dir

    torch.manual_seed(0)
    fields = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64)
    ElasticBertModel(ElasticBertConfig(vocab_size=30522, max_position_embeddings=128, **fields)).save_pretrained(
        directory
    )
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (minilm_dir() / name).is_file():
            shutil.copy(minilm_dir() / name, directory / name)
    return directory


def model_path(model: str, work: Path) -> str:
    if model.startswith("minilm"):
        from elasticbert import minilm_dir

        return str(minilm_dir())
    return str(tiny_model(work))


def arm_args(arm: str) -> list[str]:
    if arm == "full":
        return []
    if arm == "jt":
        return ["--exits", "all", "--exit-type", "mha", "--method", "jt"]
    parts = arm.split("-", 2)  # hashee-b6[-map]
    args = ["--method", "hashee", "--hash-buckets", parts[1][1:]]
    return args + (["--hash", parts[2]] if len(parts) == 3 else [])


def train(model: str, task: str, arm: str, budget: Budget, scale: Scale, work: Path) -> dict:
    run = work / model / task / arm
    args = ["train", "--model", model_path(model, work), "--task", task, "--data-dir", str(GLUE_DIR)]
    args += [
        "--epochs",
        str(budget.epochs),
        "--batch-size",
        str(budget.batch_size),
        "--max-length",
        str(budget.max_length),
    ]
    args += ["--lr", str(budget.lr), "--seed", "1", "--group-by-length", "--no-progress", "--output", str(run)]
    args += ["--overwrite"]
    if budget.train_examples:
        args += ["--max-train-examples", str(budget.train_examples)]
    if scale.dev_examples:
        args += ["--max-dev-examples", str(scale.dev_examples)]
    if (run / "dev_scores.json").is_file() and (run / "best" / "checksums.json").is_file():
        wall = json.loads((run / "dev_scores.json").read_text())["seconds"]  # finished before: scored again only
    else:
        wall = run_cli("finetune", args + arm_args(arm), work / "logs" / f"train_{model}_{task}_{arm}.log")
    scores = json.loads((run / "dev_scores.json").read_text())
    top = max(scores["best"]["exits"], key=int)
    return {
        "run": str(run),
        "train_wall_s": round(wall, 1),
        "dev_score_top_exit": scores["best"]["exits"][top]["score"],
    }


def score(model: str, task: str, arm: str, trained: dict, scale: Scale, work: Path) -> dict:
    """hashee-score (HashEE arms) or early-exit (the JT arm) on the dev set."""
    run, log = Path(trained["run"]), work / "logs" / f"score_{model}_{task}_{arm}.log"
    out = work / "scores" / model / task / arm
    limit = ["--max-examples", str(scale.dev_examples)] if scale.dev_examples else []
    if arm.startswith("hashee"):
        args = ["hashee-score", "--model", str(run / "best"), "--data-dir", str(GLUE_DIR), "--output", str(out)]
        run_cli("finetune", args + limit + ["--overwrite"], log)
        report = json.loads((out / "hashee_scores.json").read_text())
        return {"points": str(out / "elue_points.json"), **{k: v for k, v in report["dev"].items() if k != "metrics"}}
    if arm == "jt":
        args = ["early-exit", "--model", str(run / "best"), "--task", task, "--data-dir", str(GLUE_DIR)]
        args += ["--threads", "1", "--output", str(out), *limit]
        run_cli("finetune", args + ["--strategy", "entropy", "--sweep", ENTROPY_SWEEP, "--no-merge"], log)
        run_cli("finetune", args + ["--strategy", "patience", "--merge"], log)  # k = 1..L-1, into the same JSON
        result = next(out.glob("early_exit_*_dev_bs*.json"))
        data = json.loads(result.read_text())
        curves = {
            name: [(p["mean_flops"], p["score"], p.get("threshold")) for p in entry["points"]]
            for name, entry in data["strategies"].items()
        }
        static = [(p["mean_flops"], p["score"], p["layer"]) for p in data["static"]]
        return {"result": str(result), "curves": curves, "static": static, "full_model": data["full_model"]}
    return {}


# Entropy thresholds (nats) from confident-only to nearly every exit firing (ln 2 = 0.693 would fire always): the
# default sweep stops at 0.55, which leaves an uncertain small model at the full model's FLOPs.
ENTROPY_SWEEP = "0.02,0.05,0.1,0.2,0.3,0.4,0.5,0.55,0.6,0.63,0.65,0.67,0.68,0.69"


def unit_path(model: str, task: str, arm: str) -> Path:
    return OUT / "units" / f"{model}_{task}_{arm}.json"


FIRST = (
    "full",
    "jt",
    "hashee-b6",
    "hashee-b4",
    "hashee-b3",
    "hashee-b2",
)  # every model and task's main arms before the variants


def unit_order(scale: Scale) -> list[tuple[str, str, str]]:
    """Every model and task's main arms (FIRST) before any variant; within each, UNIT_ORDER."""
    units = [(model, task, arm) for (model, task), arms in scale.arms.items() for arm in arms]
    keys = list(scale.arms)
    later = [key for key in keys if key[0].endswith("-8k")]  # the larger budget after everything else
    return sorted(units, key=lambda u: (u[:2] in later, u[2] not in FIRST, keys.index(u[:2]), UNIT_ORDER.index(u[2])))


def run_units(scale: Scale, work: Path, only: set[str] | None) -> None:
    for model, task, arm in unit_order(scale):
        path = unit_path(model, task, arm)
        if path.is_file() or (only and model not in only):
            continue
        started = time.time()
        budget = scale.budgets[(model, task)]
        trained = train(model, task, arm, budget, scale, work)
        result = {"model": model, "task": task, "arm": arm, **trained}
        result.update(score(model, task, arm, trained, scale, work), budget=asdict(budget))
        result["unit_wall_s"] = round(time.time() - started, 1)
        write_json(path, result)
        print(f"hashee: {path.name} done in {result['unit_wall_s']} s", flush=True)


def front(curve: list) -> list[tuple[float, float]]:
    """The Pareto front of (FLOPs, score, ...) points: no cheaper point scores as high."""
    points, best = [], float("-inf")
    for f, score, *_ in sorted(curve):
        if score > best:
            points.append((f, score))
            best = score
    return points


def at_flops(curve: list, flops: float) -> str:
    """A curve's front at `flops`: linear between its two neighbours, the best point below it when above the range,
    or what its cheapest point gives when `flops` is below the range."""
    points = front(curve)
    if not points:
        return "–"
    if flops < points[0][0]:
        return f"not reached (cheapest: {points[0][1]:.2f} at {points[0][0] / 1e6:.1f} M)"
    for (f0, s0), (f1, s1) in zip(points, points[1:]):
        if f0 <= flops <= f1:
            return f"{s0 + (s1 - s0) * (flops - f0) / (f1 - f0):.2f}"
    return f"{points[-1][1]:.2f}"


def elue(units: dict, work: Path, key: tuple[str, str]) -> dict:
    """elue-score of HashEE points and the JT sweep against the JT model's own static curve."""
    model, task = key
    jt = units.get((model, task, "jt"))
    points = [u["points"] for (m, t, a), u in units.items() if (m, t) == key and a.startswith("hashee")]
    if jt is None or not points:
        return {}
    report = work / "elue" / f"{model}_{task}.json"
    args = ["elue-score", "--baseline", jt["result"], "--points", jt["result"], *points, "--output", str(report)]
    run_cli("finetune", args + ["--overwrite"], work / "logs" / f"elue_{model}_{task}.log")
    data = json.loads(report.read_text())
    return {system: entry["score"] for system, entry in data.items()}


def load_units() -> dict:
    units = {}
    for path in sorted((OUT / "units").glob("*.json")):
        u = json.loads(path.read_text())
        units[(u["model"], u["task"], u["arm"])] = u
    return units


def table(units: dict, key: tuple[str, str], elue_scores: dict) -> list[str]:
    """One model and task: every system's dev score and FLOPs, then HashEE against the curves at its FLOPs."""
    model, task = key
    jt = units.get((model, task, "jt"))
    hashee = [(a, u) for (m, t, a), u in sorted(units.items()) if (m, t) == key and a.startswith("hashee")]
    full, full_flops = units.get((model, task, "full")), hashee[0][1]["full_model_mean_flops"] if hashee else None
    rows = []  # (system, setting, score, flops, ELUE)
    if full and full_flops:
        rows.append(("full model", "one exit at the top", full["dev_score_top_exit"], full_flops, ""))
    if jt:
        rows += [("JT static", f"layer {layer}", score, f, "(baseline)") for f, score, layer in jt["static"]]
        for name, curve in jt["curves"].items():
            keep = set(front(curve)) if name == "entropy" else {(f, score) for f, score, _ in curve}
            rows += [
                (name, f"τ={tau:g}", score, f, f"{elue_scores.get(name, float('nan')):+.2f}")
                for f, score, tau in sorted(curve)
                if (f, score) in keep
            ]
    for arm, u in hashee:
        system = next((s for s in elue_scores if s.endswith(f"({arm})")), "")
        elue_cell = f"{elue_scores[system]:+.2f}" if system else ""
        rows.append(("HashEE", arm.removeprefix("hashee-"), u["score"], u["mean_flops"], elue_cell))
    lines = [f"**{model} · {task}** (dev set)", "", "| system | setting | dev score | MFLOPs / sample | FLOPs speed-up "
             "| ELUE score vs JT static |", "|---|---|---|---|---|---|"]  # fmt: skip
    for system, setting, score, f, elue_cell in rows:
        speed = f"{full_flops / f:.2f}×" if full_flops else ""
        lines.append(f"| {system} | {setting} | {score:.2f} | {f / 1e6:.2f} | {speed} | {elue_cell} |")
    if jt and hashee:
        header = "| HashEE | MFLOPs | score | entropy at these FLOPs | patience at these FLOPs | JT static at them |"
        lines += ["", header, "|---|---|---|---|---|---|"]
        for arm, u in hashee:
            curves = [jt["curves"].get("entropy", []), jt["curves"].get("patience", []), jt["static"]]
            cells = " | ".join(at_flops(c, u["mean_flops"]) for c in curves)
            lines.append(
                f"| {arm.removeprefix('hashee-')} | {u['mean_flops'] / 1e6:.2f} | {u['score']:.2f} | {cells} |"
            )
    return lines


def summary_rows(units: dict, key: tuple[str, str], elue_scores: dict) -> list[str]:
    """One line per HashEE arm of one model and task: HashEE, the curves at its FLOPs, and the ELUE scores."""
    model, task = key
    jt, full = units.get((model, task, "jt")), units.get((model, task, "full"))
    lines = []
    for (m, t, arm), u in sorted(units.items()):
        if (m, t) != key or not arm.startswith("hashee") or jt is None:
            continue
        curves = [jt["curves"].get("entropy", []), jt["curves"].get("patience", []), jt["static"]]
        at = " | ".join(at_flops(c, u["mean_flops"]) for c in curves)
        system = next((s for s in elue_scores if s.endswith(f"({arm})")), None)
        scores = [elue_scores.get(name) for name in (system, "entropy", "patience")]
        elue_cell = " / ".join(f"{x:+.2f}" if x is not None else "–" for x in scores)
        full_cell = f"{full['dev_score_top_exit']:.2f}" if full else "–"
        lines.append(
            f"| {model} | {task} | {arm.removeprefix('hashee-')} | {full_cell} | {u['score']:.2f} | "
            f"{u['mean_flops'] / 1e6:.1f} ({u['flops_speedup']:.2f}×) | {at} | {elue_cell} |"
        )
    return lines


SUMMARY_HEADER = [
    "| model | task | HashEE | full model | HashEE score | HashEE MFLOPs (speed-up) | entropy at these FLOPs | "
    "patience at these FLOPs | JT static at these FLOPs | ELUE score: HashEE / entropy / patience |",
    "|---|---|---|---|---|---|---|---|---|---|",
]


def report(scale_name: str, work: Path) -> None:
    units = load_units()
    keys = sorted({(m, t) for m, t, _ in units})
    sections, summary, short = [], {}, list(SUMMARY_HEADER)
    for key in keys:
        scores = elue(units, work, key)
        summary["/".join(key)] = {"elue": scores}
        sections += table(units, key, scores) + [""]
        short += summary_rows(units, key, scores)
    sections = ["At matched FLOPs (dev sets; ELUE scores against the JT model's own static curve):", "", *short, "",
                *sections]  # fmt: skip
    write_json(
        OUT / "results.json", {"scale": scale_name, "units": [units[k] for k in sorted(units)], "summary": summary}
    )
    (OUT / "section.md").write_text("\n".join(sections) + "\n", encoding="utf-8")
    print("\n".join(sections))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="report")
    parser.add_argument("--work-dir", default="/tmp/hashee_exp")
    parser.add_argument("--models", nargs="*", help="only these models' units (minilm, tiny, minilm-8k)")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    work = Path(args.work_dir)
    global OUT
    if args.scale != "report":  # only the report's units are committed
        OUT = work / "results"
    if not args.report_only:
        run_units(SCALES[args.scale], work, set(args.models) if args.models else None)
    report(args.scale, work)


if __name__ == "__main__":
    main()
