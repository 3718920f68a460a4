"""A picture of a trajectory's records against step (or time): ``jaxlog plot``'s figure.

Why its own module: the command line draws what a person asks to see of a kept trajectory, and a
test reads the figure back (its ticks, its markers) instead of a PNG. Short records read as the
failure plots do: a marker on each of a few frames (a lone frame is a visible point, not an
empty panel) and ticks at whole steps. Drawn with matplotlib's object API on an Agg canvas.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import JaxlogError
from .plot import new_figure, point_style, step_axis

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
