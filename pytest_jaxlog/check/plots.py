"""Pictures of what a check saw: an invariant violation against its steps, and a trajectory's
records against step (``jaxlog plot``)."""

from __future__ import annotations

import math
import os
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

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

# ---------------------------------------------------------------------------------------------
# A picture of a trajectory's records against step (or time): ``jaxlog plot``'s figure.
#
# Why its own module: the command line draws what a person asks to see of a kept trajectory, and a
# test reads the figure back (its ticks, its markers) instead of a PNG. Short records read as the
# failure plots do: a marker on each of a few frames (a lone frame is a visible point, not an
# empty panel) and ticks at whole steps. Drawn with matplotlib's object API on an Agg canvas.

MAX_ELEMENTS = 8  # elements of a record drawn one line each; more: their mean and min..max band


@dataclass(frozen=True)
class RecordsPlot:
    """What to draw: ``records`` of ``trajectory`` against step, or ``time`` (needs the run's dt);
    ``mark_step`` (a failure's first bad step) dashed on every panel; ``title`` above them."""

    trajectory: Any
    records: Sequence[str]
    time: bool = False
    mark_step: int | None = None
    title: str = ""


def draw_records(spec: RecordsPlot) -> Any:
    """The figure (a ``matplotlib.figure.Figure``), one panel per record, sharing the x axis."""
    traj, n = spec.trajectory, len(spec.records)
    fig = new_figure(8, 2.4 * n + 0.6, "the records")
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
    for ax, path in zip(axes, spec.records):
        steps = np.asarray(traj.steps(path))
        x = steps
        if spec.time:
            t = traj.time(path)
            if t is None:
                raise JaxlogError(f"[jaxlog] record {path!r} has no time (the run had no dt); plot against step")
            x = np.asarray(t)
        _draw_record(ax, x, _values(traj[path]))
        ax.set_ylabel(path, fontsize="small")
        ax.grid(alpha=0.3)
        if spec.mark_step is not None:
            mark_step(ax, steps, x if spec.time else None, spec.mark_step)
        if not spec.time:
            step_axis(ax, [*steps, *([] if spec.mark_step is None else [spec.mark_step])])
    axes[-1].set_xlabel("time" if spec.time else "step")
    if spec.title:
        fig.suptitle(spec.title, fontsize="medium")
    fig.tight_layout()
    return fig


def mark_step(ax: Any, steps: np.ndarray, time: np.ndarray | None, step: int) -> None:
    """A dashed red line at ``step`` (at its time when the x axis is ``time``), as failure plots mark it."""
    at = float(np.interp(step, steps, time)) if time is not None and len(steps) else float(step)
    ax.axvline(at, color="tab:red", ls="--", lw=1, label=f"step {step}")
    ax.legend(fontsize="x-small")


def _values(values: Any) -> np.ndarray:
    """A record's values as float64 (bfloat16 and other narrow or void types widened, complex as modulus)."""
    y = np.asarray(values)
    if y.dtype.kind == "V" or y.dtype.name == "bfloat16":
        y = y.astype(np.float32)
    if y.dtype.kind == "c":
        y = np.abs(y)
    return y


def _draw_record(ax: Any, x: np.ndarray, y: np.ndarray) -> None:
    flat = y.reshape(len(y), -1).astype(np.float64)
    style = point_style(len(x))
    if flat.shape[1] <= MAX_ELEMENTS:
        for j in range(flat.shape[1]):
            label = None if flat.shape[1] == 1 else str(np.unravel_index(j, y.shape[1:]))
            ax.plot(x, flat[:, j], lw=1, label=label, **style)
        if flat.shape[1] > 1:
            ax.legend(fontsize="x-small", ncol=4)
        return
    with np.errstate(invalid="ignore"):
        ax.fill_between(x, np.nanmin(flat, 1), np.nanmax(flat, 1), alpha=0.3, label="min..max")
        ax.plot(x, np.nanmean(flat, 1), lw=1, label="mean", **style)
    ax.legend(fontsize="x-small")


def title_of(path: str | Path, status: str | None) -> str:
    """``trajectory.h5 (violated)``: the file and how its run ended."""
    return f"{Path(path).name}" + (f" ({status})" if status else "")
