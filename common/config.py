"""Typed-config helpers shared by the run configs (pretrain's YAML, finetune's flags): fixed choices are `Literal`
types, and the allowed values are read from the type, never repeated in a comment or a second list."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Callable
from typing import Any


def strip_optional(tp: Any) -> tuple[Any, bool]:
    """(T, True) for `T | None`, else (tp, False)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def literal_choices(tp: Any) -> tuple[Any, ...] | None:
    """The allowed values of a `Literal[...]` (or `Literal[...] | None`) type, else None."""
    tp, _ = strip_optional(tp)
    return typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else None


def field_types(cls: type) -> dict[str, Any]:
    """Resolved type hints of a dataclass's fields (postponed annotations evaluated)."""
    return typing.get_type_hints(cls)


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
