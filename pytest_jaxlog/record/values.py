"""Values as users give them and as people read them: the one check of numeric arguments (an
integer or a real number as the user meant it), the arguments users pass to checks (tolerances,
flags, record names), and text made safe to show. One module, so every entry point words a bad
argument the same way: a ``JaxlogError`` naming the argument and what it got."""

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

# ---------------------------------------------------------------------------------------------
# Text from a file, a manifest or a record's name made safe to show: every control or format
# character written as its escape (``\\x1b``, ``\\u202e``), so a name or value never drives the
# terminal (colours, cursor moves, titles, reordered text) nor, where each line is one entry (a
# log), forges a line of its own. One function for the command line and the text sinks, so both
# escape alike. Standard library only.

def printable(text: str, *, newlines: bool = True) -> str:
    """``text`` with its control and format characters escaped; ``newlines=False`` escapes the
    newline too (one log line stays one line)."""
    keep = "\n" if newlines else ""
    if (text.replace("\n", "") if newlines else text).isprintable():
        return text
    return "".join(c if c == keep or c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


# ---------------------------------------------------------------------------------------------
# Validation of the arguments users pass to checks (invariants, tolerances, golden options), in
# one place so every check words a bad argument the same way: a ``JaxlogError`` naming the
# argument and what it got. Numbers and integer steps are checked above.

def tolerance(x: Any, what: str) -> float:
    """A finite real number >= 0 (rtol, atol)."""
    value = real(x, what)
    if not (math.isfinite(value) and value >= 0):
        raise JaxlogError(f"{what} must be finite and >= 0, got {x!r}")
    return value


def flag(x: Any, what: str) -> bool:
    """A bool (numpy bools too): a string such as "no" would silently be true."""
    if not isinstance(x, (bool, np.bool_)):
        raise JaxlogError(f"{what} must be True or False, got {x!r}")
    return bool(x)


def record_name(name: Any, what: str) -> str:
    """A record name: a leaf path or a record group ("energy", "state/positions")."""
    if not isinstance(name, str) or not name:
        raise JaxlogError(f"{what} needs a record name (a non-empty string), got {name!r}")
    return name
