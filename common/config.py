"""The one config loader of both trainers: nested typed dataclasses (one per component) filled from layers of
values — the dataclass defaults < a YAML file < command-line shortcuts < `--set a.b=c` — with every problem reported
at once, a "did you mean" for an unknown key or choice, and the source of every value (`ConfigLayers`).

Fixed choices are `Literal` types: the allowed values are read from the type, never repeated in a comment or a
second list."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import operator
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError
from .io import read_object


def strip_optional(tp: Any) -> tuple[Any, bool]:
    """(T, True) for `T | None` (T itself a union when several types remain), else (tp, False)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = tuple(a for a in typing.get_args(tp) if a is not type(None))
        if len(args) < len(typing.get_args(tp)):
            return functools.reduce(operator.or_, args), True
    return tp, False


def literal_choices(tp: Any) -> tuple[Any, ...] | None:
    """The allowed values of a `Literal[...]` (or `Literal[...] | None`) type, else None."""
    tp, _ = strip_optional(tp)
    return typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else None


def field_types(cls: type) -> dict[str, Any]:
    """Resolved type hints of a dataclass's fields (postponed annotations evaluated)."""
    return typing.get_type_hints(cls)


def finite_float(text: str) -> float:
    """`text` as a finite number; ValueError when it is not a number or not finite (nan, inf)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not finite")
    return value


def choice_problem(key: str, value: Any, choices: tuple[Any, ...]) -> str | None:
    """A readable problem for a value outside its choices ("did you mean" when one is close), else None."""
    if value in choices:
        return None
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{key}={value!r}{hint}; expected one of {', '.join(repr(c) for c in choices)}"


def literal_problems(obj: Any, key: Callable[[str], str] = str) -> list[str]:
    """Every `Literal` field of dataclass instance `obj` whose value is not one of its choices; `key(name)` spells the
    field the way the user wrote it (e.g. `optim.decay` or `--exit-type`)."""
    problems = []
    hints = field_types(type(obj))
    for f in dataclasses.fields(obj):
        choices = literal_choices(hints[f.name])
        value = getattr(obj, f.name)
        if choices is None or (value is None and strip_optional(hints[f.name])[1]):
            continue
        problem = choice_problem(key(f.name), value, choices)
        if problem:
            problems.append(problem)
    return problems


# ------------------------------------------------------------------------------------ layered YAML -> typed config


@dataclass
class Findings:
    """What reading a tree into the dataclasses found. A value of the wrong type (or a null where none is allowed)
    makes `types_sound` false: checks of meaning would trip over it, so they wait until it is fixed. Unknown keys and
    values outside their `Literal` choices leave every field well-typed."""

    problems: list[str] = field(default_factory=list)
    types_sound: bool = True

    def wrong_type(self, problem: str) -> None:
        self.problems.append(problem)
        self.types_sound = False

    def add(self, problem: str) -> None:
        self.problems.append(problem)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _coerce_scalar(value: Any, tp: Any, key: str, found: Findings) -> Any:
    """bool / int / float / str: YAML's own types, with the two conversions YAML needs (2.0 -> 2, "1e-3" -> 0.001)."""
    if tp is bool:
        if not isinstance(value, bool):
            found.wrong_type(f"{key}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            found.wrong_type(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            if isinstance(value, str):
                try:
                    return float(value)  # YAML reads "1e-3" as a string
                except ValueError:
                    pass
            found.wrong_type(f"{key}: expected a number, got {value!r}")
            return value
        return float(value)
    if tp is str and not isinstance(value, str):
        found.wrong_type(f"{key}: expected a string, got {value!r}")
    return value


def _coerce_choice(value: Any, choices: tuple[Any, ...], key: str, found: Findings) -> Any:
    """A `Literal` field: one of its choices (2.0 counts as 2, true never as 1), else a "did you mean" problem."""
    for choice in choices:
        if value == choice and isinstance(value, bool) == isinstance(choice, bool):
            return choice
    found.add(
        choice_problem(key, value, choices) or f"{key}={value!r}; expected one of {', '.join(repr(c) for c in choices)}"
    )
    return value


def _coerce_union(value: Any, arms: tuple[Any, ...], key: str, found: Findings) -> Any:
    """`A | B`: the first arm the value fits without a problem."""
    for arm in arms:
        trial = Findings()
        coerced = _coerce(value, arm, key, trial)
        if not trial.problems:
            return coerced
    names = " or ".join(str(literal_choices(a) or getattr(a, "__name__", a)) for a in arms)
    found.wrong_type(f"{key}: expected {names}, got {value!r}")
    return value


def _coerce(value: Any, tp: Any, key: str, found: Findings) -> Any:
    """Check/convert one value against a field type; record a readable problem instead of raising."""
    tp, optional = strip_optional(tp)
    if value is None:
        if not optional:
            found.wrong_type(f"{key}: must not be null")
        return None
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return _coerce_union(value, typing.get_args(tp), key, found)
    choices = literal_choices(tp)
    if choices is not None:
        return _coerce_choice(value, choices, key, found)
    if _is_dataclass_type(tp):
        if not isinstance(value, dict):
            found.wrong_type(f"{key}: expected a mapping, got {type(value).__name__}")
            return tp()
        return build(tp, value, key, found)
    if typing.get_origin(tp) is list:
        (inner,) = typing.get_args(tp)
        if not isinstance(value, list | tuple):
            found.wrong_type(f"{key}: expected a list, got {value!r}")
            return []
        return [_coerce(v, inner, f"{key}[{i}]", found) for i, v in enumerate(value)]
    return _coerce_scalar(value, tp, key, found)


def build(cls: type, data: Mapping[str, Any], prefix: str = "", found: Findings | None = None) -> Any:
    """Dataclass `cls` from a tree of plain values; unknown keys get a "did you mean". A field whose metadata has
    `parse` (a function of the written value) reads its value through it first, e.g. "1,3,6" -> [1, 3, 6]."""
    found = found if found is not None else Findings()
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = field_types(cls)
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean '{prefix + '.' if prefix else ''}{close[0]}'?)" if close else ""
            found.add(f"unknown key '{full}'{hint}; known: {', '.join(fields)}")
            continue
        parse = fields[key].metadata.get("parse")
        if parse is not None:
            try:
                value = parse(value)
            except (ValueError, TypeError) as err:
                found.wrong_type(f"{full}: {err}")
                continue
        kwargs[key] = _coerce(value, hints[key], full, found)
    return cls(**kwargs)


