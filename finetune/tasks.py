"""Task registry, tsv loaders and metrics for GLUE and ELUE.

Stable API (imported by other fine-tuning modules): `get_task(name) -> TaskSpec`, `load_split(task, data_dir, split)
-> list[Example]`, `TaskSpec.compute_metrics(preds, labels) -> dict`, `TaskSpec.main_metric`, `benchmark_score`.

Files are read by header name, not position, so GLUE's layout and ELUE's (`sentence\\tlabel`,
`premise\\thypothesis\\tlabel`, `sentence1\\tsentence2\\tlabel`) go through one reader. An ELUE file whose header
names none of those columns is read by position instead, as the official ELUE processors read every file (fastnlp/
ElasticBERT `elue/elue.py`: the header row skipped, fixed columns per task, test files with an index column first).
Lines are split on tabs with no quote handling (GLUE text contains bare `"`), as GLUE's own processors do. Every bad
row is reported as `file:line: what is wrong`.

Metrics are percentages (0-100, the scale GLUE/ELUE leaderboards print). Every metric dict carries `score`, the task's
headline number: the mean of its official metrics (MRPC/QQP: F1 and accuracy; STS-B: Pearson and Spearman; CoLA:
MCC; the rest: accuracy), which is both GLUE's and ELUE's per-task convention.
"""

from __future__ import annotations

import difflib
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from common.config import finite_float
from common.errors import UserError
from elasticbert.early_exit import logits_to_predictions  # [N, K] -> class ids, [N, 1] -> values: the one place

SPLITS = ("train", "dev", "test")


class DataError(UserError):
    """Bad or missing task data; the message names the file (and line) at fault."""


class MissingSplitError(DataError):
    """A task's folder has no file for a split (a test split is optional: evaluation skips it, and says so)."""


@dataclass(frozen=True)
class Example:
    """One row: `label` is a class index (classification), a float (regression) or None (unlabelled test rows).
    `index` is the id a submission file must carry (the file's index/id column, else the 0-based row number)."""

    text_a: str
    text_b: str | None
    label: int | float | None
    index: int


@dataclass(frozen=True)
class ColumnPositions:
    """Where the official ELUE processors read each field (0-based; label -1 = the last column). Test files differ:
    most put an index first and drop the label."""

    text: tuple[int, ...]
    label: int
    test_text: tuple[int, ...]
    test_index: int | None


@dataclass(frozen=True)
class TaskSpec:
    """Everything task-specific: where the files are, how to read them, how to score predictions."""

    name: str
    benchmark: str  # "glue" | "elue"
    directory: str  # folder under --data-dir
    label_names: tuple[str, ...]  # () for regression
    text_columns: tuple[tuple[str, ...], ...]  # per text field: accepted header names
    label_column: tuple[str, ...]
    metrics: tuple[str, ...]  # official metrics; their mean is `score`
    split_files: Mapping[str, str] = field(default_factory=lambda: {s: f"{s}.tsv" for s in SPLITS})
    index_column: tuple[str, ...] = ("index", "id", "idx")
    headerless_columns: tuple[str, ...] | None = None  # CoLA train/dev have no header row
    positions: ColumnPositions | None = None  # ELUE: the official processors' columns, when header names don't match
    other_columns: tuple[str, ...] = ()  # the other columns its GLUE files carry (what tells them from another task's)
    submission_name: str = ""
    hf_dataset: tuple[str, str] | None = None  # (hub name, config) for users with the HF hub

    @property
    def num_labels(self) -> int:
        """1 = regression (MSE); otherwise the number of classes."""
        return len(self.label_names) or 1

    @property
    def is_regression(self) -> bool:
        return not self.label_names

    @property
    def main_metric(self) -> str:
        """The key of `compute_metrics` used for model selection and aggregates."""
        return "score"

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2

    def compute_metrics(self, preds: Sequence | np.ndarray, labels: Sequence | np.ndarray) -> dict[str, float]:
        """Metrics in percent. `preds` may be logits [N, K] (argmax taken), class ids [N] or regression values."""
        return compute_metrics(self, preds, labels)

    def label_name(self, label: int | float) -> str:
        """The string a submission file carries for a prediction (STS-B: the score, 3 decimals)."""
        if self.is_regression:
            return f"{float(label):.3f}"
        return self.label_names[int(label)]


