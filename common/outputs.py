"""Where a command may write: the one rule of every command that takes `--output`, so that no command deletes, or
writes into, what it did not write, and no two processes write one output at once.

An output is a file (predict's JSONL, elue-score's JSON, a diagnostics PNG) or a folder (a run directory, an
evaluation, an export, a prepared corpus). `check_output` runs before anything is loaded. Inside a command it first
claims the output (`common.claims`: while another live process - on this host or another sharing the file system -
holds it, refused in one line naming it; held until the command ends), and then refuses, in one line that says what
the path is:

- an output that is one of the command's inputs (its model, input files, config files, DeepSpeed JSON, operating
  point, ...; a hard link to one included) or lies inside an input folder (`--output RUN/best/x.jsonl` with `--model
  RUN/best`); and a folder that holds an input when the command may remove what the folder holds (`overwrite`, a
  folder written whole, a run directory): replacing it would delete the input. Paths are compared by what they are
  (device and inode of the path and of the folders above it), not how they are spelled: a symbolic link, `..`, a
  bind mount or another case of one folder is that folder;
- a file output that is a folder, of any kind: `--overwrite` replaces a file, never a folder;
- a folder output that is a file, or a folder another command wrote (`folder_kind`: a model directory, a pre-training
  checkpoint folder or run, a fine-tuning run, a prepared corpus, a dedup output, ...) unless it is one of this
  command's own kinds (`Output.accepts`; the folders of results - evaluations, early-exit results, submissions - are
  shared by the commands that write results, which keep another model's results apart by identity);
- a run directory holding a file of a name its runs write (`Output.writes`) that no run wrote there (not in its
  `.run_files.json`, `common.run_dir`): a user's own `events.jsonl` is never appended to, nor replaced;
- an existing file, or a non-empty folder the command writes whole, that is not this command's own output: without
  `--overwrite` it is never replaced; with it, only when the command recognises it as its own (`Output.own`: its
  format — a predictions JSONL, an export of the same layout). An empty file holds nothing to lose.

`common.io.atomic_path` adds a last guard below every writer: a file is never renamed over a folder.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from . import claims
from .claims import Part
from .dist import resolve_env
from .errors import UserError
from .io import peek_object
from .run_dir import RUN_FILES, foreign_run_files


class OutputError(UserError):
    """An output path a command must not write: an input, inside one, a folder of another kind, or something it did
    not write itself."""


# What a folder is, from the files that mark it (first match wins; a kind is a phrase: "--output X is KIND").
MODEL_DIRECTORY = "a model directory"
ONNX_EXPORT = "an ONNX early-exit export"
CHECKPOINT_FOLDER = "a pre-training checkpoint folder"
CHECKPOINT = "a pre-training checkpoint"
PRETRAIN_RUN = "a pre-training run directory"
FINETUNE_RUN = "a fine-tuning run directory"
CORPUS = "a prepared corpus"
DEDUP_OUTPUT = "a dedup output"
TOKENIZER = "a tokenizer folder"
EVALUATION = "an evaluation folder"
EARLY_EXIT_RESULTS = "an early-exit results folder"
SUBMISSION = "an ELUE submission folder"
CORPUS_STATS = "a corpus statistics folder"

# the folders of results (JSON, plots, prediction files) that the commands writing results may share: each refuses
# to mix another model's results with its own by their recorded identity (finetune/results.py), not by folder
RESULTS = (EVALUATION, EARLY_EXIT_RESULTS, SUBMISSION)

WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "spm.model", "sentencepiece.bpe.model")


def _has(folder: Path, *names: str) -> list[str]:
    return [name for name in names if (folder / name).exists()]


def folder_kind(folder: str | os.PathLike) -> str | None:
    """What `folder` is, as one of the kinds above with the files that say so (`a model directory [config.json,
    model.safetensors]`), or None for a folder none of them marks (empty, or a user's own)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    if (folder / "onnx" / "manifest.json").is_file():
        return f"{ONNX_EXPORT} [onnx/manifest.json]"
    weights = _has(folder, *WEIGHT_FILES)
    if (folder / "config.json").is_file() and weights:
        return f"{MODEL_DIRECTORY} [config.json, {', '.join(weights)}]"
    if (folder / "latest").is_file() or any(folder.glob("global_step*/")):
        return f"{CHECKPOINT_FOLDER} [latest, global_step*/]"
    if any(folder.glob("*model_states.pt")) or any(folder.glob("*optim_states.pt")):
        return f"{CHECKPOINT} [*_model_states.pt]"
    if (folder / "checkpoints").is_dir() or (folder / "metrics.jsonl").is_file():
        return f"{PRETRAIN_RUN} [{', '.join(_has(folder, 'checkpoints', 'metrics.jsonl'))}]"
    if (folder / "run_config.json").is_file() or (folder / "resume" / "latest").exists():
        return f"{FINETUNE_RUN} [{', '.join(_has(folder, 'run_config.json', 'best', 'resume'))}]"
    work = peek_object(folder / ".work" / "plan.json") or {}
    dedup = (work.get("plan") or {}).get("splitter") == "dedup" if isinstance(work.get("plan"), dict) else False
    if (folder / "dedup_report.json").is_file() or dedup:
        return f"{DEDUP_OUTPUT} [{', '.join(_has(folder, 'dedup_report.json', 'text', '.work'))}]"
    if (folder / "manifest.json").is_file() or work:
        return f"{CORPUS} [{', '.join(_has(folder, 'manifest.json', '.work'))}]"
    if (folder / "dev_scores.json").is_file():
        return f"{EVALUATION} [dev_scores.json]"
    if any(folder.glob("early_exit_*.json")):
        return f"{EARLY_EXIT_RESULTS} [early_exit_*.json]"
    if any(folder.glob("*/submission.json")):
        return f"{SUBMISSION} [*/submission.json]"
    if (folder / "stats.json").is_file():
        return f"{CORPUS_STATS} [stats.json]"
    if _has(folder, *TOKENIZER_FILES) and not any(p.is_dir() for p in folder.iterdir()):
        return f"{TOKENIZER} [{', '.join(_has(folder, *TOKENIZER_FILES))}]"
    return None


def _never(path: Path) -> bool:
    return False


@dataclass(frozen=True)
class Output:
    """What a command writes at `--output`: a `file`, or a `folder` (its files written into it; `whole`: the folder is
    written whole and replaced with --overwrite; `exclusive`: a run directory, which may hold no input either).
    `what` names it in messages ("a JSONL file of predictions"); `own(path)` recognises an existing output this
    command wrote (its format); `accepts` are the folder kinds of `folder_kind` the command writes into (its own: a
    run it resumes, an evaluation it adds to); `writes`, of a run directory, the names (glob patterns) its runs write
    at its top, which a run takes over only where a run wrote them (`common.run_dir`)."""

    command: str
    what: str
    folder: bool = False
    whole: bool = False
    exclusive: bool = False  # a run directory: the command's alone (it writes fixed names there, clears them)
    own: Callable[[Path], bool] = _never
    accepts: tuple[str, ...] = field(default_factory=tuple)
    writes: tuple[str, ...] = ()  # a run directory's names (glob patterns) at its top: never someone else's file


def _real(path: str | os.PathLike) -> Path:
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of `path`: what a folder or file is, however it is spelled (a symbolic link, `..`, a bind
    mount, another case on a case-insensitive file system, a hard link)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _ancestors(path: Path) -> set[tuple[int, int]]:
    """The identities of the existing folders above `path`."""
    return {ident for parent in path.parents if (ident := _identity(parent)) is not None}


def local_inputs(inputs: Iterable[tuple[str, object]]) -> list[tuple[str, str, Path]]:
    """(flag, as given, real path) of each input that is a local path (hub names, `hf:` sources, unset options and
    `-` are not); a glob stands for the folder before its first wildcard."""
    found = []
    for flag, value in inputs:
        if value is None or value == "" or value == "-" or str(value).startswith("hf:"):
            continue
        text = str(value)
        if any(c in text for c in "*?["):
            text = text[: min(text.index(c) for c in "*?[" if c in text)]
            text = text if text.endswith(os.sep) or not text else os.path.dirname(text)
            if not text:
                continue
        if os.path.lexists(os.path.expanduser(text)):
            found.append((flag, str(value), _real(text)))
    return found


def _name(flag: str, given: str) -> str:
    return f"the input {flag} {given}" if flag else f"the input {given}"


def input_problem(output: Path, spec: Output, inputs: Iterable[tuple[str, object]], overwrite: bool) -> str | None:
    """Why `output` may not be written because of an input: it is one, lies inside one, or (a folder the command may
    clear) holds one. Compared by identity (device and inode of the paths and of the folders above them), so that no
    spelling of a path - a symbolic link, `..`, a bind mount, a hard link, another case - hides an input."""
    real = _real(output)
    output_id, above_output = _identity(real), _ancestors(real)
    for flag, given, source in local_inputs(inputs):
        kind = folder_kind(source)
        described = f" ({kind})" if kind else ""
        source_id = _identity(source)
        if real == source or (source_id is not None and source_id == output_id):
            return f"is {_name(flag, given)}{described}: writing there would replace what the command reads"
        if source.is_dir() and source_id in above_output:
            return (
                f"is inside {_name(flag, given)}{described}: a command never writes into what it reads (its files "
                "would be mixed with, or replace, the input's)"
            )
        holds = output_id is not None and real.is_dir() and output_id in _ancestors(source)
        if spec.folder and (spec.whole or overwrite) and holds:
            return f"holds {_name(flag, given)}: replacing the folder (--overwrite) would delete the input"
        if spec.exclusive and (holds or real in source.parents):
            return (
                f"holds {_name(flag, given)}: a run directory is the run's alone (it writes config.yaml, "
                "checkpoints, logs there, and clears them to start over)"
            )
    return None


def check_output(
    output: str | os.PathLike,
    spec: Output,
    inputs: Iterable[tuple[str, object]] = (),
    overwrite: bool = False,
    flag: str = "--output",
    part: Part | None = None,
    claim: bool = True,
) -> Path:
    """Refuse `output` (OutputError, one line: the path, what it is, what to do) as the module docstring says;
    return it as a Path. `inputs`: (flag, path) of what the command reads (`--model`, `--input`, `--checkpoint`,
    corpus paths, config files); `overwrite`: the command's `--overwrite`. Inside a command (`common.cli`) the
    output is claimed first (`common.claims`: refused while another process writes it) and stays claimed until the
    command ends; `part`: which part of a job this process is, for an output the parts of one job write together
    (default: a run directory's rank, `Part.of`; one process otherwise). `claim=False`: a check that writes nothing
    there (`pretrain preflight`, one process per node of one job side by side, before the ranks claim it)."""
    path = Path(output)
    head = f"{flag} {output}"
    if problem := input_problem(path, spec, list(inputs), overwrite):
        raise OutputError(f"{head} {problem}; choose another {flag}")
    held = None
    if claim and claims.in_command():
        part = part or (Part.of(resolve_env(export=False)) if spec.exclusive else Part())
        held = claims.take(path, part, flag)  # a file where a folder of its path should be: ENOTDIR naming it
    try:
        _check_existing(path, spec, overwrite, head, flag)
    except BaseException:
        if held is not None:
            held.release()
        raise
    if held is not None and spec.writes:
        held.run_files = spec.writes  # recorded in the run directory's manifest when the run creates it
    return path


def _check_existing(path: Path, spec: Output, overwrite: bool, head: str, flag: str) -> None:
    """What is at `path` already, against what the command writes there (the module docstring's rules)."""
    if not os.path.lexists(path):
        return
    if path.is_dir():
        kind = folder_kind(path)
        if not spec.folder:
            what = kind or "a folder"
            where = f"e.g. {path / _example_name(spec)}" if kind is None else "outside it"
            raise OutputError(
                f"{head} is {what}; {spec.command} writes one file ({spec.what}) and never replaces a folder "
                f"(--overwrite included): name a file, {where}"
            )
        if kind is not None and not any(kind.startswith(accepted) for accepted in spec.accepts):
            raise OutputError(
                f"{head} is {kind}, which {spec.command} did not write; it writes {spec.what} and never into another "
                f"command's folder: choose another {flag}"
            )
        if foreign := foreign_run_files(path, spec.writes, own_kind=kind is not None):
            them = "it" if len(foreign) == 1 else "them"
            raise OutputError(
                f"{head} holds {', '.join(foreign)}, which no run of {spec.command} wrote there (not listed in its "
                f"{RUN_FILES}): a run directory never appends to or replaces a file it did not create; move {them} "
                f"away, or choose another {flag}"
            )
        if spec.whole and any(path.iterdir()):
            _replace_folder(path, spec, overwrite, head, flag)
        return
    if not path.exists():  # a dangling link: the file it names is gone, nothing to lose
        return
    if spec.folder:
        raise OutputError(f"{head} is a file; {spec.command} writes a folder ({spec.what}): choose another {flag}")
    if path.stat().st_size == 0:
        if not overwrite:
            raise OutputError(f"{head} exists (an empty file); pass --overwrite to replace it")
        return
    if not spec.own(path):
        raise OutputError(
            f"{head} exists and is not {spec.what} that {spec.command} wrote; it replaces only its own output "
            f"(--overwrite included): choose another {flag}, or move the file away yourself"
        )
    if not overwrite:
        raise OutputError(f"{head} exists ({spec.what} of an earlier run); pass --overwrite to replace it")


def _replace_folder(path: Path, spec: Output, overwrite: bool, head: str, flag: str) -> None:
    if not spec.own(path):
        raise OutputError(
            f"{head} is a non-empty folder that is not {spec.what} written by {spec.command}; it replaces only its own "
            f"output (--overwrite included): choose another {flag}, or an empty folder"
        )
    if not overwrite:
        raise OutputError(f"{head} holds {spec.what} of an earlier run; pass --overwrite to replace it")


def _example_name(spec: Output) -> str:
    return {"predict": "predictions.jsonl", "elue-score": "elue_score.json"}.get(spec.command, "output")


def first_json_line_has(path: Path, keys: Iterable[str]) -> bool:
    """Whether the first line of `path` is a JSON object with one of `keys` (a JSONL file of records this project
    writes), read without loading the file."""
    import json

    try:
        with open(path, "rb") as handle:
            line = handle.readline(1 << 20)
        record = json.loads(line.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(record, dict) and any(key in record for key in keys)
