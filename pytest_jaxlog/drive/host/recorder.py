"""``jl.Recorder``: the Logger protocol for loops written by hand (``with rec: ... rec.log(state, k)``).

Each ``log`` evaluates the scheduled views in one jitted call and keeps the results on the
device; every ``flush_every`` calls (and at exit) they come to the host in one transfer and go,
as frames, to the same sinks and invariants ``jl.run`` uses. So the loop is not synced to the
host every step, and the recorded data is identical in format to ``jl.run``'s.
"""

from __future__ import annotations

import time
import warnings
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
        self._on = [spec.schedule.contains for spec in self.specs]
        self._keys: dict[tuple[int, ...], _LogKey] = {}
        self._bufs: list[dict | None] = [None] * len(self.specs)  # device buffers, self._rows[i] rows
        self._rows: list[int] = [self.flush_every] * len(self.specs)
        self._steps: list[list[int]] = [[] for _ in self.specs]  # labels written into them
        self._times: list[list[int]] = [[] for _ in self.specs]  # their log() times (with a timeline)
        self._pending = False
        self._through: int | None = None  # the last logged step whose frames were all handed to the sinks
        self._flush_times: dict[str, np.ndarray] = {}
        self._jit_state: bool | None = None  # decided on the first log: can the state be a jit argument?
        self._calls = 0
        self._first: int | None = None
        self._last: int | None = None
        self._active = False
        self._halted = False
        self._expect: list[dict[str, tuple[tuple[int, ...], np.dtype]]] = []
        self._trajectory = None
        self._log_lane: int | None = None  # the lane of the logs handed to log(logs=...)
        self._unheard_before = 0  # jl.log calls nothing collected, before the `with` block
        self._warned = False

    # --- Logger protocol --------------------------------------------------------------------
    def __enter__(self) -> "Recorder":
        if self.status != "new":
            raise JaxlogError("a Recorder records one run; make a new one for the next `with` block")
        self._t0 = time.perf_counter()
        self._sigterm = sigterm_noted()  # SIGTERM noted, acted on at the next log (drive.host.signals)
        self._noted = self._sigterm.__enter__()
        self._tracker = CompileTracker(exclude=_OWN_PROGRAMS).__enter__()
        self._unheard_before = unheard_count()
        self._active = True
        self.status = "running"
        return self

    def log(self, state: Any, step: int, *, logs: Mapping[str, Any] | None = None) -> None:
        """Record ``state`` as step ``step``; ``logs``: what ``jl.spool(step)`` returned beside it."""
        __tracebackhide__ = hide_frame_from_checks
        if not self._active:
            raise JaxlogError("Recorder.log() called outside `with recorder:` (enter it first; it opens the sinks)")
        if self._noted is not None:  # a SIGTERM since the last log: stop here, as for Ctrl-C
            self._noted.act()
        step = _step_label(step)
        if not self._warned and unheard_count() > self._unheard_before:
            self._warn_unheard()
        declared = False
        if logs is not None:
            logs = _check_logs(logs, step)
            declared = logs is not None and _declared(logs)
        if self._last is not None and step <= self._last:
            what = "repeats" if step == self._last else "goes backwards"
            raise JaxlogError(f"Recorder.log: step {step} {what} (previous step {self._last}); labels must increase")
        if self._halted:
            self._last = step
            return
        if self.schema is None:
            self._start(state, logs)
        if logs is not None and self._log_lane is None:
            raise JaxlogError(
                f"Recorder.log: logs= given at step {step} but not at the first log (step {self._first}), which "
                f"fixed the records: give logs= from the first log on; for a first state no step produced, "
                f"declare their shapes: rec.log(state, {self._first}, logs=jax.eval_shape(jl.spool(step), state)[1])")
        take_logs = logs is not None and not declared
        idx = tuple(i for i, on in enumerate(self._on) if on(step) and (i != self._log_lane or take_logs))
        if idx:
            key = self._keys.get(idx)
            if key is None:
                key = self._keys[idx] = _LogKey.of(self.specs, idx)
            bufs = []
            for i in idx:
                if self._bufs[i] is None:  # put from the host: jnp.zeros dispatches (and compiles) a program per leaf
                    self._bufs[i] = jax.device_put({p: np.zeros((self._rows[i], *shape), dtype) for p, (shape, dtype)
                                                    in self._expect[i].items()}, _replicated_on(state))
                bufs.append(self._bufs[i])
            rows = np.array([len(self._steps[i]) for i in idx], np.int32)  # one argument, one transfer
            try:
                if self._jit_state is None:
                    self._jit_state = _jittable(state)
                new = None
                if self._jit_state:  # views and buffer writes in one jitted call
                    try:
                        new = (_log_into(key, state, tuple(bufs), rows) if not take_logs
                               else _log_into(key, state, tuple(bufs), rows, logs))
                    except TypeError:
                        if _jittable(state):
                            raise
                        self._jit_state = False  # the state changed kind since the first log
                if not self._jit_state:  # views on the concrete state (any object), then one jitted buffer write
                    new = _write_into(key, _eval_views(key, state, logs if take_logs else None), tuple(bufs), rows)
            except _ShapeChange as e:
                raise JaxlogError(f"record {e.path!r} at step {step}: {e.detail}") from e.__cause__
            full = False
            t_log = now_ns() if self.timeline is not None else 0
            for i, b in zip(idx, new):
                self._bufs[i] = b
                self._steps[i].append(step)
                if self.timeline is not None:
                    self._times[i].append(t_log)
                full = full or len(self._steps[i]) >= self._rows[i]
            self._pending = True
        else:
            full = False
        # only now is the step logged (a Ctrl-C or SIGTERM above leaves steps_done at the previous one)
        self._last = step
        if self._first is None:
            self._first = step
        self._calls += 1
        if self._calls % self.flush_every == 0 or full:
            self._flush()

    def __exit__(self, exc_type, exc, tb):
        __tracebackhide__ = hide_frame_from_checks
        if not self._active:
            return False
        self._active = False
        if exc_type is None and not self._warned:
            self._warn_unheard()
        try:
            if exc_type is None:
                if self.schema is None:
                    self._open(Schema((), batched=self.batched, dt=self.dt), logged=False)
                if not self._halted:
                    self._flush()
                if not self._halted and self._pipe.opened:
                    late = self._pipe.finish()  # an aggregate whose window the loop ended before
                    if late:
                        self._violated(late)
                if not self._pipe.closed:
                    # "warn"/"record" with a violation: the whole loop was recorded, and it broke an invariant
                    status = "complete" if self._pipe.first is None else "violated"
                    try:
                        self._pipe.close(status, steps_done=self._last or 0)
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
                    elif not self._halted:
                        self._flush(check=False)
                except BaseException as e:
                    exc.add_note(f"[jaxlog] Recorder: the frames logged since the last flush were not "
                                 f"written: {type(e).__name__}: {e}")
                status = "stopped" if issubclass(exc_type, KeyboardInterrupt) else "failed"
                if not self._pipe.closed:  # what the sinks were handed (a log cut short may have lost its rows)
                    self._pipe.close(status, steps_done=self._through or 0, raise_errors=False, reason=exc)
                    self.status = status
        finally:
            self._tracker.__exit__(None, None, None)
            steps = 0 if self._first is None else self._last - self._first
            self.timings = run_timings(self._tracker, time.perf_counter() - self._t0, steps)
            if self.timeline is not None:
                self._tracker.add_to_timeline(self.timeline)
            # last: a SIGTERM noted after the loop's last log is raised here (the loop's own error wins)
            self._sigterm.__exit__(exc_type, exc, tb)
        if exc_type is None and self.violation is not None and self.on_violation == "raise" and self._raise_at_exit:
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
        return 0 if self._last is None else self._last

    # --- internals --------------------------------------------------------------------------
    _raise_at_exit = False

    def _warn_unheard(self) -> None:
        """Say once that this thread traced ``jl.log`` calls nothing collected since the recorder
        started (a step jitted as it is): their values are lost."""
        lost = unheard()
        if lost.calls <= self._unheard_before:
            return
        self._warned = True
        warnings.warn(JaxlogRuntimeWarning(
            f"[jaxlog] Recorder: jl.log was called {lost.calls - self._unheard_before} time(s) while nothing "
            f"collected it (the latest: log {lost.name!r} at {lost.where}), so those values are not recorded. "
            f"To record them, spool the step and hand its logs over: `state, logs = jl.spool(step)(state); "
            f"rec.log(state, k, logs=logs)` (recorded as 'log/<name>'), or log them inside a record's view"),
            stacklevel=3)

    def _start(self, state: Any, logs: Mapping[str, Any] | None = None) -> None:
        if logs:  # the step's logs: a lane of their own, taken at every step they are given
            self._log_lane = len(self.specs)
            lane = Lane(LOG, Every(1), log_paths=(LOG,))
            self.specs = (*self.specs, lane)
            self._on.append(lane.schedule.contains)
            self._bufs.append(None)
            self._rows.append(self.flush_every)
            self._steps.append([])
            self._times.append([])
        found = resolve(self.specs, state, batched=self.batched, dt=self.dt, abstract=_jittable(state),
                        log_capacity=self.log_capacity, logs=lambda _state: _as_values(logs))
        self.specs, schema = found.lanes, found.schema  # views that call jl.log wrapped to collect
        self._open(schema)
        self._expect = [{leaf.path: (tuple(leaf.shape), np.dtype(leaf.dtype)) for leaf in schema.leaves
                         if leaf.record == spec.name} for spec in self.specs]
        for spec, expect in zip(self.specs, self._expect):
            if spec.when is not None:  # the when= flag of each row, kept beside it until the flush
                expect[_KEPT] = ((), np.dtype(np.bool_))
        # rows per device buffer: flush_every, or fewer when that many frames of the record would
        # pass buffer_bytes (a sparse or large record with a huge flush_every: flushed when full)
        for i, leaves in enumerate(self._expect):
            frame = sum(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize for shape, dtype in leaves.values())
            self._rows[i] = int(max(1, min(self.flush_every, self.buffer_bytes // max(1, frame))))

    def _open(self, schema: Schema, *, logged: bool = True) -> None:
        self.schema = schema
        described = {"driver": "recorder", "steps": None, "chunk": self.flush_every, "dt": self.dt,
                     "batched": self.batched, "flush_every": self.flush_every}
        if self.meta:
            described[runmeta.KEY] = self.meta
        self._pipe.open(schema, described, bind=logged)

    def _frames(self) -> tuple[Frames, list[int]]:
        """The buffered rows as frames, and which buffers they came from. Nothing is cleared
        here: the caller clears the buffers once the frames are handed over, so a Ctrl-C or
        SIGTERM in between loses no row (the flush at exit hands them over again)."""
        live = [i for i, st in enumerate(self._steps) if st]
        host = jax.device_get([self._bufs[i] for i in live])  # one transfer per flush
        per_path = {}
        self._flush_times = {}
        for i, vals in zip(live, host):
            n = len(self._steps[i])
            steps = np.asarray(self._steps[i], np.int64)
            keep = vals.pop(_KEPT)[:n] if _KEPT in vals else np.ones(n, bool)  # when= rows that held
            for p, v in vals.items():
                per_path[p] = (steps[keep], v[:n][keep])
                if self._times[i]:
                    self._flush_times[p] = np.asarray(self._times[i], np.int64)[keep]
        frames = Frames()
        for leaf in self.schema.leaves:
            if leaf.path in per_path:
                frames.add(leaf.path, *per_path[leaf.path])
        return frames, live

    def _clear(self, live: list[int]) -> None:
        for i in live:
            self._steps[i] = []
            self._times[i] = []
            self._bufs[i] = None  # fresh buffers next time: the host arrays may alias these
        self._pending = any(self._steps)

    def _flush(self, check: bool = True) -> None:
        __tracebackhide__ = hide_frame_from_checks
        if not self._pending:
            return
        frames, live = self._frames()
        try:
            new = self._pipe.feed(frames, f"flush {len(frames)} records", times=self._flush_times, check=check)
        except KeyboardInterrupt:  # the frames may be handed over only in part: the flush at exit says
            raise
        except BaseException as exc:
            self._pipe.close("failed", steps_done=self._last or 0, raise_errors=False, reason=exc)
            self.status = "failed"
            raise
        self._clear(live)
        self._through = self._last
        if new:
            self._violated(new)

    def _violated(self, new: list) -> None:
        """New violations from one flush, earliest first (the pipeline's ``first`` is the run's first)."""
        __tracebackhide__ = hide_frame_from_checks
        self.violation = self._pipe.first
        if self.on_violation == "raise":
            v = new[0]
            self._halted = True
            self.status = "violated"
            self._pipe.close("violated", steps_done=v.step)
            if self._active:
                raise v
            self._raise_at_exit = True


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
