"""Whether a task fits a fine-tuned model: the one check `evaluate`, `early-exit`, `submission`, `plot-embeddings`,
`predict`, `save-early-exit` and `EarlyExitClassifier` share before they score, tune or classify anything.

A head answers in its own labels. Scored against another task's labels it yields numbers that look like a result
and mean nothing (an SST-2 model "scoring" 0.00 on CoLA, whose labels are also 0/1 single sentences), and a threshold
tuned on another task's sweep runs another model's operating point. So a task is refused when
- the model records the task it was fine-tuned on (`finetuning_task`, as `finetune train` writes it) and it is
  another (MNLI's matched and mismatched sets are one task): a model is scored and tuned only on its own task;
- its number of labels differs from the head's (regression counts as one), or the model names its labels
  (`id2label`) and the task's are others.
A model that records no task (a released checkpoint, another tool's) is scored on the task asked for when its head
fits it, with a note that says so.
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


def check_task_fits(
    config: object, task: TaskSpec, model: str | Path, option: str = "--task", fix: str | None = None
) -> str | None:
    """Refuse `task` for the model of `config` (at `model`) as the module docstring says (`fix`: what to do, else
    "pass OPTION OWN_TASK"); return a note to print when the model records no task of this project (scored as
    asked), else None."""
    own = model_task(config)
    trained = f", fine-tuned on {own.name}" if own is not None else ""
    count = int(getattr(config, "num_labels", 0) or 0)
    names = model_labels(config)
    head = "a regression head" if count == 1 else f"a head of {count} labels"
    head += f" ({', '.join(names)})" if names and count > 1 else ""
    if fix is None:
        fix = f"pass {option} {own.name}, or a model fine-tuned on {task.name}" if own else "pass a task of its labels"
    if count != task.num_labels or (names is not None and count > 1 and names != list(task.label_names)):
        raise DataError(
            f"{option} {task.name}{', which' if option.endswith(' on') else ''} needs {_labels(task)}, but {model} "
            f"has {head}{trained}: its scores would compare "
            f"{task.name}'s labels with another task's predictions; {fix}"
        )
    if own is None:
        recorded = getattr(config, "finetuning_task", None)
        said = f"records the task {recorded!r}, which this project does not know" if recorded else "records no task"
        return f"{model} {said} (a released checkpoint?): using it for {task.name} as asked, its head fits the labels"
    if own.name == task.name or own.directory == task.directory:
        return None
    raise DataError(
        f"{option} {task.name}: {model} was fine-tuned on {own.name}; a model is scored and tuned only on its own "
        f"task (its head answers {own.name}'s question, whatever {task.name}'s rows ask, even with the same labels): "
        f"{fix}"
    )


def check_measured_task(
    config: object, measured: str, model: str | Path, what: str = "the operating point"
) -> tuple[str, str | None]:
    """Refuse a threshold or result measured on task `measured` for the model of `config` (at `model`) unless it is
    the model's own task (`check_task_fits`, `what` named in the message). Returns the task name to record with the
    threshold (the model's own when it records one, else `measured`) and the note to print, if any."""
    own = model_task(config)
    fix = f"sweep {model} on {own.name} (finetune early-exit --task {own.name}) and use that result" if own else None
    note = check_task_fits(config, get_task(measured), model, option=f"{what} was measured on", fix=fix)
    return (own.name if own is not None else get_task(measured).name), note
