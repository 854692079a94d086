"""Predictions with early exiting from Python: a fine-tuned multi-exit model plus an exit rule.

```python
from finetune.serve.predict import EarlyExitClassifier

classifier = EarlyExitClassifier.from_pretrained("runs/sst2/best", strategy="entropy", threshold=0.5545)
classifier.predict(["it 's a charming and often affecting journey . "])  # a pair: ("premise", "hypothesis")
# [{"label": "1", "probabilities": {"0": 0.0364, "1": 0.9636}, "exit_layer": 1, "flops": 43560416, "tokens": 12}]
```

Each prediction: `label` (the config's `id2label` name) and `probabilities` (softmax of the exit's logits, by label
name) - for a regression model `value` instead -, `exit_layer` (the 1-based layer whose exit answered), `flops`
(ELUE conventions, `elasticbert.flops`: the sample's real length, its exit and every exit head it ran, plus the LTE
head's calls) and `tokens` (its length; inputs are cut to `max_length` tokens as in training); `id` when the input
carried one. Inputs go through the early-exit engine in length-sorted batches (samples leave a batch as they exit)
and come back in input order: the same batches, rule and engine as `finetune early-exit`, so the predictions equal
its per-sample records on the same rows.

The rule - one `elasticbert.EarlyExitSetting`, a rule of the table `elasticbert.exit_setting.RULES` at a threshold:
`strategy`/`threshold` (entropy, maxprob, patience, pcee, lte with `lte_head`, or static = the full model), or
`operating_point="RESULT.json:fastest-within=1.0"` (see `early_exit.operating_point`), else the setting saved in
the model's config (`elasticbert.save_early_exit`; what `pipeline("text-classification")` runs), else the full
model. `EarlyExitClassifier(model, tokenizer, setting)` takes the setting itself. The `predict` command
(`predict_cli.py`) is this class on files and stdin.

Every input gets its own verdict before it is classified (`verdicts`): one the model cannot read - nothing visible
(`empty`), punctuation only (`no-words`), mostly characters its vocabulary does not know (`unknown-text`: no more than
`min_readable_share` of them readable) - is not classified, and its record says so instead of carrying a label:
`{"flag": "unknown-text", "reason": "6 of its 7 characters are unreadable ..."}` (with its `id`). Callers check
`"flag" in record`; a record with a label is always one the model could read.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from common.errors import ConfigError
from common.hub import resolve_pretrained
from common.vocab import DEFAULT_MAX_UNK_FRACTION
from elasticbert import EarlyExitSetting, ElasticBertForSequenceClassification
from elasticbert.early_exit import EarlyExitResult, ExitRule, LayerRunner, rule_for, serving_runner
from elasticbert.loading import read_config
from elasticbert.precision import for_inference, precision_problem

from ..config import load_run_config
from ..data import UNK_MIN_TOKENS, check_vocabulary_fits, load_tokenizer, text_id_table, unk_counts, unk_refusal
from ..model import check_max_length, load_finetuned, model_device, resolve_device
from ..task_check import check_measured_task, check_task_fits, model_task
from ..tasks import DataError, TaskSpec
from .early_exit.lte import LearnedExitHead
from .early_exit.operating_point import OperatingPoint, chosen_setting, run_precision
from .inputs import TextInput
from .onnx_runtime import RUNTIMES, OnnxLayers, read_manifest
from .predict_stream import PredictionStream
from .verdicts import DEFAULT_MIN_READABLE_SHARE, VocabularyJudge

Input = str | tuple[str, str] | list[str] | TextInput


class EarlyExitClassifier:
    """A fine-tuned multi-exit classifier with an exit rule: predictions with their exit layer and FLOPs."""

    def __init__(
        self,
        model: ElasticBertForSequenceClassification,
        tokenizer: object,
        setting: EarlyExitSetting | ExitRule | None = None,
        *,
        lte_head: LearnedExitHead | None = None,
        max_length: int = 128,
        batch_size: int = 32,
        task: TaskSpec | None = None,
        max_unk_fraction: float = DEFAULT_MAX_UNK_FRACTION,
        precision: str = "fp32",
        min_readable_share: float = DEFAULT_MIN_READABLE_SHARE,
    ) -> None:
        """`setting`: the rule's (default: static, the full model), or the rule `rule_for` made of one."""
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if not 0.0 <= max_unk_fraction <= 1.0:
            raise ConfigError(f"--max-unk-fraction must be within [0, 1] (1 never refuses), got {max_unk_fraction}")
        if not 0.0 <= min_readable_share < 1.0:
            raise ConfigError(
                f"--min-readable-share must be within [0, 1) (0: any input with one readable character), got "
                f"{min_readable_share}"
            )
        check_vocabulary_fits(tokenizer, model.config.vocab_size, getattr(tokenizer, "name_or_path", "of the model"))
        self.judge = VocabularyJudge(tokenizer, min_readable_share)
        self.model, self.tokenizer = for_inference(model, precision), tokenizer
        self.runner, self.config = serving_runner(self.model), model.config  # GraphedLayers on a CUDA device
        self.precision = precision
        self.max_unk_fraction, self.unk_seen = max_unk_fraction, [0, 0]  # [UNK] and text tokens of all inputs
        self.is_text, self.flops_memo = text_id_table(tokenizer), {}  # see per_sample_flops(memo=)
        exits = len(model.exit_layers)
        if not isinstance(setting, ExitRule):
            setting = rule_for(setting or EarlyExitSetting("static"), model.config.num_labels, exits, lte_head=lte_head)
        elif setting.setting is not None and setting.checked_exits != exits:  # made for no or another count of exits
            setting.setting.validated(model.config.num_labels, num_exits=exits)
        self.rule, self.setting = setting, setting.setting
        where = getattr(model, "name_or_path", None) or "the model"
        if self.setting is not None and self.setting.task:  # another task's operating point is refused
            if note := check_measured_task(model.config, self.setting.task, where, "the setting")[1]:
                print(f"finetune: note: {note}", file=sys.stderr, flush=True)
        if task is not None:  # a task asked for: the model's own, or one its head fits when it records none
            if note := check_task_fits(model.config, task, where, option="task"):
                print(f"finetune: note: {note}", file=sys.stderr, flush=True)
        self.max_length, self.batch_size = max_length, batch_size
        self.task = task if task is not None else _own_task(model)
        self.description = self.setting.describe()
        check_max_length(model, max_length, getattr(model, "name_or_path", "model"))

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        strategy: str | None = None,
        threshold: float | None = None,
        *,
        patience: int | None = None,
        delta: float | None = None,
        lte_head: str | Path | LearnedExitHead | None = None,
        operating_point: str | OperatingPoint | None = None,
        max_length: int | None = None,
        batch_size: int = 32,
        device: str = "auto",
        max_unk_fraction: float = DEFAULT_MAX_UNK_FRACTION,
        precision: str | None = None,
        min_readable_share: float = DEFAULT_MIN_READABLE_SHARE,
        runtime: str = "torch",
        threads: int | None = None,
    ) -> EarlyExitClassifier:
        """A fine-tuned model directory (RUN/best) or hub name, with the rule chosen as the module docstring says;
        `max_length` defaults to the operating point's, else the training run's (RUN/run_config.json), else 128;
        `precision` to the operating point's or saved setting's (what its threshold was chosen at), else fp32. The
        setting is checked once, as its rule is made, before the model loads. `runtime="onnxruntime"`: `path` is a
        `finetune export --layout onnx` directory, run by the same engine on ONNX Runtime (`threads`: its intra-op
        threads, default torch's)."""
        if runtime not in RUNTIMES:
            raise ConfigError(f"unknown runtime {runtime!r} (choose from {', '.join(RUNTIMES)})")
        place = resolve_device(device) if runtime == "torch" else _cpu_only(device)
        directory = resolve_pretrained(path, what="--model") if runtime == "torch" else Path(path)
        if runtime == "onnxruntime":
            read_manifest(directory)  # verified before anything is read from it
        config = read_config(directory)
        num_exits = len(config.get("exit_layers") or []) or None
        head_file = str(lte_head) if isinstance(lte_head, str | Path) else None
        overrides = {"patience": patience, "delta": delta}
        setting, point = chosen_setting(operating_point, strategy, threshold, lte_head=head_file, **overrides)
        saved = setting is None
        if saved:
            where = f"{directory / 'config.json'}: early_exit"
            saved_setting = config.get("early_exit") or {"strategy": "static"}
            own = config.get("finetuning_task")
            setting = EarlyExitSetting.from_dict(saved_setting, source=where, num_exits=num_exits, model_task=own)
            setting = replace(setting, **{k: v for k, v in overrides.items() if v is not None})
        run_at = run_precision(precision, setting.precision if point or saved else None, setting.strategy)
        if runtime == "torch" and (problem := precision_problem(run_at, place)):
            raise ConfigError(problem)
        head = None if head_file else lte_head
        labels = len(config.get("id2label") or {}) or config.get("num_labels", 2)
        rule = rule_for(setting, labels, num_exits, lte_head=head)  # (its task: compared in _task_of)
        if runtime == "onnxruntime":
            model = OnnxLayers(directory, run_at, threads)
            length = max_length or (point.max_length if point else None) or model.max_length
        else:
            model = _load(directory, full_model_only=not rule.can_fire).to(place)
            length = max_length or (point.max_length if point else None) or trained_max_length(directory)
        task = _task_of(model, point, directory)
        if point is not None and point.task:  # compared once (above); the classifier keeps the model's own name
            rule.setting = replace(rule.setting, task=None)
        classifier = cls(
            model,
            load_tokenizer(directory),
            rule,
            max_length=length,
            batch_size=batch_size,
            task=task,
            max_unk_fraction=max_unk_fraction,
            precision=run_at,
            min_readable_share=min_readable_share,
        )
        if point is not None:
            classifier.description = point.describe()
        elif saved and setting.strategy != "static":
            classifier.description += ", the model's saved setting"
        classifier.description += f"; {run_at}"
        return classifier

    @property
    def device(self) -> torch.device:
        return self.model.device if isinstance(self.model, LayerRunner) else model_device(self.model)

    def predict(self, texts: Sequence[Input], batch_size: int | None = None) -> list[dict]:
        """One prediction per text (a string) or pair (two strings), in input order (see the module docstring)."""
        inputs = [_as_input(text, i) for i, text in enumerate(texts)]
        return self.predict_inputs(inputs, batch_size=batch_size)

    def predict_inputs(
        self,
        inputs: Sequence[TextInput],
        progress: Callable[[int], None] | None = None,
        batch_size: int | None = None,
    ) -> list[dict]:
        """`predict` on parsed inputs, through one `stream` flushed at the end; `progress(n)` once all n are
        answered. An input the model cannot read gets its verdict instead of a prediction (module docstring)."""
        stream = self.stream(batch_size)
        stream.submit(inputs)
        stream.flush()
        records = [record for _, record in stream.ready()]
        if progress is not None:
            progress(len(records))
        return records

    def stream(self, batch_size: int | None = None, max_wait: float | None = None) -> PredictionStream:
        """A `PredictionStream`: inputs submitted as they come, records handed out in input order, every layer call
        a full batch of `batch_size` rows (default: the classifier's) of whatever inputs reached that layer; a row
        waits at most `max_wait` seconds for its batch to fill (default: until it fills or the stream flushes)."""
        return PredictionStream(self, batch_size or self.batch_size, max_wait)

    def check_unk(self, input_ids: torch.Tensor) -> None:
        """Refuse inputs this model's vocabulary does not fit (data_prep's guard), once `UNK_MIN_TOKENS` are in."""
        unk, tokens = unk_counts(self.tokenizer, input_ids, self.is_text)
        self.unk_seen = [self.unk_seen[0] + unk, self.unk_seen[1] + tokens]
        if self.unk_seen[1] >= UNK_MIN_TOKENS:
            what = f"the {self.unk_seen[1]:,} text tokens of the inputs so far"
            refusal = unk_refusal(*self.unk_seen, self.max_unk_fraction, what, "of the model")
            if refusal is not None:
                raise refusal

    def record(self, result: EarlyExitResult, row: int, flops: float, ident: object) -> dict:
        """The prediction record of `result`'s row `row` (module docstring)."""
        logits = result.logits[row]
        if self.config.num_labels == 1:
            record: dict = {"value": float(logits[0])}
        else:
            names = self.config.id2label
            scores = logits.numpy().astype(np.float64)
            probabilities = np.exp(scores - scores.max())
            probabilities = (probabilities / probabilities.sum()).tolist()
            record = {
                "label": names[int(scores.argmax())],
                "probabilities": {names[k]: p for k, p in enumerate(probabilities)},
            }
        record.update(exit_layer=int(result.exit_layers[row]), flops=round(flops), tokens=int(result.lengths[row]))
        if ident is not None:
            record = {"id": ident, **record}
        return record

    def check_kinds(self, inputs: Sequence[TextInput]) -> None:
        """A pair for a single-text task (or the reverse) is a mistake the model cannot notice: refused."""
        if self.task is None:
            return
        wrong = next((i for i in inputs if (i.text_b is not None) != self.task.is_pair and not _blank(i)), None)
        if wrong is not None:
            given, wanted = ("a text pair", "single texts") if wrong.text_b is not None else ("a single text", "pairs")
            raise DataError(f"{wrong.where}: {given}, but the model was fine-tuned on {self.task.name} ({wanted})")


