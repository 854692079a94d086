"""The ranges of the serving numbers, one table for the commands' options (`predict --max-wait`) and the Python API's
arguments (`EarlyExitClassifier.stream(max_wait=...)`), checked before anything loads or runs.

A number outside its range is refused in one line naming it: nan (which every comparison lets through), an infinity
where it means nothing, a negative number, a zero where it means nothing, a fraction where a count is meant. Before,
`--max-wait nan` served with a bound that never fired, `stream(max_wait=-1)` forced every row out at once, and a
`max_length` or `batch_size` of 0 silently became the default.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    """A number's range: at least `low`; a whole number where `whole`; infinity allowed where `unbounded` (it means
    no bound, as the option's absence does)."""

    low: float
    whole: bool
    unbounded: bool = False

    def describe(self, value: object) -> str:
        """'>= 1', with what else the value must be that `value` is not."""
        whole = self.whole and not (isinstance(value, int) and not isinstance(value, bool))
        unbounded = " (inf: no bound)" if self.unbounded else ""
        return f">= {self.low:g}" + (" and a whole number" if whole else "") + unbounded

    def admits(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            return False
        if math.isinf(value):
            return self.unbounded and value > 0
        return value >= self.low and (not self.whole or float(value).is_integer())


LIMITS = {
    "batch_size": Limit(1, whole=True),  # rows per layer call
    "max_length": Limit(1, whole=True),  # tokens per input (the model's own bound is checked where it loads)
    "threads": Limit(1, whole=True),
    "max_wait": Limit(0, whole=False, unbounded=True),  # seconds a row waits for its batch to fill; 0: none
}


def number_problems(values: Mapping[str, object], spell: Callable[[str], str] = str) -> list[str]:
    """One line per value of `values` (name -> value; None: not given) outside its range in `LIMITS`; `spell(name)`
    is how the caller names it (`--max-wait` on the command line, `max_wait` in Python)."""
    return [
        f"{spell(name)} must be {LIMITS[name].describe(value)}, got {value!r}"
        for name, value in values.items()
        if value is not None and not LIMITS[name].admits(value)
    ]


def option_name(name: str) -> str:
    """`max_wait` -> `--max-wait`."""
    return "--" + name.replace("_", "-")
