"""One policy for the DeepSpeed JSON of both trainers (`--ds-config`, `train.ds_config`).

- Where it is read from: the path as given (`~` and `$VARS` expanded; a relative one from the current directory),
  else, for a relative path that is not there, from the repository root, so the shipped `ds_configs/NAME.json` work
  from any directory (`resolve_ds_path`).
- The run config is the single source of truth for what it decides (batch sizes, clipping, the optimizer): a JSON
  field that is "auto" or absent is filled from it; one that disagrees is refused, naming the JSON key, the file and
  both values (`DsFill.fill`), never silently overwritten or silently winning.
- `scheduler`: refused in both trainers. The lr schedule lives in the run config (`optim.warmup_steps`,
  `optim.warmup_fraction`, ...) and is computed by the trainer.
- `optimizer`: checked against the run config's optimizer like any other field (`DsFill.optimizer`). Pre-training
  hands the filled section to DeepSpeed, which builds the optimizer from it; fine-tuning builds its AdamW itself
  (per-group learning rates), so a section that agrees with it is dropped after the check and one that does not is
  refused (it used to be dropped without a word).
- A field left "auto" that the run config cannot fill is refused (`DsFill.done`).

The trainers' own parts (pre-training: precision sections, ZeRO stage overrides; fine-tuning: fp32) stay with them:
`pretrain.ds_config.fill_ds_config`, `finetune.train.trainer.fill_finetune_ds_config`.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .io import path_problem, read_object

AUTO = "auto"
REPO_ROOT = Path(__file__).resolve().parent.parent
HINT = "the DeepSpeed config (--ds-config, train.ds_config)"


class DsJson(dict):
    """A DeepSpeed JSON as read, remembering its file (named in every refusal; copies keep it)."""

    source: str = "the DeepSpeed JSON"

    def __init__(self, data: dict[str, Any], source: str) -> None:
        super().__init__(data)
        self.source = source


def resolve_ds_path(path: str | os.PathLike) -> Path:
    """The file `path` names: as given (relative to the current directory), else relative to the repository root."""
    p = Path(os.path.expandvars(os.path.expanduser(str(path))))
    if p.is_absolute() or (Path.cwd() / p).exists():
        return p if p.is_absolute() else Path.cwd() / p
    return REPO_ROOT / p


def load_ds_json(path: str | os.PathLike) -> DsJson:
    """The DeepSpeed JSON `path` names (`resolve_ds_path`); a missing or malformed file is a ConfigError naming it."""
    p = resolve_ds_path(path)
    if problem := path_problem(p):
        where = f"read from the current directory {Path.cwd()}, else from the repository {REPO_ROOT}, whose "
        where = (
            "" if Path(os.path.expanduser(str(path))).is_absolute() else where + "ds_configs/ holds the shipped ones; "
        )
        problem = "does not exist" if problem == "no such file" else problem  # or a folder, not a file
        raise ConfigError(f"DeepSpeed config {path} {problem} ({where}--ds-config, train.ds_config)")
    return DsJson(read_object(p, ConfigError, "a JSON object", hint=HINT), str(p))


def source_of(raw: dict[str, Any]) -> str:
    return getattr(raw, "source", DsJson.source)


def _same(current: Any, value: Any) -> bool:
    if isinstance(current, list | tuple) and isinstance(value, list | tuple):
        return list(current) == list(value)
    return current == value and isinstance(current, bool) == isinstance(value, bool)


class DsFill:
    """A copy of one DeepSpeed JSON being filled from a run config, and every disagreement found on the way."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.source = source_of(raw)
        self.ds: dict[str, Any] = copy.deepcopy(dict(raw))
        self.problems: list[str] = []

    def fill(self, section: dict[str, Any], where: str, key: str, value: Any, run_key: str) -> None:
        """`section[key]` = `value` when "auto" or absent; any other value that differs is refused."""
        current = section.get(key, AUTO)
        if current == AUTO:
            section[key] = value
        elif not _same(current, value):
            name = f"{where}.{key}" if where else key
            self.problems.append(
                f"{name}={current!r} in the DeepSpeed JSON disagrees with the run config: {run_key}={value!r} "
                f'(JSON: {self.source}); set it to "auto" or change the run config'
            )

    def batch(self, global_batch: int, micro_batch: int, accumulation: int, keys: tuple[str, str, str]) -> None:
        """The three batch fields; `keys` name the run config's values (global, micro, accumulation)."""
        self.fill(self.ds, "", "train_batch_size", global_batch, keys[0])
        self.fill(self.ds, "", "train_micro_batch_size_per_gpu", micro_batch, keys[1])
        self.fill(self.ds, "", "gradient_accumulation_steps", accumulation, keys[2])

    def refuse_scheduler(self) -> None:
        if "scheduler" in self.ds:
            self.problems.append(
                f"the DeepSpeed JSON {self.source} has a 'scheduler': the lr schedule lives in the run config "
                "(optim.warmup_steps / optim.warmup_fraction, ...), computed by the trainer from the step; remove it"
            )

    def optimizer(self, type_: str, params: dict[str, tuple[Any, str]], run_key: str = "optim.*") -> dict[str, Any]:
        """The `optimizer` section filled from the run config's optimizer: `type_` and `params` (name -> (value, the
        run-config key that sets it)); a section that is absent is created all "auto"."""
        opt = self.ds.setdefault("optimizer", {"type": AUTO, "params": {}})
        if not isinstance(opt, dict) or not isinstance(opt.get("params", {}), dict):
            self.problems.append(f"optimizer in {self.source} must be an object with a 'params' object")
            return {}
        self.fill(opt, "optimizer", "type", type_, run_key)
        section = opt.setdefault("params", {})
        for name, (value, key) in params.items():
            self.fill(section, "optimizer.params", name, value, key)
        return section

    def leftovers(self) -> list[str]:
        return [k for k, v in _walk(self.ds) if v == AUTO]

    def done(self, what: str = "DeepSpeed config") -> dict[str, Any]:
        """The filled config; every problem at once (ConfigError) when there is any, or an "auto" left."""
        left = self.leftovers()
        if left:
            self.problems.append(
                f'DeepSpeed JSON fields left as "auto" that the run config cannot fill: {left} ({self.source})'
            )
        if self.problems:
            raise ConfigError(self.problems, source=what)
        return self.ds


def _walk(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    if isinstance(d, dict):
        for k, v in d.items():
            out.extend(_walk(v, f"{prefix}.{k}" if prefix else k))
    else:
        out.append((prefix, d))
    return out