# ---------------------------------------------------------------------------------------------------------- registry

_BINARY = ("0", "1")
_NLI2 = ("entailment", "not_entailment")
_GLUE = "nyu-mll/glue"
_PAIR = (("sentence1",), ("sentence2",))
_ELUE_SINGLE = ColumnPositions(text=(0,), label=1, test_text=(1,), test_index=0)
_ELUE_PAIR = ColumnPositions(text=(0, 1), label=-1, test_text=(1, 2), test_index=0)


def _glue(name: str, **kwargs: object) -> TaskSpec:
    kwargs.setdefault("directory", name)
    kwargs.setdefault("submission_name", name)
    return TaskSpec(name=name, benchmark="glue", **kwargs)


def _elue(name: str, **kwargs: object) -> TaskSpec:
    kwargs.setdefault("directory", name)
    kwargs.setdefault("submission_name", name)
    kwargs.setdefault("label_column", ("label",))
    return TaskSpec(name=f"elue/{name}", benchmark="elue", **kwargs)


_MNLI_COMMON = dict(
    directory="MNLI",
    label_names=("contradiction", "entailment", "neutral"),
    text_columns=_PAIR,
    label_column=("gold_label", "label"),
    metrics=("accuracy",),
    other_columns=(
        "promptID",
        "pairID",
        "genre",
        "sentence1_binary_parse",
        "sentence2_binary_parse",
        "sentence1_parse",
        "sentence2_parse",
        *(f"label{i}" for i in range(1, 6)),
    ),
)

TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        _glue(
            "CoLA",
            label_names=_BINARY,
            text_columns=(("sentence",),),
            label_column=("label",),
            metrics=("mcc",),
            headerless_columns=("source", "label", "original_label", "sentence"),
            hf_dataset=(_GLUE, "cola"),
        ),
        _glue(
            "SST-2",
            label_names=_BINARY,
            text_columns=(("sentence",),),
            label_column=("label",),
            metrics=("accuracy",),
            hf_dataset=(_GLUE, "sst2"),
        ),
        _glue(
            "MRPC",
            label_names=_BINARY,
            text_columns=(("#1 String", "sentence1"), ("#2 String", "sentence2")),
            label_column=("Quality", "label"),
            metrics=("f1", "accuracy"),
            other_columns=("#1 ID", "#2 ID"),
            hf_dataset=(_GLUE, "mrpc"),
        ),
        _glue(
            "STS-B",
            label_names=(),
            text_columns=_PAIR,
            label_column=("score", "label"),
            metrics=("pearson", "spearman"),
            other_columns=("genre", "filename", "year", "old_index", "source1", "source2"),
            hf_dataset=(_GLUE, "stsb"),
        ),
        _glue(
            "QQP",
            label_names=_BINARY,
            text_columns=(("question1",), ("question2",)),
            label_column=("is_duplicate", "label"),
            metrics=("f1", "accuracy"),
            other_columns=("qid1", "qid2"),
            hf_dataset=(_GLUE, "qqp"),
        ),
        _glue(
            "MNLI",
            **_MNLI_COMMON,
            split_files={"train": "train.tsv", "dev": "dev_matched.tsv", "test": "test_matched.tsv"},
            submission_name="MNLI-m",
            hf_dataset=(_GLUE, "mnli"),
        ),
        _glue(
            "MNLI-mm",
            **_MNLI_COMMON,
            split_files={"train": "train.tsv", "dev": "dev_mismatched.tsv", "test": "test_mismatched.tsv"},
            submission_name="MNLI-mm",
            hf_dataset=(_GLUE, "mnli"),
        ),
        _glue(
            "QNLI",
            label_names=_NLI2,
            text_columns=(("question",), ("sentence",)),
            label_column=("label",),
            metrics=("accuracy",),
            hf_dataset=(_GLUE, "qnli"),
        ),
        _glue(
            "RTE",
            label_names=_NLI2,
            text_columns=_PAIR,
            label_column=("label",),
            metrics=("accuracy",),
            hf_dataset=(_GLUE, "rte"),
        ),
        _glue(
            "WNLI",
            label_names=_BINARY,
            text_columns=_PAIR,
            label_column=("label",),
            metrics=("accuracy",),
            hf_dataset=(_GLUE, "wnli"),
        ),
        # ELUE (label strings and column positions as the official ELUE processors define them)
        _elue(
            "SST-2", label_names=_BINARY, text_columns=(("sentence",),), metrics=("accuracy",), positions=_ELUE_SINGLE
        ),
        _elue(
            "IMDb", label_names=_BINARY, text_columns=(("sentence",),), metrics=("accuracy",), positions=_ELUE_SINGLE
        ),
        _elue(
            "SNLI",
            label_names=("0", "1", "2"),
            text_columns=(("premise",), ("hypothesis",)),
            metrics=("accuracy",),
            positions=_ELUE_PAIR,
        ),
        _elue(
            "SciTail",
            label_names=_BINARY,
            text_columns=(("premise",), ("hypothesis",)),
            metrics=("accuracy",),
            positions=_ELUE_PAIR,
        ),
        _elue(
            "MRPC",
            label_names=_BINARY,
            text_columns=(("sentence1", "#1 String"), ("sentence2", "#2 String")),
            label_column=("label", "Quality"),
            metrics=("f1", "accuracy"),
            positions=ColumnPositions(text=(3, 4), label=0, test_text=(3, 4), test_index=None),  # GLUE's MRPC columns
        ),
        _elue(
            "STS-B",
            label_names=(),
            text_columns=_PAIR,
            label_column=("label", "score"),
            metrics=("pearson", "spearman"),
            positions=_ELUE_PAIR,
        ),
    )
}

