"""The compiled chunk program of ``jl.run``: ``n <= C`` work steps in one device loop.

How a chunk of work steps ``k0 .. k0+n-1`` (recording steps ``k0+1 .. k0+n``) runs:

- one program per kernel and records, compiled for the capacity ``C`` with the trip count ``n``
  a runtime value: every chunk length, runs of any length and the post-mortem replay run the
  very same executable. The steps themselves run in *blocks*, loops of a trip count XLA knows
  (``plan.block`` slots; a slot past the chunk's end or a stop is masked: computed, its results
  not kept), and only the loop over blocks has a runtime trip count: XLA:GPU asks the host for a
  runtime loop condition before every iteration, so a round trip per block, not per step (see
  :func:`blocks`). A dispatch of fewer steps than a block (a profile-window step) computes the
  whole block and keeps its steps; the masked slots are counted (``timings.masked_steps``);
- the record buffers are arguments, donated: the program writes the rows it records into them
  and returns them. Consecutive short chunks write into one set of buffers, each from where the
  previous one left off (``fill``), until it holds ``C`` steps; a pulled set goes back to the
  driver's pool for a later chunk. So no chunk fills ``C`` rows with zeros (a one-step chunk costs
  one step, not a memset of the capacity), a run of one-step chunks needs one set of buffers,
  not one per step, and rows past what was recorded are stale, never read;
- what is recorded is grouped in *lanes* (one view, or the selected aux leaves or ``jl.log``
  values on one schedule):
  every-step lanes write one row per step into ``C + 2``-row buffers (row 0 of a run's first
  set: the initial state's frame; the scalar leaves of one dtype share a buffer, a column each,
  so one update per step writes them all, see ``row_buffers``); sparser lanes are *compact*:
  evaluated only at their scheduled steps, or only where their ``when=`` predicate also holds,
  and written to the next slot (with its step where ``when=`` decides it: the host works out the
  others' steps from their schedules), so only kept rows reach the host. Schedules are
  evaluated on the device from the step number (``every``/``at``/``window``; a schedule class the
  program does not know comes as a per-chunk mask computed on the host);
- where the compact lanes are views with device schedules, the loops are nested like a nested
  scan: the steps up to the next state a compact lane is scheduled at run in an inner loop
  that writes only the every-step records (no schedule test or ``cond`` per step), then the
  state reached is recorded; with only sparse aux or log lanes, the steps before the scheduled
  one run in an inner loop that only steps, then the scheduled step runs and records;
- a sharded state's fresh set of buffers is made inside the program (``bufs=None``), so it is
  laid out as XLA places the views and nothing moves between devices;
- what a dispatch is asked to do (``Control``: the first step, the step count, the row it starts
  at, whether to record the initial state's frame and check ``until=`` on it) and where the
  compact lanes' slots are (their counts) come as scalars, each an argument of its own: XLA:CPU
  compiles every small computation outside the loops into a kernel of its own, milliseconds
  each, so slicing a control vector (and stacking the counts again on the way out) cost a first
  run five kernels more to compile. The initial frame and ``until=`` on the initial state are evaluated
  inside the program, under a ``cond``, so a run compiles one program, not one per helper;
- a step that calls ``jl.log`` runs under the collector (``log.collect``), which returns
  what it logged beside its output; a step without logs runs as it is;
- ``until=``: the loop also stops at the first step whose state satisfies the predicate (per
  system in batched runs: a finished system is frozen); the flag is an input and an output, so
  the next chunk, already dispatched, runs no step once it is set;
- the step's key is ``fold_in(key, k)`` (and ``fold_in(fold_in(key, k), system)`` per system in
  batched runs): nothing depends on where chunk boundaries fall, so a run resumes exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...errors import JaxlogError
from ...logs import collect, collected_shapes
from ...record.records import AUX, LOG
from ...record.schedule import Schedule
from ..prepare.identity import Cache, step_key, with_consts
from ..prepare.schema import WhenFlags, ask, check_system_axes, flatten_view, step_values, view_values
from ..prepare.sharding import explicit_mesh

INT32_MAX = 2**31 - 1
RECORD_INITIAL = 1  # flags: record the initial state's frame (row 0 / the first slot)
CHECK_INITIAL = 2  # flags: evaluate until= on the initial state


@dataclass(frozen=True)
class Lane:
    """Record leaves taken together: a view of the state (``view``), the aux leaves under
    ``aux_paths`` or the step's ``jl.log`` values under ``log_paths``, on one schedule, optionally
    only where ``when(state)`` holds (``when_values``: ``when(state, values)``, the step's aux and
    logs; see ``drive.prepare.schema``). Hashable from its parts, so equal runs share one compiled
    program."""

    name: str
    schedule: Schedule
    view: Callable | None = None
    aux_paths: tuple[str, ...] | None = None
    when: Callable | None = None
    log_paths: tuple[str, ...] | None = None
    when_values: bool = False  # when= takes (state, values): kept only at states a step computed

    @property
    def from_aux(self) -> bool:
        return self.aux_paths is not None

    @property
    def from_step(self) -> bool:
        """Read from what the step returns or logs (not a view of the state), or kept by what it
        computed (a ``when=`` that takes values: no frame of the initial state, and recorded in the
        loop that has the step's values at hand)."""
        return self.aux_paths is not None or self.log_paths is not None or self.when_values

    def read(self, state: Any, aux: Any, logs: Any = None) -> dict[str, Any]:
        """``{record path: value}`` of this lane at one step."""
        if self.when_values and isinstance(self.view, WhenFlags):  # a batched when='s flags, from the step's values
            return flatten_view(self.name, self.view(state, self.values(aux, logs)))
        if self.log_paths is not None:
            flat = flatten_view(LOG, logs)
            return {p: v for p, v in flat.items() if _selected(p, self.log_paths)}
        if self.aux_paths is None:
            return view_values(self.name, self.view, state)
        flat = flatten_view(AUX, aux)
        return {p: v for p, v in flat.items() if _selected(p, self.aux_paths)}

    def values(self, aux: Any, logs: Any) -> dict[str, Any] | None:
        """What this lane's ``when=`` is given beside the state: the step's values, or None
        (a state predicate)."""
        return step_values(aux, logs) if self.when_values else None

    @property
    def in_loop_every_step(self) -> bool:
        """Taken at every step the loop can record (1 .. 2**31-1), unconditionally: a row buffer."""
        return self.when is None and self.schedule.count_between(1, INT32_MAX) == INT32_MAX


def _selected(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in prefixes)


@dataclass(frozen=True)
class Plan:
    """Everything static about a chunk program: equal plans share one compiled executable. A run's
    step, views and predicates are canonical callables here (``drive.prepare.identity``), equal where
    they compute the same, so plans built from other function objects are equal too."""

    step: Callable
    lanes: tuple[Lane, ...]
    dense: tuple[int, ...]  # lane indices with row buffers (C + 2 rows)
    compact: tuple[tuple[int, int], ...]  # (lane index, slots): sparse and when= lanes, compacted on the device
    initial: tuple[int, ...]  # view lanes whose schedule holds at step 0 (the initial state's frame)
    host_masks: tuple[int, ...]  # compact lanes whose schedule the program cannot evaluate: masks from the host
    has_aux: bool
    keyed: bool
    n_systems: int | None  # batched runs: per-system keys and freezing
    until: Callable | None
    length: int  # the capacity C: most work steps per chunk
    # the row buffers: (key, paths) each, a scalar leaves' buffer holding a column per path (see ``row_buffers``)
    row_buffers: tuple[tuple[str, tuple[str, ...]], ...] = ()
    collect: bool = False  # the step calls jl.log: run it under the collector
    log_capacity: int | None = None  # capacity of logs inside while loops that give none
    until_values: bool = False  # until= takes (state, values): the step's aux and logs (see drive.prepare.schema)
    block: int = 1  # loop slots per block of steps (a loop of that trip count, known to XLA; see ``blocks``)
    segment: int = 1  # nested plans: loop slots between two states the compact lanes are asked about
    segments: Any = None  # a ragged batch (drive.prepare.schema.Segments): a finished graph's rows are frozen too
    _hash: int = dataclasses.field(init=False, repr=False, compare=False)  # see __post_init__

    def __post_init__(self):  # jit hashes its static argument on every call: hash the lanes once
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f) for f in _PLAN_FIELDS)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def slots(self) -> int:
        """Loop slots one block computes, so one dispatch at least (a one-step dispatch keeps one):
        ``block``, or whole segments of a nested plan (one, where a segment is longer)."""
        if self.block == 1 or self.segment <= 1:
            return self.block
        return max(self.block // self.segment, 1) * self.segment

    @property
    def rows(self) -> int:
        """Rows of a row buffer: the initial frame's, one per step of the capacity, and one a masked
        slot past the end of a full set writes (see ``_ChunkLoop.dense_rows``). Blocks of one slot
        mask none (a slot runs only while the loop goes on), so they need no such row: a set on the
        CPU is a record smaller, and a large record's set a third smaller."""
        return self.length + (2 if self.block > 1 else 1)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Plan) or self._hash != other._hash:
            return False
        return all(getattr(self, f) == getattr(other, f) for f in _PLAN_FIELDS)


