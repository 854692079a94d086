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
(`cli.py`) is this class on files and stdin.

Every input gets its own verdict before it is classified (`verdicts`): one the model cannot read - nothing visible
(`empty`), punctuation only (`no-words`), mostly characters its vocabulary does not know (`unknown-text`: no more than
`min_readable_share` of them readable) - is not classified, and its record says so instead of carrying a label:
`{"flag": "unknown-text", "reason": "6 of its 7 characters are unreadable ..."}` (with its `id`). Callers check
`"flag" in record`; a record with a label is always one the model could read.

The class is a face: the rule and model it loads are `loading.py`'s, the input judging `input_checks.py`'s and
`verdicts.py`'s, the engine that answers `predict_stream.py`'s (`elasticbert.exit_queues`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import torch

from common.errors import ConfigError
from common.hub import resolve_pretrained
from common.vocab import DEFAULT_MAX_UNK_FRACTION
from elasticbert import EarlyExitSetting, ElasticBertForSequenceClassification
from elasticbert.early_exit import ExitRule, LayerRunner, rule_for, serving_runner
from elasticbert.precision import for_inference
from elasticbert.verification import checksum_verification_as

from ..data import load_tokenizer
from ..model import check_max_length, model_device, resolve_device
from ..task_check import check_measured_task, check_task_fits
from ..tasks import DataError, TaskSpec
from .early_exit.lte import LearnedExitHead
from .early_exit.operating_point import OperatingPoint
from .input_checks import InputChecks
from .inputs import TextInput
from .limits import number_problems
from .loading import choose_rule, cpu_only, load_served, own_task, task_of, trained_max_length
from .onnx_runtime import RUNTIMES, read_manifest
from .predict_stream import PredictionStream
from .verdicts import DEFAULT_MIN_READABLE_SHARE

Input = str | tuple[str, str] | list[str] | TextInput
__all__ = ["EarlyExitClassifier", "Input", "trained_max_length"]


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
        if problems := number_problems({"batch_size": batch_size, "max_length": max_length}):
            raise ConfigError(problems)
        self.checks = InputChecks(tokenizer, model.config.vocab_size, max_unk_fraction, min_readable_share)
        self.model, self.tokenizer = for_inference(model, precision), tokenizer
        self.runner, self.config = serving_runner(self.model), model.config  # GraphedLayers on a CUDA device
        self.precision, self.flops_memo = precision, {}  # see per_sample_flops(memo=)
        self.rule = _checked_rule(model, setting, lte_head)
        self.setting = self.rule.setting
        where = getattr(model, "name_or_path", None) or "the model"
        if self.setting is not None and self.setting.task:  # another task's operating point is refused
            if note := check_measured_task(model.config, self.setting.task, where, "the setting")[1]:
                _note(note)
        if task is not None:  # a task asked for: the model's own, or one its head fits when it records none
            if note := check_task_fits(model.config, task, where, option="task"):
                _note(note)
        self.max_length, self.batch_size = max_length, batch_size
        self.task = task if task is not None else own_task(model)
        self.description = self.setting.describe()
        check_max_length(model, max_length, getattr(model, "name_or_path", None) or "given")

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
        verify_checksums: bool | None = None,
    ) -> EarlyExitClassifier:
        """A fine-tuned model directory (RUN/best) or hub name, with the rule chosen as the module docstring says;
        `max_length` defaults to the operating point's, else the training run's (RUN/run_config.json), else 128;
        `precision` to the operating point's or saved setting's (what its threshold was chosen at), else fp32. The
        setting is checked once, as its rule is made, before the model loads. `runtime="onnxruntime"`: `path` is a
        `finetune export --layout onnx` directory, run by the same engine on ONNX Runtime (`threads`: its intra-op
        threads, default torch's). `verify_checksums=False` loads a directory that fails its checksums.json (as
        `--no-verify-checksums` does; None: as `elasticbert.set_checksum_verification` says)."""
        if runtime not in RUNTIMES:
            raise ConfigError(f"unknown runtime {runtime!r} (choose from {', '.join(RUNTIMES)})")
        if problems := number_problems({"batch_size": batch_size, "max_length": max_length, "threads": threads}):
            raise ConfigError(problems)
        torch_runtime = runtime == "torch"
        with checksum_verification_as(verify_checksums):  # every file it reads, whichever loader reads it
            place = resolve_device(device) if torch_runtime else cpu_only(device)
            directory = resolve_pretrained(path, what="--model") if torch_runtime else Path(path)
            if not torch_runtime:
                read_manifest(directory)  # verified before anything is read from it
            overrides = {"patience": patience, "delta": delta}
            on = place if torch_runtime else None
            choice = choose_rule(directory, on, strategy, threshold, overrides, lte_head, operating_point, precision)
            model, length = load_served(directory, choice, on, threads, max_length)
            task = task_of(model, choice.point, directory)
            if choice.point is not None and choice.point.task:  # compared once; the classifier keeps the model's own
                choice.rule.setting = replace(choice.rule.setting, task=None)
            classifier = cls(
                model,
                load_tokenizer(directory),
                choice.rule,
                max_length=length,
                batch_size=batch_size,
                task=task,
                max_unk_fraction=max_unk_fraction,
                precision=choice.precision,
                min_readable_share=min_readable_share,
            )
            classifier.description = choice.describe(classifier.description)
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

    def stream(
        self, batch_size: int | None = None, max_wait: float | None = None, one_file: bool = True
    ) -> PredictionStream:
        """A `PredictionStream`: inputs submitted as they come, records handed out in input order, every layer call
        a full batch of `batch_size` rows (default: the classifier's) of whatever inputs reached that layer; a row
        waits at most `max_wait` seconds for its batch to fill (default: until it fills or the stream flushes). On
        ONNX Runtime at batch size 1 the export's one file serves instead (`onnx_one_file`; `one_file=False`: the
        per-layer queues all the same)."""
        if problems := number_problems({"batch_size": batch_size, "max_wait": max_wait}):
            raise ConfigError(problems)
        bound = None if max_wait is None or math.isinf(max_wait) else max_wait  # inf: no bound, as None
        return PredictionStream(self, self.batch_size if batch_size is None else batch_size, bound, one_file)


def _checked_rule(
    model: ElasticBertForSequenceClassification,
    setting: EarlyExitSetting | ExitRule | None,
    lte_head: LearnedExitHead | None,
) -> ExitRule:
    """The rule of `setting` for `model`'s labels and exits (static, the full model, by default); a rule made for
    no or another count of exits is checked again."""
    exits = len(model.exit_layers)
    if not isinstance(setting, ExitRule):
        return rule_for(setting or EarlyExitSetting("static"), model.config.num_labels, exits, lte_head=lte_head)
    if setting.setting is not None and setting.checked_exits != exits:
        setting.setting.validated(model.config.num_labels, num_exits=exits)
    return setting


def _note(note: str) -> None:
    print(f"finetune: note: {note}", file=sys.stderr, flush=True)


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
