"""``jl.Recorder``: the Logger protocol for loops written by hand (``with rec: ... rec.log(state, k)``).

Each ``log`` evaluates the scheduled views in one jitted call and keeps the results on the
device; every ``flush_every`` calls (and at exit) they come to the host in one transfer and go,
as frames, to the same sinks and invariants ``jl.run`` uses. So the loop is not synced to the
host every step, and the recorded data is identical in format to ``jl.run``'s.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._drive import SinkSet, Watch, add_compiles, compile_tracker, make_timings, provenance, Clock
from ._errors import JaxlogError
from ._invariants import as_list, check_on_violation, warn_violation
from ._frames import Frames, Schema
from ._records import AUX, normalize_records
from ._resolve import resolve_schema
from ._run import _JIT_NAMES, _views
from ._schedule import At, Every, Schedule, Window

__all__ = ["Recorder"]

BUFFER_BYTES = 64 * 2**20  # device buffer per record between flushes (like jl.run's chunk budget)


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

    Memory: each record's device buffer holds ``flush_every`` frames, or as many as fit in
    ``buffer_bytes`` (64 MiB) when fewer; a full buffer flushes early. So a large ``flush_every``
    (fewer host syncs) never allocates ``flush_every`` frames of a big or sparse record up front.
    """

    def __init__(self, record: Any = None, *, sinks: Any = (), invariants: Any = (), flush_every: int = 100,
                 dt: float | None = None, batched: bool = False, on_violation: str = "raise", timeline: Any = None,
                 buffer_bytes: int = BUFFER_BYTES):
        if isinstance(flush_every, bool) or not isinstance(flush_every, (int, np.integer)) or flush_every < 1:
            raise JaxlogError(f"flush_every must be an int >= 1, got {flush_every!r}")
        if isinstance(buffer_bytes, bool) or not isinstance(buffer_bytes, (int, np.integer)) or buffer_bytes < 1:
            raise JaxlogError(f"buffer_bytes must be an int >= 1, got {buffer_bytes!r}")
        self.buffer_bytes = int(buffer_bytes)
        self.specs = tuple(normalize_records(record, reserved=(AUX,)))
        self.sink_arg = sinks
        self.invariants = as_list(invariants)
        self.flush_every = int(flush_every)
        self.dt = dt
        self.batched = bool(batched)
        self.on_violation = check_on_violation(on_violation)
        self.timeline = timeline
        self.schema: Schema | None = None
        self.violation = None
        self.timings = None
        self.status = "new"
        self._sinks: SinkSet | None = None
        self._watch: Watch | None = None
        self._on = [_contains(spec.schedule) for spec in self.specs]
        self._keys: dict[tuple[int, ...], _LogKey] = {}
        self._bufs: list[dict | None] = [None] * len(self.specs)  # device buffers, self._rows[i] rows
        self._rows: list[int] = [self.flush_every] * len(self.specs)
        self._steps: list[list[int]] = [[] for _ in self.specs]  # labels written into them
        self._times: list[list[int]] = [[] for _ in self.specs]  # their log() times (with a timeline)
        self._pending = False
        self._flush_times: dict[str, np.ndarray] = {}
        self._jit_state: bool | None = None  # decided on the first log: can the state be a jit argument?
        self._calls = 0
        self._first: int | None = None
        self._last: int | None = None
        self._active = False
        self._halted = False
        self._expect: list[dict[str, tuple[tuple[int, ...], np.dtype]]] = []
        self._trajectory = None

    # --- Logger protocol --------------------------------------------------------------------
    def __enter__(self) -> "Recorder":
        if self.status != "new":
            raise JaxlogError("a Recorder records one run; make a new one for the next `with` block")
        self._sinks = SinkSet(self.sink_arg)
        self._sinks.set_timeline(self.timeline)
        self._clock = Clock()
        self._tracker = compile_tracker(exclude=_JIT_NAMES)
        if self._tracker is not None:
            self._tracker.__enter__()
        self._active = True
        self.status = "running"
        return self

    def log(self, state: Any, step: int) -> None:
        if not self._active:
            raise JaxlogError("Recorder.log() called outside `with recorder:` (enter it first; it opens the sinks)")
        step = _step_label(step)
        if self._last is not None and step <= self._last:
            what = "repeats" if step == self._last else "goes backwards"
            raise JaxlogError(f"Recorder.log: step {step} {what} (previous step {self._last}); labels must increase")
        if self._halted:
            self._last = step
            return
        if self.schema is None:
            self._start(state)
        self._last = step
        if self._first is None:
            self._first = step
        idx = tuple(i for i, on in enumerate(self._on) if on(step))
        if idx:
            key = self._keys.get(idx)
            if key is None:
                key = self._keys[idx] = _LogKey(self.specs, idx)
            bufs = []
            for i in idx:
                if self._bufs[i] is None:
                    self._bufs[i] = {p: jnp.zeros((self._rows[i], *shape), dtype) for p, (shape, dtype)
                                     in self._expect[i].items()}
                bufs.append(self._bufs[i])
            rows = tuple(len(self._steps[i]) for i in idx)
            try:
                if self._jit_state is None:
                    self._jit_state = _jittable(state)
                new = None
                if self._jit_state:  # views and buffer writes in one jitted call
                    try:
                        new = _log_into(key, state, tuple(bufs), rows)
                    except TypeError:
                        if _jittable(state):
                            raise
                        self._jit_state = False  # the state changed kind since the first log
                if not self._jit_state:  # views on the concrete state (any object), then one jitted buffer write
                    new = _write_into(key, _eval_views(key, state), tuple(bufs), rows)
            except _ShapeChange as e:
                raise JaxlogError(f"record {e.path!r} at step {step}: {e.detail}") from e.__cause__
            full = False
            t_log = _now() if self.timeline is not None else 0
            for i, b in zip(idx, new):
                self._bufs[i] = b
                self._steps[i].append(step)
                if self.timeline is not None:
                    self._times[i].append(t_log)
                full = full or len(self._steps[i]) >= self._rows[i]
            self._pending = True
        else:
            full = False
        self._calls += 1
        if self._calls % self.flush_every == 0 or full:
            self._flush()

    def __exit__(self, exc_type, exc, tb):
        if not self._active:
            return False
        self._active = False
        try:
            if exc_type is None:
                if self.schema is None:
                    self._open(Schema((), batched=self.batched, dt=self.dt))
                if not self._halted:
                    self._flush()
                if not self._sinks.closed:
                    first = None if self._watch is None else self._watch.first
                    try:
                        if first is None:
                            self._sinks.close("complete", steps_done=self._last or 0)
                            self.status = "complete"
                        else:  # "warn"/"record": the whole loop was recorded, and it broke an invariant
                            first.with_artifacts(self._sinks.artifacts)
                            self._sinks.close("violated", steps_done=self._last or 0, violation=first.to_json())
                            self.status = "violated"
                    except BaseException:  # a sink failed to close (its error is raised): not complete
                        self.status = "failed"
                        raise
            else:
                if self.schema is not None and not self._halted:
                    try:
                        self._flush(check=False)
                    except BaseException:
                        pass
                if self.schema is None:
                    try:
                        self._open(Schema((), batched=self.batched, dt=self.dt))
                    except BaseException:
                        pass
                status = "stopped" if issubclass(exc_type, KeyboardInterrupt) else "failed"
                if not self._sinks.closed:
                    first = None if self._watch is None else self._watch.first
                    self._sinks.close(status, steps_done=self._last or 0, raise_errors=False,
                                      violation=None if first is None else first.to_json())
                    self.status = status
        finally:
            if self._tracker is not None:
                self._tracker.__exit__(None, None, None)
            steps = 0 if self._first is None else self._last - self._first
            self.timings = make_timings(self._clock.elapsed(), steps, self._tracker)
            add_compiles(self._tracker, self.timeline)
        if exc_type is None and self.violation is not None and self.on_violation == "raise" and self._raise_at_exit:
            raise self.violation
        return False

    # --- results ----------------------------------------------------------------------------
    @property
    def trajectory(self) -> Any:
        if self._sinks is None:
            raise JaxlogError("Recorder has not run yet")
        if self._trajectory is None:
            self._trajectory = self._sinks.trajectory()
        return self._trajectory

    @property
    def artifacts(self) -> dict:
        return {} if self._sinks is None else self._sinks.artifacts

    @property
    def steps_done(self) -> int:
        return 0 if self._last is None else self._last

    # --- internals --------------------------------------------------------------------------
    _raise_at_exit = False

    def _start(self, state: Any) -> None:
        schema = resolve_schema(self.specs, state, batched=self.batched, dt=self.dt)
        self._watch = Watch(self.invariants, schema, self.on_violation)
        self._open(schema)
        self._expect = [{leaf.path: (tuple(leaf.shape), np.dtype(leaf.dtype)) for leaf in schema.leaves
                         if leaf.record == spec.name} for spec in self.specs]
        # rows per device buffer: flush_every, or fewer when that many frames of the record would
        # pass buffer_bytes (a sparse or large record with a huge flush_every: flushed when full)
        for i, leaves in enumerate(self._expect):
            frame = sum(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize for shape, dtype in leaves.values())
            self._rows[i] = int(max(1, min(self.flush_every, self.buffer_bytes // max(1, frame))))

    def _open(self, schema: Schema) -> None:
        self.schema = schema
        meta = {"provenance": provenance(),
                "run": {"driver": "recorder", "steps": None, "chunk": self.flush_every, "dt": self.dt,
                        "batched": self.batched, "flush_every": self.flush_every,
                        "invariants": [getattr(i, "name", repr(i)) for i in (self.invariants or ())]}}
        self._sinks.open(schema, meta)

    def _frames(self) -> Frames:
        live = [i for i, st in enumerate(self._steps) if st]
        host = jax.device_get([self._bufs[i] for i in live])  # one transfer per flush
        per_path = {}
        self._flush_times = {}
        for i, vals in zip(live, host):
            n = len(self._steps[i])
            steps = np.asarray(self._steps[i], np.int64)
            for p, v in vals.items():
                per_path[p] = (steps, v[:n])
                if self._times[i]:
                    self._flush_times[p] = np.asarray(self._times[i], np.int64)
        for i in live:
            self._steps[i] = []
            self._times[i] = []
            self._bufs[i] = None  # fresh buffers next time: the host arrays may alias these
        self._pending = False
        frames = Frames()
        for leaf in self.schema.leaves:
            if leaf.path in per_path:
                frames.add(leaf.path, *per_path[leaf.path])
        return frames

    def _flush(self, check: bool = True) -> None:
        if not self._pending:
            return
        t0 = _now()
        frames = self._frames()
        watch = self._watch
        try:
            new = watch.check(frames) if (check and watch) else []
            self._sinks.write(watch.frames_to_write(frames, new) if new else frames)
        except BaseException:
            self._sinks.close("failed", steps_done=self._last or 0, raise_errors=False)
            self.status = "failed"
            raise
        if self.timeline is not None:
            self.timeline.slice("host", f"flush {len(frames)} records", t0, _now())
            self._counters(watch.frames_to_write(frames, new) if new else frames)
        if new:
            self._violated(new)

    def _counters(self, frames: Frames) -> None:
        """A counter track per scalar record on the timeline, each value at its ``log()`` time
        (as ``jl.run`` does per chunk)."""
        for p in frames:
            v, ts = frames.values[p], self._flush_times.get(p)
            if (ts is None or v.ndim != 1 or not len(v) or np.iscomplexobj(v)
                    or not (np.issubdtype(v.dtype, np.number) or v.dtype == np.bool_)):
                continue
            try:
                self.timeline.counter_series(p, ts[: len(v)], v.astype(np.float64))
            except Exception:
                pass

    def _violated(self, new: list) -> None:
        """New violations from one flush, earliest first (``self._watch.first`` is the run's first)."""
        self.violation = self._watch.first
        if self.timeline is not None:
            for v in new:
                self.timeline.instant("invariants", v.invariant, args={
                    "step": v.step, "record": v.record, "system": -1 if v.system is None else v.system})
        if self.on_violation == "raise":
            v = new[0]
            self._halted = True
            self.status = "violated"
            v.with_artifacts(self._sinks.artifacts)
            self._sinks.close("violated", steps_done=v.step, violation=v.to_json())
            if self._active:
                raise v
            self._raise_at_exit = True
        elif self.on_violation == "warn":
            for v in new:
                warn_violation(v.with_artifacts(self._sinks.artifacts) or v, stacklevel=4)


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


def _contains(schedule: Schedule):
    """A fast ``step in schedule`` (called per log; the generic one builds numpy arrays)."""
    if type(schedule) is Every:
        n, start = schedule.n, schedule.start
        return lambda k: k >= start and (k - start) % n == 0
    if type(schedule) is Window:
        n, start, stop = schedule.every, schedule.start, schedule.stop
        return lambda k: start <= k <= stop and (k - start) % n == 0
    if type(schedule) is At:
        steps = frozenset(int(x) for x in schedule.steps)
        return steps.__contains__
    return schedule.__contains__


class _LogKey:
    """Static argument of the per-log jitted function, hashed once (jit hashes it every call)."""

    __slots__ = ("specs", "idx", "_hash")

    def __init__(self, specs, idx):
        self.specs, self.idx = specs, idx
        self._hash = hash((specs, idx))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return self is other or (isinstance(other, _LogKey) and self.specs == other.specs and self.idx == other.idx)


class _ShapeChange(Exception):
    def __init__(self, path, detail):
        super().__init__(path, detail)
        self.path, self.detail = path, detail


def _eval_views(key: _LogKey, state) -> tuple:
    """The scheduled views' outputs, one ``{path: value}`` per record (a failing view is named)."""
    out = []
    for i in key.idx:
        try:
            out.append(_views(key.specs, state, (i,)))
        except Exception as exc:  # the user's view broke on this state: name the record
            err = _ShapeChange(key.specs[i].name, f"the view raised {type(exc).__name__}: {exc}")
            raise err from exc
    return tuple(out)


def _log_impl(key: _LogKey, state, bufs, rows):
    """Evaluate the scheduled views and write them into row ``rows[j]`` of their device buffers."""
    return _write_impl(key, _eval_views(key, state), bufs, rows)


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
            new[p] = lax.dynamic_update_index_in_dim(b, v, row, 0)
        out.append(new)
    return tuple(out)


_log_into = jax.jit(_log_impl, static_argnums=0, donate_argnums=2)
_write_into = jax.jit(_write_impl, static_argnums=0, donate_argnums=2)


def _jittable(state: Any) -> bool:
    """Whether ``state`` can be a jit argument: a pytree of arrays and numbers only (a hand-written
    loop's state may be any object, or hold strings and configuration)."""
    return all(isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float, complex))
               for leaf in jax.tree_util.tree_leaves(state))


def _now() -> int:
    import time

    return time.perf_counter_ns()
