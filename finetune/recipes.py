"""Fine-tuning recipes by name: YAML presets shipped in `finetune/presets/` (package data, so a
non-editable install has them too) read into `TrainConfig`.

`finetune train --recipe elasticbert-static | elasticbert-dynamic | acl` (or `--recipe path/to/file.yaml`) starts
from the preset's values; every option given explicitly on the command line overrides the preset. The resolved
values are what runs and what `run_config.json` holds, with the recipe's name and file and the flags that overrode
it under `provenance`.

A preset file:

    name: acl
    description: one line
    values:            # TrainConfig fields, spelled as in Python (lam = --lambda)
      lr: 2.0e-5
      ...
    by_method:         # optional: values that depend on --method (the method resolved first: flag, preset, default)
      2st: {epochs: 3, stage2_epochs: 3}

Each value is checked against the field's type; an unknown key or a wrong type names the file and the key.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from common.config import field_types, literal_choices, strip_optional
from common.errors import ConfigError

from .config import TrainConfig, parse_exits

RECIPE_DIR = Path(__file__).resolve().parent / "presets"
# Fields a preset may not set: they say where this run's inputs and outputs are, not how it trains.
NOT_IN_RECIPES = ("model", "task", "output", "data_dir", "tokenizer", "overwrite", "recipe", "provenance")


@dataclass(frozen=True)
class Recipe:
    """A parsed preset: its values (checked against TrainConfig's types) and the method-dependent ones."""

    name: str
    path: Path
    description: str = ""
    values: dict[str, Any] = field(default_factory=dict)
    by_method: dict[str, dict[str, Any]] = field(default_factory=dict)

    def values_for(self, method: str) -> dict[str, Any]:
        """The preset's values for a run of `method`."""
        return {**self.values, **self.by_method.get(method, {})}


def recipe_names() -> list[str]:
    """The presets shipped in finetune/presets/."""
    return sorted(p.stem for p in RECIPE_DIR.glob("*.yaml")) if RECIPE_DIR.is_dir() else []


def recipe_path(name_or_path: str) -> Path:
    """finetune/presets/NAME.yaml for a shipped name, else the path given (a .yaml/.yml file)."""
    if name_or_path in recipe_names():
        return RECIPE_DIR / f"{name_or_path}.yaml"
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError(f"--recipe {name_or_path}: no such file")
        return path
    close = difflib.get_close_matches(name_or_path, recipe_names(), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    shipped = ", ".join(recipe_names()) or f"none found in {RECIPE_DIR}"
    raise ConfigError(f"--recipe {name_or_path!r}: unknown recipe{hint}; expected one of {shipped}, or a .yaml file")


def load_recipe(name_or_path: str) -> Recipe:
    """Read and check one preset (see the module docstring for the format)."""
    path = recipe_path(name_or_path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the recipe ({err})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err})") from None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: a recipe is a YAML mapping with 'values' (and optionally 'by_method')")
    unknown = sorted(set(raw) - {"name", "description", "values", "by_method"})
    if unknown:
        raise ConfigError(f"{path}: unknown top-level keys {unknown} (expected name, description, values, by_method)")
    values = check_values(raw.get("values") or {}, f"{path}: values")
    by_method_raw = raw.get("by_method") or {}
    if not isinstance(by_method_raw, Mapping):
        raise ConfigError(f"{path}: by_method must map a method name to values")
    methods = literal_choices(field_types(TrainConfig)["method"])
    by_method = {}
    for method, entry in by_method_raw.items():
        if method not in methods:
            raise ConfigError(f"{path}: by_method.{method}: not a method (expected one of {', '.join(methods)})")
        by_method[method] = check_values(entry or {}, f"{path}: by_method.{method}")
    name = str(raw.get("name") or path.stem)
    return Recipe(name, path, str(raw.get("description") or ""), values, by_method)


def check_values(values: object, where: str) -> dict[str, Any]:
    """`values` checked against TrainConfig's fields and types (ints accepted for floats, PyYAML's '2e-5' strings
    too); every problem is reported at once."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where}: expected a mapping of TrainConfig fields")
    hints = field_types(TrainConfig)
    names = [f.name for f in dataclasses.fields(TrainConfig) if f.name not in NOT_IN_RECIPES]
    out, problems = {}, []
    for key, value in values.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            allowed = " (it names the run's inputs/outputs: pass it as a flag)" if key in NOT_IN_RECIPES else ""
            problems.append(f"{where}.{key}: not a recipe setting{hint}{allowed}")
            continue
        try:
            out[key] = _exits(value) if key == "exits" else _coerce(value, hints[key])
        except (TypeError, ConfigError) as err:
            problems.append(f"{where}.{key}: {err}")
    if problems:
        raise ConfigError(problems)
    return out


def _exits(value: Any) -> list[int] | str | None:
    """`exits`: null, "all", "1,3,6" / "1-6", or a list of layer numbers."""
    if value is None or isinstance(value, str):
        return parse_exits(value)
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return value
    raise TypeError(f"expected 'all', a list of layers or null, got {value!r}")


def _coerce(value: Any, tp: Any) -> Any:
    """`value` as type `tp` (a TrainConfig annotation), or TypeError saying what was expected."""
    base, optional = strip_optional(tp)
    if value is None:
        if optional:
            return None
        raise TypeError("may not be null")
    choices = literal_choices(base)
    if choices is not None:
        if value not in choices:
            raise TypeError(f"{value!r} is not one of {', '.join(map(repr, choices))}")
        return value
    if base is bool:
        if not isinstance(value, bool):
            raise TypeError(f"expected true or false, got {value!r}")
        return value
    if base is float:
        if isinstance(value, str):  # PyYAML reads 2e-5 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                raise TypeError(f"expected a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"expected a number, got {value!r}")
        return float(value)
    if base is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"expected a whole number, got {value!r}")
        return value
    if base is str:
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {value!r}")
        return value
    raise TypeError(f"cannot be set from a recipe ({value!r})")  # pragma: no cover - every field is covered above


def resolve(
    defaults: Mapping[str, Any], explicit: Mapping[str, Any], recipe: Recipe | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's values: TrainConfig defaults < the recipe < explicit flags; and their provenance (saved with the
    run): the recipe, its file, the values it set, and the flags that overrode it."""
    values = {**defaults, **explicit}
    if recipe is None:
        return values, {"recipe": None, "explicit_flags": sorted(explicit)}
    method = explicit.get("method", recipe.values.get("method", defaults.get("method")))
    preset = recipe.values_for(method)
    for key, value in preset.items():
        if key not in explicit:
            values[key] = value
    values["recipe"] = recipe.name
    overridden = {key: {"recipe": preset[key], "flag": explicit[key]} for key in preset if key in explicit}
    provenance = {
        "recipe": recipe.name,
        "recipe_file": str(recipe.path),
        "recipe_values": preset,
        "overridden_by_flags": overridden,
        "explicit_flags": sorted(explicit),
    }
    return values, provenance
