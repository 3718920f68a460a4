"""Invariants checked on host frames as they arrive, reporting the first bad step exactly.

An ``Invariant`` is a description (what to check on which records); ``bind(schema)`` validates it
against what is actually recorded (an unrecorded record or a check that cannot apply is a
``JaxlogError`` *before* the run starts) and returns a fresh stateful checker. A checker sees
frames in ascending step order, in batches of any size (a ``jl.run`` chunk or a ``Recorder``
flush), and finds the first violating frame with one vectorised numpy pass per leaf: results do
not depend on how the steps were split into batches.

Drivers use :func:`bind_all` / :func:`check_all` and, for ``on_violation="warn"``,
:func:`warn_violation`, which emits ``jl.JaxlogRuntimeWarning`` carrying the violation as
``warning.violation``. To make such warnings fail a test, use pytest's
``-W error::pytest_jaxlog.JaxlogRuntimeWarning`` (or ``filterwarnings`` in the config).
"""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ._errors import JaxlogError, JaxlogRuntimeWarning
from ._frames import Frames, LeafSpec, Schema

RECENT = 5  # how many recorded values (up to the violating step) a violation carries
ON_VIOLATION = ("raise", "warn", "record")

__all__ = [
    "Invariant",
    "InvariantViolation",
    "Checker",
    "finite",
    "bounded",
    "conserved",
    "monotonic",
    "invariant",
    "bind_all",
    "check_all",
    "warn_violation",
    "check_on_violation",
]


# --------------------------------------------------------------------------- formatting / JSON


def _fmt(v: Any) -> str:
    """Short human form of a value for messages (6 significant digits)."""
    if v is None:
        return "None"
    if isinstance(v, str):
        return v
    if isinstance(v, np.ndarray) and v.ndim > 0:
        return np.array2string(v, threshold=8, precision=6, separator=", ")
    if isinstance(v, np.ndarray):
        v = v.item()
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (complex, np.complexfloating)):
        v = complex(v)
        return f"({v.real:.6g}{v.imag:+.6g}j)"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items()) + "}"
    try:
        return f"{float(v):.6g}"
    except (TypeError, ValueError):
        return str(v)


