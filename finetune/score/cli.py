"""The scoring commands of `python -m finetune`: `evaluate` (per-exit dev scores and test prediction files,
`evaluation.py`), `plot-angles` and `plot-embeddings` (the ACL diagnostics' figures, `diagnostics.py` and
`finetune/plots.py`), `elue-score` (`elue.py`) and `submission` (ELUE submission files, `submission.py`).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from common.cli import (
    add_command,
    add_data_dir,
    add_device,
    add_max_examples,
    add_output,
    add_switch,
    call_with_options,
)
from common.errors import ConfigError
from common.io import atomic_write_json, make_dirs, peek_object, removed_on_failure
from common.outputs import Output, check_output

from ..plots import plot_angles, plot_embeddings, read_angles
from ..serve.early_exit.operating_point import load_result
from . import submission
from .diagnostics import exit_embeddings
from .elue import OUT_OF_RANGE, elue_score, load_baseline_with_info, load_curves, merge_systems
from .evaluation import evaluate_model
from .submission import write_submissions_for_results

# ------------------------------------------------------------------------------------------------------ evaluate

EVALUATE_DESCRIPTION = """\
Per-exit evaluation: the layer-score curve (JSON + PNG) and GLUE/ELUE test prediction files.

`python -m finetune evaluate --model RUN_DIR/best --task RTE --data-dir GLUE --output OUT` writes
OUT/dev_scores.json, OUT/layer_curve.png and OUT/predictions/{TASK}.tsv (`index\\tprediction`, label names) from
the chosen exit (default: the last); `--all-exits` adds OUT/predictions/layer_{l}/{TASK}.tsv for every exit.
For MNLI the mismatched dev/test sets are scored too (MNLI-m.tsv and MNLI-mm.tsv).
"""


EVALUATE_HELP = "per-exit dev scores (JSON + PNG curve) and GLUE/ELUE test prediction files"


def _add_evaluate(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "evaluate", evaluate_main, EVALUATE_HELP, description=EVALUATE_DESCRIPTION)
    p.add_argument("--model", required=True, help="a fine-tuned run's model directory (RUN_DIR/best)")
    p.add_argument("--task", help="task name (default: the one the model was fine-tuned on)")
    add_data_dir(p)
    add_output(p, "directory for dev_scores.json, layer_curve.png and predictions/")
    p.add_argument("--split", default="dev")
    add_switch(p, "--test", True, "write the test prediction files")
    add_switch(p, "--overwrite", False, "replace the evaluation of another model or configuration in --output")
    p.add_argument("--predict-exit", type=int, help="exit whose predictions go into the submission (default: last)")
    add_switch(p, "--all-exits", False, "also write predictions of every exit")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-length", type=int, help="default: the training run's, else 128")
    add_max_examples(p, help="score a seeded random subset of the split")
    add_device(p)


def evaluate_main(args: argparse.Namespace) -> int:
    """`python -m finetune evaluate ...`"""
    result = call_with_options(evaluate_model, args, model_dir=args.model, task_name=args.task)
    for name, entry in result["tasks"].items():
        curve = ", ".join(f"L{k}: {v[entry['main_metric']]:.2f}" for k, v in entry["exits"].items())
        print(f"{name} {entry['split']} ({entry['examples']} examples) {entry['main_metric']} per exit: {curve}")
    print(f"wrote {Path(args.output) / 'dev_scores.json'}")
    return 0


# ---------------------------------------------------------------------------------- plot-angles, plot-embeddings

# `python -m finetune plot-angles` and `plot-embeddings`: the ACL diagnostics' figures (drawn by `plots.py`).
#
# - `python -m finetune plot-angles RUN [--output PNG]`: histogram and per-step trace of the angle between the CE and
#   contrastive gradients from RUN/acl_diagnostics.json (batches ACL-Grad dropped in red).
# - `python -m finetune plot-embeddings --model RUN/best --task T --data-dir D --layer l [--method tsne|pca]`:
#   exit l's L2-normalised representations h^e of dev examples and its K label embeddings (classifier rows), projected
#   together, as the paper's visualisation; the raw arrays go to an .npz beside the PNG.


def _starts_with(magic: bytes) -> object:
    def own(path: Path) -> bool:
        try:
            with open(path, "rb") as handle:
                return handle.read(len(magic)) == magic
        except OSError:
            return False

    return own


PNG = Output("a plot command", "a PNG figure", own=_starts_with(b"\x89PNG\r\n\x1a\n"))
ARRAYS = Output("plot-embeddings", "the figure's arrays (.npz)", own=_starts_with(b"PK\x03\x04"))

PLOT_ANGLES_HELP = "histogram/trace of CE vs contrastive gradient angles of a run"
PLOT_EMBEDDINGS_HELP = "t-SNE/PCA of one exit's representations + label embeddings"


def _add_plots(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "plot-angles", angles_main, PLOT_ANGLES_HELP)
    p.add_argument("run", help="run directory (or its acl_diagnostics.json)")
    add_output(p, "PNG path (default: RUN/angles.png)", required=False)
    add_switch(p, "--overwrite", False, "replace an existing PNG these commands wrote (never another file)")

    p = add_command(subparsers, "plot-embeddings", embeddings_main, PLOT_EMBEDDINGS_HELP)
    p.add_argument("--model", required=True, help="fine-tuned model dir (RUN/best)")
    p.add_argument("--task", help="default: the model's fine-tuning task")
    add_data_dir(p)
    p.add_argument("--layer", type=int, help="exit layer (default: last)")
    p.add_argument("--split", default="dev")
    add_max_examples(p, default=500, help="a seeded random subset of N examples of the split (default: 500)")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--method", choices=("tsne", "pca"), default="tsne")
    add_device(p)
    add_output(p, "PNG path (arrays go to the same name with .npz)")
    add_switch(p, "--overwrite", False, "replace an existing PNG and .npz this command wrote (never another file)")


def angles_main(args: argparse.Namespace) -> int:
    """`python -m finetune plot-angles ...`"""
    source, _ = read_angles(args.run)
    check_output(args.output or source.parent / "angles.png", PNG, [("RUN", source)], args.overwrite)
    print(f"wrote {plot_angles(args.run, args.output)}")
    return 0


def embeddings_main(args: argparse.Namespace) -> int:
    """`python -m finetune plot-embeddings ...`"""
    read = [("--model", args.model), ("--data-dir", args.data_dir)]
    check_output(args.output, PNG, read, args.overwrite)
    check_output(Path(args.output).with_suffix(".npz"), ARRAYS, read, args.overwrite, flag="--output (.npz)")
    arrays = call_with_options(exit_embeddings, args, model_dir=args.model, task_name=args.task)
    print(f"wrote {plot_embeddings(arrays, args.output, args.method)}")
    return 0


# ---------------------------------------------------------------------------------------------------- elue-score

# `python -m finetune elue-score`: score points files against a baseline (`elue.py`) and print every score with
# the baseline it was measured against.


def _is_report(path: Path) -> bool:
    """An `elue-score` report: a JSON object of systems, each with its tasks and score."""
    report = peek_object(path)
    return bool(report) and all(isinstance(v, Mapping) and "tasks" in v and "score" in v for v in report.values())


REPORT = Output("elue-score", "an ELUE score report (JSON)", own=_is_report)


def format_table(name: str, report: Mapping) -> str:
    """The report of one system: every score line names the baseline it was measured against."""
    base = report.get("baseline", {})
    against = f"vs baseline {base.get('name', '?')!r}"
    lines = [
        f"system {name}: ELUE score {_fmt(report['score'])} {against} (out-of-range: {report['out_of_range']})",
        f"  baseline: {base.get('name', '?')} [{base.get('kind', '?')}] - source: {base.get('source', 'not given')}",
    ]
    for task, entry in report["tasks"].items():
        lines.append(
            f"  {task:10s} {_fmt(entry['score'])} {against}  ({entry['used']} points, {entry['dropped']} dropped)"
        )
        for pt in entry["points"]:
            lines.append(
                f"      FLOPs {pt['flops']:.4g}  score {pt['score']:.2f}  baseline {_fmt(pt['baseline'])}"
                f"  [{pt['status']}]"
            )
    if report["tasks_without_points"]:
        lines.append(f"  (no points for: {', '.join(report['tasks_without_points'])})")
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f}" if abs(x) < 50 else f"{x:.2f}"


ELUE_SCORE_HELP = "ELUE score of operating points against a baseline per-exit curve"


ELUE_SCORE_DESCRIPTION = (
    "score = mean_i (p_i - p_EB(f_i)) per task with p_EB linearly interpolated from the baseline's "
    "points; the benchmark score is the mean over tasks. Baseline/points files: JSON {name, source, tasks: "
    "{TASK: [{flops, score}, ...]}}, CSV task,flops,score[,system], or an early-exit result (as a baseline: the "
    "model's own static curve, and every score says so). FLOPs > 0 per sample, scores in [-100, 100]. See "
    "finetune/score/elue.py and docs/early_exit.md."
)


def _add_elue_score(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `elue-score` on the `python -m finetune` command line."""
    p = add_command(
        subparsers,
        "elue-score",
        elue_main,
        ELUE_SCORE_HELP,
        description=ELUE_SCORE_DESCRIPTION,
    )
    p.add_argument("--baseline", required=True, nargs="+", help="baseline curve file(s): JSON, CSV or early-exit JSON")
    p.add_argument("--points", required=True, nargs="+", help="system points file(s): JSON, CSV or early-exit JSON")
    p.add_argument("--out-of-range", choices=OUT_OF_RANGE, default="clamp")
    p.add_argument("--system", default=None, help="score only this system (e.g. one strategy)")
    add_output(p, "write the full report as JSON here", required=False)
    add_switch(p, "--overwrite", False, "replace an existing --output report of elue-score (never another file)")
    return p


