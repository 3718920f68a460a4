"""Reading one leaf's frames the way every invariant needs: which kind of numbers it holds, values
in a dtype numpy compares exactly, and the first violating frame, system and element of a mask.

The search order (frame first, then system, then element) is what makes a violation's location
independent of how the run split its steps into batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np

from ..errors import JaxlogError
from ..record.frames import Frames, LeafSpec, Schema
from .violation import InvariantViolation, decode_array, encode


def leaf_kind(leaf: LeafSpec) -> str:
    """'key', 'bool', 'int', 'float', 'complex' or 'other' (bfloat16 and other ml_dtypes floats are 'float')."""
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
    import ml_dtypes

    try:  # bfloat16, float8_*: numpy kind 'V'
        ml_dtypes.finfo(dt)
    except ValueError:  # not a float type ml_dtypes knows: nothing numeric to check
        return "other"
    return "float"


def numeric_dtype(leaf: LeafSpec) -> np.dtype:
    """The dtype values of ``leaf`` are compared in: float64 for floats (bfloat16 included),
    complex128 for complex, the leaf's own dtype otherwise."""
    kind = leaf_kind(leaf)
    if kind == "float":
        return np.dtype(np.float64)
    if kind == "complex":
        return np.dtype(np.complex128)
    return np.dtype(leaf.dtype)


def as_numeric(leaf: LeafSpec, values: np.ndarray) -> np.ndarray:
    """``values`` in :func:`numeric_dtype` (no copy when already there)."""
    return np.asarray(values).astype(numeric_dtype(leaf), copy=False)


def isnan(v: Any) -> bool:
    try:
        return bool(np.any(np.isnan(v)))
    except TypeError:  # ints, bools, strings: never NaN
        return False


def scalar(v: Any) -> Any:
    """A 0-d array or numpy scalar as a Python number; anything else unchanged."""
    if isinstance(v, np.ndarray) and v.ndim == 0:
        return v.item()
    if isinstance(v, np.generic):
        return v.item()
    return v


class Spot(NamedTuple):
    """Where in a batch a mask first says "violated"."""

    frame: int
    system: int | None
    index: tuple[int, ...] | None


def locate(mask: np.ndarray, batched: bool) -> Spot | None:
    """First violating frame; then the first system at that frame; then the first element.

    ``mask`` is (n_frames, *leaf_shape) with True where violated. With ``batched``, axis 1 is the
    system axis.
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
        return Spot(f, system, None)
    elem = int(np.argmax(row.ravel()))
    return Spot(f, system, tuple(int(i) for i in np.unravel_index(elem, row.shape)))


def pick(values: np.ndarray, system: int | None, index: tuple[int, ...] | None) -> np.ndarray:
    """values[:, system, *index] (values: (n, *leaf_shape)); the frame axis stays."""
    out = values
    if system is not None:
        out = out[:, system]
    if index is not None:
        out = out[(slice(None), *index)]
    return out


def element(values: np.ndarray, system: int | None, index: tuple[int, ...] | None) -> Any:
    """values[system, *index] of one frame (no frame axis) as a Python number."""
    return scalar(pick(np.asarray(values)[None], system, index)[0])

# ---------------------------------------------------------------------------------------------
# How an invariant is checked over a run: the ``Invariant`` contract and the one ``Checker`` that
# runs any invariant on frames as they arrive.
#
# An ``Invariant`` is a description (what to check on which records) that also carries the check:
# ``scan`` looks at one leaf's batch of frames with its running state and says where the first
# violation is and how to word it (a ``Finding``). ``bind(schema)`` validates the description against
# what is actually recorded (an unrecorded record or a check that cannot apply is a ``JaxlogError``
# *before* the run starts) and returns a fresh ``Checker``: the per-run part, holding each leaf's
# state and its last few values (for the message). So adding an invariant is one class.
#
# A checker sees frames in ascending step order, in batches of any size (a ``jl.run`` chunk or a
# ``Recorder`` flush), and finds the first violating frame with one vectorised numpy pass per leaf:
# results do not depend on how the steps were split into batches. ``state()``/``restore()`` give its
# running state as a JSON-able dict (the first value ``conserved`` compares with, the last value
# ``monotonic`` saw, an aggregate's partial sums), so a resumed run checks as if it never stopped.

RECENT = 5  # how many recorded values (up to the violating step) a violation carries
STATE_VERSION = 1


class Batch(NamedTuple):
    """One leaf's frames in one batch: steps (ascending) and values stacked on axis 0."""

    leaf: LeafSpec
    steps: np.ndarray
    values: np.ndarray


class Finding(NamedTuple):
    """What an invariant says about a violation it found: the InvariantViolation's wording."""

    value: Any
    expected: Any
    tolerance: float | None = None
    detail: str | None = None