def _enc(v: Any) -> Any:
    """JSON-able form: floats as floats, non-finite floats as "nan"/"inf"/"-inf", arrays as lists."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, np.ndarray):
        if v.ndim == 0:
            return _enc(v.item())
        return [_enc(x) for x in v]
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (complex, np.complexfloating)):
        v = complex(v)
        return {"real": _enc(v.real), "imag": _enc(v.imag)}
    if isinstance(v, (float, np.floating)) or hasattr(v, "__float__"):
        f = float(v)
        if math.isnan(f):
            return "nan"
        if math.isinf(f):
            return "inf" if f > 0 else "-inf"
        return f
    if isinstance(v, dict):
        return {str(k): _enc(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_enc(x) for x in v]
    return str(v)


_SPECIAL = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _dec(v: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, str):
        return _SPECIAL.get(v, v)
    if isinstance(v, dict):
        if set(v) == {"real", "imag"}:
            return complex(_dec(v["real"]), _dec(v["imag"]))
        return {k: _dec(x) for k, x in v.items()}
    if isinstance(v, list):
        items = [_dec(x) for x in v]
        try:
            arr = np.asarray(items)
        except ValueError:
            return items
        return arr if arr.dtype.kind in "biufc" else items
    return v


# --------------------------------------------------------------------------- the violation


class InvariantViolation(AssertionError):
    """An invariant failed at ``step`` (and ``system`` in batched runs); the message says what to look at.

    ``expected`` is the reference value for ``conserved`` (``tolerance`` is the allowed
    ``atol + rtol*|ref|``) and a human string otherwise. ``recent`` lists the last few
    ``(step, value)`` recorded for the same record/system/element, up to and including ``step``.
    """

    def __init__(
        self,
        invariant: str,
        *,
        record: str,
        step: int,
        system: int | None = None,
        index: tuple[int, ...] | None = None,
        value: Any = None,
        expected: Any = None,
        tolerance: float | None = None,
        detail: str | None = None,
        recent: Sequence[tuple[int, Any]] = (),
        artifacts: dict[str, Any] | None = None,
    ):
        self.invariant = invariant
        self.record = record
        self.step = int(step)
        self.system = None if system is None else int(system)
        self.index = None if index is None else tuple(int(i) for i in index)
        self.value = value
        self.expected = expected
        self.tolerance = None if tolerance is None else float(tolerance)
        self.detail = detail
        self.recent = [(int(s), v) for s, v in recent]
        self.artifacts = dict(artifacts or {})
        # whether the message names the record (when the leaf is not simply the named record)
        # name the leaf in the message unless the invariant's display name already does
        self._where = self.index is not None or not re.search(rf"[(, ]{re.escape(record)}[,)]", invariant)
        super().__init__(self._message())

    # -- message
    def _location(self) -> str:
        out = f" at step {self.step}"
        if self.system is not None:
            out += f" (system {self.system})"
        if self._where:
            out += f" in {self.record}"
            if self.index is not None:
                out += "[" + ", ".join(map(str, self.index)) + "]"
        return out

    def _message(self) -> str:
        if self.tolerance is not None:
            expected = f"{_fmt(self.expected)} ± {_fmt(self.tolerance)}"
        else:
            expected = _fmt(self.expected)
        head = f"[jaxlog] invariant {self.invariant} violated{self._location()}: value {_fmt(self.value)}, expected {expected}"
        if self.detail:
            head += f" ({self.detail})"
        lines = [head]
        if self.recent:
            what = self.record
            if self.index is not None:
                what += "[" + ", ".join(map(str, self.index)) + "]"
            if self.system is not None:
                what += f" (system {self.system})"
            lines.append(f"  last recorded values of {what}:")
            width = max(len(str(s)) for s, _ in self.recent)
            lines.extend(f"    step {s:>{width}}: {_fmt(v)}" for s, v in self.recent)
        for kind, path in self.artifacts.items():
            lines.append(f"  {kind}: {path}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.args[0] if self.args else self._message()

    def with_artifacts(self, artifacts: dict[str, Any]) -> "InvariantViolation":
        """Add the files where the evidence lives (trajectory, trace) and refresh the message."""
        self.artifacts.update(artifacts or {})
        self.args = (self._message(),)
        return self

    # -- JSON (stored in the trajectory file; no pickle)
    def to_json(self) -> dict:
        return {
            "invariant": self.invariant,
            "record": self.record,
            "step": self.step,
            "system": self.system,
            "index": None if self.index is None else list(self.index),
            "value": _enc(self.value),
            "expected": _enc(self.expected),
            "tolerance": _enc(self.tolerance),
            "detail": self.detail,
            "recent": [[s, _enc(v)] for s, v in self.recent],
            "artifacts": {k: str(v) for k, v in self.artifacts.items()},
            "message": self._message(),
        }

    @classmethod
    def from_json(cls, data: dict) -> "InvariantViolation":
        index = data.get("index")
        return cls(
            data["invariant"],
            record=data["record"],
            step=data["step"],
            system=data.get("system"),
            index=None if index is None else tuple(index),
            value=_dec(data.get("value")),
            expected=_dec(data.get("expected")),
            tolerance=_dec(data.get("tolerance")),
            detail=data.get("detail"),
            recent=[(s, _dec(v)) for s, v in data.get("recent", [])],
            artifacts={k: Path(v) for k, v in (data.get("artifacts") or {}).items()},
        )

    def __reduce__(self):  # copy/deepcopy/multiprocessing without a custom pickle format
        return (InvariantViolation.from_json, (self.to_json(),))

    def __repr__(self) -> str:
        sys = "" if self.system is None else f", system={self.system}"
        return f"InvariantViolation({self.invariant!r}, record={self.record!r}, step={self.step}{sys})"


# --------------------------------------------------------------------------- leaf helpers


def _leaf_kind(leaf: LeafSpec) -> str:
    """'key', 'bool', 'int', 'float', 'complex' (bfloat16 and other ml_dtypes floats are 'float')."""
    if leaf.key_impl is not None:
        return "key"
    dt = np.dtype(leaf.dtype)
    if dt.kind == "b":
        return "bool"
    if dt.kind in "iu":
        return "int"
    if dt.kind == "f":
        return "float"
    if dt.kind == "c":
        return "complex"
    try:  # bfloat16, float8_*: numpy kind 'V'
        import ml_dtypes

        ml_dtypes.finfo(dt)
        return "float"
    except Exception:
        return "other"


def _as_numeric(values: np.ndarray, kind: str) -> np.ndarray:
    """Values in a dtype numpy compares exactly: floats (incl. bfloat16) -> float64, complex -> complex128."""
    if kind == "float":
        return np.asarray(values).astype(np.float64, copy=False)
    if kind == "complex":
        return np.asarray(values).astype(np.complex128, copy=False)
    return np.asarray(values)


def _isnan(v: Any) -> bool:
    try:
        return bool(np.any(np.isnan(v)))
    except TypeError:
        return False


class _Hit:
    """A violation located inside one leaf's batch (built into an InvariantViolation only if it wins)."""

    __slots__ = ("leaf", "order", "frame", "system", "index", "step", "steps", "values", "ctx")

    def __init__(self, leaf, order, frame, system, index, step, steps, values, ctx):
        self.leaf, self.order, self.frame, self.system, self.index = leaf, order, frame, system, index
        self.step, self.steps, self.values, self.ctx = step, steps, values, ctx


