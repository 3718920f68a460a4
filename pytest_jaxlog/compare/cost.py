"""The cost wing: a readable JSON file of ``jl.Cost`` figures per platform, the comparison that
says which metric moved, and its picture."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..check.plots import new_figure, save_figure
from ..errors import JaxlogError
from ..profiling.cost import METRICS, Cost

FORMAT = "jaxlog-cost/1"


@dataclass(frozen=True)
class Moved:
    """One metric outside the tolerance: ``ratio`` is obtained / stored (inf when stored is 0)."""

    metric: str
    stored: float | None
    obtained: float | None
    ratio: float | None

    def describe(self) -> str:
        if self.stored is None or self.obtained is None:
            return f"{self.metric}: stored {_fmt(self.stored)}, obtained {_fmt(self.obtained)} (one is missing)"
        way = "more" if self.obtained > self.stored else "less"
        return f"{self.metric}: stored {_fmt(self.stored)}, obtained {_fmt(self.obtained)} " \
               f"(x{self.ratio:.4g}, {way})"

    @property
    def improved(self) -> bool:
        return self.stored is not None and self.obtained is not None and self.obtained < self.stored


def _fmt(v: Any) -> str:
    if v is None:
        return "none"
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:.6g}"


def read(path: Path) -> dict[str, Any]:
    """The file's entries by platform key; {} when the file does not exist."""
    path = Path(path)
    if not path.exists():
        return {}
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise JaxlogError(f"cost golden {path}: not readable JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("entries"), dict):
        raise JaxlogError(f"cost golden {path}: not a {FORMAT} file (expected {{'format': {FORMAT!r}, 'entries': "
                          "{...}}); regenerate it with --jaxlog-regen")
    for key, stored in doc["entries"].items():
        _check_entry(path, key, stored)
    return doc["entries"]


_PLATFORM_KINDS = {"backend": str, "device_kind": str, "jax_version": str, "x64": bool}


def _check_entry(path: Path, key: str, stored: Any) -> None:
    """An entry as ``write`` stores it: its platform fields of their kind, every metric a finite
    number >= 0 or null. A file of NaN or infinite figures would pass any kernel (every comparison
    with NaN is false), so it is refused when read, naming the file, the entry and the field."""
    where = f"[jaxlog] cost golden {path} entry {key!r}"
    if not isinstance(stored, dict) or not isinstance(stored.get("metrics"), dict):
        raise JaxlogError(f"{where}: not an object with 'metrics'; regenerate it with --jaxlog-regen")
    for field, kind in _PLATFORM_KINDS.items():
        if stored.get(field) is not None and not isinstance(stored[field], kind):
            raise JaxlogError(f"{where}: field {field!r} is {stored[field]!r:.60}, expected a {kind.__name__}; "
                              "regenerate it with --jaxlog-regen")
    for name, value in stored["metrics"].items():
        if value is not None and not is_figure(value):
            raise JaxlogError(f"{where}: metric {name!r} is {value!r:.60}, expected a finite number >= 0 or null; "
                              "regenerate it with --jaxlog-regen")


def is_figure(value: Any) -> bool:
    """A cost figure: a finite number >= 0 (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def entry(cost: Cost) -> dict[str, Any]:
    """What a file stores of one cost: its platform and its metrics (views' under ``views/...``)."""
    return {**cost.platform, "metrics": cost.metrics()}


def write(path: Path, cost: Cost, test: str) -> None:
    """Store ``cost`` as this platform's entry, keeping the other platforms' (atomic replace)."""
    path = Path(path)
    entries = read(path) if path.exists() else {}
    entries[cost.platform_key()] = entry(cost)
    doc = {"format": FORMAT, "test": test, "entries": dict(sorted(entries.items()))}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def selected(names: Iterable[str], metrics: Iterable[str] | None) -> list[str]:
    """The metric names a check compares: all, or those named (a plain name such as ``"flops"``
    selects it for the step and every view; ``"views/energy/flops"`` one figure)."""
    names = list(names)
    if metrics is None:
        return names
    if isinstance(metrics, str):
        metrics = [metrics]
    wanted = list(metrics)
    bad = [m for m in wanted if m not in METRICS and m not in names]
    if bad:
        raise JaxlogError(f"check_cost(metrics=...): unknown metric(s) {bad}; metrics are {list(METRICS)} "
                          "(a plain name applies to the step and every view) or 'views/<record>/<metric>'")
    return [n for n in names if n in wanted or n.rsplit("/", 1)[-1] in wanted]


def compare(stored: dict[str, Any], obtained: dict[str, Any], rtol: float,
            metrics: Iterable[str] | None = None, where: str = "the stored cost") -> list[Moved]:
    """The metrics that moved by more than ``rtol`` of the stored figure, either way; a metric
    present on one side only (a view added or dropped) counts as moved. A figure on either side
    that is not a finite number >= 0 is a JaxlogError naming it (``where``: the file and entry):
    a comparison with NaN is always false, so it would pass anything."""
    if isinstance(rtol, bool) or not isinstance(rtol, (int, float)) or not (0 <= rtol < math.inf):
        raise JaxlogError(f"check_cost: rtol must be a finite number >= 0, got {rtol!r}")
    moved = []
    for name in selected(sorted(set(stored) | set(obtained), key=_order), metrics):
        a, b = stored.get(name), obtained.get(name)
        for side, value in (("stored", a), ("obtained", b)):
            if value is not None and not is_figure(value):
                raise JaxlogError(f"[jaxlog] check_cost: {side} metric {name!r} of {where} is {value!r:.60}, not a "
                                  "finite number >= 0: it cannot be compared; regenerate it with --jaxlog-regen")
        if a is None and b is None:
            continue
        if a is None or b is None:
            moved.append(Moved(name, a, b, None))
        elif abs(b - a) > rtol * abs(a):
            moved.append(Moved(name, a, b, b / a if a else math.inf))
    return moved


def _order(name: str) -> tuple:
    """The step's metrics first in their usual order, then each view's."""
    head, _, last = name.rpartition("/")
    return (head, METRICS.index(last) if last in METRICS else len(METRICS), last)


def failure_message(shown: str, key: str, moved: Sequence[Moved], rtol: float, fix: str) -> str:
    """Which figures moved from the stored entry, ending with ``fix`` (the pytest side's words for
    the flag that rewrites it): a kernel made cheaper fails too, since a regression back to the
    stored figures would pass unseen, and its last line says so."""
    lines = [f"[jaxlog] compiled cost moved from cost golden {shown} [{key}] (rtol={rtol:g}):"]
    lines += [f"  {m.describe()}" for m in moved]
    if all(m.improved for m in moved):
        lines.append("every figure went down: if the kernel was made cheaper on purpose, store the new figures "
                     f"so a regression back is caught: {fix}")
    else:
        lines.append(f"if the change is intended, {fix}")
    return "\n".join(lines)

# ---------------------------------------------------------------------------------------------
# A picture of a cost regression: each compared metric's obtained figure as a multiple of the
# stored one, the tolerance band around 1, the metrics that moved in red.
#
# Why ratios: flops, bytes and kernel counts differ by orders of magnitude, so bars of the raw
# figures would hide a 3% move of one under the height of another; the figures themselves are
# written beside each bar.

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


def plot_regression(stored: dict[str, Any], obtained: dict[str, Any], rtol: float, metrics: Iterable[str] | None,
                    moved: Sequence[Moved], title: str, path: str | os.PathLike) -> Path:
    """The picture of a failed ``compare``: every compared metric (not only the moved ones, so a
    move reads against those that held), the moved ones red."""
    names = selected(sorted(set(stored) | set(obtained), key=_order), metrics)
    bad = {m.metric for m in moved}
    return plot_cost([CostBar(n, stored.get(n), obtained.get(n), n in bad) for n in names], rtol, title, path)


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
        ax.text(1.0, y, f"  {_bar_label(bar.stored)} \u2192 {_bar_label(bar.obtained)}", va="center", fontsize=7)
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


def _bar_label(v: float | None) -> str:
    if v is None:
        return "none"
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:.4g}"
