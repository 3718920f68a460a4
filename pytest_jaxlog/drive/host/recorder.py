"""``jl.Recorder``: the Logger protocol for loops written by hand (``with rec: ... rec.log(state, k)``).

Each ``log`` evaluates the scheduled views in one jitted call and keeps the results on the
device; every ``flush_every`` calls (and at exit) they come to the host in one transfer and go,
as frames, to the same sinks and invariants ``jl.run`` uses. So the loop is not synced to the
host every step, and the recorded data is identical in format to ``jl.run``'s.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...errors import JaxlogError, JaxlogRuntimeWarning, hide_frame_from_checks
from ...logs import unheard, unheard_count
from ...profiling.timeline import now_ns
from ...profiling.timings import CompileTracker
from ...record import records as runmeta
from ...record.frames import Frames, Schema
from ...record.records import AUX, LOG, normalize_records
from ...record.schedule import Every, check_count
from ...record.values import check_dt
from ..device import program
from ..device.program import Lane
from ..prepare.identity import Cache
from ..prepare.schema import resolve, takes_values
from ..prepare.sharding import explicit_mesh
from .pipeline import Pipeline
from .result import run_timings
from .signals import sigterm_noted

__all__ = ['Recorder']

BUFFER_BYTES = 64 * 2**20  # device buffer per record between flushes (like jl.run's chunk budget)
_KEPT = "\0when"  # buffer entry of a when= record: whether the row is kept (not a record path)


class Recorder:
    """Records views of the states a hand-written loop passes to ``log(state, step)``.

    Step labels must increase (they may be sparse, or start anywhere, e.g. a resumed run); a
    record is taken when its schedule contains the label. The schema is resolved on the first
    ``log`` (sinks open then). Invariants are checked per flush. ``on_violation="raise"``: the sinks
    get the frames up to the violating step and are closed ``violated``, the violation is raised
    (from ``log``, or at exit) and later ``log`` calls are ignored. ``"warn"`` (a JaxlogRuntimeWarning
    per invariant, at its first violation) and ``"record"`` go on recording: every frame is written
    and the sinks are closed ``violated`` at exit with the first violation (``.violation``). For
    post-mortem states, put a ``jl.RingBuffer`` beside the recorder in a ``jl.CompositeLogger``.

    ``timings.compiles`` counts every compilation during the ``with`` block except the recorder's
    own (so a user step that recompiles every call, e.g. on a changing shape, shows it).

    Values a view logs with ``jl.log`` (inside a library function it calls, say) are recorded
    too, as ``"log/<name>"`` on that view's schedule; ``log_capacity`` is the capacity of such logs
    inside ``lax.while_loop`` that give none. What the step itself logs is the loop's to hand
    over: ``state, logs = jl.spool(step)(state); rec.log(state, k, logs=logs)`` records each name
    as ``"log/<name>"`` at every step given ``logs`` (from the first ``log`` on, as the records are
    fixed then). A ``jl.log`` traced during the ``with`` block with nothing collecting it (a step
    jitted as it is) would be lost: a ``JaxlogRuntimeWarning`` says so, once.

    ``meta={...}``: the run's metadata as JSON, as for ``jl.run`` (kept in the file, read back as
    ``traj.meta`` and ``rec.meta``, listed in the pytest manifest).

    Memory: each record's device buffer holds ``flush_every`` frames, or as many as fit in
    ``buffer_bytes`` (64 MiB) when fewer; a full buffer flushes early. So a large ``flush_every``
    (fewer host syncs) never allocates ``flush_every`` frames of a big or sparse record up front.
    """

    feeds_sinks = True  # it feeds sinks of its own: a run refuses one in its sinks=

    def __init__(self, record: Any = None, *, sinks: Any = (), invariants: Any = (), flush_every: int = 100,
                 dt: float | None = None, batched: bool = False, on_violation: str = "raise", timeline: Any = None,
                 buffer_bytes: int = BUFFER_BYTES, log_capacity: int | None = None, meta: dict | None = None):
        self.meta = {} if meta is None else runmeta.check_meta(meta)
        self.flush_every = check_count(flush_every, "flush_every", minimum=1)
        self.buffer_bytes = check_count(buffer_bytes, "buffer_bytes", minimum=1)
        self.specs = tuple(Lane(s.name, s.schedule, view=s.view, when=_state_predicate(s.name, s.when))
                           for s in normalize_records(record, reserved=(AUX, LOG)))
        self.log_capacity = None if log_capacity is None else check_count(log_capacity, "log_capacity", minimum=1,
                                                                          none="or None")
        self.dt = check_dt(dt)
        self.batched = bool(batched)
        self.timeline = timeline
        self.schema: Schema | None = None
        self.violation = None
        self.timings = None
        self.status = "new"
        self._pipe = Pipeline(sinks=sinks, invariants=invariants, on_violation=on_violation, timeline=timeline)
        self.on_violation = self._pipe.on_violation
        self._buffers = _Buffers(self.specs, self.flush_every)
        self._labels = _Labels()
        self._block: _Block | None = None  # the `with` block, once entered
        self._trajectory = None

    # --- Logger protocol --------------------------------------------------------------------
    def __enter__(self) -> "Recorder":
        if self.status != "new":
            raise JaxlogError("a Recorder records one run; make a new one for the next `with` block")
        self._block = _Block()
        self._labels.active = True
        self.status = "running"
        return self

    def log(self, state: Any, step: int, *, logs: Mapping[str, Any] | None = None) -> None:
        """Record ``state`` as step ``step``; ``logs``: what ``jl.spool(step)`` returned beside it."""
        __tracebackhide__ = hide_frame_from_checks
        labels, block, buffers = self._labels, self._block, self._buffers
        if not labels.active or block is None:
            raise JaxlogError("Recorder.log() called outside `with recorder:` (enter it first; it opens the sinks)")
        if block.noted is not None:  # a SIGTERM since the last log: stop here, as for Ctrl-C
            block.noted.act()
        step = _step_label(step)
        if not block.warned and unheard_count() > block.unheard_before:
            block.warn_unheard()
        declared = False
        if logs is not None:
            logs = _check_logs(logs, step)
            declared = logs is not None and _declared(logs)
        if labels.last is not None and step <= labels.last:
            what = "repeats" if step == labels.last else "goes backwards"
            raise JaxlogError(f"Recorder.log: step {step} {what} (previous step {labels.last}); labels must increase")
        if labels.halted:
            labels.last = step
            return
        if self.schema is None:
            self._start(state, logs)
        if logs is not None and buffers.log_lane is None:
            raise JaxlogError(
                f"Recorder.log: logs= given at step {step} but not at the first log (step {labels.first}), which "
                f"fixed the records: give logs= from the first log on; for a first state no step produced, "
                f"declare their shapes: rec.log(state, {labels.first}, logs=jax.eval_shape(jl.spool(step), state)[1])")
        take_logs = logs is not None and not declared
        idx = tuple(i for i, on in enumerate(buffers.on) if on(step) and (i != buffers.log_lane or take_logs))
        full = bool(idx) and buffers.write(self.specs, idx, state, step, logs if take_logs else None,
                                           timed=self.timeline is not None)
        # only now is the step logged (a Ctrl-C or SIGTERM above leaves steps_done at the previous one)
        labels.last = step
        if labels.first is None:
            labels.first = step
        labels.calls += 1
        if labels.calls % self.flush_every == 0 or full:
            self._flush()

    def __exit__(self, exc_type, exc, tb):
        __tracebackhide__ = hide_frame_from_checks
        labels, block = self._labels, self._block
        if not labels.active or block is None:
            return False
        labels.active = False
        if exc_type is None and not block.warned:
            block.warn_unheard()
        try:
            if exc_type is None:
                if self.schema is None:
                    self._open(Schema((), batched=self.batched, dt=self.dt), logged=False)
                if not labels.halted:
                    self._flush()
                if not labels.halted and self._pipe.opened:
                    late = self._pipe.finish()  # an aggregate whose window the loop ended before
                    if late:
                        self._violated(late)
                if not self._pipe.closed:
                    # "warn"/"record" with a violation: the whole loop was recorded, and it broke an invariant
                    status = "complete" if self._pipe.first is None else "violated"
                    try:
                        self._pipe.close(status, steps_done=labels.last or 0)
                        self.status = status
                    except BaseException:  # a sink failed to close (its error is raised): not complete
                        self.status = "failed"
                        raise
            else:
                # the loop's own exception is the one to raise; what goes wrong while saving what it
                # handed over is added to it as a note
                try:
                    if self.schema is None:
                        self._open(Schema((), batched=self.batched, dt=self.dt), logged=False)
                    elif not labels.halted:
                        self._flush(check=False)
                except BaseException as e:
                    exc.add_note(f"[jaxlog] Recorder: the frames logged since the last flush were not "
                                 f"written: {type(e).__name__}: {e}")
                status = "stopped" if issubclass(exc_type, KeyboardInterrupt) else "failed"
                if not self._pipe.closed:  # what the sinks were handed (a log cut short may have lost its rows)
                    self._pipe.close(status, steps_done=labels.through or 0, raise_errors=False, reason=exc)
                    self.status = status
        finally:
            self.timings = block.timings(0 if labels.first is None else labels.last - labels.first, self.timeline)
            # last: a SIGTERM noted after the loop's last log is raised here (the loop's own error wins)
            block.sigterm.__exit__(exc_type, exc, tb)
        if exc_type is None and self.violation is not None and self.on_violation == "raise" and labels.raise_at_exit:
            raise self.violation
        return False

    # --- results ----------------------------------------------------------------------------
    @property
    def trajectory(self) -> Any:
        if self.status == "new":
            raise JaxlogError("Recorder has not run yet")
        if self._trajectory is None:
            self._trajectory = self._pipe.trajectory()
        return self._trajectory

    @property
    def artifacts(self) -> dict:
        return self._pipe.artifacts

    @property
    def steps_done(self) -> int:
        return 0 if self._labels.last is None else self._labels.last

    # --- internals --------------------------------------------------------------------------
    def _start(self, state: Any, logs: Mapping[str, Any] | None = None) -> None:
        buffers = self._buffers
        if logs:  # the step's logs: a lane of their own, taken at every step they are given
            lane = Lane(LOG, Every(1), log_paths=(LOG,))
            buffers.add_log_lane(len(self.specs), lane, self.flush_every)
            self.specs = (*self.specs, lane)
        found = resolve(self.specs, state, batched=self.batched, dt=self.dt, abstract=_jittable(state),
                        log_capacity=self.log_capacity, logs=lambda _state: _as_values(logs))
        self.specs, schema = found.lanes, found.schema  # views that call jl.log wrapped to collect
        self._open(schema)
        buffers.size(self.specs, schema, self.flush_every, self.buffer_bytes)

    def _open(self, schema: Schema, *, logged: bool = True) -> None:
        self.schema = schema
        described = {"driver": "recorder", "steps": None, "chunk": self.flush_every, "dt": self.dt,
                     "batched": self.batched, "flush_every": self.flush_every}
        if self.meta:
            described[runmeta.KEY] = self.meta
        self._pipe.open(schema, described, bind=logged)

    def _flush(self, check: bool = True) -> None:
        __tracebackhide__ = hide_frame_from_checks
        buffers = self._buffers
        if not buffers.pending:
            return
        frames, live = buffers.frames(self.schema)
        try:
            new = self._pipe.feed(frames, f"flush {len(frames)} records", times=buffers.flush_times, check=check)
        except KeyboardInterrupt:  # the frames may be handed over only in part: the flush at exit says
            raise
        except BaseException as exc:
            self._pipe.close("failed", steps_done=self._labels.last or 0, raise_errors=False, reason=exc)
            self.status = "failed"
            raise
        buffers.clear(live)
        self._labels.through = self._labels.last
        if new:
            self._violated(new)

    def _violated(self, new: list) -> None:
        """New violations from one flush, earliest first (the pipeline's ``first`` is the run's first)."""
        __tracebackhide__ = hide_frame_from_checks
        self.violation = self._pipe.first
        if self.on_violation == "raise":
            v = new[0]
            self._labels.halted = True
            self.status = "violated"
            self._pipe.close("violated", steps_done=v.step)
            if self._labels.active:
                raise v
            self._labels.raise_at_exit = True


@dataclass
class _Labels:
    """The steps a Recorder was given, and whether it still takes them."""

    first: int | None = None
    last: int | None = None
    through: int | None = None  # the last logged step whose frames were all handed to the sinks
    calls: int = 0
    active: bool = False  # inside the `with` block
    halted: bool = False  # a violation stopped the recording (on_violation="raise")
    raise_at_exit: bool = False  # that violation is raised when the block ends


class _Block:
    """A Recorder's ``with`` block: its clock, the compilations during it (the recorder's own
    excepted), SIGTERM noted (acted on at the next log, ``drive.host.signals``), and the ``jl.log``
    calls nothing collected."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.sigterm = sigterm_noted()
        self.noted = self.sigterm.__enter__()
        self.tracker = CompileTracker(exclude=_OWN_PROGRAMS).__enter__()
        self.unheard_before = unheard_count()  # jl.log calls nothing collected, before the `with` block
        self.warned = False

    def warn_unheard(self) -> None:
        """Say once that this thread traced ``jl.log`` calls nothing collected since the recorder
        started (a step jitted as it is): their values are lost."""
        lost = unheard()
        if lost.calls <= self.unheard_before:
            return
        self.warned = True
        warnings.warn(JaxlogRuntimeWarning(
            f"[jaxlog] Recorder: jl.log was called {lost.calls - self.unheard_before} time(s) while nothing "
            f"collected it (the latest: log {lost.name!r} at {lost.where}), so those values are not recorded. "
            f"To record them, spool the step and hand its logs over: `state, logs = jl.spool(step)(state); "
            f"rec.log(state, k, logs=logs)` (recorded as 'log/<name>'), or log them inside a record's view"),
            stacklevel=3)

    def timings(self, steps: int, timeline: Any) -> Any:
        """The block's timings (the tracker stops), put on the timeline too."""
        self.tracker.__exit__(None, None, None)
        timings = run_timings(self.tracker, time.perf_counter() - self.t0, steps)
        if timeline is not None:
            self.tracker.add_to_timeline(timeline)
        return timings