def _locate(mask: np.ndarray, batched: bool) -> tuple[int, int | None, tuple[int, ...] | None] | None:
    """First violating frame; then the first system at that frame; then the first element.

    ``mask`` is (n_frames, *leaf_shape) with True where violated. With ``batched``, axis 1 is the
    system axis. Returns (frame, system, index) or None.
    """
    n = mask.shape[0]
    if n == 0:
        return None
    per_frame = mask.reshape(n, -1).any(axis=1)
    f = int(np.argmax(per_frame))
    if not per_frame[f]:
        return None
    row = mask[f]
    system = None
    if batched and row.ndim >= 1:
        per_sys = row.reshape(row.shape[0], -1).any(axis=1)
        system = int(np.argmax(per_sys))
        row = row[system]
    if row.ndim == 0:
        return f, system, None
    elem = int(np.argmax(row.ravel()))
    return f, system, tuple(int(i) for i in np.unravel_index(elem, row.shape))


def _pick(values: np.ndarray, system: int | None, index: tuple[int, ...] | None) -> np.ndarray:
    """values[..., system, *index] on the frame axis (values: (n, *leaf_shape))."""
    out = values
    if system is not None:
        out = out[:, system]
    if index is not None:
        out = out[(slice(None), *index)]
    return out


def _scalar(v: Any) -> Any:
    if isinstance(v, np.ndarray) and v.ndim == 0:
        return v.item()
    if isinstance(v, np.generic):
        return v.item()
    return v


# --------------------------------------------------------------------------- checkers


