"""A picture of an invariant violation: the violating record against its steps, the bound or the
conserved value (with its tolerance band), and the first bad step marked.

Why: a person reading a failed CI job sees at a glance whether energy drifted slowly, jumped at
one step or went NaN, without downloading the trajectory. matplotlib is optional (the ``plot``
extra); figures are drawn with its object API and the Agg canvas, never pyplot, so drawing
touches no global backend state of the user's.
"""

from __future__ import annotations

import math
import os
import re
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import JaxlogError

#: How to get matplotlib, the ``plot`` extra.
INSTALL_PLOT = "pip install 'pytest-jaxlog[plot]' (matplotlib)"
#: What a failure says when matplotlib is missing.
HOW_TO_PLOT = f"{INSTALL_PLOT} to get a plot of each failing invariant"
MAX_LINES = 16  # elements of a non-scalar record drawn at most
#: Series of at most this many points get a marker on each point: a failure at step 1 has two
#: frames and a one-frame record a single point, which a line alone would not show.
MARKERS_UP_TO = 60

_WINDOW = re.compile(r"^(?P<reduce>\w+) over .*?: \d+ frames? at steps? (?P<lo>-?\d+)(?:\.\.(?P<hi>-?\d+))?")
_BOUND = re.compile(r"^(?:in \[(?P<lo>[^,\]]+), (?P<hi>[^\]]+)\]|>= (?P<ge>\S+)|<= (?P<le>\S+))$")


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_violation(trajectory: Any, violation: Any, path: str | os.PathLike) -> Path:
    """Draw ``violation`` (a ``jl.InvariantViolation``) from ``trajectory`` (``jl.load`` or
    ``run.trajectory``) into ``path`` (PNG or SVG by its suffix) and return the path."""
    return save_figure(draw_violation(trajectory, violation), path)


def new_figure(width: float, height: float, what: str) -> Any:
    """A ``matplotlib.figure.Figure`` on its own Agg canvas; without matplotlib a JaxlogError
    saying how to get ``what`` (e.g. "the violation") drawn."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise JaxlogError(f"no plot of {what}: {HOW_TO_PLOT if what == 'the violation' else INSTALL_PLOT}") from exc
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Any, path: str | os.PathLike) -> Path:
    """Write ``fig`` to ``path`` (format by suffix), creating its folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def point_style(n: int) -> dict[str, Any]:
    """Keyword arguments of ``Axes.plot`` for a series of ``n`` points: a marker on each point when
    they are few enough to tell apart, bigger for a lone one, so a short record reads at a glance."""
    if n > MARKERS_UP_TO:
        return {}
    return {"marker": "o", "markersize": 6 if n == 1 else 3.5}


def step_axis(ax: Any, steps: Any) -> None:
    """Ticks at whole steps only (steps are integers: a tick at step 0.25 names nothing), and half
    a step either side of a record whose frames span less than two steps, so its points sit inside
    the panel, not on its edges."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    found = np.asarray(steps, dtype=np.float64).ravel()
    found = found[np.isfinite(found)]
    if found.size and found.max() - found.min() < 2:
        ax.set_xlim(found.min() - 0.5, found.max() + 0.5)


def draw_violation(trajectory: Any, violation: Any) -> Any:
    """The violation's figure (a ``matplotlib.figure.Figure`` on an Agg canvas)."""
    fig = new_figure(8, 4.5, "the violation")
    record = violation.record
    steps = np.asarray(trajectory.steps(record))
    values = _series(np.asarray(trajectory[record]), violation)
    ax = fig.add_subplot()
    element = "" if violation.index is None else "[" + ", ".join(map(str, violation.index)) + "]"
    label = record + element + ("" if violation.system is None else f" (system {violation.system})")
    for j in range(values.shape[1]):
        ax.plot(steps, values[:, j], lw=1.2 if values.shape[1] == 1 else 0.8, label=label if j == 0 else None,
                **point_style(len(steps)))
    _reference(ax, violation)
    _aggregate_window(ax, violation)
    bad = violation.step
    ax.axvline(bad, color="tab:red", ls="--", lw=1, label=f"first bad step {bad}")
    value = _number(violation.value)
    if value is not None and math.isfinite(value):
        ax.plot([bad], [value], "o", color="tab:red", ms=6)
    ax.set_xlabel("step")
    step_axis(ax, [*steps, bad])
    ax.set_ylabel(record)
    ax.set_title(_wrap(str(violation).splitlines()[0]), fontsize=9)
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _series(values: np.ndarray, violation: Any) -> np.ndarray:
    """The violating system's (and element's) values as ``[steps, lines]``."""
    if violation.system is not None and values.ndim > 1:
        values = values[:, violation.system]
    if violation.index is not None and values.ndim > 1:
        values = values[(slice(None), *violation.index)]
    values = values.reshape(len(values), -1)[:, :MAX_LINES]
    if np.iscomplexobj(values):
        values = np.abs(values)
    return values.astype(np.float64)


def _reference(ax: Any, violation: Any) -> None:
    """The conserved value and its band, or the bounds, when the violation says them."""
    expected = _number(violation.expected)
    if expected is not None:
        ax.axhline(expected, color="tab:green", lw=1, label=f"expected {expected:.6g}")
        tol = violation.tolerance
        if tol:
            ax.axhspan(expected - tol, expected + tol, color="tab:green", alpha=0.12, label=f"± {tol:.3g}")
        return
    found = _BOUND.match(str(violation.expected or "").strip())
    if found is None:
        return
    for name in ("lo", "hi", "ge", "le"):
        bound = _number(found.group(name))
        if bound is not None:
            ax.axhline(bound, color="tab:orange", lw=1, label=f"bound {bound:.6g}")


def _aggregate_window(ax: Any, violation: Any) -> None:
    """An aggregate's window shaded and its statistic drawn across it: the bound applies to the
    statistic (a mean after burn-in), not to each value."""
    found = _WINDOW.match(str(getattr(violation, "detail", None) or ""))
    value = _number(violation.value)
    if found is None or value is None:
        return
    lo = int(found.group("lo"))
    hi = int(found.group("hi") or lo)
    ax.axvspan(lo, hi, color="0.5", alpha=0.1, label=f"window, steps {lo}..{hi}")
    ax.hlines(value, lo, hi, color="tab:purple", lw=2, label=f"{found.group('reduce')} over the window {value:.6g}")


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return float(arr) if arr.ndim == 0 else None


def _wrap(text: str, width: int = 100) -> str:
    return "\n".join(textwrap.wrap(text, width)[:3])
