"""Lower/upper bounds with an absolute tolerance, shared by ``bounded`` (each value) and
``aggregate`` (a reduction over a window): one rule for what lies outside and one wording."""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import numpy as np

from ..errors import JaxlogError
from ..record.frames import LeafSpec, Schema
from ..record.schedule import Schedule, schedule_from_json
from ..record import values as args
from .checker import (
    RECENT,
    Batch,
    Checker,
    Finding,
    Hit,
    Invariant,
    Mask,
    as_list,
    as_numeric,
    bind_all,
    check_all,
    element,
    finish_all,
    isnan,
    leaf_kind,
    locate,
    numeric_dtype,
    restore_all,
    save_all,
    scalar,
)
from .violation import ON_VIOLATION, InvariantViolation, check_on_violation, decode_array, fmt, warn_violation

__all__ = ['Invariant', 'InvariantViolation', 'Checker', 'finite', 'bounded', 'conserved', 'monotonic', 'aggregate', 'invariant', 'as_list', 'bind_all', 'check_all', 'finish_all', 'save_all', 'restore_all', 'warn_violation', 'check_on_violation', 'ON_VIOLATION', 'RECENT', 'spec_of', 'from_spec']

class Bounds(NamedTuple):
    lo: float | None
    hi: float | None
    atol: float

    @classmethod
    def parse(cls, what: str, lo: Any, hi: Any, atol: Any) -> "Bounds":
        """lo/hi (either may be None, not both, lo <= hi) and atol >= 0, validated."""
        lo = None if lo is None else args.real(lo, f"{what}: lo")
        hi = None if hi is None else args.real(hi, f"{what}: hi")
        if lo is None and hi is None:
            raise JaxlogError(f"{what} needs lo=, hi= or both")
        if lo is not None and hi is not None and not lo <= hi:
            raise JaxlogError(f"{what}: lo={lo!r} is greater than hi={hi!r}")
        return cls(lo, hi, args.tolerance(atol, f"{what}: atol"))

    @property
    def text(self) -> str:
        """``in [lo, hi]``, ``>= lo`` or ``<= hi``: the expected value in a message."""
        if self.lo is not None and self.hi is not None:
            return f"in [{fmt(self.lo)}, {fmt(self.hi)}]"
        if self.lo is not None:
            return f">= {fmt(self.lo)}"
        return f"<= {fmt(self.hi)}"

    def outside(self, x: np.ndarray) -> np.ndarray:
        """Where ``x`` lies outside ``[lo - atol, hi + atol]``; NaN is outside."""
        ok = np.ones(x.shape, dtype=bool)
        with np.errstate(all="ignore"):
            if self.lo is not None:
                ok &= x >= self.lo - self.atol
            if self.hi is not None:
                ok &= x <= self.hi + self.atol
            if x.dtype.kind == "f":
                ok &= ~np.isnan(x)
        return ~ok

    def why(self, value: Any) -> str:
        """Why ``value`` is outside, and by how much (from the bound itself, not the tolerance)."""
        if isnan(value):
            return "value is NaN"
        if self.lo is not None and value < self.lo:
            return f"below the lower bound by {fmt(self.lo - value)}"
        return f"above the upper bound by {fmt(value - self.hi)}"


def call_text(head: str, *parts: str, **options: Any) -> str:
    """``head(part, ..., key=value, ...)`` showing the options that are not None: an invariant's
    name, written the way it was called."""
    shown = [*parts, *(f"{k}={v!r}" for k, v in options.items() if v is not None)]
    return f"{head}({', '.join(shown)})"

# ---------------------------------------------------------------------------------------------
# Invariants on a reduction of many frames rather than on each frame: the mean acceptance rate of
# an MCMC chain after burn-in, the average temperature of a thermostat, the largest step size.
#
# A single frame of such a quantity says little (one proposal is accepted or not); the statistic
# over a window of frames is what a test can bound. The reduction is streamed (a running sum,
# minimum, ... per system and element), so memory does not grow with the window, and the running
# state is a few arrays that ``Checker.state()`` saves for checkpoints.
#
# When a window is judged: as soon as a frame at or after the window's last step that the record
# is scheduled at has been seen (``jl.window(start, stop)``, ``jl.at(...)``, or a record that is
# itself only taken on a bounded schedule). A window with no such last step (``steps=None``: the
# whole run; ``jl.every(n, start=burn_in)``), or a run that ends before the window does (fewer
# steps, a stop condition), is judged at the end of the run on the frames seen (``finish``); a
# window in which no frame was recorded is not judged.

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

