"""Per-exit evaluation: every exit's scores on a split, the layer-score curve and GLUE/ELUE test prediction files
(the library of `evaluate`, whose command line is `cli.py`; `train/trainer.py` scores dev sets with it too)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from common.errors import ConfigError
from common.hub import resolve_pretrained
from common.io import atomic_write_json, atomic_write_text, make_dirs, removed_on_failure
from common.outputs import RESULTS, Output, check_output
from elasticbert import ElasticBertForSequenceClassification

from ..config import load_run_config
from ..data import EncodedSplit, forward_in_order, load_tokenizer, subsample
from ..model import check_max_length, exit_logits, load_finetuned, model_device, resolve_device
from ..plots import plot_layer_curve
from ..results import check_earlier_result, data_files, data_source, result_identity
from ..task_check import check_data_fits, check_task_fits
from ..tasks import DataError, Example, MissingSplitError, TaskSpec, get_task, load_split, predictions_from_outputs

EVALUATION = Output(
    "evaluate", "an evaluation (dev_scores.json, layer curves, predictions/)", folder=True, accepts=RESULTS
)


@torch.inference_mode()
def predict_exits(
    model: ElasticBertForSequenceClassification,
    tokenizer: object,
    examples: Sequence[Example],
    batch_size: int = 64,
    max_length: int = 128,
    exits: Sequence[int] | None = None,
) -> tuple[dict[int, np.ndarray], np.ndarray | None]:
    """Logits of every exit for `examples` (in their order) and their labels (None if unlabelled).

    Examples are batched by token length (less padding, same results) and put back in order.
    """
    model.eval()
    layers = tuple(exits) if exits is not None else model.exit_layers
    split = EncodedSplit.from_examples(tokenizer, examples, max_length)

    def forward(ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> dict[int, torch.Tensor]:
        out = model(ids, mask, types, exit_layers=layers)
        return {layer: logits.float() for layer, logits in zip(out.exit_layers, exit_logits(out))}

    logits, _ = forward_in_order(forward, split.batches(batch_size, device=model_device(model)))
    labels = None
    if all(e.label is not None for e in examples):
        labels = np.asarray([e.label for e in examples])
    return {layer: values.numpy() for layer, values in logits.items()}, labels


def per_exit_scores(
    task: TaskSpec, logits: dict[int, np.ndarray], labels: np.ndarray | None
) -> dict[int, dict[str, float]]:
    """The task's metrics for each exit."""
    if labels is None:
        raise DataError(f"{task.name}: the examples carry no labels, nothing to score")
    return {layer: task.compute_metrics(values, labels) for layer, values in sorted(logits.items())}


def write_predictions(task: TaskSpec, examples: Sequence[Example], outputs: np.ndarray, path: Path) -> Path:
    """A GLUE-style submission file: header `index\\tprediction`, one row per test example, label names."""
    preds = predictions_from_outputs(task, outputs)
    make_dirs(path.parent)
    lines = ["index\tprediction"] + [f"{e.index}\t{task.label_name(p)}" for e, p in zip(examples, preds)]
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def task_for(model: ElasticBertForSequenceClassification, task_name: str | None) -> TaskSpec:
    """--task, else the task the model was fine-tuned on (saved in its config)."""
    name = task_name or getattr(model.config, "finetuning_task", None)
    if not name:
        raise DataError("the model's config names no fine-tuning task: pass --task")
    return get_task(name)


def companion_tasks(task: TaskSpec) -> list[TaskSpec]:
    """MNLI is scored on matched and mismatched sets; every other task on itself."""
    if task.directory == "MNLI" and task.benchmark == "glue":
        return [get_task("MNLI"), get_task("MNLI-mm")]
    return [task]


