"""The ranges a number in an input file may take, checked in one place for every file format.

Each format the tool reads (target files, study files, measurement catalogues and their kernel
tables, ``.mlir`` headers) has one validator of its own, which knows its fields; the rule a
number of a field follows is one of the `Range`s here, so "a fraction" or "a count" means the
same in every file and every refusal states the allowed range the same way::

    check(value, FRACTION, "target file t.toml: field energy.static_fraction.value", TargetError)
    -> TargetError("target file t.toml: field energy.static_fraction.value must be a fraction
       in (0, 1], got 1.7")
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dabench_ir.errors import UserError

__all__ = [
    "COUNT",
    "FINITE",
    "FRACTION",
    "NON_NEGATIVE",
    "POSITIVE",
    "Range",
    "check",
    "finite_float",
    "is_number",
    "violates",
]


@dataclass(frozen=True)
class Range:
    """An allowed range of a field's number: finite always, between ``low`` and ``high``
    (each end open or closed, None for no end), whole when ``integer``. ``text`` is how every
    refusal states it."""

    text: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False

    def holds(self, value: Any) -> bool:
        """True when ``value`` is a number (not a bool) in this range."""
        if not is_number(value) or (self.integer and value != int(value)):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)


FINITE = Range("a finite number")
NON_NEGATIVE = Range("a finite number >= 0", low=0.0)
POSITIVE = Range("a finite number > 0", low=0.0, low_open=True)
FRACTION = Range("a fraction in (0, 1]", low=0.0, high=1.0, low_open=True)
COUNT = Range("a positive integer below 2^31", low=1.0, high=2**31 - 1, integer=True)
"""Units, PEs, devices, elements: a count past 2^31 is no machine's (1e300 units gave 3.7e292 s a step)."""


def is_number(value: Any) -> bool:
    """True for a finite int or float (a bool is no number here: TOML's ``true`` is not 1)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def finite_float(value: Any) -> float | None:
    """``value`` (a number, or a number's text) as a finite float, else None: missing, a bool, not a
    number, infinite or NaN. How a report's or a row's figure is read where it may be absent."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def violates(value: Any, rule: Range) -> str | None:
    """Why ``value`` breaks ``rule`` (``must be a fraction in (0, 1], got 1.7``), or None when it holds."""
    return None if rule.holds(value) else f"must be {rule.text}, got {value!r}"


def check(value: Any, rule: Range, where: str, error: type[UserError] = UserError) -> Any:
    """``value`` when it lies in ``rule``'s range, else ``error`` (a `UserError` kind: exit 2)
    with one line: ``where`` (the file and the field) and the allowed range."""
    why = violates(value, rule)
    if why is not None:
        raise error(f"{where} {why}")
    return value