class _Buffers:
    """A Recorder's device buffers between flushes, one per record: ``rows[i]`` rows each, the
    step labels written into them (and their log() times, with a timeline)."""

    def __init__(self, specs: tuple, flush_every: int):
        self.on = [spec.schedule.contains for spec in specs]
        self.keys: dict[tuple[int, ...], _LogKey] = {}
        self.bufs: list[dict | None] = [None] * len(specs)
        self.rows: list[int] = [flush_every] * len(specs)
        self.steps: list[list[int]] = [[] for _ in specs]
        self.times: list[list[int]] = [[] for _ in specs]
        self.expect: list[dict[str, tuple[tuple[int, ...], np.dtype]]] = []
        self.flush_times: dict[str, np.ndarray] = {}
        self.pending = False
        self.jit_state: bool | None = None  # decided on the first log: can the state be a jit argument?
        self.log_lane: int | None = None  # the lane of the logs handed to log(logs=...)

    def add_log_lane(self, index: int, lane: Lane, flush_every: int) -> None:
        self.log_lane = index
        self.on.append(lane.schedule.contains)
        self.bufs.append(None)
        self.rows.append(flush_every)
        self.steps.append([])
        self.times.append([])

    def size(self, specs: tuple, schema: Schema, flush_every: int, buffer_bytes: int) -> None:
        """What each record's rows hold, and how many rows a buffer takes: flush_every, or fewer
        when that many frames of the record would pass buffer_bytes (a sparse or large record
        with a huge flush_every: flushed when full)."""
        self.expect = [{leaf.path: (tuple(leaf.shape), np.dtype(leaf.dtype)) for leaf in schema.leaves
                        if leaf.record == spec.name} for spec in specs]
        for spec, expect in zip(specs, self.expect):
            if spec.when is not None:  # the when= flag of each row, kept beside it until the flush
                expect[_KEPT] = ((), np.dtype(np.bool_))
        for i, leaves in enumerate(self.expect):
            frame = sum(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize for shape, dtype in leaves.values())
            self.rows[i] = int(max(1, min(flush_every, buffer_bytes // max(1, frame))))

    def write(self, specs: tuple, idx: tuple[int, ...], state: Any, step: int, logs: Any, *, timed: bool) -> bool:
        """The records ``idx`` of ``state`` (and the step's ``logs``) written into the next row of
        their buffers (``timed``: their log() time kept, for the timeline); whether a buffer is full."""
        key = self.keys.get(idx)
        if key is None:
            key = self.keys[idx] = _LogKey.of(specs, idx)
        bufs = []
        for i in idx:
            if self.bufs[i] is None:  # put from the host: jnp.zeros dispatches (and compiles) a program per leaf
                self.bufs[i] = jax.device_put({p: np.zeros((self.rows[i], *shape), dtype) for p, (shape, dtype)
                                               in self.expect[i].items()}, _replicated_on(state))
            bufs.append(self.bufs[i])
        rows = np.array([len(self.steps[i]) for i in idx], np.int32)  # one argument, one transfer
        try:
            if self.jit_state is None:
                self.jit_state = _jittable(state)
            new = None
            if self.jit_state:  # views and buffer writes in one jitted call
                try:
                    new = (_log_into(key, state, tuple(bufs), rows) if logs is None
                           else _log_into(key, state, tuple(bufs), rows, logs))
                except TypeError:
                    if _jittable(state):
                        raise
                    self.jit_state = False  # the state changed kind since the first log
            if not self.jit_state:  # views on the concrete state (any object), then one jitted buffer write
                new = _write_into(key, _eval_views(key, state, logs), tuple(bufs), rows)
        except _ShapeChange as e:
            raise JaxlogError(f"record {e.path!r} at step {step}: {e.detail}") from e.__cause__
        full = False
        t_log = now_ns() if timed else 0
        for i, b in zip(idx, new):
            self.bufs[i] = b
            self.steps[i].append(step)
            if timed:
                self.times[i].append(t_log)
            full = full or len(self.steps[i]) >= self.rows[i]
        self.pending = True
        return full

    def frames(self, schema: Schema) -> tuple[Frames, list[int]]:
        """The buffered rows as frames, and which buffers they came from. Nothing is cleared
        here: the caller clears the buffers once the frames are handed over, so a Ctrl-C or
        SIGTERM in between loses no row (the flush at exit hands them over again)."""
        live = [i for i, st in enumerate(self.steps) if st]
        host = jax.device_get([self.bufs[i] for i in live])  # one transfer per flush
        per_path = {}
        self.flush_times = {}
        for i, vals in zip(live, host):
            n = len(self.steps[i])
            steps = np.asarray(self.steps[i], np.int64)
            keep = vals.pop(_KEPT)[:n] if _KEPT in vals else np.ones(n, bool)  # when= rows that held
            for p, v in vals.items():
                per_path[p] = (steps[keep], v[:n][keep])
                if self.times[i]:
                    self.flush_times[p] = np.asarray(self.times[i], np.int64)[keep]
        frames = Frames()
        for leaf in schema.leaves:
            if leaf.path in per_path:
                frames.add(leaf.path, *per_path[leaf.path])
        return frames, live

    def clear(self, live: list[int]) -> None:
        for i in live:
            self.steps[i] = []
            self.times[i] = []
            self.bufs[i] = None  # fresh buffers next time: the host arrays may alias these
        self.pending = any(self.steps)


def _check_logs(logs: Any, step: int) -> Mapping[str, Any] | None:
    """``log(logs=...)``: the dict ``jl.spool`` returns beside the output (``None``: none given;
    an empty one, from a step that logged nothing, is none)."""
    if logs is None:
        return None
    if not isinstance(logs, Mapping):
        raise JaxlogError(f"Recorder.log(state, {step}, logs=...): logs must be the dict jl.spool returns beside "
                          f"the output (`out, logs = jl.spool(step)(state)`), got {type(logs).__name__}")
    return logs or None


def _declared(logs: Mapping[str, Any]) -> bool:
    """Whether ``logs`` only declares the shapes of logs to come (``jax.ShapeDtypeStruct`` leaves,
    for a first state no step produced): nothing is recorded from it."""
    leaves = jax.tree_util.tree_leaves(logs)
    shapes = [isinstance(x, jax.ShapeDtypeStruct) for x in leaves]
    if any(shapes) and not all(shapes):
        raise JaxlogError("Recorder.log(logs=...): mixes values and jax.ShapeDtypeStruct declarations; give "
                          "either the logs a spooled step returned, or only their shapes")
    return all(shapes)


def _as_values(logs: Mapping[str, Any]) -> Any:
    """Declared shapes as (abstract) values: what resolution traces."""
    return jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype) if isinstance(x, jax.ShapeDtypeStruct)
                                  else x, logs)


def _step_label(step: Any) -> int:
    """``log``'s step as an int: Python/numpy ints, or a 0-d integer array (e.g. a step counter
    carried in the state: ``rec.log(state, state.step)``, the same label the other loggers take)."""
    if not isinstance(step, (int, np.integer)) or isinstance(step, (bool, np.bool_)):
        try:
            ok = getattr(step, "shape", None) == () and np.issubdtype(np.dtype(step.dtype), np.integer)
        except (AttributeError, TypeError):  # no dtype, or one numpy does not know (PRNG keys)
            ok = False
        if not ok:
            raise JaxlogError(f"Recorder.log(state, step): step must be an int >= 0, got {step!r}")
    step = int(step)
    if step < 0:
        raise JaxlogError(f"Recorder.log(state, step): step must be an int >= 0, got {step!r}")
    return step


class _LogKey:
    """Static argument of the per-log jitted function, hashed once (jit hashes it every call) and
    interned (jit compares it with the one it compiled for on every call: the same object
    compares at once, an equal one compares every record's view and schedule)."""

    __slots__ = ("specs", "idx", "_hash")
    _interned = Cache("recorder log keys", keep=256)  # a bound: keys of records no longer used may go

    def __init__(self, specs, idx):
        self.specs, self.idx = specs, idx
        self._hash = hash((specs, idx))

    @classmethod
    def of(cls, specs, idx) -> "_LogKey":
        key = cls(specs, idx)
        return cls._interned.intern(key)

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return self is other or (isinstance(other, _LogKey) and self.specs == other.specs and self.idx == other.idx)


class _ShapeChange(Exception):
    def __init__(self, path, detail):
        super().__init__(path, detail)
        self.path, self.detail = path, detail


def _state_predicate(name: str, when: Any) -> Any:
    """A Recorder record's ``when=``: a predicate of the state handed to ``log()``. One that takes
    the step's values (``when=lambda s, v: ...``) is refused: a hand-written loop's step is not
    the recorder's, so it has no aux or logs of it to give."""
    if takes_values(when, f"record {name!r}: when="):
        raise JaxlogError(f"record {name!r}: when= takes (state, values), but a Recorder sees only the state "
                          f"each log(state, step) is given, not what the loop's step computed: decide on the "
                          f"state (put the value in it), or run the step with jl.run, whose when= gets the step's "
                          f"aux and logs")
    return when


def _eval_views(key: _LogKey, state, logs=None) -> tuple:
    """The scheduled views' outputs, one ``{path: value}`` per record (a failing view is named)."""
    out = []
    for i in key.idx:
        try:
            vals = key.specs[i].read(state, None, logs)
            if key.specs[i].when is not None:
                vals[_KEPT] = program.when_flag(key.specs[i], state)
            out.append(vals)
        except Exception as exc:  # the user's view broke on this state: name the record
            err = _ShapeChange(key.specs[i].name, f"the view raised {type(exc).__name__}: {exc}")
            raise err from exc
    return tuple(out)


def _log_impl(key: _LogKey, state, bufs, rows, logs=None):
    """Evaluate the scheduled views (and take the step's logs) and write them into row ``rows[j]``
    of their device buffers."""
    return _write_impl(key, _eval_views(key, state, logs), bufs, rows)


def _write_impl(key: _LogKey, values, bufs, rows):
    """Write view outputs (checked against the schema) into row ``rows[j]`` of their buffers."""
    out = []
    for vals, buf, row in zip(values, bufs, rows):
        new = {}
        for p, b in buf.items():
            v = vals.get(p)
            if v is not None and not hasattr(v, "shape"):  # a Python scalar in the view's output
                v = jnp.asarray(v, b.dtype)
            if v is None or tuple(v.shape) != tuple(b.shape[1:]) or np.dtype(v.dtype) != np.dtype(b.dtype):
                got = "nothing" if v is None else f"{np.dtype(v.dtype)}{list(v.shape)}"
                raise _ShapeChange(p, f"got {got}, the schema says {np.dtype(b.dtype)}{list(b.shape[1:])} "
                                      "(views must keep their shape and dtype)")
            new[p] = lax.dynamic_update_index_in_dim(b, _unsharded(v), row, 0)
        out.append(new)
    return tuple(out)


def _replicated_on(state: Any) -> Any:
    """Replicated on the mesh of explicit axes a leaf of ``state`` is sharded over, else None (the
    default device): a row is written only into a buffer of its mesh."""
    for leaf in jax.tree_util.tree_leaves(state):
        mesh = explicit_mesh(getattr(leaf, "sharding", None))
        if mesh is not None:
            return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return None


def _unsharded(v: Any) -> Any:
    """``v`` replicated where its type is sharded over explicit mesh axes (``jax.make_mesh``'s
    default): a recorder's buffers are plain device arrays whose rows the host pulls whole, and a
    row is written only into a buffer of its own sharding."""
    sharding = getattr(jax.typeof(v), "sharding", None)
    if sharding is None or all(a is None for a in getattr(sharding, "spec", ())):
        return v
    return jax.sharding.reshard(v, jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec()))


_log_into = jax.jit(_log_impl, static_argnums=0, donate_argnums=2)
_write_into = jax.jit(_write_impl, static_argnums=0, donate_argnums=2)
# the drivers' own programs, never counted as the user's compilations
_OWN_PROGRAMS = (program.chunk_impl, _log_impl, _write_impl)


def _jittable(state: Any) -> bool:
    """Whether ``state`` can be a jit argument: a pytree of arrays and numbers only (a hand-written
    loop's state may be any object, or hold strings and configuration)."""
    return all(isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float, complex))
               for leaf in jax.tree_util.tree_leaves(state))