def check_counts(**counts: int | None) -> None:
    """Each given count (`batch_size=64`, `max_examples=None`: not given) at least 1, named by its option."""
    for name, value in counts.items():
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def evaluate_model(
    model_dir: str | Path,
    task_name: str | None,
    data_dir: str | None,
    output: str | Path,
    split: str = "dev",
    test: bool = True,
    predict_exit: int | None = None,
    all_exits: bool = False,
    batch_size: int = 64,
    max_length: int | None = None,
    max_examples: int | None = None,
    device: str = "auto",
    overwrite: bool = False,
) -> dict:
    """Score every exit on `split`, plot the curve, and write test predictions. Returns what dev_scores.json holds.

    `max_length` defaults to the training run's (RUN/run_config.json beside RUN/best), else 128. Exits that were
    never trained are scored with a warning and listed under `untrained_exits`. A task the model's head does not fit,
    or data of another task when the task was taken from the model, is refused (`task_check`). An `output` holding the
    evaluation of another model, configuration or data (files' sha256) is refused unless `overwrite` (then its
    prediction files are replaced too); so is an `output` that is the model, in an input or another command's folder
    (`common.outputs`). A failed run leaves nothing it created, never another model's dev_scores.json beside its own.
    """
    check_counts(batch_size=batch_size, max_examples=max_examples)
    check_output(output, EVALUATION, [("--model", model_dir), ("--data-dir", data_dir)], overwrite)
    model_dir, model, max_length = _load_for_scoring(model_dir, device, max_length)
    task, exit_layer = _task_and_exit(model, model_dir, task_name, predict_exit)
    specs, splits = companion_tasks(task), [split, "test"] if test else [split]
    files = _checked_data(specs, data_dir, splits, task_given=task_name is not None)
    out_dir = Path(output)
    settings = dict(split=split, data_dir=data_source(data_dir), max_examples=max_examples, max_length=max_length)
    identity = {**result_identity(model_dir, task=task.name, **settings), "data_files": files}
    if not overwrite:
        check_earlier_result(out_dir / "dev_scores.json", identity, "evaluation", "--overwrite to replace it")
    with removed_on_failure(out_dir):
        make_dirs(out_dir)  # an output that cannot be a folder is refused before the scoring, not after it
        if overwrite:  # another model's scores never stand beside this run's files, even if it fails
            (out_dir / "dev_scores.json").unlink(missing_ok=True)
        result: dict = {
            "identity": identity,
            "model": str(model_dir),
            "exit_layers": list(model.exit_layers),
            "untrained_exits": model.untrained_exits,  # scored, but their heads are random (see the warning)
            "tasks": {},
        }
        tokenizer = load_tokenizer(model_dir)
        for spec in specs:
            result["tasks"][spec.name] = _evaluate_task(
                model, tokenizer, spec, data_dir, out_dir, split, max_examples, batch_size, max_length, len(specs) > 1
            )
            if test:
                predictions = out_dir / "predictions"
                result["tasks"][spec.name]["test"] = _test_predictions(
                    model, tokenizer, spec, data_dir, predictions, exit_layer, all_exits, batch_size, max_length
                )
        if overwrite:  # the earlier evaluation's prediction files that this one did not write
            _remove_other_predictions(out_dir / "predictions", result)
        atomic_write_json(out_dir / "dev_scores.json", result)
    return result


def _checked_data(
    specs: list[TaskSpec], data_dir: str | None, splits: list[str], task_given: bool
) -> dict[str, str] | None:
    """The sha256 of every file of `splits` to be scored or predicted, once the rows are known to be the task's: a
    folder or file of another task is refused unless --task named it (`check_data_fits`; then a note)."""
    for spec in specs:
        if note := check_data_fits(spec, data_dir, splits, task_given=task_given):
            print(f"finetune: note: {note}", file=sys.stderr, flush=True)
    return data_files(specs, data_dir, splits)