# ---------------------------------------------------------------------------------------------
# The public invariants: what users pass as ``invariants=`` to ``jl.run`` and ``jl.Recorder``.
#
# Each class is the whole invariant: its arguments, its name as shown in messages, which leaf
# kinds it applies to, the vectorised check of a batch of frames and the wording of a violation
# (see ``checker.Invariant`` for the contract). An invariant given a record group (``"energy"``
# with leaves ``energy/kinetic`` and ``energy/total``) checks every leaf under it, each on its
# own; the message names the leaf that broke and the group.
#
# Drivers use :func:`bind_all` / :func:`check_all` / :func:`finish_all` and, for
# ``on_violation="warn"``, :func:`warn_violation`, which emits ``jl.JaxlogRuntimeWarning`` carrying
# the violation as ``warning.violation``.

class finite(Invariant):
    """No NaN/inf in the float and complex leaves of ``records`` (all records when none are named);
    integer, bool and key leaves are left out. A record group means every leaf under it."""

    def __init__(self, *records: str):
        self.records = tuple(args.record_name(r, "finite()") for r in records)
        self.name = f"finite({', '.join(self.records)})"

    def leaves(self, schema):
        leaves = self.resolve(schema) if self.records else list(schema.leaves)
        return [leaf for leaf in leaves if leaf_kind(leaf) in ("float", "complex")]

    def mask(self, leaf, steps, values, state):
        if np.dtype(leaf.dtype).kind not in "fc":  # bfloat16 and other ml_dtypes floats
            values = values.astype(np.float32)
        with np.errstate(all="ignore"):
            if np.isfinite(values.sum()):  # one pass and no mask: a NaN or inf anywhere makes it non-finite
                return Mask(None)
            return Mask(~np.isfinite(values))

    def describe(self, leaf, value, spot, context, state):
        return Finding(value, "finite")


class bounded(Invariant):
    """``lo - atol <= value <= hi + atol`` elementwise (either bound may be None); NaN is a violation.

    ``atol`` absorbs rounding at a bound: a float32 acceptance probability of ``1 + 1.2e-7``
    passes ``bounded("p", 0, 1, atol=1e-6)``. A record group means every leaf under it.
    """

    kinds = ("bool", "int", "float")

    def __init__(self, record: str, lo: float | None = None, hi: float | None = None, *, atol: float = 0.0):
        self.record = args.record_name(record, "bounded()")
        self.records = (record,)
        self.bounds = Bounds.parse(f"bounded({record})", lo, hi, atol)
        self.name = call_text("bounded", record, lo=lo, hi=hi, atol=atol or None)

    def mask(self, leaf, steps, values, state):
        return Mask(self.bounds.outside(as_numeric(leaf, values)))

    def describe(self, leaf, value, spot, context, state):
        return Finding(value, self.bounds.text, self.bounds.atol or None, self.bounds.why(value))


class conserved(Invariant):
    """``|x - x0| <= atol + rtol*|x0|`` against the first recorded value ``x0``, per system and
    element. A record group means every leaf under it, each against its own first value."""

    kinds = ("int", "float", "complex")

    def __init__(self, record: str, rtol: float = 0.0, atol: float = 0.0):
        self.record = args.record_name(record, "conserved()")
        self.records = (record,)
        self.rtol = args.tolerance(rtol, f"conserved({record}): rtol")
        self.atol = args.tolerance(atol, f"conserved({record}): atol")
        self.name = call_text("conserved", record, rtol=rtol or None, atol=atol or None)

    def mask(self, leaf, steps, values, state):
        x = as_numeric(leaf, values)
        if x.dtype.kind in "biu":
            x = x.astype(np.float64)
        if state is None:
            state = {"ref": np.array(x[0], copy=True)}
        ref = state["ref"]
        with np.errstate(all="ignore"):
            tol = self.atol + self.rtol * np.abs(ref)
            ok = np.abs(x - ref) <= tol  # NaN anywhere -> not ok
        return Mask(~ok, None, state)

    def describe(self, leaf, value, spot, context, state):
        ref = element(state["ref"], spot.system, spot.index)
        tol = self.atol + self.rtol * abs(ref)
        if isnan(value):
            detail = "value is NaN"
        elif isnan(ref):
            detail = "the first recorded value is NaN"
        else:
            with np.errstate(all="ignore"):
                drift = abs(value - ref)
                detail = f"relative drift {drift / abs(ref):.3g}" if ref != 0 else f"absolute drift {drift:.3g}"
        return Finding(value, ref, float(tol), detail)

    def load_state(self, leaf, data):
        dtype = np.complex128 if leaf_kind(leaf) == "complex" else np.float64
        return {"ref": decode_array(data["ref"], dtype).reshape(leaf.shape)}