_PLAN_FIELDS = tuple(f.name for f in dataclasses.fields(Plan) if f.compare)  # what hashes and compares a plan


_PLANS = Cache("plans", keep=256)  # a bound: plans of kernels no longer run may go


def intern(plan: Plan) -> Plan:
    """The one equal plan already seen, or ``plan``: jit compares its static argument with the
    one it compiled for on every call, and the same object compares at once (an equal one
    compares every lane's view and schedule)."""
    return _PLANS.intern(plan)


def layout(lanes: tuple[Lane, ...], capacity: int, shapes: tuple[dict, ...], pack: bool, block: int = 1) -> dict:
    """Which lanes get row buffers (and how their leaves share them, see ``row_buffers``), which
    are compacted (and with how many slots), which record the initial state, and which need host
    masks, for a capacity of ``capacity`` loop steps; and the loop's blocks of ``block`` slots
    (see :func:`blocks`)."""
    initial = tuple(i for i, ln in enumerate(lanes) if not ln.from_step and ln.schedule.contains(0))
    dense = tuple(i for i, ln in enumerate(lanes) if ln.in_loop_every_step)
    rows = row_buffers([shapes[i] for i in dense], pack)
    # compact lanes: a slot per scheduled step of a set of buffers (the initial frame's too), and a
    # spare one, where the nested loop writes a value it does not keep (see ``_put_next``)
    compact = tuple((i, max(1, ln.schedule.max_in_span(capacity)) + (i in initial) + 1)
                    for i, ln in enumerate(lanes) if i not in dense)
    host = tuple(i for i, _ in compact if device_schedule(lanes[i].schedule) is None)
    out = {"dense": dense, "compact": compact, "initial": initial, "host_masks": host, "length": capacity,
           "row_buffers": rows}
    return {**out, **blocks(lanes, compact, host, block, capacity)}


def blocks(lanes: tuple[Lane, ...], compact: tuple[tuple[int, int], ...], host: tuple[int, ...], block: int,
           capacity: int) -> dict:
    """How the chunk loop blocks its steps: ``block`` slots per block, and for nested plans
    ``segment`` slots between two states the compact lanes are asked about.

    Why blocks: XLA:GPU copies a ``while`` loop's condition to the host before every iteration,
    a round trip that cost a few-microsecond step 2.6x. A loop of a trip count XLA knows runs on
    the device alone, so the steps run in blocks of such loops (``block`` slots, a slot past the
    chunk's end or ``until=`` masked: computed, and its results not kept), and only the loop over
    blocks asks the host. Nested plans (sparse views) step in segments of ``segment`` slots (the
    shortest period of their schedules, if a dispatch of the capacity ``capacity`` holds it: a
    view is evaluated once per period, as in a nested scan), ``block // segment`` segments a
    block. The blocks depend on the platform and the records only, never on the chunk size or
    the run length: every dispatch (one-step chunks, profile-window steps, post-mortem replays)
    runs the one program, so results are the same bit for bit whatever the chunk size (XLA fuses
    a loop of another trip count differently, and a reduction in a view can differ in its last
    bit). ``block`` 1 is the plain loop, one step an iteration, and its nested plans (``segment``
    0) step to the next scheduled state in an inner loop of a runtime trip count, as a nested
    scan would."""
    block = max(1, int(block))
    if not compact or host or any(lanes[i].from_step for i, _ in compact):
        return {"block": block, "segment": 1}
    if block == 1:
        return {"block": 1, "segment": 0}
    periods = [p.n for p in (_progression(lanes[i].schedule) for i, _ in compact) if p is not None]
    period = min(periods) if periods else block
    return {"block": block, "segment": period if period <= min(SEGMENT_MAX, capacity) else block}


