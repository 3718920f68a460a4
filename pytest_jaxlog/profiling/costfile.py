"""Cost goldens: a readable JSON file of ``jl.Cost`` figures per platform (backend, device kind,
jax version, x64), and the comparison that says which metric moved.

XLA's figures change between jax versions and backends, so one file keeps one entry per platform
and a check compares only with the entry for its own; regenerating one platform's entry keeps
the others. The figures are exact for a given platform, so the default tolerance is zero, and a
metric that went *down* beyond the tolerance fails too: the stored figures must stay the true
ones, or a later regression back to the old figure would pass unnoticed.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..errors import JaxlogError
from .cost import METRICS, Cost

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
