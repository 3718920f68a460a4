"""Invariants on a reduction of many frames rather than on each frame: the mean acceptance rate of
an MCMC chain after burn-in, the average temperature of a thermostat, the largest step size.

A single frame of such a quantity says little (one proposal is accepted or not); the statistic
over a window of frames is what a test can bound. The reduction is streamed (a running sum,
minimum, ... per system and element), so memory does not grow with the window, and the running
state is a few arrays that ``Checker.state()`` saves for checkpoints.

When a window is judged: as soon as a frame at or after the window's last step that the record
is scheduled at has been seen (``jl.window(start, stop)``, ``jl.at(...)``, or a record that is
itself only taken on a bounded schedule). A window with no such last step (``steps=None``: the
whole run; ``jl.every(n, start=burn_in)``), or a run that ends before the window does (fewer
steps, a stop condition), is judged at the end of the run on the frames seen (``finish``); a
window in which no frame was recorded is not judged.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from ..errors import JaxlogError
from ..record.frames import LeafSpec, Schema
from ..record.schedule import Schedule
from . import args
from .bounds import Bounds, call_text
from .checker import Batch, Checker, Finding, Hit, Invariant
from .codec import decode_array
from .leaves import element, locate


class Reduction:
    """A streamed reduction over the frame axis: ``update`` folds a batch into the running
    ``acc`` (arrays of the leaf's shape, float64), ``value`` reads the statistic."""

    name = ""
    keys: tuple[str, ...] = ()

    def update(self, acc: dict, n: int, x: np.ndarray) -> dict:
        raise NotImplementedError

    def value(self, acc: dict, n: int) -> np.ndarray:
        raise NotImplementedError


class _Mean(Reduction):
    name, keys = "mean", ("sum",)

    def update(self, acc, n, x):
        return {"sum": x.sum(axis=0) + acc.get("sum", 0.0)}

    def value(self, acc, n):
        return acc["sum"] / n


class _Sum(_Mean):
    name = "sum"

    def value(self, acc, n):
        return acc["sum"]


class _Min(Reduction):
    name, keys = "min", ("min",)

    def update(self, acc, n, x):
        m = x.min(axis=0)  # NaN propagates, as in np.min
        return {"min": m if "min" not in acc else np.minimum(acc["min"], m)}

    def value(self, acc, n):
        return acc["min"]


class _Max(Reduction):
    name, keys = "max", ("max",)

    def update(self, acc, n, x):
        m = x.max(axis=0)
        return {"max": m if "max" not in acc else np.maximum(acc["max"], m)}

    def value(self, acc, n):
        return acc["max"]


class _Std(Reduction):
    """Population standard deviation (``np.std``, ddof=0), merged batch by batch (Chan et al.),
    which stays accurate where a running sum of squares would cancel."""

    name, keys = "std", ("mean", "m2")

    def update(self, acc, n, x):
        k = x.shape[0]
        mean_b = x.mean(axis=0)
        m2_b = ((x - mean_b) ** 2).sum(axis=0)
        if not n:
            return {"mean": mean_b, "m2": m2_b}
        delta = mean_b - acc["mean"]
        total = n + k
        return {"mean": acc["mean"] + delta * (k / total), "m2": acc["m2"] + m2_b + delta**2 * (n * k / total)}

    def value(self, acc, n):
        return np.sqrt(acc["m2"] / n)


REDUCTIONS: dict[str, Reduction] = {r.name: r for r in (_Mean(), _Sum(), _Min(), _Max(), _Std())}
_NUMPY: dict[Callable, str] = {np.mean: "mean", np.sum: "sum", np.min: "min", np.max: "max", np.std: "std",
                               np.amin: "min", np.amax: "max"}


def as_reduction(reduce: Any) -> Reduction:
    """A reduction by name ("mean") or as the numpy function (``np.mean``)."""
    name = reduce if isinstance(reduce, str) else _NUMPY.get(reduce)
    if name not in REDUCTIONS:
        raise JaxlogError(
            f"aggregate(reduce=...) takes one of {', '.join(map(repr, REDUCTIONS))} (or np.mean, np.sum, np.min, "
            f"np.max, np.std), got {reduce!r}: reductions are streamed so memory does not grow with the window"
        )
    return REDUCTIONS[name]


# --------------------------------------------------------------------------- the window's last step


_EMPTY = -1


@functools.lru_cache(maxsize=256)
def window_end(record: Schedule, window: Schedule | None) -> int | None:
    """The last step both the record's schedule and the window name: the window is complete once
    it has been seen. None: no such step before the end of the run; ``_EMPTY``: none at all."""
    ends = [e for e in (record.last_step(), None if window is None else window.last_step()) if e is not None]
    if not ends:
        return None
    lo = max(record.first_step(), 0 if window is None else window.first_step())
    hi = min(ends)
    block = 1 << 16
    while hi >= lo:  # backwards in blocks: the last common step is usually in the first one
        a = max(lo, hi - block + 1)
        steps = record.steps_between(a, hi)
        if window is not None:
            steps = steps[window.mask(steps)]
        if len(steps):
            return int(steps[-1])
        hi = a - 1
    return _EMPTY


# --------------------------------------------------------------------------- the invariant


class aggregate(Invariant):
    """``lo - atol <= reduce(frames in the window) <= hi + atol``, per system and element.

    ``reduce``: ``"mean"`` (default), ``"sum"``, ``"min"``, ``"max"`` or ``"std"`` (or ``np.mean``
    etc.), over the frames of ``record`` whose steps ``steps`` names: ``jl.window(burn_in, stop)``,
    ``jl.every(n, start=burn_in)``, ``jl.at(...)``, or None for every recorded frame. Bool
    records reduce as 0/1 (a mean is the fraction true). A record group means every leaf under it.

    The window is judged once its last step the record is scheduled at has been seen; an
    unbounded window, or a run that ends first, is judged at the end of the run on the frames
    seen. The violation's step is the window's last recorded step; its message names the
    reduction, the window, how many frames at which steps, and the value::

        jl.aggregate("acceptance", "mean", lo=0.2, hi=0.9, steps=jl.window(1000, 5000))
    """

    kinds = ("bool", "int", "float")

    def __init__(self, record: str, reduce: Any = "mean", *, lo: float | None = None, hi: float | None = None,
                 steps: Schedule | None = None, atol: float = 0.0):
        self.record = args.record_name(record, "aggregate()")
        self.records = (record,)
        self.reduction = as_reduction(reduce)
        self.reduce = self.reduction.name
        if steps is not None and not isinstance(steps, Schedule):
            raise JaxlogError(f"aggregate({record}): steps= takes a schedule (jl.window(start, stop), "
                              f"jl.every(n, start=...), jl.at(...)) or None for the whole run, got {steps!r}")
        self.steps = steps
        self.bounds = Bounds.parse(f"aggregate({record})", lo, hi, atol)
        self.name = call_text("aggregate", record, self.reduce, lo=lo, hi=hi, steps=steps, atol=atol or None)

    @property
    def window_text(self) -> str:
        return "the whole run" if self.steps is None else repr(self.steps)

    def leaves(self, schema: Schema) -> list[LeafSpec]:
        leaves = super().leaves(schema)
        for leaf in leaves:
            try:
                end = window_end(leaf.schedule, self.steps)
            except JaxlogError as exc:  # a schedule that does not say where it starts or ends
                cause = str(exc).removeprefix("[jaxlog] ")
                raise JaxlogError(f"invariant {self.name}: record {leaf.path!r}: {cause}") from None
            if end == _EMPTY:
                raise JaxlogError(f"invariant {self.name}: record {leaf.path!r} ({leaf.schedule!r}) is never "
                                  f"recorded in {self.window_text}: nothing to aggregate")
        return leaves

    def scan(self, batch: Batch, state: Any, schema: Schema) -> tuple[Any, Hit | None]:
        leaf, steps = batch.leaf, batch.steps
        if state is None:
            state = {"n": 0, "first": None, "last": None, "seen": None, "done": False}
        if state["done"]:
            return state, None
        end = window_end(leaf.schedule, self.steps)
        inside = np.ones(len(steps), bool) if self.steps is None else np.asarray(self.steps.mask(steps), bool)
        if end is not None:
            inside &= steps <= end
        if inside.any():
            x = np.asarray(batch.values[inside]).astype(np.float64)
            acc = self.reduction.update({k: state[k] for k in self.reduction.keys if k in state}, state["n"], x)
            state = {**state, **acc, "n": state["n"] + len(x), "last": int(steps[inside][-1])}
            if state["first"] is None:
                state["first"] = int(steps[inside][0])
        state["seen"] = int(steps[-1])
        if end is None or steps[-1] < end:
            return state, None
        state["done"] = True
        return state, self._judge(leaf, state, schema, complete=True)

    def finish(self, checker: Checker) -> Hit | None:
        """The run ended before these windows completed: judge the frames seen."""
        best = None
        for leaf in checker.leaves:
            state = checker.states.get(leaf.path)
            if state is None or state["done"]:
                continue
            state["done"] = True
            hit = self._judge(leaf, state, checker.schema, complete=False)
            if hit is not None and (best is None or hit.step < best.step):
                best = hit
        return best

    def _judge(self, leaf: LeafSpec, state: dict, schema: Schema, *, complete: bool) -> Hit | None:
        if not state["n"]:
            return None
        with np.errstate(all="ignore"):
            value = np.asarray(self.reduction.value(state, state["n"]))
        spot = locate(self.bounds.outside(value)[None], bool(schema.batched))
        if spot is None:
            return None
        v = element(value, spot.system, spot.index)
        window = self.window_text if complete else f"{self.window_text}, cut short: the run ended at step {state['seen']}"
        frames = f"{state['n']} frame{'s' if state['n'] != 1 else ''} at steps {state['first']}..{state['last']}"
        detail = f"{self.reduce} over {window}: {frames}; {self.bounds.why(v)}"
        return self.hit(leaf, state["last"], spot.system, spot.index, Finding(v, self.bounds.text, self.bounds.atol or None, detail))

    def load_state(self, leaf: LeafSpec, data: Any) -> Any:
        state = {k: data[k] for k in ("n", "first", "last", "seen", "done")}
        for k in self.reduction.keys:
            if k in data:
                state[k] = decode_array(data[k], np.float64).reshape(leaf.shape)
        return state