SEGMENT_MAX = 4096  # a nested plan's longest segment: longer periods step in segments of ``block``

# loop slots per block by platform: a GPU asks the host for a runtime loop condition; a CPU runs its
# loops on the host, and a TPU's scalar unit runs them on the chip: the plain loop there (BLOCK_DEFAULT)
BLOCK = {"gpu": 32, "cuda": 32, "rocm": 32}
BLOCK_DEFAULT = 1


@contextlib.contextmanager
def block_setting(block: int) -> Iterator[None]:
    """``JAXLOG_BLOCK`` set to ``block`` for the runs inside (read when a run lays out its
    program), then as it was: runs compared in other loop blocks (``jl.calibrate``, benchmarks)."""
    old = os.environ.get("JAXLOG_BLOCK")
    os.environ["JAXLOG_BLOCK"] = str(block)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("JAXLOG_BLOCK", None)
        else:
            os.environ["JAXLOG_BLOCK"] = old


def block_for(platform: str) -> int:
    """Loop slots per block on ``platform``: enough that a GPU's round trip per block weighs little
    against a few-microsecond step, few enough that a short dispatch masks little.
    ``JAXLOG_BLOCK`` sets it (1: the plain loop, one step an iteration)."""
    env = os.environ.get("JAXLOG_BLOCK", "").strip()
    if env:
        try:
            value = int(env)
        except ValueError:
            value = 0
        if value < 1:
            raise JaxlogError(f"JAXLOG_BLOCK={env!r}: loop slots per block must be a whole number >= 1")
        return value
    return BLOCK.get(platform, BLOCK_DEFAULT)


PACKED = "/"  # a shared row buffer's key: "/<dtype>", which no record path is (paths are a/b/c names)


def row_buffers(shapes: list[dict], pack: bool) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The row buffers of the every-step leaves ``shapes`` (``{path: ShapeDtypeStruct}`` per
    lane), as ``(key, paths)``. With ``pack``, the scalar leaves of one dtype share one buffer, a
    column each (sorted by path), written by one in-place update per step: XLA:CPU compiles each
    update as a kernel of its own (milliseconds each), and a device runs each as one. Other leaves, and
    every leaf without ``pack`` (a sharded state, whose records are laid out as XLA places
    them), get a buffer of their own, keyed by their path."""
    out: list = []
    scalars: dict = {}
    for lane in shapes:
        for path, sd in lane.items():
            if pack and tuple(sd.shape) == () and not jax.dtypes.issubdtype(sd.dtype, jax.dtypes.extended):
                scalars.setdefault(str(sd.dtype), []).append(path)
            else:
                out.append((path, (path,)))
    for dtype, paths in scalars.items():
        out.append((PACKED + dtype, tuple(sorted(paths))) if len(paths) > 1 else (paths[0], (paths[0],)))
    return tuple(out)


def _row_shapes(plan: Plan, shapes: list[dict]) -> dict:
    """``{key: (frame shape, dtype)}`` of the row buffers, from the leaves' shapes per dense lane."""
    by_path = {p: sd for lane in shapes for p, sd in lane.items()}
    return {key: ((len(paths),) if key.startswith(PACKED) else tuple(by_path[key].shape), by_path[paths[0]].dtype)
            for key, paths in plan.row_buffers}


def _put_rows(plan: Plan, dense: dict, vals: dict, row: Any) -> dict:
    """Row ``row`` of the row buffers holding ``vals`` (``{path: value}``). A shared buffer's row
    is its columns stacked; a column ``vals`` lacks gets a zero (the initial frame of a buffer
    shared with lanes that do not record step 0: that row is never read for them)."""
    out = dict(dense)
    for key, paths in plan.row_buffers:
        if not any(p in vals for p in paths):
            continue
        buf = dense[key]
        if key.startswith(PACKED):
            new = jnp.stack([jnp.asarray(vals[p], buf.dtype) if p in vals else jnp.zeros((), buf.dtype)
                             for p in paths])
        else:
            new = vals[key]
        out[key] = lax.dynamic_update_index_in_dim(buf, jnp.asarray(new, buf.dtype), row, 0)
    return out


@dataclass(frozen=True)
class _Progression:
    """A schedule's progression ``start, start + n, ...`` up to ``stop``, clipped to int32."""

    n: int
    start: int
    stop: int


def _progression(schedule: Schedule) -> _Progression | None:
    prog = schedule.progression()
    if prog is None:
        return None
    stop = INT32_MAX if prog.stop is None else min(prog.stop, INT32_MAX)
    return _Progression(n=prog.n, start=prog.start, stop=stop)


def _step_table(schedule: Schedule) -> np.ndarray | None:
    """A schedule's table of steps that int32 holds, sorted."""
    steps = schedule.table()
    if steps is None:
        return None
    steps = np.unique(np.asarray(steps, np.int64))
    return np.asarray(steps[steps <= INT32_MAX], np.int32)


def device_schedule(schedule: Schedule) -> Callable[[Any], Any] | None:
    """``k -> whether step k is scheduled`` as device code for a schedule that is a progression or
    a table of steps, else None."""
    prog, steps = _progression(schedule), _step_table(schedule)
    if prog is not None:
        if prog.start > INT32_MAX:
            return lambda k: jnp.zeros((), bool)
        if prog.n == 1:
            return lambda k: (k >= prog.start) & (k <= prog.stop)
        # lax.rem, not %: no sign fix-up to compile (k - start < 0 is excluded by the first test)
        return lambda k: (k >= prog.start) & (k <= prog.stop) & (lax.rem(k - prog.start, prog.n) == 0)
    if steps is not None:
        if not len(steps):
            return lambda k: jnp.zeros((), bool)

        def at(k):
            table = jnp.asarray(steps)
            i = jnp.minimum(jnp.searchsorted(table, k), len(steps) - 1)
            return table[i] == k
        return at
    return None


