"""The one check of numeric arguments: an integer or a real number as the user meant it.

A bool is not an integer (``steps=True`` is a mistake, not 1), a string is not a number, and a
float is not an integer however round; the error names the argument and what it got.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import JaxlogError


def is_integer(x: Any) -> bool:
    """A Python or numpy integer (a bool is not one); a JSON integer in particular."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


LARGEST_STORED_STEP = 2**62  # steps a file may name: sums and differences of them stay within int64


def is_stored_step(x: Any) -> bool:
    """A step number a file may hold (the reader refuses any other, so nothing writes one)."""
    return is_integer(x) and 0 <= x < LARGEST_STORED_STEP


def check_count(value: Any, what: str, *, minimum: int = 0, none: str = "", expected: str | None = None,
                below: int | None = None) -> int:
    """``value`` as an int >= ``minimum`` (and < ``below``), or one JaxlogError ``"<what>
    <expected>, got <value>"``: ``expected`` defaults to ``"must be an int >= <minimum>"``, and
    ``none`` adds the alternative (``"or None"``)."""
    if is_integer(value) and value >= minimum:
        if below is not None and value >= below:
            raise JaxlogError(f"{what} must be < {below}, got {int(value)}")
        return int(value)
    alt = f" {none}" if none else ""
    shown = int(value) if is_integer(value) else value
    raise JaxlogError(f"{what} {expected or f'must be an int >= {minimum}'}{alt}, got {shown!r}")


def check_step(value: Any, what: str) -> int:
    """A step number: an int >= 0 that a file can hold."""
    if not is_integer(value):
        raise JaxlogError(f"{what} must be an integer step, got {value!r}")
    return check_count(value, what, expected="must be >= 0", below=LARGEST_STORED_STEP)


def is_dt(dt: Any) -> bool:
    """What a step may last (``dt=``): None or a finite real number; the writer and the reader
    of trajectory files both hold to it."""
    return dt is None or (isinstance(dt, (int, float, np.integer, np.floating)) and not isinstance(dt, (bool, np.bool_))
                          and math.isfinite(dt))


def check_dt(dt: Any, what: str = "dt") -> float | None:
    """``dt`` as a float (or None) when :func:`is_dt` holds, else one JaxlogError naming it."""
    if not is_dt(dt):
        raise JaxlogError(f"{what} must be a finite number or None, got {dt!r}: a trajectory file cannot hold it")
    return None if dt is None else float(dt)


def real(x: Any, what: str) -> float:
    """A real number (not a bool, not a string) as a float."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise JaxlogError(f"{what} must be a real number, got {x!r}")
    return float(x)


def positive(x: Any, what: str) -> float:
    """A finite number > 0 (a ratio or factor); a bool or string is a mistake, not 1.0."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)) \
            or not 0 < x < math.inf:
        raise JaxlogError(f"{what} must be a finite number > 0, got {x!r}")
    return float(x)
