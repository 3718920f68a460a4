"""Lower/upper bounds with an absolute tolerance, shared by ``bounded`` (each value) and
``aggregate`` (a reduction over a window): one rule for what lies outside and one wording."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..errors import JaxlogError
from . import args
from .codec import fmt
from .leaves import isnan


class Bounds(NamedTuple):
    lo: float | None
    hi: float | None
    atol: float

    @classmethod
    def parse(cls, what: str, lo: Any, hi: Any, atol: Any) -> "Bounds":
        """lo/hi (either may be None, not both, lo <= hi) and atol >= 0, validated."""
        lo = None if lo is None else args.real(lo, f"{what}: lo")
        hi = None if hi is None else args.real(hi, f"{what}: hi")
        if lo is None and hi is None:
            raise JaxlogError(f"{what} needs lo=, hi= or both")
        if lo is not None and hi is not None and not lo <= hi:
            raise JaxlogError(f"{what}: lo={lo!r} is greater than hi={hi!r}")
        return cls(lo, hi, args.tolerance(atol, f"{what}: atol"))

    @property
    def text(self) -> str:
        """``in [lo, hi]``, ``>= lo`` or ``<= hi``: the expected value in a message."""
        if self.lo is not None and self.hi is not None:
            return f"in [{fmt(self.lo)}, {fmt(self.hi)}]"
        if self.lo is not None:
            return f">= {fmt(self.lo)}"
        return f"<= {fmt(self.hi)}"

    def outside(self, x: np.ndarray) -> np.ndarray:
        """Where ``x`` lies outside ``[lo - atol, hi + atol]``; NaN is outside."""
        ok = np.ones(x.shape, dtype=bool)
        with np.errstate(all="ignore"):
            if self.lo is not None:
                ok &= x >= self.lo - self.atol
            if self.hi is not None:
                ok &= x <= self.hi + self.atol
            if x.dtype.kind == "f":
                ok &= ~np.isnan(x)
        return ~ok

    def why(self, value: Any) -> str:
        """Why ``value`` is outside, and by how much (from the bound itself, not the tolerance)."""
        if isnan(value):
            return "value is NaN"
        if self.lo is not None and value < self.lo:
            return f"below the lower bound by {fmt(self.lo - value)}"
        return f"above the upper bound by {fmt(value - self.hi)}"


def call_text(head: str, *parts: str, **options: Any) -> str:
    """``head(part, ..., key=value, ...)`` showing the options that are not None: an invariant's
    name, written the way it was called."""
    shown = [*parts, *(f"{k}={v!r}" for k, v in options.items() if v is not None)]
    return f"{head}({', '.join(shown)})"