class monotonic(Invariant):
    """Each recorded value ``>=`` (``>`` with ``strict``; ``<=``/``<`` when not ``increasing``) the
    previous one, across batches; NaN is a violation. A record group means every leaf under it."""

    kinds = ("bool", "int", "float")

    def __init__(self, record: str, increasing: bool = True, strict: bool = False):
        self.record = args.record_name(record, "monotonic()")
        self.records = (record,)
        self.increasing = args.flag(increasing, f"monotonic({record}): increasing")
        self.strict = args.flag(strict, f"monotonic({record}): strict")
        parts = [record] + (["increasing=False"] if not self.increasing else []) + (["strict=True"] if self.strict else [])
        self.name = f"monotonic({', '.join(parts)})"

    @property
    def operator(self) -> str:
        if self.increasing:
            return ">" if self.strict else ">="
        return "<" if self.strict else "<="

    def mask(self, leaf, steps, values, state):
        x = as_numeric(leaf, values)
        if state is not None:  # the last value of the previous batch
            prev = np.concatenate([state["value"][None], x[:-1]])
        else:
            prev = np.concatenate([x[:1], x[:-1]])  # first frame ever: compared with itself
        with np.errstate(all="ignore"):
            if self.increasing:
                ok = (x > prev) if self.strict else (x >= prev)
            else:
                ok = (x < prev) if self.strict else (x <= prev)
            if state is None:
                ok[0] = True
            if x.dtype.kind == "f":
                ok &= ~np.isnan(x)
        prev_steps = np.concatenate([[state["step"] if state is not None else -1], steps[:-1]])
        new = {"step": int(steps[-1]), "value": np.array(x[-1], copy=True)}
        return Mask(~ok, (prev_steps, prev), new)

    def describe(self, leaf, value, spot, context, state):
        prev_steps, prev = context
        pv = element(prev[spot.frame], spot.system, spot.index)
        ps = int(prev_steps[spot.frame])
        if isnan(value):
            detail = "value is NaN"
        elif isnan(pv):
            detail = f"previous value is NaN (step {ps})"
        else:
            detail = f"previous value {fmt(pv)} at step {ps}"
        return Finding(value, f"{self.operator} {fmt(pv)}", None, detail)

    def load_state(self, leaf, data):
        return {"step": int(data["step"]), "value": decode_array(data["value"], numeric_dtype(leaf)).reshape(leaf.shape)}


class invariant(Invariant):
    """A user check: ``predicate(values)`` -> bool per frame (or per frame and system), vectorised.

    ``values`` is the record's host array of shape (n_frames, *leaf_shape); when ``record`` names a
    record group with several leaves (recorded on one schedule), a dict {sub_path: array} of all
    of them at once. The message names the record and the user's ``name``.
    """

    def __init__(self, name: str, predicate: Callable[[Any], Any], record: str):
        if not isinstance(name, str) or not name:
            raise JaxlogError(f"invariant() needs a name (a non-empty string), got {name!r}")
        if not callable(predicate):
            raise JaxlogError(f"invariant {name}: predicate must be callable, got {predicate!r}")
        self.name = name
        self.predicate = predicate
        self.record = args.record_name(record, f"invariant {name}")
        self.records = (record,)

    def bind(self, schema: Schema) -> Checker:
        leaves = self.leaves(schema)
        if len({leaf.schedule for leaf in leaves}) > 1:
            raise JaxlogError(
                f"invariant {self.name}: the leaves of record {self.record!r} have different schedules "
                f"({', '.join(f'{leaf.path}: {leaf.schedule!r}' for leaf in leaves)})"
            )
        return Checker(self, schema, leaves)

    def _single(self, leaves: tuple[LeafSpec, ...]) -> bool:
        return len(leaves) == 1 and leaves[0].path == self.record

    def check_batch(self, checker: Checker, batches: list[Batch]) -> Hit | None:
        leaves = checker.leaves
        if len(batches) != len(leaves) or any(not np.array_equal(b.steps, batches[0].steps) for b in batches):
            raise JaxlogError(
                f"invariant {self.name}: the leaves of record {self.record!r} were not recorded at the same steps "
                f"in this batch; give the predicate a single leaf or record them on one schedule"
            )
        steps = batches[0].steps
        cut = len(self.record) + 1
        arg: Any = batches[0].values if self._single(leaves) else {b.leaf.path[cut:]: b.values for b in batches}
        try:
            ok = np.asarray(self.predicate(arg))
        except Exception as exc:  # the user's predicate broke: re-raised naming the invariant, record and steps
            raise JaxlogError(
                f"invariant {self.name}: the predicate raised {type(exc).__name__}: {exc} "
                f"(record {self.record!r}, steps {int(steps[0])}..{int(steps[-1])})"
            ) from exc
        n, n_sys = len(steps), checker.schema.n_systems
        allowed = [(n,)] + ([(n, n_sys)] if checker.batched and n_sys is not None else [])
        if ok.shape not in allowed:
            raise JaxlogError(
                f"invariant {self.name}: the predicate must return a bool array of shape "
                f"{' or '.join(str(s) for s in allowed)} (one per frame{' or per frame and system' if len(allowed) > 1 else ''}) "
                f"for record {self.record!r}, got shape {ok.shape} at steps {int(steps[0])}..{int(steps[-1])}"
            )
        spot = locate(~ok.astype(bool), batched=ok.ndim == 2)
        if spot is None:
            return None
        f, system = spot.frame, spot.system

        def at(values: np.ndarray) -> Any:
            return scalar(values[f] if system is None else values[f, system])

        value = at(batches[0].values) if self._single(leaves) else {k: at(v) for k, v in arg.items()}
        finding = Finding(value, "predicate true")
        return Hit(self.record, tuple(leaves), int(steps[f]), system, None, finding, None, True)

