"""ELUE submission files, as the `submission` command writes them from an `early-exit` result.

ELUE does not run submitted models: it takes test predictions plus, per sample, the modules the sample activated
with the shape of each module's input, and a Python file defining those modules, and computes each sample's FLOPs
from the two (Liu et al., 2022, "Towards Efficient NLP: A Standard Evaluation and A Strong Baseline", NAACL,
section 3 on ELUE's submission and evaluation; the trace is written in the paper's own example form
``(10),emb; (10,768),layer_1; (768),exit_1``, as restated in this project's issue 17). The paper's text was not
retrievable here beyond that example. The prediction file's layout (header ``index<TAB>prediction``, the task's label
strings) is what the official ELUE inference code writes (fastnlp/ElasticBERT ``finetune-dynamic/inferences.py``),
and ``{TASK}_exit_layer.tsv`` starts with that code's ``index<TAB>exit_layer`` columns; the file names (one folder
per operating point, `TaskSpec.submission_name`) are ours: check them against the ELUE site's current instructions
before uploading.

`python -m finetune submission --results EARLY_EXIT.json --output DIR [--strategy NAME[,NAME...]]` re-runs every
operating point of the result (model, data, batch size and maximum length as recorded in it) on the test split and
writes one directory per point, `DIR/<strategy>_<threshold>/`, each a complete submission:
- ``{TASK}.tsv``: ``index<TAB>prediction`` (label strings as the task's files spell them; STS-B: 3 decimals);
- ``{TASK}_modules.tsv``: ``index<TAB>modules``, the activation trace of each sample, e.g. for a sample of 10 tokens
  that left at exit 2 of a model with hidden size 768 and linear exits at every layer:
  ``(10),emb; (10,768),layer_1; (768),exit_1; (10,768),layer_2; (768),exit_2``. Names: ``emb`` (input: the token
  ids, shape (L)), ``layer_i`` (the i-th transformer layer, input (L, H)), ``exit_i`` (the exit after layer i: input
  (H), the [CLS] vector, for a linear exit; (L, H) for an MHA exit). L is the sample's real length (no padding);
- ``model.py``: the definition of those modules (torch only; ``build()`` returns an ``nn.ModuleDict`` keyed by the
  trace's names, each module taking one input of the traced shape with a leading batch dimension);
- ``{TASK}_exit_layer.tsv``: ``index<TAB>exit_layer<TAB>length<TAB>flops`` (our own record: the 1-based exit, the
  real length, the FLOPs of this project's counter, which equals the official ElasticBERT one);
- ``submission.json``: model, strategy, threshold, mean test FLOPs, exit histogram.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.errors import ConfigError
from common.hub import resolve_pretrained
from common.io import atomic_write_json, atomic_write_text, make_dirs, read_object, removed_on_failure
from common.outputs import RESULTS, Output, check_output
from elasticbert import ElasticBertForSequenceClassification
from elasticbert.early_exit import make_rule
from elasticbert.exit_setting import degenerate_problem

from ..data import Batch, EncodedSplit, load_tokenizer
from ..model import check_max_length, load_finetuned, resolve_device
from ..serve.early_exit.engine import exit_histogram, per_sample_flops, run_dataset
from ..serve.early_exit.lte import LearnedExitHead
from ..serve.early_exit.sweep import is_early_exit_result
from ..task_check import check_task_fits
from ..tasks import DataError, TaskSpec, get_task, load_split
from . import elue_modules

SUBMISSION_OUTPUT = Output(
    "submission", "ELUE submission folders (<strategy>_<threshold>/)", folder=True, accepts=RESULTS
)

SUBMISSION_JSON = "a submission.json written by `finetune submission` (a JSON object)"


def activation_trace(
    exits_run: Sequence[int], exit_layer: int, length: int, hidden_size: int, exit_type: str = "linear"
) -> str:
    """The modules one sample activated, in order, each with the shape of its input (ELUE's form):
    `(L),emb; (L,H),layer_1; (H),exit_1; ...` (an MHA exit reads the whole sequence: `(L,H),exit_i`)."""
    ran = set(exits_run)
    exit_shape = f"({length},{hidden_size})" if exit_type == "mha" else f"({hidden_size})"
    parts = [f"({length}),emb"]
    for layer in range(1, exit_layer + 1):
        parts.append(f"({length},{hidden_size}),layer_{layer}")
        if layer in ran:
            parts.append(f"{exit_shape},exit_{layer}")
    return "; ".join(parts)


def parse_activation_trace(text: str) -> list[tuple[tuple[int, ...], str]]:
    """`(10),emb; (10,768),layer_1` -> [((10,), "emb"), ((10, 768), "layer_1")] (the inverse of `activation_trace`)."""
    out = []
    for part in text.split(";"):
        shape, _, name = part.strip().rpartition(",")
        if not (shape.startswith("(") and shape.endswith(")") and name):
            raise DataError(f"not an activation trace entry: {part.strip()!r} (expected '(D1,D2,...),name')")
        out.append((tuple(int(d) for d in shape[1:-1].split(",") if d.strip()), name.strip()))
    return out


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
    config: object | None = None,
) -> list[Path]:
    """Write one task's submission files (see the module docstring) into `directory`; `config` is the model's
    (an ElasticBertConfig, or anything with its attributes) and gives the traced shapes and model.py."""
    directory = Path(directory)
    make_dirs(directory)
    name = task.submission_name or task.name
    hidden, exit_type = int(config.hidden_size), str(config.exit_type)
    pred_lines = ["index\tprediction\n"]
    trace_lines = ["index\tmodules\n"]
    exit_lines = ["index\texit_layer\tlength\tflops\n"]
    for idx, pred, layer, length, flop, ran in zip(index, predictions, exit_layers, lengths, flops, exits_run):
        pred_lines.append(f"{int(idx)}\t{task.label_name(pred)}\n")
        trace = activation_trace(ran, int(layer), int(length), hidden, exit_type)
        trace_lines.append(f"{int(idx)}\t{trace}\n")
        exit_lines.append(f"{int(idx)}\t{int(layer)}\t{int(length)}\t{float(flop):.0f}\n")
    paths = [
        directory / f"{name}.tsv",
        directory / f"{name}_modules.tsv",
        directory / f"{name}_exit_layer.tsv",
        directory / "model.py",
    ]
    for path, text in zip(
        paths, ("".join(pred_lines), "".join(trace_lines), "".join(exit_lines), model_definition(config))
    ):
        atomic_write_text(path, text)
    if meta is not None:
        meta_path = directory / "submission.json"
        existing = read_object(meta_path, DataError, SUBMISSION_JSON, missing_ok=True)
        existing[name] = dict(meta)
        atomic_write_json(meta_path, existing, indent=1)
        paths.append(meta_path)
    return paths


MODEL_CONFIG_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
    "num_labels",
    "exit_layers",
    "exit_type",
    "exit_mha_dim",
    "exit_mha_heads",
)


def model_definition(config: object) -> str:
    """The source of `elue_modules.py` with CONFIG set to `config`'s values: the submission's model.py."""
    values = {key: getattr(config, key) for key in MODEL_CONFIG_KEYS}
    values["exit_layers"] = [int(layer) for layer in values["exit_layers"]]
    source = Path(elue_modules.__file__).read_text(encoding="utf-8")
    start = source.index("CONFIG: dict = {")
    end = source.index("\n}\n", start) + 3
    literal = "CONFIG: dict = " + json.dumps(values, indent=4) + "\n"
    header = "# Written by `python -m finetune submission` for this model (ELUE model definition).\n"
    return header + source[:start] + literal + source[end:]


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
        cls,
        results: Mapping,
        model: ElasticBertForSequenceClassification | None = None,
        split_name: str = "test",
        device: str = "auto",
    ) -> TestRun:
        """The model, data and settings recorded in an early-exit result (`model` may be given, already loaded;
        else it is loaded onto `device`)."""
        missing = [key for key in ("task", "model", "strategies") if key not in results]
        if missing:
            raise DataError(f"the early-exit result lacks the keys {missing}")
        task = get_task(results["task"])
        place = resolve_device(device)
        model_dir = resolve_pretrained(results["model"], what="the result's model")
        if model is None:
            model = load_finetuned(model_dir, require_trained=True, purpose="a submission").to(place)
        if note := check_task_fits(model.config, task, model_dir, option="the result's task"):
            print(f"finetune: note: {note}", file=sys.stderr, flush=True)
        max_length, batch_size = int(results.get("max_length", 128)), int(results.get("batch_size", 32))
        check_max_length(model, max_length, model_dir)
        if batch_size < 1:
            raise DataError(f"the early-exit result's batch_size must be >= 1, got {batch_size}")
        tokenizer = load_tokenizer(model_dir)
        examples = load_split(task, results.get("data_dir"), split_name)
        split = EncodedSplit.from_examples(tokenizer, examples, max_length)
        return cls(results, model, task, split_name, split, split.batches(batch_size, device=model.device))

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
            num_exits=len(self.model.exit_layers),
            lte_head=head,
        )
        result, _ = run_dataset(self.model, self.batches, rule)
        flops, _ = per_sample_flops(self.model.config, result, rule.head_width)
        meta = {
            "identity": {"early_exit": self.results.get("identity") or self.results["model"], "split": self.split_name},
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
            self.model.config,
        )


def write_submissions_for_results(
    results: Mapping,
    directory: str | Path,
    model: ElasticBertForSequenceClassification | None = None,
    lte_head: LearnedExitHead | None = None,
    split_name: str = "test",
    strategies: Sequence[str] | None = None,
    device: str = "auto",
    overwrite: bool = False,
    inputs: Sequence[tuple[str, object]] = (),
) -> list[Path]:
    """Re-run every operating point of an early-exit result on the test split and write its submission files to
    `directory/<strategy>_<threshold>/`. The model, data and settings come from the result JSON unless given.

    A folder collects one system's submission: each task's files may come from another result, but one task's
    files from two results (two models of that task) are never mixed — refused, or with `overwrite` the task's earlier
    files are removed from every point directory first. `directory` is refused when it is (or is inside) what the
    run reads (`inputs`: (option, path) besides the result's model, data and LTE head) or a folder another command
    wrote (`common.outputs`)."""
    if not is_early_exit_result(results):
        raise DataError("not an early-exit result (its 'format' is not elasticbert-early-exit/...)")
    read = [("the result's model", results.get("model")), ("the result's data_dir", results.get("data_dir"))]
    read += [("the result's lte_head", results.get("lte_head")), *inputs]
    check_output(directory, SUBMISSION_OUTPUT, read, overwrite)
    identity = {"early_exit": results.get("identity") or results.get("model"), "split": split_name}
    spec = get_task(results.get("task", ""))
    _claim_task(Path(directory), spec.submission_name or spec.name, identity, overwrite)
    unknown = sorted(set(strategies or ()) - set(results["strategies"]))
    if unknown:
        raise ConfigError(f"--strategy {','.join(unknown)}: the result has only {', '.join(results['strategies'])}")
    written, skipped = [], []
    with removed_on_failure(directory):  # a failed run leaves no point directory half-written
        make_dirs(directory)  # an output that cannot be a folder is refused before the test split is run
        run = TestRun.from_results(results, model, split_name, device)
        for name, entry in results["strategies"].items():
            if strategies is not None and name not in strategies:
                continue
            head = lte_head if name != "lte" or lte_head is not None else _lte_head_of(results)
            for point in entry["points"]:
                patience = int(point.get("patience", entry.get("params", {}).get("patience", 2)))
                exits, labels = len(run.model.exit_layers), run.model.config.num_labels
                if problem := degenerate_problem(name, point["threshold"], labels, exits, patience):
                    skipped.append(problem)  # an earlier version's sweep measured it: not a rule's point
                    continue
                out = Path(directory) / f"{name}_{point['threshold']:g}"
                run.write_point(name, point, entry.get("params", {}), head, out)
                written.append(out)
        if skipped:
            print(f"submission: skipped {len(skipped)} point(s): {'; '.join(skipped)}", file=sys.stderr, flush=True)
        if not written:  # an empty submission folder must not look like a written one
            why = "; ".join(skipped) or f"the result's strategies {sorted(results['strategies'])} hold no points"
            raise ConfigError(f"no operating point to write: {why}")
    return written


def _claim_task(directory: Path, task: str, identity: dict, overwrite: bool) -> None:
    """Refuse (or, with `overwrite`, clear) the files of task `task` (its submission name: the files' stem and its
    key in each point directory's submission.json) that another result wrote in `directory`."""
    others = []
    for meta_path in sorted(directory.glob("*/submission.json")):
        entry = read_object(meta_path, DataError, SUBMISSION_JSON).get(task)
        if entry is not None and entry.get("identity") != identity:
            others.append(meta_path)
    if not others:
        return
    if not overwrite:
        raise ConfigError(
            f"{others[0].parent} (and {len(others) - 1} more) holds {task}'s submission files of another early-exit "
            "result (another model or configuration); one task's files from two results are never mixed: pass "
            "another --output, or --overwrite to replace them"
        )
    for meta_path in others:
        meta = read_object(meta_path, DataError, SUBMISSION_JSON)
        meta.pop(task)
        for suffix in (".tsv", "_modules.tsv", "_exit_layer.tsv"):
            (meta_path.parent / f"{task}{suffix}").unlink(missing_ok=True)
        atomic_write_json(meta_path, meta, indent=1)


def _lte_head_of(results: Mapping) -> LearnedExitHead:
    if not results.get("lte_head"):
        raise DataError("the result has LTE points but names no LTE head file")
    return LearnedExitHead.load(results["lte_head"])
