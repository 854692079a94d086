"""`python -m finetune early-exit`: sweep exit rules on a fine-tuned multi-exit model; write the result JSON,
per-sample TSVs and the Pareto plot. ELUE scoring of the result is `elue-score`; submission files, `submission`."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import common.cli
from common.cli import add_command, add_max_examples, add_output, add_switch, config_argument
from common.errors import ConfigError
from common.hub import resolve_pretrained
from common.io import atomic_write_json, make_dirs, read_object, removed_on_failure
from common.outputs import RESULTS, Output, check_output
from elasticbert import ElasticBertForSequenceClassification
from elasticbert.precision import PRECISIONS, for_inference, precision_problem

from ...data import EncodedSplit, load_tokenizer, subsample
from ...model import check_max_length, load_finetuned, resolve_device
from ...plots import plot_pareto
from ...results import check_earlier_result, data_source, result_identity
from ...task_check import check_task_fits
from ...tasks import DataError, TaskSpec, get_task, load_split
from .lte import LearnedExitHead, train_lte_head
from .rules import STRATEGIES
from .sweep import (
    SweepConfig,
    measure_reference,
    merge_results,
    parse_thresholds,
    resolve_strategies,
    summary_table,
    sweep,
)

DESCRIPTION = (
    "Run dynamic early exit over a GLUE/ELUE split for one or more strategies and thresholds; write JSON (+ per-sample "
    "TSVs) and a Pareto PNG. Speed-ups are against the full model's own forward on the same batches. Wall times here "
    "are single passes (--repeats to repeat); on a shared machine use bench/serving/early_exit.py, which pairs "
    "reference and early exit batch by batch, for the wall/FLOPs ratio."
)


EARLY_EXIT_OUTPUT = Output(
    "early-exit", "early-exit results (early_exit_*.json, .png, samples/)", folder=True, accepts=RESULTS
)
LTE_HEAD_OUTPUT = Output("early-exit", "an LTE head file")
EARLY_EXIT_HELP = "sweep early-exit rules on a fine-tuned multi-exit model: score, FLOPs, speed-ups, Pareto plot"


def add_subparser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `early-exit` on the `python -m finetune` command line."""
    p = add_command(subparsers, "early-exit", main, EARLY_EXIT_HELP, description=DESCRIPTION)
    p.add_argument("--model", required=True, help="fine-tuned multi-exit model directory (RUN/best)")
    p.add_argument("--task", required=True, help="task name, e.g. SST-2, MRPC, STS-B, elue/SNLI")
    p.add_argument("--strategy", default="all", help=f"comma list of {', '.join(STRATEGIES)}, or 'all'")
    p.add_argument("--sweep", default=None, help="thresholds τ1,τ2,... (one strategy; patience: k values)")
    common.cli.add_data_dir(p)
    p.add_argument("--split", default="dev")
    config_argument(p, SweepConfig, "batch_size", help="batch size")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="inference precision the sweep runs (and calibrates its thresholds) at; int8: dynamic quantization, CPU",
    )
    add_max_examples(
        p,
        help="a seeded random subset of the split (the rows `finetune train --max-dev-examples` "
        "scores with its default --dev-subset-seed)",
    )
    config_argument(p, SweepConfig, "patience", help="PCEE: consecutive confident exits needed")
    config_argument(p, SweepConfig, "delta", help="PABEE regression: |Δ| below this counts as unchanged")
    config_argument(p, SweepConfig, "repeats", help="timing repeats (the minimum wall time is kept)")
    common.cli.add_threads(p)
    common.cli.add_device(p)
    add_output(p, "output directory (default runs/early_exit/<task>)", required=False)
    add_switch(p, "--merge", True, "keep the other strategies of an earlier run in the same JSON")
    p.add_argument("--lte-head", default=None, help="LTE head file (.safetensors); trained and saved here if absent")
    add_switch(p, "--train-lte", False, "(re)train the LTE head even if --lte-head exists")
    p.add_argument("--lte-split", default="train", help="split the LTE head is fitted on")
    add_max_examples(p, "lte", default=4000, help="rows of --lte-split used to fit the LTE head (default: 4000)")
    p.add_argument("--lte-epochs", type=int, default=30)
    return p