GLUE_TASKS = tuple(n for n, s in TASKS.items() if s.benchmark == "glue")
ELUE_TASKS = tuple(n for n, s in TASKS.items() if s.benchmark == "elue")


def _normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9/]", "", name.lower().replace("elue:", "elue/").replace("glue:", ""))


_ALIASES: dict[str, str] = {_normalise(n): n for n in TASKS}
_ALIASES.update(
    {
        _normalise(s.name.removeprefix("elue/")): s.name
        for s in TASKS.values()
        if s.benchmark == "elue" and _normalise(s.name.removeprefix("elue/")) not in _ALIASES
    }
)  # IMDb, SNLI, SciTail are ELUE-only: their bare names resolve to ELUE
_ALIASES.update({"mnlim": "MNLI", "mnlimatched": "MNLI", "mnlimismatched": "MNLI-mm"})


def get_task(name: str | TaskSpec) -> TaskSpec:
    """Look a task up by name, case- and punctuation-insensitively (`sst2`, `STS-B`, `elue/snli`, `elue:mrpc`).

    Bare names mean GLUE where GLUE has the task; `elue/` selects ELUE's version. Typos get a suggestion.
    """
    if isinstance(name, TaskSpec):
        return name
    key = _normalise(name)
    if key in _ALIASES:
        return TASKS[_ALIASES[key]]
    candidates = list(TASKS) + [n.removeprefix("elue/") for n in TASKS]
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.5) or difflib.get_close_matches(
        key, list(_ALIASES), n=1, cutoff=0.5
    )
    hint = f" Did you mean {TASKS[_ALIASES[_normalise(close[0])]].name!r}?" if close else ""
    raise DataError(f"unknown task {name!r}.{hint} Known tasks: {', '.join(TASKS)}")


def folder_task(folder: str | Path) -> TaskSpec | None:
    """The task a folder is named for (`SST-2`, `sst2`, `IMDb`, `MNLI`: a task's folder or name), else None."""
    key = _normalise(Path(folder).name)
    return TASKS[_ALIASES[key]] if key in _ALIASES else None


