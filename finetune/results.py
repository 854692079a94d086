"""One rule for a folder of results (`evaluate`, `early-exit`): it holds the results of one model and one
configuration. Each result JSON records the identity of what it measured — the weights (their sha256, so a model
retrained in the same directory is another model), the data files it read (their sha256: `data_files`, so a dev set
edited or replaced at the same path is other data) and the settings they were scored with — and a run whose
identity differs is refused before it writes anything, instead of replacing or mixing another model's JSON, plots,
prediction files and samples."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from common.errors import ConfigError
from common.integrity import read_checksums, sha256_file

from .tasks import MissingSplitError, TaskSpec, get_task, split_path

WEIGHT_NAMES = ("model.safetensors", "pytorch_model.bin")
WEIGHT_NAMES += tuple(f"{name}.index.json" for name in WEIGHT_NAMES)


def result_identity(model_dir: Path, splits: Sequence[str] | None = None, **settings: object) -> dict:
    """The model (its directory and weights digest), the `settings` that decide what a result measured and, when
    they name a `task`, `data_dir` and `split`, the files it read (`data_files` of that split, or of `splits`)."""
    weights = next(model_dir / n for n in WEIGHT_NAMES if (model_dir / n).is_file())  # the loader has found one
    recorded = read_checksums(model_dir) or {}
    digest = recorded.get(weights.name, {}).get("sha256") or sha256_file(weights)
    identity = {"model_dir": str(model_dir.resolve()), "weights_sha256": digest, **settings}
    if all(key in settings for key in ("task", "data_dir", "split")):
        read = splits if splits is not None else [str(settings["split"])]
        identity["data_files"] = data_files([get_task(str(settings["task"]))], settings["data_dir"], read)
    return identity


def data_files(tasks: Sequence[TaskSpec], data_dir: str | Path | None, splits: Sequence[str]) -> dict[str, str] | None:
    """The sha256 of every file of `splits` of `tasks` in `data_dir` that is there, by its path under `data_dir`:
    what a scores file records of its rows. None for hub data (`data_dir` None or `hf:`), read by name."""
    if data_dir is None or str(data_dir).startswith("hf:"):
        return None
    root, files = Path(data_dir).resolve(), {}
    for task in tasks:
        for split in splits:
            try:
                path = split_path(task, root, split)
            except MissingSplitError:
                continue
            files[str(path.relative_to(root)) if path.is_relative_to(root) else str(path)] = sha256_file(path)
    return dict(sorted(files.items()))


def with_data_files(summary: dict, task: TaskSpec, data_dir: str | Path | None) -> dict:
    """`finetune train`'s dev_scores.json: `summary` with the sha256 of the train and dev files it was trained and
    selected on (`data_files`), added in place."""
    summary["data_files"] = data_files([task], data_dir, ("train", "dev"))
    return summary


def data_source(data_dir: str | Path | None) -> str | None:
    """Where the rows came from, as an identity records it: a resolved local path, or the hub name (`hf:...`)."""
    if data_dir is None or str(data_dir).startswith("hf:"):
        return None if data_dir is None else str(data_dir)
    return str(Path(data_dir).resolve())


def check_earlier_result(path: Path, identity: dict, what: str, replace_hint: str) -> None:
    """Refuse to write over (or merge with) `path` when it holds `what` of another model or configuration."""
    if not path.is_file():
        return
    try:
        previous = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(
            f"{path}: the earlier result to merge with is not valid JSON ({err}); remove it or {replace_hint}"
        ) from None
    earlier = previous.get("identity") if isinstance(previous, dict) else None
    if isinstance(earlier, dict) and "data_files" not in earlier:  # written before results recorded their files
        identity = {k: v for k, v in identity.items() if k != "data_files"}
    if earlier == identity:
        return
    differs = sorted(k for k in identity if not isinstance(earlier, dict) or earlier.get(k) != identity[k])
    found = ", ".join(f"{k} {earlier.get(k)!r} vs {identity[k]!r}" for k in differs) if earlier else "no identity"
    raise ConfigError(
        f"{path} holds the {what} of another model or configuration ({found}); results of two models are never "
        f"mixed: pass another --output, or {replace_hint}"
    )