def lte_head_for(
    args: argparse.Namespace,
    model: ElasticBertForSequenceClassification,
    task: TaskSpec,
    output: Path,
    tokenizer: object,
    log: Callable[[str], None] = print,
) -> tuple[LearnedExitHead, Path]:
    """The LTE head of `--lte-head` (default OUTPUT/lte_head_TASK.safetensors), trained and saved there if absent."""
    path = Path(args.lte_head) if args.lte_head else output / f"lte_head_{task.name.replace('/', '_')}.safetensors"
    if path.is_file() and not args.train_lte:
        log(f"LTE head: loaded {path}")
        return LearnedExitHead.load(path), path
    examples = subsample(load_split(task, args.data_dir, args.lte_split), args.max_lte_examples, seed=1)
    train = EncodedSplit.from_examples(tokenizer, examples, args.max_length)
    start = time.perf_counter()
    head, stats = train_lte_head(model, train, epochs=args.lte_epochs)
    head.save(path, {"task": task.name, "model": str(args.model), "split": args.lte_split})
    log(
        f"LTE head: trained on {len(train)} {args.lte_split} rows in {time.perf_counter() - start:.1f}s "
        f"(MSE {stats['initial_mse']:.4f} -> {stats['final_mse']:.4f}), saved {path}"
    )
    return head, path


def sweep_config(
    args: argparse.Namespace, strategies: list[str], head: LearnedExitHead | None, output: Path, task: TaskSpec
) -> SweepConfig:
    """The sweep the options ask for; `--sweep` thresholds need exactly one strategy, and one at least at which the
    rule depends on the input for `task`'s number of labels."""
    thresholds = parse_thresholds(args.sweep)
    if thresholds is not None and len(strategies) != 1:
        raise ConfigError("--sweep needs exactly one --strategy (each strategy has its own threshold scale)")
    return SweepConfig(
        strategies=strategies,
        thresholds={strategies[0]: thresholds} if thresholds else {},
        batch_size=args.batch_size,
        repeats=args.repeats,
        patience=args.patience,
        delta=args.delta,
        lte_head=head,
        samples_dir=output / "samples",
        num_labels=task.num_labels,
    ).validate()


def write_results(results: dict, path: Path, merge: bool) -> dict:
    """Write the result JSON, first merging this configuration's earlier run's other strategies unless `merge` is
    off (`check_earlier_result` has refused any other's)."""
    if path.is_file() and merge:
        results = merge_results(read_object(path, DataError, "an early-exit result"), results)
    make_dirs(path.parent)
    atomic_write_json(path, results, indent=1)
    return results


def option_problems(args: argparse.Namespace) -> list[str]:
    """The numeric options outside their ranges (the thresholds are `SweepConfig.validate`'s)."""
    checks = [
        ("--max-length", args.max_length, 1),
        ("--max-examples", args.max_examples, 1),
        ("--max-lte-examples", args.max_lte_examples, 1),
        ("--lte-epochs", args.lte_epochs, 1),
        ("--threads", args.threads, 1),
    ]
    return [f"{name} must be >= {low}, got {value}" for name, value, low in checks if value is not None and value < low]