def _blank(item: TextInput) -> bool:
    """An input with no text at all (a blank line of a stream): its verdict (`empty`) answers it, whatever kind."""
    return not item.text_a.strip() and not (item.text_b or "").strip()


def _cpu_only(device: str) -> torch.device:
    """ONNX Runtime serves on the CPU here (its CPU execution provider)."""
    if device not in ("auto", "cpu"):
        raise ConfigError(f"--device {device}: --runtime onnxruntime runs on the CPU; pass --device cpu (or auto)")
    return torch.device("cpu")


def _as_input(text: Input, i: int) -> TextInput:
    where = f"input {i}"
    if isinstance(text, TextInput):
        return text
    if isinstance(text, str):
        parts = [text]
    elif isinstance(text, tuple | list) and len(text) == 2 and all(isinstance(t, str) for t in text):
        parts = list(text)
    else:
        raise DataError(f"{where}: expected a text or a pair of texts, got {type(text).__name__} {text!r:.60}")
    return TextInput(parts[0], parts[1] if len(parts) == 2 else None, where)


def _load(directory: Path, full_model_only: bool) -> ElasticBertForSequenceClassification:
    """The fine-tuned model; every exit must be trained unless only the last one runs (the full model)."""
    if not full_model_only:
        return load_finetuned(directory, require_trained=True, purpose="early exit")
    last = max(read_config(directory).get("exit_layers") or [0]) or None
    return load_finetuned(directory, require_trained=[last] if last else True, purpose="the full model")


def _own_task(model: ElasticBertForSequenceClassification) -> TaskSpec | None:
    """The task the model was fine-tuned on, when it names one this project knows and its head fits it."""
    task = model_task(model.config)
    return task if task is not None and task.num_labels == model.config.num_labels else None


def _task_of(
    model: ElasticBertForSequenceClassification, point: OperatingPoint | None, directory: Path
) -> TaskSpec | None:
    """The model's own task (`_own_task`). An operating point measured on another task is refused: its threshold
    was chosen on other data, with another head (`task_check.check_measured_task`)."""
    if point is not None and point.task:
        if note := check_measured_task(model.config, point.task, directory)[1]:
            print(f"finetune: note: {note}", file=sys.stderr, flush=True)
    if point is not None and point.model and Path(point.model).resolve() != Path(directory).resolve():
        print(
            f"finetune: note: the operating point was measured on {point.model}, predictions use {directory}",
            file=sys.stderr,
            flush=True,
        )
    return _own_task(model)


def trained_max_length(directory: Path) -> int:
    """The training run's --max-length (RUN/run_config.json beside RUN/best), else 128."""
    run_config = directory.parent / "run_config.json"
    return load_run_config(run_config).data.max_length if run_config.is_file() else 128