def device_next(schedule: Schedule) -> Callable[[Any], Any] | None:
    """``k -> the first scheduled step after k`` (int32 max: none) as device code, for the
    schedules :func:`device_schedule` knows, else None."""
    prog, steps = _progression(schedule), _step_table(schedule)
    if prog is not None:
        if prog.start > INT32_MAX:
            return lambda k: jnp.int32(INT32_MAX)

        def nxt(k):
            s = jnp.maximum(k + 1, prog.start)
            if prog.n > 1:  # up to the next multiple: lax.rem, as s - start >= 0 (no sign fix-up to compile)
                r = lax.rem(s - prog.start, prog.n)
                s = s + jnp.where(r == 0, 0, prog.n - r)
            return jnp.where((s <= prog.stop) & (s >= k + 1), s, INT32_MAX).astype(jnp.int32)
        return nxt
    if steps is not None:
        if not len(steps):
            return lambda k: jnp.int32(INT32_MAX)

        def at(k):
            table = jnp.asarray(np.append(steps, INT32_MAX).astype(np.int32))
            return table[jnp.searchsorted(table, k + 1)]
        return at
    return None


def host_mask(schedule: Schedule, k0: int, length: int, capacity: int) -> np.ndarray:
    """Per loop index: whether the step it records is scheduled (schedules without device code)."""
    out = np.zeros(capacity, dtype=bool)
    out[:length] = schedule.mask(np.arange(k0 + 1, k0 + length + 1, dtype=np.int64))
    return out


def apply_logged(plan: Plan, key: Any, k: Any, state: Any) -> tuple[Any, Any, dict]:
    """One application of the user's step: ``(new state, aux or None, what it logged)``; the
    step goes through the collector only when the plan says it logs."""
    if not plan.collect:
        return (*_call_step(plan, key, k, state), {})
    (state, aux), logs = collect(lambda key, k, st: _call_step(plan, key, k, st), capacity=plan.log_capacity)(
        key, k, state)
    return state, aux, logs


def logged_shapes(plan: Plan, key: Any, k: Any, state: Any) -> tuple[Any, Any, dict]:
    """``jax.eval_shape`` of :func:`apply_logged` through the collector, the step traced once."""
    (state, aux), logs = collected_shapes(lambda key, k, st: _call_step(plan, key, k, st), key, k, state,
                                          capacity=plan.log_capacity)
    return state, aux, logs


def _call_step(plan: Plan, key: Any, k: Any, state: Any) -> tuple[Any, Any]:
    if plan.keyed:
        out = plan.step(step_key(key, k, plan.n_systems), state)
    else:
        out = plan.step(state)
    if plan.has_aux:
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise JaxlogError("has_aux=True: the step function must return (state, aux)")
        return out[0], out[1]
    return out, None


def until_flags(plan: Plan, state: Any, values: dict | None = None) -> Any:
    """``until(state)`` (``until(state, values)`` where it takes the step's values) as a bool
    scalar, or one bool per system in batched runs."""
    if plan.n_systems is not None:
        check_system_axes(state, plan.n_systems, plan.segments)
    flag = jnp.asarray(ask(plan.until, state, (values or {}) if plan.until_values else None, "until="))
    want = () if plan.n_systems is None else (plan.n_systems,)
    if flag.dtype != jnp.bool_ or flag.shape != want:
        what = "one bool" if not want else f"one bool per system, shape ({plan.n_systems},)"
        raise JaxlogError(f"until= must return {what}, got {flag.dtype}{list(flag.shape)}")
    return flag


def _done_along(plan: Plan, done: Any, x: Any) -> Any:
    """``done`` along ``x``'s leading axis, shaped to broadcast against it: per system, or in a
    ragged batch per row (``done[ids]``, each row its graph's flag); None where ``x`` has neither
    axis (shared by all systems)."""
    n = plan.n_systems
    if getattr(x, "ndim", 0) < 1:
        return None
    if x.shape[0] == n:
        along = done
    elif plan.segments is not None and x.shape[0] == plan.segments.n_rows:
        along = done[plan.segments.ids]
    else:
        return None
    return along.reshape(along.shape + (1,) * (x.ndim - 1))


def _freeze(plan: Plan, done: Any, old: Any, new: Any) -> Any:
    """Systems that are done keep their state (in a ragged batch: their graphs' rows too); shared
    leaves (no system axis) go on."""
    def pick(o, x):
        mask = _done_along(plan, done, x)
        return x if mask is None else jnp.where(mask, o, x)
    return jax.tree_util.tree_map(pick, old, new)


def finished_systems() -> dict:
    """What a finished system's rows hold after its stop in a batched run with until= (kept in
    the file's run summary as "finished_systems", read back by ``traj.finished_systems``; a new
    dict each time, the run's own): views see its frozen state, the state at its stop; what the
    step returns or logs there comes from steps whose results were thrown away, so it is marked
    invalid (see ``_invalidate``). ``traj.live`` says which rows hold each system's data: those
    at steps up to its ``systems_done``."""
    return {
        "views": "frozen",  # records of the state, what views log included
        "aux": "invalid",
        "step logs": "invalid",
        "invalid": {"float": "nan", "complex": "nan", "signed int": "min", "unsigned int": "max", "bool": False},
        "live": "steps <= systems_done",
    }


def _invalid(x: Any) -> Any:
    """The value a finished system's aux or log leaf holds: NaN where the dtype has one, else
    the end of its range furthest from ordinary counts (False for bools)."""
    dt = x.dtype
    if jnp.issubdtype(dt, jnp.inexact):
        return jnp.full((), jnp.nan, dt)
    if jnp.issubdtype(dt, jnp.integer):
        info = jnp.iinfo(dt)
        return jnp.full((), info.min if jnp.issubdtype(dt, jnp.signedinteger) else info.max, dt)
    return jnp.zeros((), dt)


def _invalidate(plan: Plan, done: Any, tree: Any) -> Any:
    """``tree`` (the step's aux or logs) with the rows of the systems ``done`` before the step
    marked invalid (see ``finished_systems``): their step's results were thrown away."""
    def mark(x):
        mask = _done_along(plan, done, x)
        if mask is not None and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended):
            return jnp.where(mask, _invalid(x), x)
        return x
    return jax.tree_util.tree_map(mark, tree)