def main(args: argparse.Namespace) -> int:
    """`python -m finetune early-exit ...`"""
    problems = option_problems(args)
    if problems:
        raise ConfigError(problems)
    if args.threads:
        torch.set_num_threads(args.threads)
    task = get_task(args.task)
    strategies = resolve_strategies(args.strategy, task.num_labels)
    output = Path(args.output or Path("runs") / "early_exit" / task.name.replace("/", "_"))
    sweep_config(args, strategies, None, output, task)  # option errors surface before the model or any data is read
    inputs = [("--model", args.model), ("--data-dir", args.data_dir)]
    check_output(output, EARLY_EXIT_OUTPUT, [*inputs, ("--lte-head", args.lte_head)])
    if args.lte_head and not Path(args.lte_head).exists():  # trained and written there: never into the model
        check_output(args.lte_head, LTE_HEAD_OUTPUT, inputs, flag="--lte-head")
    device = resolve_device(args.device)
    model_dir = resolve_pretrained(args.model, what="--model")
    full_precision, model = load_models(args, model_dir, task, device)
    tokenizer = load_tokenizer(model_dir)
    precision = "" if args.precision == "fp32" else f"_{args.precision}"
    stem = f"early_exit_{task.name.replace('/', '_')}_{args.split}_bs{args.batch_size}{precision}"
    settings = dict(split=args.split, data_dir=data_source(args.data_dir), max_examples=args.max_examples)
    if args.precision != "fp32":  # (results of fp32 sweeps before precisions existed stay mergeable)
        settings.update(precision=args.precision)
    identity = result_identity(model_dir, task=task.name, max_length=args.max_length, **settings)
    if args.merge:
        check_earlier_result(output / f"{stem}.json", identity, "early-exit results", "--no-merge to replace them")
    examples = subsample(load_split(task, args.data_dir, args.split), args.max_examples)
    split = EncodedSplit.from_examples(tokenizer, examples, args.max_length)
    with removed_on_failure(output):  # a failed run leaves nothing it created (an empty folder, lone samples)
        make_dirs(output)  # an output that cannot be a folder is refused before the sweep, not after it
        head, head_path = lte_head_for(args, model, task, output, tokenizer) if "lte" in strategies else (None, None)
        results = sweep(model, split, task, sweep_config(args, strategies, head, output, task))
        if model is not full_precision:  # `fastest-within` is measured from the fp32 model's score, not the int8 one's
            reference = measure_reference(full_precision, split, task, split.batches(args.batch_size, device=device))
            results["full_model_fp32"] = {"score": reference.metrics.get("score"), "metrics": reference.metrics}
        results.update(
            device=str(device),
            model=str(args.model),
            split=args.split,
            data_dir=None if args.data_dir is None else str(args.data_dir),
            max_length=args.max_length,
            max_examples=args.max_examples,
            lte_head=str(head_path) if head_path else None,
            identity=identity,
        )
        results = write_results(results, output / f"{stem}.json", args.merge)
        if not args.merge:  # replaced on purpose: the earlier run's samples go with its result
            prune_samples(output / "samples", results)
        print(summary_table(results))
        plot_pareto(results, output / f"{stem}.png")
    print(f"wrote {output / f'{stem}.json'} and {output / f'{stem}.png'}")
    return 0


def load_models(
    args: argparse.Namespace, model_dir: Path, task: TaskSpec, device: torch.device
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the fp32 model, the model the sweep runs at `--precision`: thresholds are calibrated on its logits), with
    the task, exits and `--max-length` checked against it."""
    if problem := precision_problem(args.precision, device):
        raise ConfigError(problem)
    full_precision = load_finetuned(model_dir, require_trained=True, purpose="early exit").to(device)
    if note := check_task_fits(full_precision.config, task, args.model):
        print(f"finetune: note: {note}", file=sys.stderr, flush=True)
    if len(full_precision.exit_layers) < 2:
        print(
            f"finetune: note: {args.model} has one exit (layer {full_precision.exit_layers[0]}): every sample leaves "
            "there whatever the rule, so each point of the sweep is the full model (fine-tune with --exits for more)",
            file=sys.stderr,
            flush=True,
        )
    model = for_inference(full_precision, args.precision)
    check_max_length(model, args.max_length, model_dir)
    return full_precision, model


def prune_samples(directory: Path, results: dict) -> None:
    """Remove the per-sample files under `directory` of points `results` does not hold (an earlier run's)."""
    kept = {f"{name}_{point['threshold']:g}.tsv" for name, e in results["strategies"].items() for point in e["points"]}
    for path in directory.glob("*.tsv") if directory.is_dir() else []:
        if path.name not in kept:
            path.unlink()