class Mask(NamedTuple):
    """An elementwise check of one batch: ``bad`` (n_frames, *leaf_shape) or None when all is
    well, what ``describe`` needs to word a violation (``context``), and the leaf's new state."""

    bad: np.ndarray | None
    context: Any = None
    state: Any = None


@dataclass(frozen=True)
class Hit:
    """A violation located by an invariant, before the checker adds the recent values.

    ``record`` is what the message names (a leaf path, or the prefix a predicate was given);
    ``leaves`` the leaves whose recent values the message lists (several: a dict per step).
    """

    record: str
    leaves: tuple[LeafSpec, ...]
    step: int
    system: int | None
    index: tuple[int, ...] | None
    finding: Finding
    group: str | None = None
    name_leaf: bool = True
    on_leaf: bool = False  # system and index are an element of leaves[0] (an elementwise check)


class Invariant:
    """Base class: ``name`` (as shown in messages), ``records`` (names as given), ``bind(schema)``.

    A subclass says which leaf kinds it applies to (``kinds``) and checks one leaf's batch either
    elementwise (``mask`` + ``describe``) or wholesale (``scan``); one that needs all its leaves
    at once overrides ``check_batch``; one that judges only at the end of the run ``finish``.
    State that must survive a checkpoint goes through ``save_state``/``load_state``.
    """

    name: str = "invariant"
    records: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ("bool", "int", "float", "complex")

    # -- binding (before the run)
    def leaves(self, schema: Schema) -> list[LeafSpec]:
        """The leaves this invariant checks; a leaf of a kind it cannot apply to is an error."""
        leaves = self.resolve(schema)
        for leaf in leaves:
            kind = leaf_kind(leaf)
            if kind not in self.kinds:
                what = {"key": "a PRNG key", "other": f"dtype {np.dtype(leaf.dtype)}"}.get(kind, kind)
                raise JaxlogError(
                    f"invariant {self.name} cannot apply to record {leaf.path!r}: it is {what} "
                    f"({np.dtype(leaf.dtype)}{', ' + leaf.key_impl if leaf.key_impl else ''})"
                )
        return leaves

    def resolve(self, schema: Schema) -> list[LeafSpec]:
        """The leaves named by ``records`` (a leaf or every leaf under a record group), schema order."""
        wanted: set[str] = set()
        for rec in self.records:
            try:
                wanted.update(schema.resolve(rec))
            except JaxlogError as exc:  # say which invariant asked, and what is recorded
                raise JaxlogError(f"invariant {self.name}: {str(exc).removeprefix('[jaxlog] ')}") from None
        return [leaf for leaf in schema.leaves if leaf.path in wanted]

    def bind(self, schema: Schema) -> "Checker":
        """Validate against what is recorded and return a fresh checker for one run."""
        return Checker(self, schema, self.leaves(schema))

    # -- checking (per batch)
    def check_batch(self, checker: "Checker", batches: Sequence[Batch]) -> Hit | None:
        """Each leaf on its own; the earliest step wins, ties go to the leaf first in the schema.
        Every leaf's state (``checker.states``) is updated, violated or not."""
        best = None
        for b in batches:
            state, hit = self.scan(b, checker.states.get(b.leaf.path), checker.schema)
            checker.states[b.leaf.path] = state
            if hit is not None and (best is None or hit.step < best.step):
                best = hit
        return best

    def scan(self, batch: Batch, state: Any, schema: Schema) -> tuple[Any, Hit | None]:
        """(new state, first violation in the batch or None), from ``mask`` and ``describe``."""
        m = self.mask(batch.leaf, batch.steps, batch.values, state)
        spot = None if m.bad is None else locate(m.bad, bool(schema.batched))
        if spot is None:
            return m.state, None
        value = element(batch.values[spot.frame], spot.system, spot.index)
        finding = self.describe(batch.leaf, value, spot, m.context, m.state)
        return m.state, self.hit(batch.leaf, int(batch.steps[spot.frame]), spot.system, spot.index, finding)

    def mask(self, leaf: LeafSpec, steps: np.ndarray, values: np.ndarray, state: Any) -> Mask:
        raise NotImplementedError(f"{type(self).__name__} checks neither elementwise (mask) nor by scan")

    def describe(self, leaf: LeafSpec, value: Any, spot: Spot, context: Any, state: Any) -> Finding:
        raise NotImplementedError(f"{type(self).__name__}.describe")

    def finish(self, checker: "Checker") -> Hit | None:
        """At the end of the run: a violation only decidable then (an aggregate whose window did
        not complete). None for invariants judged frame by frame."""
        return None

    # -- wording
    def group_of(self, leaf: LeafSpec) -> str | None:
        """The record group this invariant was given when ``leaf`` is one of the leaves under it."""
        for rec in self.records:
            if leaf.path != rec and leaf.path.startswith(rec + "/"):
                return rec
        return None

    def names_leaf(self, leaf: LeafSpec) -> bool:
        """Whether the message names the leaf: not when the invariant's name already does (it was
        given exactly this record)."""
        return leaf.path not in self.records

    def hit(self, leaf: LeafSpec, step: int, system: int | None, index: tuple[int, ...] | None,
            finding: Finding) -> Hit:
        return Hit(leaf.path, (leaf,), step, system, index, finding, self.group_of(leaf), self.names_leaf(leaf),
                   on_leaf=True)

    # -- running state (checkpoints)
    def save_state(self, leaf: LeafSpec, state: Any) -> Any:
        """``state`` of one leaf as JSON-able data (states are None, numbers or arrays in dicts)."""
        return encode(state)

    def load_state(self, leaf: LeafSpec, data: Any) -> Any:
        """Inverse of :meth:`save_state`. Invariants that keep state override it to restore dtypes."""
        if data is not None:
            raise JaxlogError(f"invariant {self.name} keeps no state, got {data!r} for record {leaf.path!r}")
        return None

    def __repr__(self) -> str:
        return self.name


