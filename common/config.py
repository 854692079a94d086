"""The one config loader of both trainers: nested typed dataclasses (one per component) filled from layers of
values — the dataclass defaults < a YAML file < command-line shortcuts < `--set a.b=c` — with every problem reported
at once, a "did you mean" for an unknown key or choice, and the source of every value (`ConfigLayers`).

Fixed choices are `Literal` types: the allowed values are read from the type, never repeated in a comment or a
second list.

Renamed keys (`RENAMED_KEYS`, one table for both trainers) are read under their new name for one release: the old
spelling in a YAML file, `--set` or an old flag prints one deprecation line and is moved to the new key; both
spellings in one layer are an error naming both. A config stored by a run of the previous release (a resume
checkpoint, run_config.json) is read through the same table without a word (`stored_tree`)."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import operator
import sys
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

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


# --------------------------------------------------------------------------------------------------- the root


class ConfigRoot:
    """What the root config of each trainer has: its tree's name (`RENAMED_KEYS`), `to_dict`, `value`."""

    CONFIG_TREE: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def value(self, key: str) -> Any:
        """The value of a dotted key (`optim.lr`)."""
        node: Any = self
        for part in key.split("."):
            node = getattr(node, part)
        return node


def config_root(tree: str, *sections: type) -> type:
    """The dataclass base of a trainer's root config: one field per component dataclass, named after it
    (`ModelConfig` -> `model`, in the order given), each defaulting to that component's defaults. Subclass it for
    the root's own methods: `class RunConfig(config_root("pretrain", ModelConfig, DataConfig, ...))`."""
    fields = [(cls.__name__.removesuffix("Config").lower(), cls, field(default_factory=cls)) for cls in sections]
    return dataclasses.make_dataclass(
        f"{tree.title()}Sections", fields, bases=(ConfigRoot,), namespace={"CONFIG_TREE": tree}
    )


# ------------------------------------------------------------------------------------------------ renamed keys

# Per config tree (the root dataclass's `CONFIG_TREE`): old dotted key -> new dotted key. One word per concept across
# the trainers (issue 39): `data.max_length`, `train.train_steps`, `optim.warmup_steps` / `optim.warmup_fraction`.
# The old keys are accepted until the next release; remove an entry then (and its line in ADDED_KEYS).
RENAMED_KEYS: dict[str, dict[str, str]] = {
    "pretrain": {"data.max_seq_len": "data.max_length"},
    "finetune": {"train.max_steps": "train.train_steps", "optim.warmup": "optim.warmup_fraction"},
}
# Keys new in this release, with the value that a run stored before had in effect (read into a stored config that
# lacks them, so that a resume compares like with like).
ADDED_KEYS: dict[str, dict[str, Any]] = {"finetune": {"optim.warmup_steps": 0}}

_warned: set[tuple[str, str]] = set()  # (tree, old key): one deprecation line per process


def config_tree(root: type) -> str:
    """The name of a root config class's tree (`pretrain`, `finetune`); "" for one without renamed keys."""
    return str(getattr(root, "CONFIG_TREE", ""))


def deprecation_line(tree: str, old: str, new: str, spell: Callable[[str], str] = str) -> str:
    """The one line that says an old key was read under its new name."""
    return f"{tree}: {spell(old)} is deprecated: use {spell(new)} (accepted until the next release)"


def _pop_dotted(tree: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    """Remove `dotted` from a nested tree: (was it there, its value)."""
    *sections, last = dotted.split(".")
    node: Any = tree
    for part in sections:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict) or last not in node:
        return False, None
    return True, node.pop(last)


def _has_dotted(tree: Mapping[str, Any], dotted: str) -> bool:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def rename_keys(
    tree: Mapping[str, Any],
    root: type,
    source: str = "",
    warn: bool = True,
    spell: Callable[[str], str] = str,
) -> dict[str, Any]:
    """A copy of `tree` (one layer, shaped like `root`) with every old key of `RENAMED_KEYS` moved to its new one;
    `warn`: one deprecation line per old key and process on stderr. Both spellings in the tree: ConfigError."""
    name = config_tree(root)
    out = copy.deepcopy(dict(tree))
    for old, new in RENAMED_KEYS.get(name, {}).items():
        if not _has_dotted(out, old):
            continue
        if _has_dotted(out, new):
            where = f" in {source}" if source else ""
            raise ConfigError(
                f"{spell(old)} and {spell(new)} are both given{where}: {old} is the deprecated name of {new}; keep "
                f"{spell(new)} only"
            )
        _, value = _pop_dotted(out, old)
        set_dotted(out, new.split("."), value)
        if warn and (name, old) not in _warned:
            _warned.add((name, old))
            print(deprecation_line(name, old, new, spell), file=sys.stderr, flush=True)
    return out


def stored_tree(tree: Mapping[str, Any], root: type) -> dict[str, Any]:
    """A config dict stored by an earlier release (a resume checkpoint, a run's saved config) under today's keys:
    renamed keys moved silently, keys added since given the value those runs had (`ADDED_KEYS`)."""
    out = rename_keys(tree, root, warn=False)
    for key, value in ADDED_KEYS.get(config_tree(root), {}).items():
        section = key.rsplit(".", 1)[0]
        if _has_dotted(out, section) and not _has_dotted(out, key):
            set_dotted(out, key.split("."), copy.deepcopy(value))
    return out


# ------------------------------------------------------------------------------------------------------- warm-up