def columns_of(task: TaskSpec) -> set[str]:
    """Every header name a file of `task` may carry (lower case): its text, label, index and other columns."""
    names = [*(n for names in task.text_columns for n in names), *task.label_column, *task.index_column]
    names += [*(task.headerless_columns or ()), *task.other_columns]
    return {n.lower() for n in names}


def foreign_columns(tasks: Sequence[TaskSpec], header: Sequence[str]) -> dict[str, list[str]]:
    """The columns of `header` that no task of `tasks` has and another known task's files do, each with
    those tasks (their names, tasks sharing a folder once): what tells a file as another task's. Columns no task
    names (a user's own notes) are not judged."""
    own = set().union(*(columns_of(t) for t in tasks))
    folders = {t.directory for t in tasks}
    found: dict[str, list[str]] = {}
    for column in (h.strip() for h in header):
        if column.lower() in own:
            continue
        owners: dict[str, str] = {}  # one name per folder (MNLI for MNLI-mm, SST-2 for ELUE's)
        for t in TASKS.values():
            if t.directory not in folders and column.lower() in columns_of(t):
                owners.setdefault(t.directory, t.name)
        if owners:
            found[column] = list(owners.values())
    return found


def tasks_reading(text_columns: Sequence[Sequence[str]]) -> list[TaskSpec]:
    """The tasks whose files name their texts `text_columns` (SST-2, ELUE's SST-2 and IMDb share `sentence`)."""
    wanted = tuple(tuple(names) for names in text_columns)
    return [t for t in TASKS.values() if tuple(tuple(names) for names in t.text_columns) == wanted]


# ----------------------------------------------------------------------------------------------------------- loading


def task_dir(task: TaskSpec, data_dir: str | Path) -> Path:
    """`data_dir/<task folder>` if it exists, else `data_dir` itself (pointing straight at one task's folder)."""
    root = Path(data_dir)
    if not root.is_dir():
        raise DataError(f"data directory {root} {'is a file, not a folder' if root.exists() else 'does not exist'}")
    sub = root / task.directory
    return sub if sub.is_dir() else root


def split_path(task: TaskSpec, data_dir: str | Path, split: str) -> Path:
    """The file holding `split` ("train", "dev", "test", or a file stem such as "dev_mismatched")."""
    folder = task_dir(task, data_dir)
    path = folder / task.split_files.get(split, f"{split}.tsv")
    if not path.is_file():
        present = sorted(p.name for p in folder.glob("*.tsv"))
        raise MissingSplitError(
            f"{path}: no {split!r} split for task {task.name} (files in {folder}: {', '.join(present) or 'none'})"
        )
    return path


def load_split(task: str | TaskSpec, data_dir: str | Path | None, split: str) -> list[Example]:
    """Read one split. `data_dir` is a local GLUE/ELUE tree (or one task's folder); `None` or "hf:<name>" loads the
    GLUE task from the Hugging Face hub instead (needs network and `datasets`)."""
    spec = get_task(task)
    if data_dir is None or str(data_dir).startswith("hf:"):
        hub = str(data_dir)[3:] if data_dir is not None else None
        return _load_hub(spec, split, hub)
    return read_tsv(spec, split_path(spec, data_dir, split), labelled=split.startswith(("train", "dev")))


def _find_column(header: list[str], names: tuple[str, ...]) -> int | None:
    lowered = [h.strip().lower() for h in header]
    for name in names:
        if name.lower() in lowered:
            return lowered.index(name.lower())
    return None


def is_header(spec: TaskSpec, first: list[str]) -> bool:
    """Whether a file's first line is its header: always, but for a task whose files may have none (CoLA's train and
    dev) when it names none of the task's text columns."""
    return not (
        spec.headerless_columns is not None and all(_find_column(first, names) is None for names in spec.text_columns)
    )