class Checker:
    """State of one invariant over one run. ``check(frames)`` -> first violation in the batch or None."""

    def __init__(self, inv: "Invariant", schema: Schema, leaves: Sequence[LeafSpec]):
        self.invariant = inv
        self.schema = schema
        self.batched = bool(schema.batched)
        self.leaves = tuple(leaves)
        self._tail: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._state: dict[str, Any] = {}

    # subclasses: mask of violations (n, *leaf_shape), or None for none, and the per-leaf state update
    def _mask(self, leaf: LeafSpec, steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, Any]:
        raise NotImplementedError

    def _describe(self, hit: _Hit) -> dict:
        raise NotImplementedError

    def _batch(self, frames: Frames, leaf: LeafSpec) -> tuple[np.ndarray, np.ndarray] | None:
        values = frames.values.get(leaf.path)
        if values is None:
            return None
        steps = np.asarray(frames.steps[leaf.path])
        if len(steps) == 0:
            return None
        values = np.asarray(values)
        if values.shape[1:] != tuple(leaf.shape):
            raise JaxlogError(
                f"invariant {self.invariant.name}: record {leaf.path!r} at step {int(steps[0])} has per-frame "
                f"shape {values.shape[1:]}, schema says {tuple(leaf.shape)}"
            )
        return steps, values

    def check(self, frames: Frames) -> "InvariantViolation | None":
        best: _Hit | None = None
        seen = []
        for order, leaf in enumerate(self.leaves):
            batch = self._batch(frames, leaf)
            if batch is None:
                continue
            steps, values = batch
            seen.append((leaf, steps, values))
            mask, ctx = self._mask(leaf, steps, values)
            where = None if mask is None else _locate(mask, self.batched)
            if where is not None:
                f, system, index = where
                step = int(steps[f])
                if best is None or step < best.step:
                    best = _Hit(leaf, order, f, system, index, step, steps, values, ctx)
        result = None if best is None else self._build(best)  # before the tails move past it
        for leaf, steps, values in seen:
            self._remember(leaf, steps, values)
        return result

    def _remember(self, leaf: LeafSpec, steps: np.ndarray, values: np.ndarray) -> None:
        old = self._tail.get(leaf.path)
        if old is not None and len(steps) < RECENT:
            steps = np.concatenate([old[0], steps])
            values = np.concatenate([old[1], values])
        self._tail[leaf.path] = (steps[-RECENT:].copy(), np.array(values[-RECENT:], copy=True))

    def _recent(self, hit: _Hit) -> list[tuple[int, Any]]:
        steps, values = hit.steps[: hit.frame + 1], hit.values[: hit.frame + 1]
        old = self._tail.get(hit.leaf.path)
        if old is not None and len(steps) < RECENT:
            steps = np.concatenate([old[0], steps])
            values = np.concatenate([old[1], values])
        steps, values = steps[-RECENT:], values[-RECENT:]
        picked = _pick(values, hit.system, hit.index)
        return [(int(s), _scalar(v)) for s, v in zip(steps, picked)]

    def _build(self, hit: _Hit) -> "InvariantViolation":
        desc = self._describe(hit)
        return InvariantViolation(
            self.invariant.name,
            record=hit.leaf.path,
            step=hit.step,
            system=hit.system,
            index=hit.index,
            recent=self._recent(hit),
            **desc,
        )

    def _value(self, hit: _Hit) -> Any:
        return _scalar(_pick(hit.values[hit.frame : hit.frame + 1], hit.system, hit.index)[0])


class _FiniteChecker(Checker):
    def _mask(self, leaf, steps, values):
        kind = _leaf_kind(leaf)
        if kind == "float" and np.dtype(leaf.dtype).kind != "f":
            values = values.astype(np.float32)
        with np.errstate(all="ignore"):
            if np.isfinite(values.sum()):  # one pass and no mask: a NaN or inf anywhere makes it non-finite
                return None, None
            return ~np.isfinite(values), None

    def _describe(self, hit):
        value = self._value(hit)
        return {"value": value, "expected": "finite"}