def warmup_problems(steps: int, fraction: float | None, key: Callable[[str], str] = str) -> list[str]:
    """The warm-up of both trainers: `optim.warmup_steps` steps, or `optim.warmup_fraction` of the schedule's
    steps; exclusive (`key(name)` spells a key the way the user wrote it)."""
    p = []
    if steps < 0:
        p.append(f"{key('optim.warmup_steps')}={steps} must be >= 0")
    if fraction is not None:
        if not 0.0 <= fraction <= 1.0:
            p.append(f"{key('optim.warmup_fraction')}={fraction} must be in [0, 1]")
        if steps:
            p.append(
                f"{key('optim.warmup_steps')} and {key('optim.warmup_fraction')} are exclusive: set one (the other "
                "to 0 / null)"
            )
    return p


def warmup_for(steps: int, fraction: float | None, total: int) -> int:
    """Warm-up steps of a schedule of `total` steps: `fraction` of it when set, else `steps` (at most `total`)."""
    warm = round(fraction * total) if fraction is not None else steps
    return min(warm, total)


class ConfigLayers:
    """The values of one typed config from several sources, later ones winning — the dataclass defaults < files <
    command-line shortcuts < `--set` — and, per dotted key, the source that set it (saved with the run).

        layers = ConfigLayers(RunConfig)
        layers.add(read_yaml_mapping(path), f"config {path}")
        layers.add({"optim": {"lr": 1e-4}}, "--lr")
        layers.add_overrides(["train.seed=3"])
        cfg, found = layers.build()
    """

    def __init__(self, root: type, spell: Callable[[str], str] = str) -> None:
        self.root = root
        self.spell = spell  # how `add_each` (the flags) names a deprecated or conflicting key: with its flag
        self.tree: dict[str, Any] = {}
        self.sources: dict[str, str] = {}

    def add(self, tree: Mapping[str, Any], source: str) -> None:
        """Merge `tree` (nested mappings merge key by key; a list or scalar replaces what was there); an old key
        (`RENAMED_KEYS`) is read under its new name, with one deprecation line."""
        self._merge(rename_keys(tree, self.root, source), source)

    def add_each(self, values: Mapping[str, Any], source: Callable[[str], str]) -> None:
        """One layer of dotted keys, each with its own source (command-line shortcuts: `source(key)` is the flag
        written, an old one for an old key)."""
        for key, value, written in self._renamed(list(values.items()), "the command line", self.spell):
            self._merge_value(key, value, source(written))

    def _merge(self, tree: Mapping[str, Any], source: str, prefix: str = "") -> None:
        for key, value in tree.items():
            dotted = f"{prefix}.{key}" if prefix else str(key)
            node = self._node(prefix)
            if isinstance(value, Mapping) and isinstance(node.get(key, {}), dict) and value:
                node.setdefault(key, {})
                self._merge(value, source, dotted)
            else:
                node[key] = copy.deepcopy(value)
                self._record(dotted, source)

    def _merge_value(self, dotted: str, value: Any, source: str) -> None:
        set_dotted(self.tree, dotted.split("."), copy.deepcopy(value))
        self._record(dotted, source)

    def add_overrides(self, items: list[str], source: str = "--set") -> None:
        """`key=value` items (values parsed as YAML), e.g. optim.lr=1e-4 or data.corpora.0.weight=2; all of them one
        layer, so an old key and its new name both given are refused."""
        for key, value, _ in self._renamed([parse_override(item) for item in items], source):
            self._merge_value(key, value, source)

    def _renamed(
        self, pairs: list[tuple[str, Any]], source: str, spell: Callable[[str], str] = str
    ) -> list[tuple[str, Any, str]]:
        """(new key, value, key as written) for one layer of dotted keys: old keys renamed (a deprecation line each,
        both spellings refused); a section given whole (`--set data={max_seq_len: 64}`) has its keys renamed."""
        renamed = RENAMED_KEYS.get(config_tree(self.root), {})
        probe: dict[str, Any] = {}
        for key, _ in pairs:
            if key in renamed or key in renamed.values():
                set_dotted(probe, key.split("."), None)
        rename_keys(probe, self.root, source, spell=spell)  # the deprecation lines; a conflict refused
        out = []
        for key, value in pairs:
            if isinstance(value, Mapping) and any(old.startswith(key + ".") for old in renamed):
                value = rename_keys(_nest_at(key, value), self.root, source, spell=spell)
                for part in key.split("."):
                    value = value[part]
            out.append((renamed.get(key, key), value, key))
        return out

    def value(self, dotted: str, default: Any = None) -> Any:
        """The value written for `dotted` so far (before typing), else `default`."""
        node: Any = self.tree
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def written(self, dotted: str) -> bool:
        """Whether some layer set `dotted` (itself, or a section above it given whole)."""
        parts = dotted.split(".")
        return any(".".join(parts[:n]) in self.sources for n in range(len(parts), 0, -1))

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


def _nest_at(dotted: str, value: Any) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    set_dotted(tree, dotted.split("."), value)
    return tree


def leaf_keys(obj: Any, prefix: str = "") -> list[str]:
    """Every leaf of a config instance as a dotted key (`optim.lr`), in declaration order."""
    if not dataclasses.is_dataclass(obj):
        return [prefix]
    keys = []
    for f in dataclasses.fields(obj):
        keys += leaf_keys(getattr(obj, f.name), f"{prefix}.{f.name}" if prefix else f.name)
    return keys