def parse_override(item: str) -> tuple[str, Any]:
    """`--set a.b=value`: the dotted key and the value read as YAML ("" for nothing)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value, e.g. optim.lr=1e-4")
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"--set {item!r}: the value is not valid YAML ({err})") from None
    return key.strip(), value


def set_dotted(tree: dict[str, Any], path: list[str], value: Any) -> None:
    """tree[a][b]... = value for path [a, b, ...]; a numeric part indexes a list (grown as needed)."""
    node: Any = tree
    for i, part in enumerate(path[:-1]):
        if isinstance(node, list):
            idx = int(part)
            while len(node) <= idx:
                node.append({})
            node = node[idx]
            continue
        if part not in node or node[part] is None:
            node[part] = [] if path[i + 1].isdigit() else {}
        node = node[part]
    last = path[-1]
    if isinstance(node, list):
        idx = int(last)
        while len(node) <= idx:
            node.append({})
        node[idx] = value
    else:
        node[last] = value


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """A YAML config file: a mapping of sections (an empty file is an empty one); every failure names the file."""
    return read_object(path, ConfigError, "a mapping of sections", yaml_text=True)


class ConfigLayers:
    """The values of one typed config from several sources, later ones winning — the dataclass defaults < files <
    command-line shortcuts < `--set` — and, per dotted key, the source that set it (saved with the run).

        layers = ConfigLayers(RunConfig)
        layers.add(read_yaml_mapping(path), f"config {path}")
        layers.add({"optim": {"lr": 1e-4}}, "--lr")
        layers.add_overrides(["train.seed=3"])
        cfg, found = layers.build()
    """

    def __init__(self, root: type) -> None:
        self.root = root
        self.tree: dict[str, Any] = {}
        self.sources: dict[str, str] = {}

    def add(self, tree: Mapping[str, Any], source: str, prefix: str = "") -> None:
        """Merge `tree` (nested mappings merge key by key; a list or scalar replaces what was there)."""
        for key, value in tree.items():
            dotted = f"{prefix}.{key}" if prefix else str(key)
            node = self._node(prefix)
            if isinstance(value, Mapping) and isinstance(node.get(key, {}), dict) and value:
                node.setdefault(key, {})
                self.add(value, source, dotted)
            else:
                node[key] = copy.deepcopy(value)
                self._record(dotted, source)

    def add_overrides(self, items: list[str], source: str = "--set") -> None:
        """`key=value` items (values parsed as YAML), e.g. optim.lr=1e-4 or data.corpora.0.weight=2."""
        for item in items:
            key, value = parse_override(item)
            set_dotted(self.tree, key.split("."), value)
            self._record(key, source)

    def value(self, dotted: str, default: Any = None) -> Any:
        """The value written for `dotted` so far (before typing), else `default`."""
        node: Any = self.tree
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def build(self) -> tuple[Any, Findings]:
        """The typed config and everything found wrong with the values (types and choices; meaning is the
        caller's: check it only when `found.types_sound`)."""
        found = Findings()
        return build(self.root, self.tree, "", found), found

    def source_of_every_key(self, cfg: Any) -> dict[str, str]:
        """Every leaf key of the built config with its source ("default" where no layer set it)."""
        out = {}
        for key in leaf_keys(cfg):
            parts = key.split(".")
            prefixes = (".".join(parts[:n]) for n in range(len(parts), 0, -1))
            out[key] = next((self.sources[p] for p in prefixes if p in self.sources), "default")
        return out

    def _node(self, prefix: str) -> dict[str, Any]:
        node = self.tree
        for part in prefix.split(".") if prefix else []:
            node = node[part]
        return node

    def _record(self, dotted: str, source: str) -> None:
        for key in [k for k in self.sources if k.startswith(dotted + ".")]:
            del self.sources[key]  # a whole subtree replaced
        self.sources[dotted] = source


def leaf_keys(obj: Any, prefix: str = "") -> list[str]:
    """Every leaf of a config instance as a dotted key (`optim.lr`), in declaration order."""
    if not dataclasses.is_dataclass(obj):
        return [prefix]
    keys = []
    for f in dataclasses.fields(obj):
        keys += leaf_keys(getattr(obj, f.name), f"{prefix}.{f.name}" if prefix else f.name)
    return keys
