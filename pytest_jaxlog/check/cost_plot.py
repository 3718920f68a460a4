"""A picture of a cost regression: each compared metric's obtained figure as a multiple of the
stored one, the tolerance band around 1, the metrics that moved in red.

Why ratios: flops, bytes and kernel counts differ by orders of magnitude, so bars of the raw
figures would hide a 3% move of one under the height of another; the figures themselves are
written beside each bar.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .plot import new_figure, save_figure

MAX_METRICS = 40  # bars drawn at most: the moved metrics first, then the others in their order


@dataclass(frozen=True)
class CostBar:
    """One compared metric: its stored and obtained figures (None where one side lacks it)."""

    metric: str
    stored: float | None
    obtained: float | None
    moved: bool

    @property
    def ratio(self) -> float | None:
        """obtained / stored; None when a side is missing or the stored figure is 0."""
        if self.stored is None or self.obtained is None or self.stored == 0:
            return None
        return float(self.obtained) / float(self.stored)


def plot_cost(bars: Sequence[CostBar], rtol: float, title: str, path: str | os.PathLike) -> Path:
    """Draw ``bars`` into ``path`` (PNG or SVG by its suffix)."""
    return save_figure(draw_cost(bars, rtol, title), path)


def draw_cost(bars: Sequence[CostBar], rtol: float, title: str) -> Any:
    """The figure: one horizontal bar per metric at obtained / stored, a line at 1 with the band
    ``1 ± rtol``; moved metrics red, the others grey; missing sides drawn as an empty slot."""
    shown = sorted(bars, key=lambda b: not b.moved)[:MAX_METRICS]
    fig = new_figure(9, 0.32 * len(shown) + 1.6, "the cost regression")
    ax = fig.add_subplot()
    ys = list(range(len(shown)))[::-1]
    for y, bar in zip(ys, shown):
        ratio = bar.ratio
        if ratio is not None and math.isfinite(ratio):
            ax.barh(y, ratio, color="tab:red" if bar.moved else "0.6", height=0.7)
        ax.text(1.0, y, f"  {_fmt(bar.stored)} \u2192 {_fmt(bar.obtained)}", va="center", fontsize=7)
    ax.axvline(1.0, color="black", lw=1)
    if rtol:
        ax.axvspan(1.0 - rtol, 1.0 + rtol, color="tab:green", alpha=0.15, label=f"1 \u00b1 rtol ({rtol:g})")
        ax.legend(fontsize=7, loc="lower right")
    ax.set_yticks(ys, [b.metric for b in shown], fontsize=7)
    ax.set_xlabel("obtained / stored")
    ax.set_title(title[:120], fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def _fmt(v: float | None) -> str:
    if v is None:
        return "none"
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:.4g}"
