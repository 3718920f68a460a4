"""The public invariants: what users pass as ``invariants=`` to ``jl.run`` and ``jl.Recorder``.

Each class is the whole invariant: its arguments, its name as shown in messages, which leaf
kinds it applies to, the vectorised check of a batch of frames and the wording of a violation
(see ``checker.Invariant`` for the contract). An invariant given a record group (``"energy"``
with leaves ``energy/kinetic`` and ``energy/total``) checks every leaf under it, each on its
own; the message names the leaf that broke and the group.

Drivers use :func:`bind_all` / :func:`check_all` / :func:`finish_all` and, for
``on_violation="warn"``, :func:`warn_violation`, which emits ``jl.JaxlogRuntimeWarning`` carrying
the violation as ``warning.violation``.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import JaxlogError
from ..record.frames import LeafSpec, Schema
from . import args
from .aggregate import aggregate
from .bounds import Bounds, call_text
from .checker import (
    RECENT,
    Batch,
    Checker,
    Finding,
    Hit,
    Invariant,
    Mask,
    as_list,
    bind_all,
    check_all,
    finish_all,
    restore_all,
    save_all,
)
from .codec import decode_array, fmt
from .leaves import as_numeric, element, isnan, leaf_kind, locate, numeric_dtype, scalar
from .violation import ON_VIOLATION, InvariantViolation, check_on_violation, warn_violation

__all__ = [
    "Invariant",
    "InvariantViolation",
    "Checker",
    "finite",
    "bounded",
    "conserved",
    "monotonic",
    "aggregate",
    "invariant",
    "as_list",
    "bind_all",
    "check_all",
    "finish_all",
    "save_all",
    "restore_all",
    "warn_violation",
    "check_on_violation",
    "ON_VIOLATION",
    "RECENT",
]


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