def _parse_label(spec: TaskSpec, raw: str, where: str) -> int | float:
    raw = raw.strip()
    if spec.is_regression:
        try:
            return finite_float(raw)
        except ValueError:
            raise DataError(f"{where}: label {raw!r} is not a finite number (task {spec.name} is regression)") from None
    if raw in spec.label_names:
        return spec.label_names.index(raw)
    raise DataError(f"{where}: unknown label {raw!r} for task {spec.name}; expected one of {list(spec.label_names)}")


def _official_positions(
    positions: ColumnPositions, header: list[str], labelled: bool, path: Path
) -> tuple[list[int], int | None, int | None]:
    """(text columns, label column, index column) of an ELUE file read by position, as the official processors do."""
    if labelled:
        text_cols, label_col, index_col = list(positions.text), positions.label % len(header), None
    else:
        text_cols, label_col, index_col = list(positions.test_text), None, positions.test_index
    needed = max([*text_cols, label_col or 0, index_col or 0]) + 1
    if len(header) < needed:
        raise DataError(
            f"{path}:1: header {header} names none of the expected columns, and {len(header)} columns are too few to "
            f"read by the official ELUE positions (text at {text_cols}"
            + (f", label at {positions.label}" if labelled else "")
            + ")"
        )
    return text_cols, label_col, index_col


