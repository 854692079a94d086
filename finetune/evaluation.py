"""Per-exit evaluation: the layer-score curve (JSON + PNG) and GLUE/ELUE test prediction files.

`python -m finetune evaluate --model RUN_DIR/best --task RTE --data-dir GLUE --output OUT` writes
OUT/dev_scores.json, OUT/layer_curve.png and OUT/predictions/{TASK}.tsv (`index\\tprediction`, label names) from
the chosen exit (default: the last); `--all-exits` adds OUT/predictions/layer_{l}/{TASK}.tsv for every exit.
For MNLI the mismatched dev/test sets are scored too (MNLI-m.tsv and MNLI-mm.tsv).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from elasticbert import ElasticBertForSequenceClassification

from .data import encode_examples, load_tokenizer, subsample
from .tasks import DataError, Example, TaskSpec, get_task, load_split, predictions_from_outputs


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

    Examples are batched by length (less padding, same results) and put back in order.
    """
    model.eval()
    layers = tuple(exits) if exits is not None else model.exit_layers
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].text_a) + len(examples[i].text_b or ""))
    chunks: dict[int, list[np.ndarray]] = {layer: [] for layer in layers}
    for start in range(0, len(order), batch_size):
        batch = encode_examples(tokenizer, [examples[i] for i in order[start : start + batch_size]], max_length)
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], exit_layers=layers)
        for layer, logits in zip(out.exit_layers, out.logits):
            chunks[layer].append(logits.float().numpy())
    inverse = np.argsort(np.asarray(order))
    logits = {layer: np.concatenate(parts)[inverse] for layer, parts in chunks.items()}
    labels = None
    if all(e.label is not None for e in examples):
        labels = np.asarray([e.label for e in examples])
    return logits, labels


def per_exit_scores(
    task: TaskSpec, logits: dict[int, np.ndarray], labels: np.ndarray | None
) -> dict[int, dict[str, float]]:
    """The task's metrics for each exit."""
    if labels is None:
        raise DataError(f"{task.name}: the examples carry no labels, nothing to score")
    return {layer: task.compute_metrics(values, labels) for layer, values in sorted(logits.items())}


def plot_layer_curve(
    task: TaskSpec, scores: dict[int, dict[str, float]], path: Path, title: str | None = None
) -> Path:
    """Main metric per exit layer (and the task's individual metrics when it has several), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = sorted(scores)
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.plot(layers, [scores[k][task.main_metric] for k in layers], "o-", label=f"{task.main_metric}")
    if len(task.metrics) > 1:
        for metric in task.metrics:
            ax.plot(layers, [scores[k][metric] for k in layers], ".--", alpha=0.6, label=metric)
    ax.set_xlabel("exit layer")
    ax.set_ylabel("dev score (%)")
    ax.set_xticks(layers)
    ax.set_title(title or task.name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_predictions(task: TaskSpec, examples: Sequence[Example], outputs: np.ndarray, path: Path) -> Path:
    """A GLUE-style submission file: header `index\\tprediction`, one row per test example, label names."""
    preds = predictions_from_outputs(task, outputs)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["index\tprediction"] + [f"{e.index}\t{task.label_name(p)}" for e, p in zip(examples, preds)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
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
) -> dict:
    """Score every exit on `split`, plot the curve, and write test predictions. Returns what dev_scores.json holds.

    `max_length` defaults to the training run's (RUN/run_config.json beside RUN/best), else 128.
    """
    from .model import load_finetuned

    model_dir = Path(model_dir)
    if max_length is None:
        run_config = model_dir.parent / "run_config.json"
        max_length = json.loads(run_config.read_text())["max_length"] if run_config.is_file() else 128
    model = load_finetuned(model_dir)
    task = task_for(model, task_name)
    if model.config.num_labels != task.num_labels:
        raise DataError(
            f"{model_dir}: model has num_labels={model.config.num_labels}, task {task.name} needs {task.num_labels}"
        )
    tokenizer = load_tokenizer(model_dir)
    out_dir = Path(output)
    out_dir.mkdir(parents=True, exist_ok=True)
    exit_layer = predict_exit or model.exit_layers[-1]
    if exit_layer not in model.exit_layers:
        raise DataError(f"--predict-exit {exit_layer}: the model's exits are {list(model.exit_layers)}")
    result: dict = {"model": str(model_dir), "exit_layers": list(model.exit_layers), "tasks": {}}
    for spec in companion_tasks(task):
        examples = subsample(load_split(spec, data_dir, split), max_examples)
        logits, labels = predict_exits(model, tokenizer, examples, batch_size, max_length)
        scores = per_exit_scores(spec, logits, labels)
        entry: dict = {"split": split, "examples": len(examples), "main_metric": spec.main_metric,
                       "exits": {str(k): v for k, v in scores.items()}}
        stem = spec.submission_name or spec.name.replace("/", "_")
        entry["curve"] = str(plot_layer_curve(spec, scores, out_dir / f"layer_curve_{stem}.png"))
        if test:
            try:
                test_examples = load_split(spec, data_dir, "test")
            except DataError as err:
                entry["test"] = f"skipped: {err}"
            else:
                test_logits, _ = predict_exits(model, tokenizer, test_examples, batch_size, max_length)
                files = [write_predictions(spec, test_examples, test_logits[exit_layer],
                                           out_dir / "predictions" / f"{stem}.tsv")]
                if all_exits:
                    files += [
                        write_predictions(spec, test_examples, values,
                                          out_dir / "predictions" / f"layer_{layer}" / f"{stem}.tsv")
                        for layer, values in test_logits.items()
                    ]
                entry["test"] = {"exit": exit_layer, "files": [str(f) for f in files]}
        result["tasks"][spec.name] = entry
    (out_dir / "dev_scores.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if len(result["tasks"]) == 1:
        only = next(iter(result["tasks"].values()))
        Path(only["curve"]).replace(out_dir / "layer_curve.png")
        only["curve"] = str(out_dir / "layer_curve.png")
        (out_dir / "dev_scores.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def add_subparser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "evaluate",
        help="per-exit dev scores (JSON + PNG curve) and GLUE/ELUE test prediction files",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, help="a fine-tuned run's model directory (RUN_DIR/best)")
    p.add_argument("--task", help="task name (default: the one the model was fine-tuned on)")
    p.add_argument("--data-dir", help="GLUE/ELUE data root (or hf:NAME for the Hugging Face hub)")
    p.add_argument("--output", required=True)
    p.add_argument("--split", default="dev")
    p.add_argument("--no-test", dest="test", action="store_false", help="skip the test prediction files")
    p.add_argument("--predict-exit", type=int, help="exit whose predictions go into the submission (default: last)")
    p.add_argument("--all-exits", action="store_true", help="also write predictions of every exit")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-length", type=int, help="default: the training run's, else 128")
    p.add_argument("--max-examples", type=int, help="score a seeded subset of the split")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    result = evaluate_model(
        args.model, args.task, args.data_dir, args.output, args.split, args.test, args.predict_exit,
        args.all_exits, args.batch_size, args.max_length, args.max_examples,
    )
    for name, entry in result["tasks"].items():
        curve = ", ".join(f"L{k}: {v[entry['main_metric']]:.2f}" for k, v in entry["exits"].items())
        print(f"{name} {entry['split']} ({entry['examples']} examples) {entry['main_metric']} per exit: {curve}")
    print(f"wrote {Path(args.output) / 'dev_scores.json'}")
    return 0
