"""Validation rules for settings, and the record every default is declared with (one way, everywhere).

Method knobs, ``AdamParams``, ``SamplingParams`` and the engine's loss config keys all declare their
fields as ``Knob``s; this module sits below both ``methods`` and ``engine`` so neither imports the other.

A ``Knob`` is one default: its value, a one-line doc, the rule that checks a value, and where the
value comes from (paper, equation, the paper's own value, and why ours differs when it does).
The tables in ``defaults.py`` are made of these; method classes, reprs, ``wai methods``, the docs
and the prime-rl writer all read them from there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# A check returns None for a good value, or a phrase describing the valid range.
Check = Callable[[Any], "str | None"]


class _Same:
    def __repr__(self) -> str:
        return "same"


SAME: Any = _Same()

SCORED_FIELDS = ("temperature", "top_p", "top_k")
"""the sampling settings that shape the distribution a token is scored under (the rest only stop or seed it)"""


@dataclass(frozen=True)
class Knob:
    """One default value with its rule and its source."""

    value: Any
    doc: str
    check: Check
    source: str
    paper_value: Any = SAME
    why: str = ""

    @property
    def paper(self) -> Any:
        """The value the cited paper used (our value when they agree)."""
        return self.value if self.paper_value is SAME else self.paper_value


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))


def number(low: float | None = None, high: float | None = None, *, open_low: bool = False,
           open_high: bool = False) -> Check:
    """A finite float inside [low, high] (ends open where asked)."""
    lo_br = "(" if open_low or low is None else "["
    hi_br = ")" if open_high or high is None else "]"
    text = f"a finite number in {lo_br}{'-inf' if low is None else low}, {'inf' if high is None else high}{hi_br}"

    def check(x: Any) -> str | None:
        if not _is_number(x):
            return text
        if low is not None and (x < low or (open_low and x == low)):
            return text
        if high is not None and (x > high or (open_high and x == high)):
            return text
        return None

    return check


def integer(low: int = 0, high: int | None = None) -> Check:
    """A whole number (int, not bool) >= low (and <= high when given)."""
    text = f"an integer >= {low}" + ("" if high is None else f" and <= {high}")

    def check(x: Any) -> str | None:
        if isinstance(x, bool) or not isinstance(x, int) or x < low or (high is not None and x > high):
            return text
        return None

    return check


def one_of(*choices: Any) -> Check:
    text = "one of " + ", ".join(repr(c) for c in choices)

    def check(x: Any) -> str | None:
        return None if x in choices else text

    return check


def interval(low: float | None = None, high: float | None = None, contains: float | None = None,
             strictly: bool = False) -> Check:
    """A pair (a, b) of finite numbers with a < b, both inside [low, high], and a <= ``contains`` <= b (a <
    ``contains`` < b when ``strictly``: for a band whose ends are outside it)."""
    lo_br, hi_br = ("(" if low is None else "["), (")" if high is None else "]")
    sign = "<" if strictly else "<="
    text = (f"a pair (low, high) of finite numbers with low < high, inside "
            f"{lo_br}{'-inf' if low is None else low}, {'inf' if high is None else high}{hi_br}"
            + ("" if contains is None else f", with low {sign} {contains:g} {sign} high (a band that leaves out "
               f"{contains:g} acts on every on-policy token)"))

    def check(x: Any) -> str | None:
        if not isinstance(x, tuple) or len(x) != 2 or not all(_is_number(v) for v in x):
            return text
        a, b = x
        if a >= b or (low is not None and a < low) or (high is not None and b > high):
            return text
        if contains is not None and not (a < contains < b if strictly else a <= contains <= b):
            return text
        return None

    return check


def optional(check: Check, off: str) -> Check:
    """None (``off`` says what None means), or a value ``check`` accepts."""

    def checked(x: Any) -> str | None:
        if x is None:
            return None
        rule = check(x)
        return None if rule is None else f"None ({off}; null from the shell) or {rule}"

    return checked


def anything(description: str) -> Check:
    """No rule beyond the type the method checks itself."""

    def check(x: Any) -> str | None:
        return None

    check.__doc__ = description
    return check