def read_tsv(spec: TaskSpec, path: Path, labelled: bool = True) -> list[Example]:
    """Parse one GLUE- or ELUE-layout tsv file. `labelled=False` (test splits) makes the label column optional."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # utf-8-sig drops MRPC's byte-order mark
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err})") from None
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise DataError(f"{path}: empty file")

    first = lines[0].split("\t")
    has_header = is_header(spec, first)
    header = first if has_header else list(spec.headerless_columns)
    body_start = 1 if has_header else 0
    text_cols = [_find_column(header, names) for names in spec.text_columns]
    if any(c is None for c in text_cols) and spec.positions is not None:
        text_cols, label_col, index_col = _official_positions(spec.positions, header, labelled, path)
    else:
        if any(c is None for c in text_cols):
            wanted = " / ".join("|".join(n) for n in spec.text_columns)
            raise DataError(f"{path}:1: header {header} lacks the text column(s) {wanted} of task {spec.name}")
        label_col = _find_column(header, spec.label_column)
        if label_col is None and labelled:
            raise DataError(f"{path}:1: header {header} has no label column ({'|'.join(spec.label_column)})")
        index_col = _find_column(header, spec.index_column) if has_header else None

    examples = []
    for number, line in enumerate(lines[body_start:], start=body_start + 1):
        where = f"{path}:{number}"
        if not line.strip():
            raise DataError(f"{where}: blank line inside the data")
        fields = line.split("\t")
        if len(fields) != len(header):
            raise DataError(
                f"{where}: expected {len(header)} tab-separated columns ({', '.join(header)}), got {len(fields)}"
            )
        label = _parse_label(spec, fields[label_col], where) if label_col is not None else None
        row = len(examples)
        index = row
        if index_col is not None:
            try:
                index = int(fields[index_col])
            except ValueError:
                index = row
        text_b = fields[text_cols[1]] if len(text_cols) == 2 else None
        examples.append(Example(text_a=fields[text_cols[0]], text_b=text_b, label=label, index=index))
    if not examples:
        raise DataError(f"{path}: header only, no data rows")
    return examples


_HF_SPLITS = {"dev": "validation", "train": "train", "test": "test"}


def _load_hub(spec: TaskSpec, split: str, hub: str | None) -> list[Example]:
    if spec.hf_dataset is None:
        raise DataError(f"task {spec.name} has no Hugging Face hub mapping; pass --data-dir with the ELUE files")
    try:
        import datasets
    except ImportError as err:  # pragma: no cover - optional dependency
        raise DataError("loading from the hub needs `pip install datasets` (or pass --data-dir)") from err
    name, config = spec.hf_dataset
    hf_split = _HF_SPLITS.get(split, split)
    if spec.directory == "MNLI" and split in ("dev", "test"):
        hf_split += "_mismatched" if spec.name == "MNLI-mm" else "_matched"
    try:
        ds = datasets.load_dataset(hub or name, config, split=hf_split)
    except Exception as err:  # the hub raises many types (offline, missing split, ...)
        raise DataError(f"cannot load {hub or name}/{config} split {hf_split} from the hub: {err}") from err
    columns = [c for c in ds.column_names if c not in ("label", "idx")]
    hf_names = ds.features["label"].names if hasattr(ds.features["label"], "names") else None
    out = []
    for row in ds:
        raw = row["label"]
        if raw is None or (not spec.is_regression and raw < 0):
            label = None
        elif spec.is_regression:
            label = float(raw)
        else:
            label = spec.label_names.index(hf_names[raw]) if hf_names else int(raw)
        text_b = row[columns[1]] if spec.is_pair else None
        out.append(Example(text_a=row[columns[0]], text_b=text_b, label=label, index=int(row.get("idx", len(out)))))
    return out


# ----------------------------------------------------------------------------------------------------------- metrics


def predictions_from_outputs(task: TaskSpec, preds: Sequence | np.ndarray) -> np.ndarray:
    """Logits -> class ids (classification) or a flat float vector (regression); ids pass through unchanged."""
    arr = np.asarray(preds)
    if arr.ndim == 2:
        arr = logits_to_predictions(arr)
    return arr.reshape(-1).astype(np.float64) if task.is_regression else arr.astype(np.int64)


def _safe(value: float) -> float:
    return 0.0 if value is None or not math.isfinite(value) else float(value)


def compute_metrics(task: TaskSpec, preds: Sequence | np.ndarray, labels: Sequence | np.ndarray) -> dict[str, float]:
    """The task's official metrics in percent plus `score` (their mean); constant predictions score 0 correlation."""
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    y_pred = predictions_from_outputs(task, preds)
    y_true = np.asarray(labels, dtype=np.float64 if task.is_regression else np.int64).reshape(-1)
    if len(y_pred) != len(y_true):
        raise ValueError(f"{task.name}: {len(y_pred)} predictions for {len(y_true)} labels")
    if len(y_true) == 0:
        raise ValueError(f"{task.name}: no labelled examples to score")
    out: dict[str, float] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant input warnings: handled by _safe
        for metric in task.metrics:
            if metric == "accuracy":
                out[metric] = accuracy_score(y_true, y_pred)
            elif metric == "f1":
                out[metric] = f1_score(y_true, y_pred, zero_division=0)
            elif metric == "mcc":
                out[metric] = matthews_corrcoef(y_true, y_pred)
            elif metric == "pearson":
                out[metric] = pearsonr(y_pred, y_true)[0] if len(y_true) > 1 else float("nan")
            elif metric == "spearman":
                out[metric] = spearmanr(y_pred, y_true)[0] if len(y_true) > 1 else float("nan")
            else:  # pragma: no cover - registry bug
                raise KeyError(metric)
    out = {k: 100.0 * _safe(v) for k, v in out.items()}
    out["score"] = float(np.mean([out[m] for m in task.metrics]))
    return out


def benchmark_score(task_scores: Mapping[str, float], benchmark: str = "glue") -> float:
    """Macro-average of per-task `score`s. GLUE: MNLI-m and MNLI-mm are averaged into one MNLI entry first (as the
    GLUE leaderboard does); ELUE: the plain mean of its task scores."""
    scores = {get_task(k).name: float(v) for k, v in task_scores.items()}
    if not scores:
        raise ValueError("no task scores to aggregate")
    if benchmark == "glue":
        mnli = [scores.pop(k) for k in ("MNLI", "MNLI-mm") if k in scores]
        if mnli:
            scores["MNLI"] = float(np.mean(mnli))
    elif benchmark != "elue":
        raise ValueError(f"benchmark must be 'glue' or 'elue', not {benchmark!r}")
    return float(np.mean(list(scores.values())))
