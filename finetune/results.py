"""One rule for a folder of results (`evaluate`, `early-exit`): it holds the results of one model and one
configuration. Each result JSON records the identity of what it measured — the weights (their sha256, so a model
retrained in the same directory is another model) and the rows and settings they were scored with — and a run whose
identity differs is refused before it writes anything, instead of replacing or mixing another model's JSON, plots,
prediction files and samples."""

from __future__ import annotations

import json
from pathlib import Path

from common.errors import ConfigError
from common.integrity import read_checksums, sha256_file

WEIGHT_NAMES = ("model.safetensors", "pytorch_model.bin")
WEIGHT_NAMES += tuple(f"{name}.index.json" for name in WEIGHT_NAMES)


def result_identity(model_dir: Path, **settings: object) -> dict:
    """The model (its directory and weights digest) and the `settings` that decide what a result measured."""
    weights = next(model_dir / n for n in WEIGHT_NAMES if (model_dir / n).is_file())  # the loader has found one
    recorded = read_checksums(model_dir) or {}
    digest = recorded.get(weights.name, {}).get("sha256") or sha256_file(weights)
    return {"model_dir": str(model_dir.resolve()), "weights_sha256": digest, **settings}


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
    if earlier == identity:
        return
    differs = sorted(k for k in identity if not isinstance(earlier, dict) or earlier.get(k) != identity[k])
    found = ", ".join(f"{k} {earlier.get(k)!r} vs {identity[k]!r}" for k in differs) if earlier else "no identity"
    raise ConfigError(
        f"{path} holds the {what} of another model or configuration ({found}); results of two models are never "
        f"mixed: pass another --output, or {replace_hint}"
    )
