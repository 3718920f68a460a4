"""Validation of the arguments users pass to checks (invariants, tolerances, golden options), in
one place so every check words a bad argument the same way: a ``JaxlogError`` naming the
argument and what it got. Numbers and integer steps are checked by ``record.numbers``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import JaxlogError
from ..record.numbers import real  # noqa: F401  (args.real: the checks' own name for it)


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
