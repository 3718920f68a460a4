"""A picture of a golden mismatch: the obtained trajectory drawn over the golden one, with the
error against the tolerance beside it and the first difference marked.

Why: a message says where the trajectories first part; the picture says how, whether they drift
apart slowly (a changed integrator order, float32 against float64) or jump at one step (a
changed branch), which tells a person whether to loosen a tolerance or look for a bug. Batched
runs draw the system that differs first. The figure takes the comparison's result (a
``jl.golden.Diff``) as it is, so the picture shows exactly what the message reports.

A record that is a field (a profile along one axis, an image on two) is drawn as a field: element
0 against the step would show nothing of where the error sits. Its row shows the obtained and
golden field at the first differing step, their difference there against the tolerance, and the
worst error over the field, as a fraction of its tolerance, at every step.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from .plot import new_figure, point_style, save_figure, step_axis

MAX_RECORDS = 3  # differing records drawn at most (the first ones the comparison reports)
FIELD_MIN = (8, 4)  # a frame (a system's, in batched runs) is a field: a 1-D profile of at least 8
# points, or an image of at least 4 x 4 (not an (atoms, 3) array of positions)
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
    fields = [field_rank(golden[d.path], batched) for d in shown]
    columns = max([2, *(2 + r for r in fields if r)])  # 1-D: 3 panels; 2-D: 4
    fig = new_figure(5.5 * columns, 3.2 * len(shown) + 0.4, "the golden mismatch")
    axes = fig.subplots(len(shown), columns, squeeze=False)
    for row, d, rank in zip(axes, shown, fields):
        if rank:
            used = _draw_field(list(row), obtained, golden, d, diff, batched, rank)
        else:
            _draw_record(row[0], row[1], obtained, golden, d, diff, batched)
            used = 2
        for ax in row[used:]:
            ax.set_visible(False)
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
    if index:
        values = values[(slice(None), *index)]
    flat = values.reshape(len(values), -1)
    return _floats(flat[:, 0] if flat.shape[1] else np.full(len(flat), np.nan))


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
        rtol, atol = diff.tol_for(d.path)
        tol = atol + rtol * np.abs(e[ei])
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


def field_rank(values: Any, batched: bool) -> int:
    """1 or 2 where each frame (each system's) of ``values`` is a profile or an image, else 0."""
    shape = np.shape(values)[2 if batched else 1:]
    if len(shape) == 1 and shape[0] >= FIELD_MIN[0]:
        return 1
    if len(shape) == 2 and min(shape) >= FIELD_MIN[1]:
        return 2
    return 0


def _draw_field(axes: list[Any], obtained: Any, golden: Any, d: Any, diff: Any, batched: bool, rank: int) -> int:
    """One field record's row; returns the axes used."""
    system: tuple[int, ...] = (int(d.index[0]),) if batched and d.index else ((0,) if batched else ())
    a_steps, e_steps = np.asarray(obtained.steps(d.path)), np.asarray(golden.steps(d.path))
    common, ai, ei = np.intersect1d(a_steps, e_steps, return_indices=True)
    pick: tuple[Any, ...] = (slice(None), *system)
    a_all = _floats(np.asarray(obtained[d.path])[ai][pick])
    e_all = _floats(np.asarray(golden[d.path])[ei][pick])
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        err = np.abs(a_all - e_all)
        rtol, atol = diff.tol_for(d.path)
        tol = atol + rtol * np.abs(e_all)
        ratio = np.where(err == 0, 0.0, err / tol)
    at = int(np.searchsorted(common, d.step)) if d.step is not None and d.step in common else 0
    a, e = a_all[at], e_all[at]
    step = int(common[at]) if len(common) else None
    name = d.path + (f" (system {system[0]})" if batched else "")
    if rank == 1:
        x = np.arange(a.shape[0])
        axes[0].plot(x, e, color="0.45", lw=2.2, label="golden")
        axes[0].plot(x, a, color="tab:blue", lw=1.0, label="obtained")
        axes[0].set_ylabel(name, fontsize=8)
        axes[1].plot(x, a - e, color="tab:red", lw=1.0, label="obtained - golden")
        axes[1].fill_between(x, -tol[at], tol[at], color="tab:green", alpha=0.2, label="tolerance")
        for ax in axes[:2]:
            ax.set_xlabel("index")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="best")
        axes[0].set_title(f"{d.path} at step {step}", fontsize=8)
        axes[1].set_title("difference at that step", fontsize=8)
        over = axes[2]
    else:
        lo, hi = np.nanmin([a.min(), e.min()]), np.nanmax([a.max(), e.max()])
        for ax, img, what in ((axes[0], e, "golden"), (axes[1], a, "obtained")):
            ax.imshow(img, vmin=lo, vmax=hi, cmap="viridis", label=what)
            ax.set_title(f"{what}: {name} at step {step}", fontsize=8)
        worst = float(np.nanmax(np.abs(a - e), initial=0.0)) or 1.0
        axes[2].imshow(a - e, vmin=-worst, vmax=worst, cmap="RdBu_r", label="obtained - golden")
        axes[2].set_title("obtained - golden", fontsize=8)
        over = axes[3]
    worst_ratio = ratio.reshape(len(common), -1).max(axis=1) if len(common) else np.zeros(0)
    over.plot(common, worst_ratio, color="tab:red", lw=1.0, label="worst |error| / tolerance over the field",
              **point_style(len(common)))
    over.axhline(1.0, color="tab:green", ls=":", lw=1, label="tolerance")
    if step is not None:
        over.axvline(step, color="tab:red", ls="--", lw=1, label=f"first difference, step {step}")
    over.set_xlabel("step")
    step_axis(over, [*a_steps, *e_steps])
    over.grid(alpha=0.3)
    over.legend(fontsize=7, loc="best")
    if np.any(worst_ratio > 0):
        over.set_yscale("symlog", linthresh=min(1.0, float(np.min(worst_ratio[worst_ratio > 0]))))
    return 3 if rank == 1 else 4


def _floats(values: np.ndarray) -> np.ndarray:
    """float64 for drawing: low floats widened, complex values as their modulus."""
    if values.dtype.kind == "V" or values.dtype.name in ("bfloat16", "float16") or "float8" in values.dtype.name:
        values = values.astype(np.float32)
    if np.iscomplexobj(values):
        values = np.abs(values)
    return values.astype(np.float64)


def _title(diff: Any) -> str:
    where = f": {Path(diff.expected_path).name}" if diff.expected_path else ""
    own = f"; {len(diff.per_record)} records at their own tolerances" if diff.per_record else ""
    return f"obtained against golden{where} (rtol={diff.rtol:g}, atol={diff.atol:g}{own})"
