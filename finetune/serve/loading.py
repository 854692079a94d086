"""What `EarlyExitClassifier.from_pretrained` loads, in the order that fails fastest: the exit rule (from an operating
point, a strategy and threshold, or the setting saved in the model's config; checked once, as it is made, before the
model loads) and its precision, then the model — eager PyTorch on a model directory, or the ONNX pieces of an export
(`onnx_runtime.OnnxLayers`) — with the tokens per input and the task it serves."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from common.errors import ConfigError
from elasticbert import EarlyExitSetting, ElasticBertForSequenceClassification
from elasticbert.early_exit import ExitRule, LayerRunner, rule_for
from elasticbert.loading import read_config
from elasticbert.precision import precision_problem

from ..config import load_run_config
from ..model import load_finetuned
from ..task_check import check_measured_task, model_task
from ..tasks import TaskSpec
from .early_exit.lte import LearnedExitHead
from .early_exit.operating_point import OperatingPoint, chosen_setting, measured_elsewhere, run_precision
from .onnx_runtime import OnnxLayers


@dataclass
class RuleChoice:
    """The rule a classifier runs and where it came from: an operating point, the model's saved setting, or the
    caller's strategy; `precision` is what its threshold was chosen at (or asked for)."""

    rule: ExitRule
    setting: EarlyExitSetting
    point: OperatingPoint | None
    saved: bool
    precision: str

    def describe(self, description: str) -> str:
        """The classifier's description (`description`: its setting's) naming the choice and the precision."""
        if self.point is not None:
            description = self.point.describe()
        elif self.saved and self.setting.strategy != "static":
            description += ", the model's saved setting"
        return description + f"; {self.precision}"


def choose_rule(
    directory: Path,
    place: torch.device | None,
    strategy: str | None,
    threshold: float | None,
    overrides: dict[str, object],
    lte_head: str | Path | LearnedExitHead | None,
    operating_point: str | OperatingPoint | None,
    precision: str | None,
) -> RuleChoice:
    """The rule of the model in `directory` (its config.json read, nothing else), as `from_pretrained`'s docstring
    says; `place`: the torch device it will run on (None: ONNX Runtime, whose precisions are its export's)."""
    config = read_config(directory)
    num_exits = len(config.get("exit_layers") or []) or None
    head_file = str(lte_head) if isinstance(lte_head, str | Path) else None
    setting, point = chosen_setting(operating_point, strategy, threshold, lte_head=head_file, **overrides)
    saved = setting is None
    if saved:
        where = f"{directory / 'config.json'}: early_exit"
        saved_setting = config.get("early_exit") or {"strategy": "static"}
        own = config.get("finetuning_task")
        setting = EarlyExitSetting.from_dict(saved_setting, source=where, num_exits=num_exits, model_task=own)
        setting = replace(setting, **{k: v for k, v in overrides.items() if v is not None})
    run_at = run_precision(precision, setting.precision if point or saved else None, setting.strategy)
    if place is not None and (problem := precision_problem(run_at, place)):
        raise ConfigError(problem)
    head = None if head_file else lte_head
    labels = len(config.get("id2label") or {}) or config.get("num_labels", 2)
    rule = rule_for(setting, labels, num_exits, lte_head=head)  # (its task: compared in task_of)
    return RuleChoice(rule, setting, point, saved, run_at)


def load_served(
    directory: Path, choice: RuleChoice, place: torch.device | None, threads: int | None, max_length: int | None
) -> tuple[ElasticBertForSequenceClassification | LayerRunner, int]:
    """(the model or ONNX runner, tokens per input: `max_length`, else the operating point's, else the training
    run's or the export's, else 128). `place` None: the ONNX pieces of an export, on `threads` intra-op threads."""
    point_length = choice.point.max_length if choice.point else None
    if place is None:
        model = OnnxLayers(directory, choice.precision, threads)
        return model, _first_given(max_length, point_length) or model.max_length
    model = _load(directory, full_model_only=not choice.rule.can_fire).to(place)
    model.name_or_path = model.config._name_or_path = str(directory)  # as from_pretrained sets: messages name it
    return model, _first_given(max_length, point_length) or trained_max_length(directory)


def _first_given(*values: int | None) -> int | None:
    """The first value that is not None (0 included: it is refused where it is checked, never taken for 'none')."""
    return next((value for value in values if value is not None), None)


def _load(directory: Path, full_model_only: bool) -> ElasticBertForSequenceClassification:
    """The fine-tuned model; every exit must be trained unless only the last one runs (the full model)."""
    if not full_model_only:
        return load_finetuned(directory, require_trained=True, purpose="early exit")
    last = max(read_config(directory).get("exit_layers") or [0]) or None
    return load_finetuned(directory, require_trained=[last] if last else True, purpose="the full model")


def own_task(model: ElasticBertForSequenceClassification) -> TaskSpec | None:
    """The task the model was fine-tuned on, when it names one this project knows and its head fits it."""
    task = model_task(model.config)
    return task if task is not None and task.num_labels == model.config.num_labels else None


def task_of(
    model: ElasticBertForSequenceClassification, point: OperatingPoint | None, directory: Path
) -> TaskSpec | None:
    """The model's own task (`own_task`). An operating point measured on another task is refused: its threshold
    was chosen on other data, with another head (`task_check.check_measured_task`)."""
    if point is not None and point.task:
        if note := check_measured_task(model.config, point.task, directory)[1]:
            print(f"finetune: note: {note}", file=sys.stderr, flush=True)
    source = model.manifest.get("source") if isinstance(model, OnnxLayers) else None  # an export: its model's sweep
    if note := measured_elsewhere(point, directory, "predictions use", source):
        print(f"finetune: note: {note}", file=sys.stderr, flush=True)
    return own_task(model)


def cpu_only(device: str) -> torch.device:
    """ONNX Runtime serves on the CPU here (its CPU execution provider)."""
    if device not in ("auto", "cpu"):
        raise ConfigError(f"--device {device}: --runtime onnxruntime runs on the CPU; pass --device cpu (or auto)")
    return torch.device("cpu")


def trained_max_length(directory: Path) -> int:
    """The training run's --max-length (RUN/run_config.json beside RUN/best), else 128."""
    run_config = directory.parent / "run_config.json"
    return load_run_config(run_config).data.max_length if run_config.is_file() else 128