class Checker:
    """One invariant over one run. ``check(frames)`` -> first violation in the batch or None;
    ``finish()`` at the end of the run; ``state()``/``restore()`` for checkpoints."""

    def __init__(self, invariant: Invariant, schema: Schema, leaves: Sequence[LeafSpec]):
        self.invariant = invariant
        self.schema = schema
        self.batched = bool(schema.batched)
        self.leaves = tuple(leaves)
        self.states: dict[str, Any] = {}  # per leaf path: the invariant's running state
        self._tail: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # per leaf path: last RECENT frames

    def _batch(self, frames: Frames, leaf: LeafSpec) -> Batch | None:
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
        return Batch(leaf, steps, values)

    def check(self, frames: Frames) -> InvariantViolation | None:
        batches = [b for b in (self._batch(frames, leaf) for leaf in self.leaves) if b is not None]
        if not batches:
            return None
        hit = self.invariant.check_batch(self, batches)
        result = None if hit is None else self._violation(hit, batches)  # before the tails move past it
        for b in batches:
            self._remember(b)
        return result

    def finish(self) -> InvariantViolation | None:
        """The run ended: what only the end can decide (see ``Invariant.finish``)."""
        hit = self.invariant.finish(self)
        return None if hit is None else self._violation(hit, ())

    # -- recent values
    def _remember(self, b: Batch) -> None:
        steps, values = self._with_tail(b.leaf, b.steps, b.values)
        self._tail[b.leaf.path] = (steps[-RECENT:].copy(), np.array(values[-RECENT:], copy=True))

    def _with_tail(self, leaf: LeafSpec, steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        old = self._tail.get(leaf.path)
        if old is not None and len(steps) < RECENT:
            return np.concatenate([old[0], steps]), np.concatenate([old[1], values])
        return steps, values

    def _recent(self, hit: Hit, batches: Sequence[Batch]) -> list[tuple[int, Any]]:
        """The last RECENT recorded values up to ``hit.step`` of the hit's leaves (a dict per step
        when there are several, keyed by their path below ``hit.record``)."""
        current = {b.leaf.path: b for b in batches}
        per_leaf = []
        for leaf in hit.leaves:
            b = current.get(leaf.path)
            if b is not None:
                keep = b.steps <= hit.step
                steps, values = self._with_tail(leaf, b.steps[keep], b.values[keep])
            elif leaf.path in self._tail:
                steps, values = self._tail[leaf.path]
            else:
                return []
            keep = steps <= hit.step
            steps, values = steps[keep][-RECENT:], values[keep][-RECENT:]
            picked = pick(values, hit.system, hit.index)
            per_leaf.append([(int(s), scalar(v)) for s, v in zip(steps, picked)])
        if len(per_leaf) == 1:
            return per_leaf[0]
        cut = len(hit.record) + 1
        return [
            (st, {leaf.path[cut:]: rec[i][1] for leaf, rec in zip(hit.leaves, per_leaf)})
            for i, (st, _) in enumerate(per_leaf[0])
        ]

    def _violation(self, hit: Hit, batches: Sequence[Batch]) -> InvariantViolation:
        f = hit.finding
        recent = self._recent(hit, batches)
        system, index = hit.system, hit.index
        if hit.on_leaf and system is not None and self.schema.by_rows(hit.leaves[0]):
            # a ragged batch's row record: the row is named as its graph and its index in the graph
            system, row = self.schema.row_place(system)
            index = (row, *(index or ()))
        return InvariantViolation(
            self.invariant.name,
            record=hit.record,
            step=hit.step,
            system=system,
            index=index,
            value=f.value,
            expected=f.expected,
            tolerance=f.tolerance,
            detail=f.detail,
            recent=recent,
            group=hit.group,
            name_leaf=hit.name_leaf,
        )

    # -- running state (checkpoints)
    def state(self) -> dict:
        """The running state as JSON-able data: per leaf the invariant's state and the last few
        recorded values (so messages after a resume list them too)."""
        by_path = {leaf.path: leaf for leaf in self.leaves}
        return {
            "version": STATE_VERSION,
            "invariant": self.invariant.name,
            "leaves": {p: self.invariant.save_state(by_path[p], s) for p, s in self.states.items()},
            "recent": {p: {"steps": [int(x) for x in s], "values": encode(v)} for p, (s, v) in self._tail.items()},
        }

    def restore(self, state: dict) -> "Checker":
        """Continue from ``state()`` of an earlier checker of the same invariant on the same records."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise JaxlogError(f"invariant {self.invariant.name}: not a checker state (version {STATE_VERSION}): {state!r:.200}")
        if state.get("invariant") != self.invariant.name:
            raise JaxlogError(
                f"invariant {self.invariant.name}: the saved state is of invariant {state.get('invariant')}; "
                "restore each invariant from its own state (same invariants, same order)"
            )
        by_path = {leaf.path: leaf for leaf in self.leaves}
        unknown = sorted((set(state.get("leaves", {})) | set(state.get("recent", {}))) - set(by_path))
        if unknown:
            raise JaxlogError(
                f"invariant {self.invariant.name}: the saved state holds records {', '.join(unknown)}, "
                f"which this run does not check (it checks {', '.join(by_path) or 'nothing'})"
            )
        self.states = {p: self.invariant.load_state(by_path[p], d) for p, d in state.get("leaves", {}).items()}
        self._tail = {
            p: (np.asarray(d["steps"], dtype=np.int64), decode_array(d["values"], by_path[p].dtype, by_path[p].shape))
            for p, d in state.get("recent", {}).items()
        }
        return self

    def __repr__(self) -> str:
        return f"Checker({self.invariant.name})"


# --------------------------------------------------------------------------- a run's invariants


def as_list(invariants: Iterable[Invariant] | Invariant | None) -> tuple:
    """``invariants=`` as a tuple: None, one invariant or an iterable of them."""
    if invariants is None:
        return ()
    if isinstance(invariants, Invariant):
        return (invariants,)
    try:
        return tuple(invariants)
    except TypeError:
        raise JaxlogError(f"invariants= takes jl.finite/bounded/conserved/monotonic/aggregate/invariant objects "
                          f"(one, or a list of them), got {invariants!r}") from None


def bind_all(invariants: Iterable[Invariant] | Invariant | None, schema: Schema) -> list[Checker]:
    """Bind every invariant (before the run: raises JaxlogError on unrecorded records)."""
    out = []
    for inv in as_list(invariants):
        if not isinstance(inv, Invariant):
            raise JaxlogError(f"invariants must be jl.finite/bounded/conserved/monotonic/aggregate/invariant "
                              f"objects, got {inv!r}")
        out.append(inv.bind(schema))
    return out


def _earliest(checkers: Sequence[Checker], each) -> InvariantViolation | None:
    best = None
    for checker in checkers:
        v = each(checker)
        if v is not None and (best is None or v.step < best.step):
            best = v
    return best


def check_all(checkers: Sequence[Checker], frames: Frames) -> InvariantViolation | None:
    """Run every checker on a batch (all of them, so each keeps its state); the earliest violation wins.

    Ties on the step go to the invariant listed first.
    """
    return _earliest(checkers, lambda c: c.check(frames))


def finish_all(checkers: Sequence[Checker]) -> InvariantViolation | None:
    """The run ended (its last batch was checked): the earliest violation only the end decides."""
    return _earliest(checkers, lambda c: c.finish())


def save_all(checkers: Sequence[Checker]) -> list[dict]:
    """Every checker's ``state()``, in the order the invariants were given."""
    return [c.state() for c in checkers]


def restore_all(checkers: Sequence[Checker], saved: Sequence[dict]) -> None:
    """Restore each checker from ``save_all()`` of a run with the same invariants."""
    if len(saved) != len(checkers):
        raise JaxlogError(f"the saved state holds {len(saved)} invariants, this run checks {len(checkers)}: "
                          "resume with the same invariants")
    for c, s in zip(checkers, saved):
        c.restore(s)
