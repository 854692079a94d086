"""ELUE submission files, and the `submission` command that writes them from an `early-exit` result.

`python -m finetune submission --results EARLY_EXIT.json --output DIR [--strategy NAME[,NAME...]]` re-runs every
operating point of the result (model, data, batch size and maximum length as recorded in it) on the test split and
writes one directory per point, `DIR/<strategy>_<threshold>/`, with one set of files per task, in the form the
official ElasticBERT/ELUE code produced for the ELUE site:
- ``{TASK}.tsv``: ``index<TAB>prediction`` (label strings as the task's files spell them; STS-B: 3 decimals);
- ``{TASK}_exit_layer.tsv``: ``index<TAB>exit_layer`` (1-based layer each test sample left at);
- ``{TASK}_modules.tsv``: ``index<TAB>exit_layer<TAB>length<TAB>flops<TAB>modules``, the module trace the sample ran
  (``embeddings,layer1,exit1,layer2,exit2,...``), its real length and FLOPs under the ELUE conventions;
- ``submission.json``: model, strategy, threshold, mean test FLOPs, exit histogram.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.cli import add_output
from common.errors import ConfigError
from common.io import atomic_write_json, atomic_write_text
from elasticbert import ElasticBertForSequenceClassification

from .data import Batch, EncodedSplit, load_tokenizer
from .early_exit.engine import exit_histogram, per_sample_flops, run_dataset
from .early_exit.lte import LearnedExitHead
from .early_exit.rules import make_rule
from .early_exit.sweep import is_early_exit_result
from .model import load_finetuned
from .tasks import DataError, TaskSpec, get_task, load_split


def module_trace(exits_run: Sequence[int], exit_layer: int) -> str:
    """`embeddings,layer1,exit1,layer2,...` - the modules one sample went through, in order."""
    ran = set(exits_run)
    parts = ["embeddings"]
    for layer in range(1, exit_layer + 1):
        parts.append(f"layer{layer}")
        if layer in ran:
            parts.append(f"exit{layer}")
    return ",".join(parts)


def write_submission(
    directory: str | Path,
    task: TaskSpec,
    index: Sequence[int],
    predictions: Sequence[float],
    exit_layers: Sequence[int],
    lengths: Sequence[int],
    flops: Sequence[float],
    exits_run: Sequence[Sequence[int]],
    meta: Mapping | None = None,
) -> list[Path]:
    """Write one task's submission files (see the module docstring) into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    name = task.submission_name or task.name
    pred_lines = ["index\tprediction\n"]
    exit_lines = ["index\texit_layer\n"]
    trace_lines = ["index\texit_layer\tlength\tflops\tmodules\n"]
    for idx, pred, layer, length, flop, trace in zip(index, predictions, exit_layers, lengths, flops, exits_run):
        pred_lines.append(f"{int(idx)}\t{task.label_name(pred)}\n")
        exit_lines.append(f"{int(idx)}\t{int(layer)}\n")
        trace_lines.append(
            f"{int(idx)}\t{int(layer)}\t{int(length)}\t{float(flop):.0f}\t{module_trace(trace, int(layer))}\n"
        )
    paths = [directory / f"{name}.tsv", directory / f"{name}_exit_layer.tsv", directory / f"{name}_modules.tsv"]
    for path, lines in zip(paths, (pred_lines, exit_lines, trace_lines)):
        atomic_write_text(path, "".join(lines))
    if meta is not None:
        meta_path = directory / "submission.json"
        existing = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
        existing[name] = dict(meta)
        atomic_write_json(meta_path, existing, indent=1)
        paths.append(meta_path)
    return paths


