"""Whether a task fits a fine-tuned model's head: the one check `evaluate`, `early-exit`, `submission` and `predict`
share before they score or classify anything.

A head answers in its own labels. Scored against another task's labels it yields numbers that look like a result
and mean nothing (an SST-2 model "scoring" 49 % on RTE), so a task is refused when
- its number of labels differs from the head's (regression counts as one), or
- the model names its labels (`id2label`, as `finetune train` writes them) and the task's are others, or
- the model was fine-tuned on another task of this project that reads the other kind of input (single texts vs
  pairs): the head never saw the second segment, or always did.
A different task with the same labels and input kind (SST-2 -> elue/IMDb, MNLI -> elue/SNLI) is a transfer someone
may mean: it runs, with a note that says so.
"""

from __future__ import annotations

from pathlib import Path

from .tasks import DataError, TaskSpec, get_task


def model_labels(config: object) -> list[str] | None:
    """The head's label names in id order, or None when the model does not name them (LABEL_0, LABEL_1, ...)."""
    count = int(getattr(config, "num_labels", 0) or 0)
    mapping = {int(k): str(v) for k, v in (getattr(config, "id2label", None) or {}).items()}
    names = [mapping.get(i, f"LABEL_{i}") for i in range(count)]
    return None if names == [f"LABEL_{i}" for i in range(count)] else names


def model_task(config: object) -> TaskSpec | None:
    """The task the model was fine-tuned on (`finetuning_task`), when it names one this project knows."""
    name = getattr(config, "finetuning_task", None)
    try:
        return get_task(name) if name else None
    except DataError:
        return None


def _labels(task: TaskSpec) -> str:
    return "a regression value" if task.is_regression else f"{task.num_labels} labels ({', '.join(task.label_names)})"


def check_task_fits(config: object, task: TaskSpec, model: str | Path, option: str = "--task") -> str | None:
    """Refuse `task` for the model of `config` (at `model`) as the module docstring says; return a note to print
    when it is another task of the same shape, else None."""
    own = model_task(config)
    trained = f", fine-tuned on {own.name}" if own is not None else ""
    count = int(getattr(config, "num_labels", 0) or 0)
    names = model_labels(config)
    head = "a regression head" if count == 1 else f"a head of {count} labels"
    head += f" ({', '.join(names)})" if names and count > 1 else ""
    fix = f"pass {option} {own.name}, or a model fine-tuned on {task.name}" if own else "pass a task of its labels"
    if count != task.num_labels or (names is not None and count > 1 and names != list(task.label_names)):
        raise DataError(
            f"{option} {task.name} needs {_labels(task)}, but {model} has {head}{trained}: its scores would compare "
            f"{task.name}'s labels with another task's predictions; {fix}"
        )
    if own is None or own.name == task.name or own.directory == task.directory:
        return None
    if own.is_pair != task.is_pair:
        kinds = ("text pairs", "single texts") if own.is_pair else ("single texts", "text pairs")
        raise DataError(
            f"{option} {task.name} reads {kinds[1]}, but {model} was fine-tuned on {own.name} ({kinds[0]}): its head "
            f"never learned that input; {fix}"
        )
    return f"{model} was fine-tuned on {own.name}; scoring it on {task.name}, whose labels have the same names"