# ---------------------------------------------------------------------------------------------
# The built-in invariants as JSON, so a checkpoint can say which ones its run checked and a
# resume can check them again without being told (``jl.resume`` without ``invariants=``).
#
# Why only the built-ins: their arguments are numbers, record names and schedules, which JSON holds
# whole; ``jl.invariant``'s predicate (and any subclass) is code, which a file must never hold (opening
# one runs none). Such an invariant has no spec, and a resume asks for ``invariants=``.

def spec_of(inv: Any) -> dict | None:
    """``{"kind": ..., <its arguments>}``, or None for an invariant that is code (see above): only
    the built-in classes themselves, not subclasses, which may check otherwise."""
    kind = type(inv)
    if kind is finite:
        return {"kind": "finite", "records": list(inv.records)}
    if kind is bounded:
        return {"kind": "bounded", "record": inv.record, **inv.bounds._asdict()}
    if kind is conserved:
        return {"kind": "conserved", "record": inv.record, "rtol": inv.rtol, "atol": inv.atol}
    if kind is monotonic:
        return {"kind": "monotonic", "record": inv.record, "increasing": inv.increasing, "strict": inv.strict}
    if kind is aggregate:
        return {"kind": "aggregate", "record": inv.record, "reduce": inv.reduce, **inv.bounds._asdict(),
                "steps": None if inv.steps is None else inv.steps.to_json()}
    return None


def from_spec(spec: Any, name: str, where: str) -> Invariant:
    """The invariant ``spec`` describes, named ``name`` as the file's run named it (the name its
    saved state is matched by); a spec that is not one gives a ``JaxlogError`` naming ``where``."""
    try:
        kind = spec["kind"]
        if kind == "finite":
            inv: Invariant = finite(*spec["records"])
        elif kind == "bounded":
            inv = bounded(spec["record"], spec["lo"], spec["hi"], atol=spec["atol"])
        elif kind == "conserved":
            inv = conserved(spec["record"], rtol=spec["rtol"], atol=spec["atol"])
        elif kind == "monotonic":
            inv = monotonic(spec["record"], increasing=spec["increasing"], strict=spec["strict"])
        elif kind == "aggregate":
            steps = None if spec["steps"] is None else schedule_from_json(spec["steps"])
            inv = aggregate(spec["record"], spec["reduce"], lo=spec["lo"], hi=spec["hi"], steps=steps,
                            atol=spec["atol"])
        else:
            raise JaxlogError(f"unknown kind {kind!r}")
    except (JaxlogError, KeyError, TypeError, ValueError) as exc:
        cause = str(exc).removeprefix("[jaxlog] ")
        raise JaxlogError(f"{where}: invariant {name} cannot be rebuilt from the file ({type(exc).__name__}: "
                          f"{cause}); pass invariants= to jl.resume") from None
    inv.name = name
    return inv