def live_at(stopped: Any, k: Any) -> Any:
    """Per system, whether the state at step ``k`` is still its own data: it had not stopped
    before ``k`` (``stopped`` is -1 while it runs; its stop step itself is live)."""
    return (stopped < 0) | (stopped >= k)


def when_flag(lane: Lane, state: Any, plan: Plan | None = None, live: Any = None, values: dict | None = None) -> Any:
    """Whether ``lane`` keeps ``state``'s row. In batched runs (``plan.n_systems``) ``when=`` may
    return one bool per system: the row is kept where it holds for a system that is ``live``
    (not stopped by ``until=`` before this step). With per-system ``until=`` it must: one bool
    for all systems cannot leave a finished system's frozen state out. ``values``: the step's,
    for a ``when=`` that takes them."""
    what = f"record {lane.name!r}: when="
    flag = jnp.asarray(ask(lane.when, state, (values or {}) if lane.when_values else None, what))
    n = None if plan is None else plan.n_systems
    if n is not None and flag.dtype == jnp.bool_ and flag.shape == (n,):
        return jnp.any(flag if live is None else flag & live)
    if n is not None and plan.until is not None:
        raise JaxlogError(f"record {lane.name!r}: in a batched run with until=, when= must return one bool per "
                          f"system, shape ({n},) (a finished system is frozen, and one bool for all systems "
                          f"would keep deciding rows on its frozen state), got {flag.dtype}{list(flag.shape)}")
    if flag.dtype != jnp.bool_ or flag.shape != ():
        per = "" if n is None else f" or one bool per system, shape ({n},)"
        raise JaxlogError(f"record {lane.name!r}: when= must return one bool{per} (in batched runs too: reduce "
                          f"over the systems, e.g. jnp.any), got {flag.dtype}{list(flag.shape)}")
    return flag


def keeps_steps(lane: Lane) -> bool:
    """Whether a compact lane's steps are written on the device beside its values: only where
    ``when=`` decides them. Other lanes are recorded at every scheduled state the run reaches,
    so the host works their steps out from the schedule (one kernel and one transfer less)."""
    return lane.when is not None


def buffer_specs(plan: Plan, shapes: tuple[dict, ...]) -> dict:
    """One set of record buffers, as ``ShapeDtypeStruct`` leaves: row buffers of ``C + 1`` or ``C + 2`` rows (``Plan.rows``), and
    per compact lane its values' slots and, where ``keeps_steps``, its steps' (else None). What
    :func:`buffers` puts on a device, what a sharded run's program makes itself, what a set
    weighs and which pooled sets fit (equal specs, interchangeable sets)."""
    dense = {name: jax.ShapeDtypeStruct((plan.rows, *shape), dtype)
             for name, (shape, dtype) in _row_shapes(plan, [shapes[i] for i in plan.dense]).items()}
    compact = tuple(({p: jax.ShapeDtypeStruct((m, *sd.shape), sd.dtype) for p, sd in shapes[i].items()},
                     jax.ShapeDtypeStruct((m,), np.int32) if keeps_steps(plan.lanes[i]) else None)
                    for i, m in plan.compact)
    return {"dense": dense, "compact": compact}


def buffers(plan: Plan, shapes: tuple[dict, ...], device: Any = None) -> dict:
    """A fresh set of record buffers for ``plan``, on ``device`` (zeros put there from the host:
    ``jnp.zeros`` would compile a program per buffer shape, tens of milliseconds each)."""
    return jax.device_put(jax.tree_util.tree_map(lambda sd: np.zeros(sd.shape, sd.dtype), buffer_specs(plan, shapes)),
                          device)


class Control(NamedTuple):
    """What one dispatch runs: ``n`` work steps from step ``k0``, writing from row ``row0`` of its
    set of buffers (the set's rows follow the steps, so the driver knows it), and whether it
    records the initial state's frame (row ``row0``, the first slots) and checks ``until=`` on
    the initial state."""

    k0: np.int32
    n: np.int32
    row0: np.int32
    record_initial: np.bool_
    check_initial: np.bool_


def control(k0: int, n: int, row0: int, flags: int) -> Control:
    """The scalars of a dispatch (``flags``: ``RECORD_INITIAL`` | ``CHECK_INITIAL``)."""
    return Control(np.int32(k0), np.int32(n), np.int32(row0), np.bool_(flags & RECORD_INITIAL),
                   np.bool_(flags & CHECK_INITIAL))


def empty_counts(plan: Plan) -> tuple:
    """The compact lanes' slot counts of a fresh set of buffers, and its loop slots: nothing written."""
    return tuple(np.int32(0) for _ in range(len(plan.compact) + 1))


def buffer_bytes(specs: dict) -> int:
    """Bytes of one set of record buffers (its :func:`buffer_specs`)."""
    return sum(int(np.prod(sd.shape, dtype=np.int64)) * np.dtype(sd.dtype).itemsize
               for sd in jax.tree_util.tree_leaves(specs))


def _zeros(plan: Plan, state: Any, key: Any) -> dict:
    """A set of record buffers made inside the program (traced: shapes from the lanes' reads). On
    a mesh of explicit axes (``jax.make_mesh``'s default) a value's type carries its sharding, and
    a row is written only into a buffer of the same sharding: each buffer is laid out as its
    record's values, their leading (frame) axis unsharded. Elsewhere XLA places them."""
    st_shape, aux_shape, log_shape = jax.eval_shape(lambda st: apply_logged(plan, key, jnp.int32(0), st), state)
    shapes = tuple(jax.eval_shape(ln.read, st_shape, aux_shape, log_shape) for ln in plan.lanes)
    specs = buffer_specs(plan, shapes)
    of = {p: sd for lane in shapes for p, sd in lane.items()}
    dense = {p: _zeros_like_rows(sd, of.get(p)) for p, sd in specs["dense"].items()}
    compact = tuple(({p: _zeros_like_rows(sd, of.get(p)) for p, sd in vals.items()},
                     None if steps is None else jnp.zeros(steps.shape, steps.dtype))
                    for vals, steps in specs["compact"])
    return {"dense": dense, "compact": compact}