def _load_for_scoring(
    model_dir: str | Path, device: str, max_length: int | None
) -> tuple[Path, ElasticBertForSequenceClassification, int]:
    """(the model's directory, the model on its device, the tokens per input: the training run's by default, from
    RUN/run_config.json beside RUN/best, else 128), checked against what the model embeds."""
    place = resolve_device(device)
    model_dir = resolve_pretrained(model_dir, what="--model")
    model = load_finetuned(model_dir, purpose="scoring them").to(place)
    if max_length is None:
        run_config = model_dir.parent / "run_config.json"
        max_length = load_run_config(run_config).data.max_length if run_config.is_file() else 128
    check_max_length(model, max_length, model_dir)
    return model_dir, model, max_length


def _task_and_exit(
    model: ElasticBertForSequenceClassification, model_dir: Path, task_name: str | None, predict_exit: int | None
) -> tuple[TaskSpec, int]:
    """The task to score (the model's own by default; a mismatch with its head refused or noted) and the exit whose
    predictions go into the submission files (default: the last)."""
    task = task_for(model, task_name)
    if note := check_task_fits(model.config, task, model_dir):
        print(f"finetune: note: {note}", file=sys.stderr, flush=True)
    exit_layer = predict_exit or model.exit_layers[-1]
    if exit_layer not in model.exit_layers:
        raise DataError(f"--predict-exit {exit_layer}: the model's exits are {list(model.exit_layers)}")
    return task, exit_layer


def _evaluate_task(
    model: ElasticBertForSequenceClassification,
    tokenizer: object,
    spec: TaskSpec,
    data_dir: str | None,
    out_dir: Path,
    split: str,
    max_examples: int | None,
    batch_size: int,
    max_length: int,
    several: bool,
) -> dict:
    """One task's per-exit scores on `split` and its layer curve (written atomically: never a truncated PNG)."""
    examples = subsample(load_split(spec, data_dir, split), max_examples)
    logits, labels = predict_exits(model, tokenizer, examples, batch_size, max_length)
    scores = per_exit_scores(spec, logits, labels)
    curve = out_dir / (f"layer_curve_{_stem(spec)}.png" if several else "layer_curve.png")
    make_dirs(out_dir)
    plot_layer_curve(spec, scores, curve)
    return {
        "split": split,
        "examples": len(examples),
        "main_metric": spec.main_metric,
        "exits": {str(k): v for k, v in scores.items()},
        "curve": str(curve),
    }


def _stem(spec: TaskSpec) -> str:
    return spec.submission_name or spec.name.replace("/", "_")


def _remove_other_predictions(directory: Path, result: dict) -> None:
    """Remove the files under `directory` that `result` does not list (an earlier evaluation's), and empty folders."""
    written = {
        Path(path)
        for entry in result["tasks"].values()
        if isinstance(entry.get("test"), dict)
        for path in entry["test"]["files"]
    }
    for path in sorted(directory.rglob("*"), key=lambda p: len(p.parts), reverse=True) if directory.is_dir() else []:
        if path.is_file() and path not in written:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def _test_predictions(
    model: ElasticBertForSequenceClassification,
    tokenizer: object,
    spec: TaskSpec,
    data_dir: str | None,
    directory: Path,
    exit_layer: int,
    all_exits: bool,
    batch_size: int,
    max_length: int,
) -> dict | str:
    """The test split's prediction files (the chosen exit, and every exit with `all_exits`), or why they were
    skipped: no test file. A test file that is there but unreadable (a missing text column, a bad row) is an error,
    not a skip: a submission without its predictions must not look like a finished evaluation."""
    try:
        examples = load_split(spec, data_dir, "test")
    except MissingSplitError as err:
        return f"skipped: {err}"
    logits, _ = predict_exits(model, tokenizer, examples, batch_size, max_length)
    stem = _stem(spec)
    files = [write_predictions(spec, examples, logits[exit_layer], directory / f"{stem}.tsv")]
    if all_exits:
        files += [
            write_predictions(spec, examples, values, directory / f"layer_{layer}" / f"{stem}.tsv")
            for layer, values in logits.items()
        ]
    return {"exit": exit_layer, "files": [str(f) for f in files]}
