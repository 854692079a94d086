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

The task is checked against the data too (`check_data_fits`): a data folder named for another known task, or a file
whose header has another task's columns, is refused when the task was taken from the model, and read as asked (with a
note) when `--task` names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .tasks import (
    DataError,
    MissingSplitError,
    TaskSpec,
    folder_task,
    foreign_columns,
    get_task,
    is_header,
    split_path,
    task_dir,
)


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


def _header(path: Path) -> list[str] | None:
    """The first line of a TSV file as columns (None: unreadable; the loader names why)."""
    try:
        with open(path, encoding="utf-8-sig") as handle:
            return handle.readline().rstrip("\r\n").split("\t")
    except (OSError, UnicodeDecodeError):
        return None


def data_mismatches(task: TaskSpec, data_dir: str | Path | None, splits: Sequence[str]) -> list[str]:
    """What says the files of `splits` in `data_dir` are another task's than `task`: the folder they are read from is
    named for another known task (`--data-dir .../IMDb` for SST-2), or a file's header has columns of another task's
    files and not of this one's (QNLI's `question`, MNLI's `genre`, `promptID`). Hub data (`data_dir` None or
    `hf:`): nothing to judge."""
    if data_dir is None or str(data_dir).startswith("hf:") or not Path(data_dir).is_dir():
        return []
    problems = []
    folder = task_dir(task, data_dir)
    named = folder_task(folder)
    if named is not None and named.directory != task.directory:
        problems.append(f"the folder {folder} is named for task {named.name}")
    for split in splits:
        try:
            path = split_path(task, data_dir, split)
        except MissingSplitError:
            continue
        header = _header(path)
        foreign = foreign_columns([task], header) if header is not None and is_header(task, header) else {}
        if foreign:
            said = ", ".join(f"{column!r} ({' or '.join(owners)}'s)" for column, owners in foreign.items())
            plural = "s" if len(foreign) > 1 else ""
            problems.append(f"{path}:1 has column{plural} {said}, which {task.name}'s files lack")
    return problems


def check_data_fits(task: TaskSpec, data_dir: str | Path | None, splits: Sequence[str], task_given: bool) -> str | None:
    """Refuse (DataError) data that says it is another task's (`data_mismatches`) when the task was not named by the
    user but taken from the model: scored as the model's task, its rows would be recorded as that task's dev set. A
    task named with `--task` reads them as asked: returns the note to print (None when nothing is amiss)."""
    problems = data_mismatches(task, data_dir, splits)
    if not problems:
        return None
    said = "; ".join(problems)
    if task_given:
        return f"{said}: read as {task.name}'s rows, as --task says"
    raise DataError(
        f"--data-dir {data_dir}: {said}: these look like another task's rows, and the model's task {task.name} would "
        f"score them as {task.name}'s {'/'.join(splits)} set. Point --data-dir at {task.name}'s data, or pass --task "
        f"{task.name} to read them as {task.name}'s anyway"
    )