def _zeros_like_rows(sd: Any, value: Any) -> Any:
    """Zeros of buffer ``sd``, sharded as rows of ``value`` (its ShapeDtypeStruct) where its
    sharding is a type (explicit mesh axes), else placed by XLA."""
    sharding = getattr(value, "sharding", None)
    mesh = explicit_mesh(sharding)
    if mesh is None:
        return jnp.zeros(sd.shape, sd.dtype)
    spec = jax.sharding.PartitionSpec(None, *sharding.spec)  # (lax.full's sharding= is not kept by jax 0.12)
    return jax.sharding.reshard(jnp.zeros(sd.shape, sd.dtype), jax.sharding.NamedSharding(mesh, spec))


def _put(buf: dict, vals: dict, row: Any) -> dict:
    return {p: lax.dynamic_update_index_in_dim(b, jnp.asarray(vals[p], b.dtype), row, 0) for p, b in buf.items()}


def _put_step(steps: Any, k: Any, slot: Any) -> Any:
    """A compact lane's step number into ``slot``, as ``_put`` writes its values there: a dynamic
    update, not a scatter (``.at[].set``), which XLA:CPU compiles into a loop of its own. None:
    the lane's steps are not kept (see ``keeps_steps``)."""
    if steps is None:
        return None
    return lax.dynamic_update_index_in_dim(steps, jnp.asarray(k, steps.dtype), slot, 0)


def _put_next(ok: Any, buf: dict, steps: Any, count: Any, vals: dict, k: Any) -> tuple[dict, Any, Any]:
    """Write ``vals`` (step ``k``) to slot ``count`` and keep it where ``ok`` (count it): a value
    not kept lands in the slot the next kept one overwrites (``layout`` keeps a spare slot), so
    nothing is selected or copied."""
    return _put(buf, vals, count), _put_step(steps, k, count), count + ok.astype(jnp.int32)


def chunk_impl(plan: Plan, state, bufs, key, ctl: Control, counts, masks, stopped):
    """Run up to ``ctl.n`` steps from step ``ctl.k0``, writing records into ``bufs`` (None: zeros
    made here) from row ``ctl.row0`` and, per compact lane, from slot ``counts[c]``, where earlier
    chunks left off. ``stopped``: with ``until=``, the step where the run (per system: each
    system) stopped, -1 while it goes on; carried from chunk to chunk. Returns the state, the
    buffers, the new ``counts`` and ``stopped``. ``counts`` ends with the loop slots the set's
    chunks ran (see :func:`blocks`): those beyond the steps that ran were masked."""
    if bufs is None:  # a sharded state's first set: zeros laid out as XLA places the views (see drive.device.chunks)
        bufs = _zeros(plan, state, key)
    loop = _ChunkLoop(plan, key, ctl, masks)
    dense, compact = bufs["dense"], bufs["compact"]
    counts, slots = tuple(counts[:-1]), counts[-1]
    done = stopped >= 0
    if plan.initial:  # the initial state's frame: row 0 of row buffers, the first slot of compact ones
        dense, compact, counts = lax.cond(ctl.record_initial, functools.partial(loop.first_frame, state, stopped),
                                          lambda a: a, (dense, compact, counts))
    if plan.until is not None and not plan.until_values:  # a values until= is first asked about step 1
        done, stopped = lax.cond(ctl.check_initial, functools.partial(loop.first_until, state), lambda a: a,
                                 (done, stopped))
    carry = (jnp.int32(0), state, done, stopped, dense, compact, counts, slots)
    _, state, done, stopped, dense, compact, counts, slots = lax.while_loop(loop.cond, loop.block, carry)
    # the steps that ran are not returned: all ``n`` of them, or, with ``until=``, up to the
    # step ``stopped`` says (an output computed from the loop's index would be one more kernel)
    return {"state": state, "bufs": {"dense": dense, "compact": compact}, "counts": (*counts, slots),
            "stopped": stopped}


def _keep(live: Any, new: Any, old: Any) -> Any:
    """``new`` where the slot is ``live``, else ``old``: a masked slot's results are thrown away."""
    return jax.tree_util.tree_map(lambda a, b: jnp.where(live, a, b), new, old)


def _fixed(size: int, body: Callable, carry: Any) -> Any:
    """``size`` applications of ``body``: a loop of that trip count, which XLA knows (a GPU runs it
    without asking the host); one application as it is."""
    if size == 1:
        return body(carry)
    return lax.fori_loop(0, size, lambda _, c: body(c), carry)


