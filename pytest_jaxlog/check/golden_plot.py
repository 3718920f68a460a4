"""A picture of a golden mismatch: the obtained trajectory drawn over the golden one, with the
error against the tolerance beside it and the first difference marked.

Why: a message says where the trajectories first part; the picture says how, whether they drift
apart slowly (a changed integrator order, float32 against float64) or jump at one step (a
changed branch), which tells a person whether to loosen a tolerance or look for a bug. Batched
runs draw the system that differs first. The figure takes the comparison's result (a
``jl.golden.Diff``) as it is, so the picture shows exactly what the message reports.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from .plot import new_figure, point_style, save_figure, step_axis

MAX_RECORDS = 3  # differing records drawn at most (the first ones the comparison reports)
DRAWN = ("values", "steps")  # kinds of difference that have two series to draw


def plot_golden_diff(obtained: Any, golden: Any, diff: Any, path: str | os.PathLike, *,
                     batched: bool = False) -> Path | None:
    """Draw ``diff`` (``jl.golden.diff_trajectories(obtained, golden)``) into ``path``; None when no
    difference has values to draw (a record missing, another shape or dtype)."""
    fig = draw_golden_diff(obtained, golden, diff, batched=batched)
    return None if fig is None else save_figure(fig, path)


def drawn_differences(obtained: Any, golden: Any, diff: Any) -> list[Any]:
    """The differences a figure shows: value and step differences of records on both sides, the
    comparison's first difference leading."""
    both = set(obtained.records) & set(golden.records)
    first = diff.first
    ordered = ([first] if first is not None else []) + [d for d in diff.differences if d is not first]
    return [d for d in ordered if d.kind in DRAWN and d.path in both][:MAX_RECORDS]


def draw_golden_diff(obtained: Any, golden: Any, diff: Any, *, batched: bool = False) -> Any:
    """The figure (matplotlib ``Figure`` on an Agg canvas), or None when nothing can be drawn: one row
    per differing record, obtained over golden on the left, ``|obtained - golden|`` against the
    tolerance ``atol + rtol * |golden|`` on the right, the first differing step marked on both."""
    shown = drawn_differences(obtained, golden, diff)
    if not shown:
        return None
    fig = new_figure(11, 3.2 * len(shown) + 0.4, "the golden mismatch")
    axes = fig.subplots(len(shown), 2, squeeze=False)
    for row, d in zip(axes, shown):
        _draw_record(row[0], row[1], obtained, golden, d, diff, batched)
    fig.suptitle(_title(diff), fontsize=9)
    fig.tight_layout()
    return fig


def element_label(path: str, index: tuple | None, batched: bool) -> str:
    """``energy (system 3)`` in a batched run, ``x[0, 2]`` for an element, else the record."""
    if not index:
        return path
    if batched:
        rest = "" if len(index) == 1 else "[" + ", ".join(map(str, index[1:])) + "]"
        return f"{path}{rest} (system {index[0]})"
    return path + "[" + ", ".join(map(str, index)) + "]"


def series(values: Any, index: tuple | None) -> np.ndarray:
    """One element's values per frame as float64: the element at ``index``, else the first one
    (complex values as their modulus)."""
    values = np.asarray(values)
    if values.dtype.kind == "V" or values.dtype.name in ("bfloat16", "float16") or "float8" in values.dtype.name:
        values = values.astype(np.float32)
    if index:
        values = values[(slice(None), *index)]
    flat = values.reshape(len(values), -1)
    column = flat[:, 0] if flat.shape[1] else np.full(len(flat), np.nan)
    if np.iscomplexobj(column):
        column = np.abs(column)
    return column.astype(np.float64)


def _draw_record(left: Any, right: Any, obtained: Any, golden: Any, d: Any, diff: Any, batched: bool) -> None:
    index = tuple(d.index) if d.index else None
    a_steps, e_steps = np.asarray(obtained.steps(d.path)), np.asarray(golden.steps(d.path))
    a, e = series(obtained[d.path], index), series(golden[d.path], index)
    label = element_label(d.path, index, batched)
    left.plot(e_steps, e, color="0.45", lw=2.2, label="golden", **point_style(len(e_steps)))
    left.plot(a_steps, a, color="tab:blue", lw=1.0, label="obtained", **point_style(len(a_steps)))
    common, ai, ei = np.intersect1d(a_steps, e_steps, return_indices=True)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a[ai] - e[ei])
        tol = diff.atol + diff.rtol * np.abs(e[ei])
    right.plot(common, err, color="tab:red", lw=1.0, label="|obtained - golden|", **point_style(len(common)))
    right.plot(common, tol, color="tab:green", lw=1.0, ls=":", label="tolerance")
    if np.nanmax(np.where(np.isfinite(err), err, np.nan), initial=0.0) > 0:
        right.set_yscale("symlog", linthresh=max(float(np.nanmin(np.where(err > 0, err, np.inf))), 1e-300))
    for ax in (left, right):
        if d.step is not None:
            ax.axvline(d.step, color="tab:red", ls="--", lw=1, label=f"first difference, step {d.step}")
        ax.set_xlabel("step")
        step_axis(ax, [*a_steps, *e_steps])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    left.set_ylabel(label, fontsize=8)
    right.set_ylabel("error", fontsize=8)
    left.set_title(d.summary()[:110], fontsize=8)


def _title(diff: Any) -> str:
    where = f": {Path(diff.expected_path).name}" if diff.expected_path else ""
    return f"obtained against golden{where} (rtol={diff.rtol:g}, atol={diff.atol:g})"