class _BoundedChecker(Checker):
    def _mask(self, leaf, steps, values):
        inv: bounded = self.invariant  # type: ignore[assignment]
        x = _as_numeric(values, _leaf_kind(leaf))
        ok = np.ones(x.shape, dtype=bool)
        with np.errstate(all="ignore"):
            if inv.lo is not None:
                ok &= x >= inv.lo
            if inv.hi is not None:
                ok &= x <= inv.hi
            if x.dtype.kind == "f":
                ok &= ~np.isnan(x)
        return ~ok, None

    def _describe(self, hit):
        inv: bounded = self.invariant  # type: ignore[assignment]
        value = self._value(hit)
        if _isnan(value):
            detail = "value is NaN"
        elif inv.lo is not None and value < inv.lo:
            detail = f"below the lower bound by {_fmt(inv.lo - value)}"
        else:
            detail = f"above the upper bound by {_fmt(value - inv.hi)}"
        return {"value": value, "expected": inv.expected_text, "detail": detail}


class _ConservedChecker(Checker):
    def _mask(self, leaf, steps, values):
        inv: conserved = self.invariant  # type: ignore[assignment]
        x = _as_numeric(values, _leaf_kind(leaf))
        if x.dtype.kind in "biu":
            x = x.astype(np.float64)
        ref = self._state.get(leaf.path)
        if ref is None:
            ref = np.array(x[0], copy=True)
            self._state[leaf.path] = ref
        with np.errstate(all="ignore"):
            tol = inv.atol + inv.rtol * np.abs(ref)
            ok = np.abs(x - ref) <= tol  # NaN anywhere -> not ok
        return ~ok, None

    def _describe(self, hit):
        inv: conserved = self.invariant  # type: ignore[assignment]
        value = self._value(hit)
        ref = self._state[hit.leaf.path]
        if hit.system is not None:
            ref = ref[hit.system]
        if hit.index is not None:
            ref = ref[hit.index]
        ref = _scalar(ref)
        tol = inv.atol + inv.rtol * abs(ref)
        if _isnan(value):
            detail = "value is NaN"
        elif _isnan(ref):
            detail = "the first recorded value is NaN"
        else:
            with np.errstate(all="ignore"):
                drift = abs(value - ref)
                detail = f"relative drift {drift / abs(ref):.3g}" if ref != 0 else f"absolute drift {drift:.3g}"
        return {"value": value, "expected": ref, "tolerance": float(tol), "detail": detail}


class _MonotonicChecker(Checker):
    def _mask(self, leaf, steps, values):
        inv: monotonic = self.invariant  # type: ignore[assignment]
        x = _as_numeric(values, _leaf_kind(leaf))
        last = self._state.get(leaf.path)  # (step, value) of the previous frame
        if last is not None:
            prev = np.concatenate([last[1][None], x[:-1]])
        else:
            prev = np.concatenate([x[:1], x[:-1]])  # first frame ever: compared with itself
        with np.errstate(all="ignore"):
            if inv.increasing:
                ok = (x > prev) if inv.strict else (x >= prev)
            else:
                ok = (x < prev) if inv.strict else (x <= prev)
            if last is None:
                ok[0] = True
            if x.dtype.kind == "f":
                ok &= ~np.isnan(x)
        prev_steps = np.concatenate([[last[0] if last is not None else -1], steps[:-1]])
        self._state[leaf.path] = (int(steps[-1]), np.array(x[-1], copy=True))
        return ~ok, (prev_steps, prev)

    def _describe(self, hit):
        inv: monotonic = self.invariant  # type: ignore[assignment]
        prev_steps, prev = hit.ctx
        value = self._value(hit)
        pv = _scalar(_pick(prev[hit.frame : hit.frame + 1], hit.system, hit.index)[0])
        ps = int(prev_steps[hit.frame])
        op = (">" if inv.strict else ">=") if inv.increasing else ("<" if inv.strict else "<=")
        detail = "value is NaN" if _isnan(value) else f"previous value {_fmt(pv)} at step {ps}"
        if not _isnan(value) and _isnan(pv):
            detail = f"previous value is NaN (step {ps})"
        return {"value": value, "expected": f"{op} {_fmt(pv)}", "detail": detail}