class _ChunkLoop:
    """The pieces of one chunk's device loop, traced once per program: what a loop index ``j``
    (the state ``k0 + j``) does, and the block of slots that fits the plan's records. A loop carry
    is ``(j, state, done, stopped, dense, compact, counts, slots)``."""

    def __init__(self, plan: Plan, key: Any, ctl: Control, masks: tuple):
        self.plan, self.lanes, self.key = plan, plan.lanes, key
        self.k0, self.n, self.row0 = ctl.k0, ctl.n, ctl.row0
        self.slot_of = {i: c for c, (i, _) in enumerate(plan.compact)}
        self.tests = {i: device_schedule(self.lanes[i].schedule) for i, _ in plan.compact}
        self.mask_of = dict(zip(plan.host_masks, masks))
        self.nexts = [device_next(self.lanes[i].schedule) for i, _ in plan.compact]

    # -- the initial state ------------------------------------------------------------------------
    def first_frame(self, state, stopped, args):
        """The initial state's frame, every row buffer's values written together (buffers are
        shared by lanes)."""
        plan, lanes, k0 = self.plan, self.lanes, self.k0
        dense, compact, counts = args
        compact, counts = list(compact), list(counts)
        rows = {}
        for i in plan.initial:
            vals = lanes[i].read(state, None)
            if i in self.slot_of:
                c = self.slot_of[i]
                take = jnp.ones((), bool) if lanes[i].when is None else \
                    when_flag(lanes[i], state, plan, live_at(stopped, k0))
                buf, steps = compact[c]
                compact[c] = (_put(buf, vals, counts[c]), _put_step(steps, k0, counts[c]))
                counts[c] = counts[c] + take.astype(jnp.int32)
            else:
                rows.update(vals)
        return _put_rows(plan, dense, rows, self.row0), tuple(compact), tuple(counts)

    def first_until(self, state, args):
        done, stopped = args
        now = until_flags(self.plan, state)
        return done | now, jnp.where(now & ~done, self.k0, stopped)

    # -- one step ------------------------------------------------------------------------------------
    def going(self, j, done, bound):
        """Whether the loop takes another step: ``j < bound`` and, with ``until=``, some system is
        not done (without it nothing is ever done: no test, one comparison less to compile)."""
        if self.plan.until is None:
            return j < bound
        return (j < bound) & ~jnp.all(done)

    def cond(self, carry):
        return self.going(carry[0], carry[2], self.n)

    def advance(self, j, st, done, stopped):
        """One application of the step from state ``k0 + j`` (``until=``: stop flags, frozen systems)."""
        plan = self.plan
        k = self.k0 + j
        new, aux, logs = apply_logged(plan, self.key, k, st)
        if plan.until is not None:
            if plan.n_systems is not None:  # the systems done before this step: its results are thrown away
                new = _freeze(plan, done, st, new)
                aux, logs = _invalidate(plan, done, aux), _invalidate(plan, done, logs)
            now = until_flags(plan, new, step_values(aux, logs) if plan.until_values else None)
            stopped = jnp.where(now & ~done, k + 1, stopped)
            done = done | now
        return new, aux, logs, done, stopped

    def dense_rows(self, dense, st, aux, logs, j):
        """The every-step records of the state ``k0 + j + 1`` written into their row. A masked
        slot writes too (no select over a buffer): ``j`` did not move past the chunk's end, so
        its row is at most ``row0 + n + 1``, a row no step recorded yet (a later step writes it
        again; the buffers have a row beyond the capacity for the last chunk of a set)."""
        ys = {}
        for i in self.plan.dense:
            ys.update(self.lanes[i].read(st, aux, logs))
        return _put_rows(self.plan, dense, ys, self.row0 + j + 1)

    def next_bound(self, j):
        """The loop index of the next state after ``k0 + j`` some compact lane is scheduled at
        (``nexts`` give int32 max for none), or ``n`` (the chunk's end)."""
        bound: Any = self.n
        for f in self.nexts:
            bound = jnp.minimum(bound, f(self.k0 + j) - self.k0)  # no overflow: k0 >= 0
        return bound

    # -- blocks --------------------------------------------------------------------------------------
    def block(self, carry):
        """One iteration of the loop over blocks (the only loop whose trip count is a runtime
        value): ``plan.block`` slots of one step each, or for nested plans (every compact lane a
        view on a device schedule) ``plan.block // plan.segment`` segments."""
        plan, lanes = self.plan, self.lanes
        *rest, slots = carry
        nested = (not plan.host_masks and plan.compact and all(f is not None for f in self.nexts)
                  and not any(lanes[i].from_step for i, _ in plan.compact))
        if nested and plan.segment == 0:  # the plain nested loop: its slots are its steps
            out = self.segment_body(tuple(rest))
            return (*out, slots + out[0] - rest[0])
        if nested:
            size = max(1, plan.block // plan.segment)
            return (*_fixed(size, self.segment_body, tuple(rest)), slots + size * plan.segment)
        if plan.block == 1 and plan.compact and not plan.dense and not plan.host_masks \
                and all(f is not None for f in self.nexts):  # the plain loop, only sparse records
            out = self.sparse_body(tuple(rest))
            return (*out, slots + out[0] - rest[0])
        return (*_fixed(plan.block, self.step_slot, tuple(rest)), slots + plan.block)

    def step_slot(self, carry):
        """One slot: a step, its every-step records, and each compact lane where scheduled; masked
        past the chunk's end or ``until=``. Lanes of what the step returns or logs are written at
        every slot and counted where kept (they are computed anyway, and a ``cond`` would cost a
        GPU a host round trip per step); a view lane is evaluated only where scheduled, under a
        ``cond``."""
        plan, lanes = self.plan, self.lanes
        j, st0, done0, stopped0, dense, compact, counts = carry
        live = self.going(j, done0, self.n) if plan.block > 1 else jnp.ones((), bool)
        k = self.k0 + j
        st, aux, logs, done, stopped = self.advance(j, st0, done0, stopped0)
        dense = self.dense_rows(dense, st, aux, logs, j)
        new_compact, new_counts = [], []
        for (i, m), (buf, steps), count in zip(plan.compact, compact, counts):
            take = self.mask_of[i][j] if i in self.mask_of else self.tests[i](k + 1)
            if lanes[i].when is not None:
                take = take & when_flag(lanes[i], st, plan, live_at(stopped, k + 1), lanes[i].values(aux, logs))
            take = take & live
            if lanes[i].from_step and plan.block > 1:
                buf, steps, count = _put_next(take & (count < m - 1), buf, steps, count,
                                              lanes[i].read(st, aux, logs), k + 1)
            else:
                def write(args, i=i):
                    buf, steps, count = args
                    return _put(buf, lanes[i].read(st, aux, logs), count), _put_step(steps, k + 1, count), count + 1

                buf, steps, count = lax.cond(take & (count < m), write, lambda a: a, (buf, steps, count))
            new_compact.append((buf, steps))
            new_counts.append(count)
        if plan.block > 1:  # (a block of one slot runs only while the loop goes on: nothing to mask)
            j, st, done, stopped = _keep(live, (j + 1, st, done, stopped), (j, st0, done0, stopped0))
        else:
            j = j + 1
        return j, st, done, stopped, dense, tuple(new_compact), tuple(new_counts)

    def segment_body(self, carry):
        """One segment, like one iteration of a nested scan's outer loop: ``plan.segment`` slots
        that step up to the next state a compact lane is scheduled at (no further), writing the
        every-step records (no schedule test, no cond per step); then the state reached is
        recorded by the compact lanes where scheduled. The step and each view appear once in the
        program, and which states are recorded depends on the schedules only, so results are the
        same for any chunk size. A compact lane whose schedule is the only one, has no when= and
        whose period is the segment is taken at nearly every state reached (not at a chunk's end
        or a stop): its view is evaluated there unconditionally and written to its next slot,
        counted where taken (a cond costs a GPU a host round trip, and inside one the sparse
        benchmark's view ran slower on XLA:CPU); other lanes keep the cond, so an expensive view
        is never evaluated at another lane's steps."""
        plan, lanes, k0 = self.plan, self.lanes, self.k0
        schedules = {lanes[i].schedule for i, _ in plan.compact}
        prog = _progression(next(iter(schedules))) if len(schedules) == 1 else None
        plain = plan.segment == 0  # an inner loop of a runtime trip count, to the next scheduled state
        eager = {i for i, _ in plan.compact if lanes[i].when is None} \
            if len(schedules) == 1 and (plain or (prog is not None and prog.n == plan.segment)) else set()

        j, st, done, stopped, dense, compact, counts = carry
        # a segment past the chunk's end (or a stop) records nothing; the plain loop runs none
        live = jnp.ones((), bool) if plain else self.going(j, done, self.n)
        bound = self.next_bound(j) if plain else jnp.minimum(self.next_bound(j), j + plan.segment)

        def inner(c):
            j, st0, done0, stopped0, dense = c
            st, aux, logs, done, stopped = self.advance(j, st0, done0, stopped0)
            if plan.dense:
                dense = self.dense_rows(dense, st, aux, logs, j)
            if plain:
                return j + 1, st, done, stopped, dense
            j, st, done, stopped = _keep(self.going(j, done0, bound), (j + 1, st, done, stopped),
                                         (j, st0, done0, stopped0))
            return j, st, done, stopped, dense

        if plain:  # bound > j: at least one step
            j, st, done, stopped, dense = lax.while_loop(lambda c: self.going(c[0], c[2], bound), inner,
                                                         (j, st, done, stopped, dense))
        else:
            j, st, done, stopped, dense = _fixed(plan.segment, inner, (j, st, done, stopped, dense))
        new_compact, new_counts = [], []
        for (i, m), (buf, steps), count in zip(plan.compact, compact, counts):
            # whether the state reached is one this lane is scheduled at: asked again rather
            # than compared with the target found before the inner loop (no state it passed
            # is scheduled), so the target is not carried through the loop, a kernel less
            take = live & self.tests[i](k0 + j)
            if lanes[i].when is not None:
                take = take & when_flag(lanes[i], st, plan, live_at(stopped, k0 + j))
            if i in eager:
                buf, steps, count = _put_next(take & (count < m - 1), buf, steps, count,
                                              lanes[i].read(st, None, None), k0 + j)
            else:
                def write(args, i=i, k=k0 + j):
                    buf, steps, count = args
                    return _put(buf, lanes[i].read(st, None, None), count), _put_step(steps, k, count), count + 1

                buf, steps, count = lax.cond(take & (count < m), write, lambda a: a, (buf, steps, count))
            new_compact.append((buf, steps))
            new_counts.append(count)
        return j, st, done, stopped, dense, tuple(new_compact), tuple(new_counts)

    def sparse_body(self, carry):
        """The plain loop's body for only sparse records, some of them aux or logs (what the step
        returns): the steps before the next scheduled one run in an inner loop that only steps,
        then the scheduled step runs and records (no cond per step)."""
        def plain(c):
            j, st, done, stopped = c
            st, _, _, done, stopped = self.advance(j, st, done, stopped)
            return j + 1, st, done, stopped

        j, st, done, stopped = carry[:4]
        bound = self.next_bound(j)
        j, st, done, stopped = lax.while_loop(lambda c: self.going(c[0] + 1, c[2], bound), plain,
                                              (j, st, done, stopped))
        carry = (j, st, done, stopped, *carry[4:])
        return lax.cond(self.going(j, done, self.n), self.step_slot, lambda c: c, carry)


@dataclass(frozen=True)
class Signature:
    """What ``jax.jit`` sees of a call's arguments (tree, shapes, dtypes, committed shardings,
    weak types), taken cheaply at dispatch and kept without the arrays: a Run must not hold its
    initial state alive, and donated arrays are gone."""

    treedef: Any
    leaves: tuple

    @classmethod
    def of(cls, args: Any) -> "Signature":
        leaves, treedef = jax.tree_util.tree_flatten(args)
        out = []
        for x in leaves:
            if isinstance(x, jax.Array):
                out.append((x.shape, x.dtype, x.sharding if x.committed else None, bool(getattr(x, "weak_type", False))))
            else:
                x = np.asarray(x)
                out.append((x.shape, x.dtype, None, False))
        return cls(treedef, tuple(out))

    def differs(self, first: "Signature | None", at: str) -> str:
        """Why a dispatch compiled again what an earlier one with signature ``first`` compiled: the
        arguments whose shape, dtype, placement or weak type differ, named by their place in the
        chunk's arguments, or, where none differs, that JAX's caches no longer held the program."""
        names = ("state", "buffers", "key", "control", "counts", "masks", "stopped", "constants")
        if first is None or first.treedef != self.treedef:
            return f"{at}: the arguments' structure differs from the first dispatch's"
        paths = [jax.tree_util.keystr(kp) for kp, _ in
                 jax.tree_util.tree_flatten_with_path(jax.tree_util.tree_unflatten(self.treedef, range(len(self.leaves))))[0]]
        fields = ("shape", "dtype", "placement", "weak type")
        out = []
        for path, now, was in zip(paths, self.leaves, first.leaves):
            diff = [f"{f} {b} -> {a}" for f, a, b in zip(fields, now, was) if a != b]
            if diff:
                head = path.split("]", 1)
                arg = names[int(head[0][1:])] if head[0][1:].isdigit() and int(head[0][1:]) < len(names) else path
                out.append(f"{arg}{head[1] if len(head) > 1 else ''}: {', '.join(diff)}")
        if not out:
            return f"{at}: the same arguments as the first dispatch; JAX's caches no longer held the program"
        return f"{at}: " + "; ".join(out[:3]) + (f"; and {len(out) - 3} more" if len(out) > 3 else "")

    def abstract(self) -> Any:
        """The arguments as ``jax.ShapeDtypeStruct``, to lower the program again."""
        return jax.tree_util.tree_unflatten(self.treedef, [
            jax.ShapeDtypeStruct(shape, dtype, sharding=sharding, weak_type=weak)
            for shape, dtype, sharding, weak in self.leaves])


def abstract(args: Any) -> Any:
    """Arguments as ``jax.ShapeDtypeStruct`` with their shardings (committed arrays only, as jit
    sees them), to lower the program again after the arrays were donated."""
    return Signature.of(args).abstract()


# the chunk's last argument: the constants hoisted out of the step, views and predicates (see drive.prepare.identity)
chunk = jax.jit(with_consts(chunk_impl), static_argnums=0, donate_argnums=2)
chunk_donate = jax.jit(with_consts(chunk_impl), static_argnums=0, donate_argnums=(1, 2))