@dataclass
class TestRun:
    """What every operating point of one result is re-run on: the model and the encoded test split in batches."""

    results: Mapping
    model: ElasticBertForSequenceClassification
    task: TaskSpec
    split_name: str
    split: EncodedSplit
    batches: list[Batch]

    @classmethod
    def from_results(
        cls, results: Mapping, model: ElasticBertForSequenceClassification | None = None, split_name: str = "test"
    ) -> TestRun:
        """The model, data and settings recorded in an early-exit result (`model` may be given, already loaded)."""
        task = get_task(results["task"])
        model = model if model is not None else load_finetuned(results["model"])
        tokenizer = load_tokenizer(results["model"])
        examples = load_split(task, results.get("data_dir"), split_name)
        split = EncodedSplit.from_examples(tokenizer, examples, int(results.get("max_length", 128)))
        return cls(results, model, task, split_name, split, split.batches(int(results.get("batch_size", 32))))

    def write_point(
        self, name: str, point: Mapping, params: Mapping, head: LearnedExitHead | None, out: Path
    ) -> list[Path]:
        """Run one operating point (its rule, as recorded) over the split and write its files to `out`."""
        rule = make_rule(
            name,
            point["threshold"],
            self.model.config.num_labels,
            patience=int(point.get("patience", params.get("patience", 2))),
            delta=float(point.get("delta", params.get("delta", 0.1))),
            lte_head=head,
        )
        result, _ = run_dataset(self.model, self.batches, rule)
        flops, _ = per_sample_flops(self.model.config, result, head.linear.in_features if name == "lte" else 0)
        meta = {
            "model": self.results["model"],
            "task": self.task.name,
            "split": self.split_name,
            "strategy": name,
            **{k: v for k, v in point.items() if k in ("threshold", "patience", "delta")},
            "dev_score": point.get("score"),
            "test_mean_flops": float(np.mean(flops)),
            "test_exit_histogram": exit_histogram(result),
            "num_samples": len(self.split),
        }
        return write_submission(
            out,
            self.task,
            self.split.index.tolist(),
            result.predictions.tolist(),
            result.exit_layers.tolist(),
            result.lengths.tolist(),
            flops.tolist(),
            [result.trace(i) for i in range(len(self.split))],
            meta,
        )


def write_submissions_for_results(
    results: Mapping,
    directory: str | Path,
    model: ElasticBertForSequenceClassification | None = None,
    lte_head: LearnedExitHead | None = None,
    split_name: str = "test",
    strategies: Sequence[str] | None = None,
) -> list[Path]:
    """Re-run every operating point of an early-exit result on the test split and write its submission files to
    `directory/<strategy>_<threshold>/`. The model, data and settings come from the result JSON unless given."""
    if not is_early_exit_result(results):
        raise DataError("not an early-exit result (its 'format' is not elasticbert-early-exit/...)")
    unknown = sorted(set(strategies or ()) - set(results["strategies"]))
    if unknown:
        raise ConfigError(f"--strategy {','.join(unknown)}: the result has only {', '.join(results['strategies'])}")
    run = TestRun.from_results(results, model, split_name)
    written = []
    for name, entry in results["strategies"].items():
        if strategies is not None and name not in strategies:
            continue
        head = lte_head if name != "lte" or lte_head is not None else _lte_head_of(results)
        for point in entry["points"]:
            out = Path(directory) / f"{name}_{point['threshold']:g}"
            run.write_point(name, point, entry.get("params", {}), head, out)
            written.append(out)
    return written


def _lte_head_of(results: Mapping) -> LearnedExitHead:
    if not results.get("lte_head"):
        raise DataError("the result has LTE points but names no LTE head file")
    return LearnedExitHead.load(results["lte_head"])


def add_subparser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `submission` on the `python -m finetune` command line."""
    p = subparsers.add_parser(
        "submission",
        help="ELUE submission files: re-run each operating point of an early-exit result on the test split",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--results", required=True, metavar="EARLY_EXIT.json", help="a result JSON of `early-exit`")
    add_output(p, "directory that receives one <strategy>_<threshold>/ directory per operating point", metavar="DIR")
    p.add_argument("--strategy", default=None, help="comma list of the result's strategies (default: all of them)")
    p.add_argument("--split", default="test", help="split to predict (default: %(default)s)")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    """`python -m finetune submission ...`"""
    path = Path(args.results)
    if not path.is_file():
        raise DataError(f"{path}: no such file (pass the JSON `finetune early-exit` wrote)")
    results = json.loads(path.read_text(encoding="utf-8"))
    chosen = [s.strip() for s in args.strategy.split(",") if s.strip()] if args.strategy else None
    written = write_submissions_for_results(results, args.output, split_name=args.split, strategies=chosen)
    print(f"{path}: wrote {len(written)} submission directories under {args.output}")
    return 0
