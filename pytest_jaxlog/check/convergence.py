"""The order of convergence of a stepper, from its errors at several step sizes, with a confidence
interval.

Why: an ODE or PDE stepper that silently drops from fourth to second order (a stage's coefficient
mistyped, a boundary term lost) still converges, and its results at one step size may still pass
a tolerance. The slope of log(error) against log(step size) is the figure that says so, and with
a handful of step sizes it is uncertain: the gate judges the interval, not the point estimate, and
says "cannot tell" where the points scatter too much to decide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import JaxlogError

__all__ = ["ConvergenceOrder", "convergence_order"]


@dataclass(frozen=True)
class ConvergenceOrder:
    """The fitted order (the slope of log error against log step size), its ``confidence``
    interval ``[lo, hi]`` (Student's t on the least-squares slope), and the points it came from."""

    order: float
    lo: float
    hi: float
    confidence: float
    step_sizes: tuple[float, ...]
    errors: tuple[float, ...]

    def assert_order(self, expected: float, *, within: float = 0.25) -> None:
        """Fail unless the whole interval lies within ``within`` of ``expected``: a lower or higher
        order is named as such, an interval too wide to decide as "cannot tell" (more or better
        spread step sizes, or step sizes where the error is not dominated by round-off)."""
        __tracebackhide__ = True
        lo_ok, hi_ok = expected - within, expected + within
        if lo_ok <= self.lo and self.hi <= hi_ok:
            return
        if self.hi < lo_ok or self.lo > hi_ok:
            what = "lower" if self.hi < lo_ok else "higher"
        else:
            what = "cannot tell"
        raise JaxlogError(f"[jaxlog] order of convergence {self.order:.3f}, {self.confidence:.0%} interval "
                          f"[{self.lo:.3f}, {self.hi:.3f}] from {len(self.errors)} step sizes: "
                          f"{what + ' than' if what != 'cannot tell' else 'cannot tell whether it is'} "
                          f"{expected:g} ± {within:g}{self._points()}")

    def _points(self) -> str:
        pts = ", ".join(f"h={h:.4g}: {e:.3e}" for h, e in zip(self.step_sizes, self.errors))
        return f" (errors {pts})"


def convergence_order(step_sizes: Sequence[float], errors: Sequence[float], *,
                      confidence: float = 0.95) -> ConvergenceOrder:
    """Fit ``error = C * h**order`` to errors measured at step sizes ``h`` (at least three)."""
    h = np.asarray(step_sizes, dtype=np.float64).ravel()
    e = np.asarray(errors, dtype=np.float64).ravel()
    if h.shape != e.shape:
        raise JaxlogError(f"[jaxlog] convergence_order: {h.size} step sizes but {e.size} errors")
    if h.size < 3:
        raise JaxlogError(f"[jaxlog] convergence_order: {h.size} points give no interval; measure at least three "
                          f"step sizes")
    for name, v in (("step size", h), ("error", e)):
        bad = np.flatnonzero(~(np.isfinite(v) & (v > 0)))
        if bad.size:
            raise JaxlogError(f"[jaxlog] convergence_order: {name} {int(bad[0])} is {float(v[bad[0]])!r}; each must be a "
                              f"positive finite number (an error of 0 is round-off's floor: use larger steps)")
    if np.unique(h).size < h.size:
        raise JaxlogError("[jaxlog] convergence_order: the step sizes repeat; each point needs its own")
    if not 0 < confidence < 1:
        raise JaxlogError(f"[jaxlog] convergence_order: confidence must be between 0 and 1, got {confidence!r}")
    x, y = np.log(h), np.log(e)
    xm = x - x.mean()
    slope = float(xm @ (y - y.mean()) / (xm @ xm))
    resid = y - y.mean() - slope * xm
    dof = h.size - 2
    se = math.sqrt(float(resid @ resid) / dof / float(xm @ xm))
    from scipy import stats  # type: ignore[import-untyped]  # a dependency of jax

    t = float(stats.t.ppf(0.5 + confidence / 2, dof))
    return ConvergenceOrder(order=slope, lo=slope - t * se, hi=slope + t * se, confidence=confidence,
                            step_sizes=tuple(float(v) for v in h), errors=tuple(float(v) for v in e))