class _PredicateChecker(Checker):
    def __init__(self, inv, schema, leaves, prefix):
        super().__init__(inv, schema, leaves)
        self.prefix = prefix
        self._single = len(leaves) == 1 and leaves[0].path == prefix

    def check(self, frames):
        inv: invariant = self.invariant  # type: ignore[assignment]
        batches = [self._batch(frames, leaf) for leaf in self.leaves]
        present = [b for b in batches if b is not None]
        if not present:
            return None
        if len(present) != len(batches) or any(not np.array_equal(b[0], present[0][0]) for b in present):
            raise JaxlogError(
                f"invariant {inv.name}: the leaves of record {self.prefix!r} were not recorded at the same steps "
                f"in this batch; give the predicate a single leaf or record them on one schedule"
            )
        steps = present[0][0]
        n = len(steps)
        if self._single:
            arg: Any = present[0][1]
        else:
            arg = {leaf.path[len(self.prefix) + 1 :]: b[1] for leaf, b in zip(self.leaves, batches)}
        try:
            ok = np.asarray(inv.predicate(arg))
        except Exception as exc:  # the user's predicate broke: say which invariant, record and steps
            raise JaxlogError(
                f"invariant {inv.name}: the predicate raised {type(exc).__name__}: {exc} "
                f"(record {self.prefix!r}, steps {int(steps[0])}..{int(steps[-1])})"
            ) from exc
        n_sys = self.schema.n_systems
        allowed = [(n,)] + ([(n, n_sys)] if self.batched and n_sys is not None else [])
        if ok.shape not in allowed:
            raise JaxlogError(
                f"invariant {inv.name}: the predicate must return a bool array of shape "
                f"{' or '.join(str(s) for s in allowed)} (one per frame{' or per frame and system' if len(allowed) > 1 else ''}) "
                f"for record {self.prefix!r}, got shape {ok.shape} at steps {int(steps[0])}..{int(steps[-1])}"
            )
        where = _locate(~ok.astype(bool), batched=ok.ndim == 2)
        result = None
        if where is not None:
            f, system, _ = where
            if self._single:
                value = present[0][1][f] if system is None else present[0][1][f, system]
            else:
                value = {k: (v[f] if system is None else v[f, system]) for k, v in arg.items()}
            recent = self._recent_multi(steps, batches, f, system)
            result = InvariantViolation(
                inv.name,
                record=self.prefix,
                step=int(steps[f]),
                system=system,
                value=_scalar(value) if not isinstance(value, dict) else {k: _scalar(v) for k, v in value.items()},
                expected="predicate true",
                recent=recent,
            )
        for leaf, b in zip(self.leaves, batches):
            self._remember(leaf, *b)
        return result

    def _recent_multi(self, steps, batches, f, system):
        per_leaf = {}
        out_steps = None
        for leaf, (s, v) in zip(self.leaves, batches):
            hit = _Hit(leaf, 0, f, system, None, int(s[f]), s, v, None)
            rec = self._recent(hit)
            per_leaf[leaf.path] = rec
            out_steps = [st for st, _ in rec]
        if self._single:
            return per_leaf[self.leaves[0].path]
        return [
            (st, {leaf.path[len(self.prefix) + 1 :]: per_leaf[leaf.path][i][1] for leaf in self.leaves})
            for i, st in enumerate(out_steps)
        ]


# --------------------------------------------------------------------------- invariants