def elue_main(args: argparse.Namespace) -> int:
    """`python -m finetune elue-score ...`"""
    if args.output:
        read = [*(("--baseline", path) for path in args.baseline), *(("--points", path) for path in args.points)]
        check_output(args.output, REPORT, read, args.overwrite)
    baseline, info = load_baseline_with_info(args.baseline)
    systems = merge_systems([load_curves(path, role="points") for path in args.points])
    if args.system:
        if args.system not in systems:
            raise ConfigError(f"no system {args.system!r} in --points (have: {', '.join(systems)})")
        systems = {args.system: systems[args.system]}
    report = {name: elue_score(baseline, tasks, args.out_of_range, info) for name, tasks in systems.items()}
    for name, entry in report.items():
        print(format_table(name, entry))
    if args.output:
        with removed_on_failure(Path(args.output).parent) as folder:  # no folder left behind by a failed write
            make_dirs(folder)
            atomic_write_json(args.output, report, indent=1)
    return 0


# ---------------------------------------------------------------------------------------------------- submission

# `python -m finetune submission`: ELUE submission files from an `early-exit` result (the files and their layout:
# `submission.py`, whose docstring is this command's help).


SUBMISSION_HELP = "ELUE submission files: re-run each operating point of an early-exit result on the test split"


def _add_submission(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `submission` on the `python -m finetune` command line."""
    p = add_command(subparsers, "submission", submission_main, SUBMISSION_HELP, description=submission.__doc__)
    p.add_argument("--results", required=True, metavar="EARLY_EXIT.json", help="a result JSON of `early-exit`")
    add_output(p, "directory that receives one <strategy>_<threshold>/ directory per operating point", metavar="DIR")
    p.add_argument("--strategy", default=None, help="comma list of the result's strategies (default: all of them)")
    p.add_argument("--split", default="test", help="split to predict (default: %(default)s)")
    add_switch(p, "--overwrite", False, "replace a task's files that another early-exit result wrote in --output")
    add_device(p)
    return p


def submission_main(args: argparse.Namespace) -> int:
    """`python -m finetune submission ...`"""
    path = Path(args.results)
    results = load_result(path)
    chosen = [s.strip() for s in args.strategy.split(",") if s.strip()] if args.strategy else None
    written = write_submissions_for_results(
        results,
        args.output,
        split_name=args.split,
        strategies=chosen,
        device=args.device,
        overwrite=args.overwrite,
        inputs=[("--results", path)],
    )
    print(f"{path}: wrote {len(written)} submission directories under {args.output}")
    return 0


def add_subparser(subparsers: argparse._SubParsersAction) -> None:
    """Register this package's commands on the `python -m finetune` command line."""
    _add_evaluate(subparsers)
    _add_plots(subparsers)
    _add_elue_score(subparsers)
    _add_submission(subparsers)
