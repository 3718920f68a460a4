"""Small inline SVG plots of a scalar record for the session's HTML report: no matplotlib, no
script, a bounded size whatever the run's length.

A record of 60,000 steps keeps at most ``MAX_POINTS`` points: the steps are cut into buckets and
each bucket keeps its lowest and highest value (in step order), so a spike or a sudden drift in
a long run stays visible where plain striding would step over it. Non-finite values are left out
of the line and counted in the caption.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any

MAX_POINTS = 200  # points per sparkline at most
WIDTH, HEIGHT, PAD = 180, 36, 2


@dataclass(frozen=True)
class Series:
    """A record's points as drawn: steps and values (finite only), and what was left out."""

    steps: Any  # numpy int64 array
    values: Any  # numpy float64 array
    nonfinite: int
    frames: int


def downsample(steps: Any, values: Any, max_points: int = MAX_POINTS) -> Series:
    """At most ``max_points`` (step, value) pairs: each of ``max_points // 2`` buckets of steps keeps
    its minimum and maximum, in step order; non-finite values are dropped and counted."""
    import numpy as np

    steps = np.asarray(steps, np.int64).reshape(-1)
    values = np.asarray(values, np.float64).reshape(-1)
    finite = np.isfinite(values)
    s, v = steps[finite], values[finite]
    if len(v) > max_points:
        keep = np.union1d(_first_extreme(v, max_points // 2, np.minimum), _first_extreme(v, max_points // 2, np.maximum))
        s, v = s[keep], v[keep]
    return Series(s, v, int((~finite).sum()), len(values))


def _first_extreme(v: Any, buckets: int, ufunc: Any) -> Any:
    """The index of the first minimum (``np.minimum``) or maximum of each of ``buckets`` consecutive
    stretches of ``v``, cut as ``np.array_split`` cuts (vectorised: a long record in one pass)."""
    import numpy as np

    n, k = len(v), max(1, buckets)
    sizes = np.full(k, n // k)
    sizes[: n % k] += 1
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    extreme = ufunc.reduceat(v, starts)
    hits = np.flatnonzero(v == np.repeat(extreme, sizes))
    bucket = np.searchsorted(starts, hits, side="right") - 1
    _, first = np.unique(bucket, return_index=True)
    return hits[first]


def sparkline_svg(series: Series, title: str) -> str:
    """An inline ``<svg>`` of ``series`` (an escaped ``title`` as its tooltip), or a short note when
    nothing finite was recorded."""
    if len(series.values) == 0:
        return f'<span class="muted">{escape(title)}: no finite values</span>'
    x0, x1 = float(series.steps[0]), float(series.steps[-1])
    y0, y1 = float(series.values.min()), float(series.values.max())
    sx = (WIDTH - 2 * PAD) / (x1 - x0) if x1 > x0 else 0.0
    sy = (HEIGHT - 2 * PAD) / (y1 - y0) if y1 > y0 else 0.0
    pts = " ".join(f"{PAD + (float(x) - x0) * sx:.1f},{HEIGHT - PAD - (float(y) - y0) * sy:.1f}"
                   for x, y in zip(series.steps, series.values))
    if len(series.values) == 1:  # one frame: a level line across
        pts = f"{PAD},{HEIGHT / 2:.1f} {WIDTH - PAD},{HEIGHT / 2:.1f}"
    caption = f"{title}: {len(series.values)} of {series.frames} frames drawn, steps {int(x0)}..{int(x1)}, " \
              f"{y0:.6g}..{y1:.6g}" + (f", {series.nonfinite} not finite" if series.nonfinite else "")
    return (f'<svg class="spark" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img">'
            f'<title>{escape(caption)}</title><polyline fill="none" stroke="#1f77b4" stroke-width="1.2" '
            f'points="{pts}"/></svg>')