def _num(x: Any, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise JaxlogError(f"{what} must be a real number, got {x!r}")
    return float(x)


def _check_record_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name:
        raise JaxlogError(f"{what} needs a record name (a non-empty string), got {name!r}")
    return name


class Invariant:
    """Base class: ``name`` (as shown in messages), ``records`` (names as given), ``bind(schema)``."""

    name: str = "invariant"
    records: tuple[str, ...] = ()
    _checker: type[Checker] = Checker
    _forbidden: tuple[str, ...] = ("key", "other")

    def _leaves(self, schema: Schema) -> list[LeafSpec]:
        leaves = self._resolve(schema)
        for leaf in leaves:
            kind = _leaf_kind(leaf)
            if kind in self._forbidden:
                what = {"key": "a PRNG key", "other": f"dtype {np.dtype(leaf.dtype)}"}.get(kind, kind)
                raise JaxlogError(
                    f"invariant {self.name} cannot apply to record {leaf.path!r}: it is {what} "
                    f"({np.dtype(leaf.dtype)}{', ' + leaf.key_impl if leaf.key_impl else ''})"
                )
        return leaves

    def _resolve(self, schema: Schema) -> list[LeafSpec]:
        wanted: set[str] = set()
        for rec in self.records:
            try:
                wanted.update(schema.resolve(rec))
            except JaxlogError as exc:  # say which invariant asked, and what is recorded
                raise JaxlogError(f"invariant {self.name}: {str(exc).removeprefix('[jaxlog] ')}") from None
        return [leaf for leaf in schema.leaves if leaf.path in wanted]

    def bind(self, schema: Schema) -> Checker:
        """Validate against what is recorded and return a fresh checker for one run."""
        return self._checker(self, schema, self._leaves(schema))

    def __repr__(self) -> str:
        return self.name


class finite(Invariant):
    """No NaN/inf in float and complex leaves of ``records`` (all records when none are named)."""

    _checker = _FiniteChecker

    def __init__(self, *records: str):
        self.records = tuple(_check_record_name(r, "finite()") for r in records)
        self.name = f"finite({', '.join(self.records)})"

    def _leaves(self, schema):
        leaves = self._resolve(schema) if self.records else list(schema.leaves)
        return [leaf for leaf in leaves if _leaf_kind(leaf) in ("float", "complex")]


class bounded(Invariant):
    """lo <= value <= hi elementwise (either bound may be None); NaN is a violation."""

    _checker = _BoundedChecker
    _forbidden = ("key", "other", "complex")

    def __init__(self, record: str, lo: float | None = None, hi: float | None = None):
        self.record = _check_record_name(record, "bounded()")
        self.records = (record,)
        self.lo = None if lo is None else _num(lo, "bounded(lo=...)")
        self.hi = None if hi is None else _num(hi, "bounded(hi=...)")
        if self.lo is None and self.hi is None:
            raise JaxlogError(f"bounded({record}) needs lo=, hi= or both")
        if self.lo is not None and self.hi is not None and not self.lo <= self.hi:
            raise JaxlogError(f"bounded({record}): lo={lo!r} is greater than hi={hi!r}")
        parts = [record] + [f"{k}={v!r}" for k, v in (("lo", lo), ("hi", hi)) if v is not None]
        self.name = f"bounded({', '.join(parts)})"

    @property
    def expected_text(self) -> str:
        if self.lo is not None and self.hi is not None:
            return f"in [{_fmt(self.lo)}, {_fmt(self.hi)}]"
        if self.lo is not None:
            return f">= {_fmt(self.lo)}"
        return f"<= {_fmt(self.hi)}"


class conserved(Invariant):
    """|x - x0| <= atol + rtol*|x0| against the first recorded value (per system and element)."""

    _checker = _ConservedChecker
    _forbidden = ("key", "other", "bool")

    def __init__(self, record: str, rtol: float = 0.0, atol: float = 0.0):
        self.record = _check_record_name(record, "conserved()")
        self.records = (record,)
        self.rtol = _num(rtol, "conserved(rtol=...)")
        self.atol = _num(atol, "conserved(atol=...)")
        if not (self.rtol >= 0 and self.atol >= 0 and math.isfinite(self.rtol) and math.isfinite(self.atol)):
            raise JaxlogError(f"conserved({record}): rtol and atol must be finite and >= 0, got rtol={rtol!r}, atol={atol!r}")
        parts = [record] + [f"{k}={v!r}" for k, v in (("rtol", rtol), ("atol", atol)) if v]
        self.name = f"conserved({', '.join(parts)})"


class monotonic(Invariant):
    """Each recorded value >= (or >, <=, <) the previous one, across batches; NaN is a violation."""

    _checker = _MonotonicChecker
    _forbidden = ("key", "other", "complex")

    def __init__(self, record: str, increasing: bool = True, strict: bool = False):
        self.record = _check_record_name(record, "monotonic()")
        self.records = (record,)
        self.increasing = bool(increasing)
        self.strict = bool(strict)
        parts = [record] + (["increasing=False"] if not increasing else []) + (["strict=True"] if strict else [])
        self.name = f"monotonic({', '.join(parts)})"


class invariant(Invariant):
    """A user check: ``predicate(values)`` -> bool per frame (or per frame and system), vectorised.

    ``values`` is the record's host array of shape (n_frames, *leaf_shape); when ``record`` names a
    prefix with several leaves (recorded on one schedule), a dict {sub_path: array} instead.
    """

    def __init__(self, name: str, predicate: Callable[[Any], Any], record: str):
        if not isinstance(name, str) or not name:
            raise JaxlogError(f"invariant() needs a name (a non-empty string), got {name!r}")
        if not callable(predicate):
            raise JaxlogError(f"invariant {name}: predicate must be callable, got {predicate!r}")
        self.name = name
        self.predicate = predicate
        self.record = _check_record_name(record, f"invariant {name}")
        self.records = (record,)

    def bind(self, schema):
        leaves = self._leaves(schema)
        if len({leaf.schedule for leaf in leaves}) > 1:
            raise JaxlogError(
                f"invariant {self.name}: the leaves of record {self.record!r} have different schedules "
                f"({', '.join(f'{leaf.path}: {leaf.schedule!r}' for leaf in leaves)})"
            )
        return _PredicateChecker(self, schema, leaves, self.record)


# --------------------------------------------------------------------------- driver helpers


def check_on_violation(mode: Any) -> str:
    if mode not in ON_VIOLATION:
        raise JaxlogError(f"on_violation must be one of {', '.join(map(repr, ON_VIOLATION))}, got {mode!r}")
    return mode


def as_list(invariants: Iterable[Invariant] | Invariant | None) -> tuple:
    """``invariants=`` as a tuple: None, one invariant or an iterable of them."""
    if invariants is None:
        return ()
    if isinstance(invariants, Invariant):
        return (invariants,)
    try:
        return tuple(invariants)
    except TypeError:
        raise JaxlogError(f"invariants= takes jl.finite/bounded/conserved/monotonic/invariant objects "
                          f"(one, or a list of them), got {invariants!r}") from None


def bind_all(invariants: Iterable[Invariant] | Invariant | None, schema: Schema) -> list[Checker]:
    """Bind every invariant (before the run: raises JaxlogError on unrecorded records)."""
    if invariants is None:
        return []
    if isinstance(invariants, Invariant):
        invariants = (invariants,)
    out = []
    for inv in invariants:
        if not isinstance(inv, Invariant):
            raise JaxlogError(f"invariants must be jl.finite/bounded/conserved/monotonic/invariant objects, got {inv!r}")
        out.append(inv.bind(schema))
    return out


def check_all(checkers: Sequence[Checker], frames: Frames) -> InvariantViolation | None:
    """Run every checker on a batch (all of them, so each keeps its state); the earliest violation wins.

    Ties on the step go to the invariant listed first.
    """
    best = None
    for checker in checkers:
        v = checker.check(frames)
        if v is not None and (best is None or v.step < best.step):
            best = v
    return best


def warn_violation(violation: InvariantViolation, stacklevel: int = 2) -> None:
    """``on_violation="warn"``: a JaxlogRuntimeWarning whose ``.violation`` is the InvariantViolation."""
    w = JaxlogRuntimeWarning(str(violation))
    w.violation = violation  # type: ignore[attr-defined]
    warnings.warn(w, stacklevel=stacklevel + 1)
