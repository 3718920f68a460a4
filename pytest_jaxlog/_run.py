"""``jl.run``: the fast driver. Chunks of steps run on the device in one compiled loop; records
come out as device buffers and reach the host while the next chunk runs. No host callbacks in the step.

How a chunk of ``n <= C`` work steps ``k0 .. k0+n-1`` (recording steps ``k0+1 .. k0+n``) runs:

- one program per run, compiled for the capacity ``C`` (the chunk size) with the trip count ``n``
  a runtime value (``lax.fori_loop`` with a traced bound, i.e. a while loop): the last, shorter
  chunk, profile-window steps (``n = 1``) and the post-mortem replay run the very same executable.
  A loop whose trip count is known at compile time may be unrolled or removed by XLA (length 1),
  which changes fusion and so the last bits of reductions in views: with a runtime trip count,
  records and states are bit-identical whatever the chunk size;
- records scheduled every step (and the step's aux output) are written to row ``j`` of ``C``-row
  buffers; sparser records go into a slot buffer of ``schedule.max_in_span(C)`` rows: the host
  computes, per step, which slot the value goes to (or a trash slot), from the pure schedule, so
  only scheduled steps are transferred;
- the step's key is ``fold_in(key, k)``: nothing depends on where chunk boundaries fall, so a run
  resumes exactly.

Chunk ``i+1`` is dispatched before chunk ``i``'s outputs are pulled (JAX dispatch is async), so
host work (frames, invariants, sinks) overlaps device work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._drive import SinkSet, Watch, add_compiles, compile_tracker, make_timings, provenance, Clock
from ._errors import JaxlogError
from ._invariants import as_list, check_on_violation, warn_violation
from ._frames import Frames, Schema
from ._records import AUX, RecordSpec, normalize_records
from ._resolve import flatten_view, resolve_schema, state_key_impls, state_paths

__all__ = ["run", "Run", "auto_chunk"]

DEFAULT_BUDGET = 64 * 2**20
CHUNK_CAP = 10_000
_JIT_NAMES = ("_chunk_impl", "_views_impl", "_log_impl", "_write_impl")  # the drivers' own programs
_STEP_PROGRAMS = ("_chunk_impl",)  # those that compile the step function


@dataclass(frozen=True)
class _Plan:
    """Everything static about a chunk function: equal plans share one compiled executable."""

    step: Callable
    specs: tuple[RecordSpec, ...]
    dense: tuple[int, ...]  # spec indices recorded every step (row buffers)
    sparse: tuple[tuple[int, int], ...]  # (spec index, slots per chunk)
    has_aux: bool
    keyed: bool
    length: int


def _apply(step, has_aux, keyed, key, k, state):
    out = step(jax.random.fold_in(key, k), state) if keyed else step(state)
    if has_aux:
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise JaxlogError("has_aux=True: the step function must return (state, aux)")
        return out[0], out[1]
    return out, None


def _views(specs, state, idx):
    out = {}
    for i in idx:
        out.update(flatten_view(specs[i].name, specs[i].view(state)))
    return out


def _chunk_impl(plan: _Plan, state, key, k0, n, slots):
    def outputs(st):  # what one step records densely: every-step views and the aux output
        st, aux = _apply(plan.step, plan.has_aux, plan.keyed, key, k0, st)
        ys = _views(plan.specs, st, plan.dense)
        if plan.has_aux:
            ys.update(flatten_view(AUX, aux))
        return ys

    dense = {p: jnp.zeros((plan.length, *sd.shape), sd.dtype) for p, sd in jax.eval_shape(outputs, state).items()}
    bufs = []
    for i, m in plan.sparse:
        shapes = jax.eval_shape(lambda s: _views(plan.specs, s, (i,)), state)
        bufs.append({p: jnp.zeros((m + 1, *sd.shape), sd.dtype) for p, sd in shapes.items()})

    def body(j, carry):
        st, dense, bufs = carry
        st, aux = _apply(plan.step, plan.has_aux, plan.keyed, key, k0 + j, st)
        ys = _views(plan.specs, st, plan.dense)
        if plan.has_aux:
            ys.update(flatten_view(AUX, aux))
        dense = {p: lax.dynamic_update_index_in_dim(b, jnp.asarray(ys[p], b.dtype), j, 0) for p, b in dense.items()}
        new = []
        for (i, _), buf, slot in zip(plan.sparse, bufs, slots):
            # computed every step, written to its slot (the trash slot when unscheduled): no cond, so
            # XLA can share work between the view and the step (e.g. LJ pair terms)
            vals = _views(plan.specs, st, (i,))
            new.append({p: lax.dynamic_update_index_in_dim(buf[p], jnp.asarray(vals[p], buf[p].dtype), slot[j], 0)
                        for p in buf})
        return st, dense, tuple(new)

    state, dense, bufs = lax.fori_loop(0, n, body, (state, dense, tuple(bufs)))
    return state, dense, tuple({p: b[:m] for p, b in buf.items()} for (_, m), buf in zip(plan.sparse, bufs))


def _views_impl(specs, idx, state):
    return _views(specs, state, idx)


_chunk = jax.jit(_chunk_impl, static_argnums=0)
_chunk_donate = jax.jit(_chunk_impl, static_argnums=0, donate_argnums=1)
_views_jit = jax.jit(_views_impl, static_argnums=(0, 1))


@dataclass
class Run:
    """What ``jl.run`` returns: the state at ``steps_done``, the trajectory, timings, violation."""

    state: Any
    steps_done: int
    timings: Any
    violation: Any = None
    artifacts: dict = field(default_factory=dict)
    schema: Schema | None = None
    chunk: int | None = None
    status: str = "complete"
    _sinks: Any = field(default=None, repr=False)
    _trajectory: Any = field(default=None, repr=False)

    @property
    def trajectory(self) -> Any:
        """The recorded trajectory: loaded from the file sink if any, else in memory."""
        if self._trajectory is None:
            self._trajectory = self._sinks.trajectory()
        return self._trajectory


def auto_chunk(schema: Schema, steps: int, budget_bytes: int = DEFAULT_BUDGET, cap: int = CHUNK_CAP) -> int:
    """The chunk size ``chunk=None`` picks.

    ``min(steps, cap, budget_bytes // bytes_per_step)``, at least 1, where ``bytes_per_step`` is
    the recorded data one step adds (every-step leaves in full, sparser ones by their density).
    The budget bounds device and host memory per chunk whatever the run length; the cap (10,000
    steps) keeps the first frames and invariant checks coming while the run goes on; for long
    runs it gives a few hundred dispatches per million steps, which costs ~nothing.
    """
    per_step = 0.0
    for leaf in schema.leaves:
        nbytes = int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
        density = leaf.schedule.max_in_span(cap) / cap
        per_step += nbytes * density
    limit = cap if per_step <= 0 else int(budget_bytes // per_step)
    return int(max(1, min(steps, cap, limit)))


def _segments(start: int, end: int, chunk: int, windows) -> list[tuple[int, int, Any]]:
    """(k0, length, window or None) covering work steps start..end-1; window steps one by one."""
    out = []
    k = start
    for w in windows:
        lo, hi = max(w.start, start), min(w.stop, end - 1)
        if hi < lo:
            continue
        while k < lo:
            n = min(chunk, lo - k)
            out.append((k, n, None))
            k += n
        for j in range(lo, hi + 1):
            out.append((j, 1, w))
        k = hi + 1
    while k < end:
        n = min(chunk, end - k)
        out.append((k, n, None))
        k += n
    return out


def _slots(schedule, k0: int, length: int, m: int, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    steps = schedule.steps_between(k0 + 1, k0 + length)
    slot = np.full(capacity, m, dtype=np.int32)
    slot[steps - k0 - 1] = np.arange(len(steps), dtype=np.int32)
    return steps, slot


def _copy_tree(tree):
    return jax.tree_util.tree_map(lambda x: x.copy() if isinstance(x, jax.Array) else jnp.array(x, copy=True), tree)


def _host(tree):
    return jax.tree_util.tree_map(np.asarray, tree)


def _start_copy(tree):
    for leaf in jax.tree_util.tree_leaves(tree):
        try:
            leaf.copy_to_host_async()
        except Exception:
            pass


def run(step: Callable, state: Any, steps: int, *, record: Any = None, invariants: Any = (), sinks: Any = (),
        key: Any = None, dt: float | None = None, chunk: int | None = None, profile: Any = None, has_aux: bool = False,
        batched: bool = False, on_violation: str = "raise", postmortem: int = 3, progress: Any = None,
        chunk_budget_bytes: int = DEFAULT_BUDGET, timeline: Any = None, donate: bool = True,
        start_step: int = 0) -> Run:
    """Run ``steps`` applications of ``step`` on ``state`` on the device, recording as scheduled.

    ``step(state)``, or ``step(key_k, state)`` with ``key_k = fold_in(key, k)`` for the work of step
    ``k``; ``has_aux=True``: ``step`` returns ``(state, aux)`` and aux leaves are recorded every step
    as ``"aux/<path>"`` (from step ``start_step+1``). Steps are numbered from ``start_step`` (a resumed
    run continues the numbering and the key folding; its initial state is not recorded again).
    ``chunk=None``: see :func:`auto_chunk`. ``profile``: ProfileWindow(s) whose work steps run one
    dispatch each inside the trace. ``donate``: the carried state is donated to the device between
    chunks when nothing needs a chunk-start state again (no invariants); the caller's arrays are
    never donated. Invariant violations: the post-mortem states of the last ``postmortem`` steps up
    to the run's first violating step are attached to the sinks (replayed from a kept chunk-start
    state), and the sinks are closed ``violated`` with that violation (artifact paths included).
    ``on_violation="raise"`` stops there: sinks get the frames up to the violating step, ``run.state``
    is the state at that step, and the violation is raised. ``"warn"`` (a JaxlogRuntimeWarning per
    invariant, at its first violation) and ``"record"`` go on to the end: every frame is written,
    ``run.violation`` is the first violation and ``steps_done`` the full count.
    ``run.timings.compiles`` counts the step function's compilations that happened during this run
    (distinct state signatures: 1 on a cold cache, 0 when all was compiled before). KeyboardInterrupt and other exceptions close the sinks (``stopped``/
    ``failed``) and are re-raised with the partial :class:`Run` as ``exc.jaxlog_run``: its state is
    the state at the last step whose frames were written (``donate=False`` or invariants given),
    or, when the state was donated, the newest state computed (``steps_done`` then says which
    step it is; the sinks' ``steps_done`` is the last written step).
    """
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise JaxlogError(f"steps must be an int >= 0, got {steps!r}")
    if isinstance(start_step, bool) or not isinstance(start_step, (int, np.integer)) or start_step < 0:
        raise JaxlogError(f"start_step must be an int >= 0, got {start_step!r}")
    steps, start_step = int(steps), int(start_step)
    if start_step + steps >= 2**31:
        raise JaxlogError(f"step numbers up to {start_step + steps} do not fit the int32 step counter")
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1):
        raise JaxlogError(f"chunk must be an int >= 1 or None, got {chunk!r}")
    if not callable(step):
        raise JaxlogError(f"step must be callable, got {step!r}")
    check_on_violation(on_violation)
    invariants = as_list(invariants)
    postmortem = int(postmortem)
    keyed = key is not None
    specs = tuple(normalize_records(record, reserved=(AUX,)))

    clock = Clock()
    tracker = compile_tracker(*_STEP_PROGRAMS)
    if tracker is not None:
        tracker.__enter__()
    try:
        return _run(step, state, steps, specs, invariants, sinks, key, keyed, dt, chunk, profile, has_aux, batched,
                    on_violation, postmortem, progress, chunk_budget_bytes, timeline, donate, start_step, clock,
                    tracker)
    finally:
        if tracker is not None:
            tracker.__exit__(None, None, None)
            add_compiles(tracker, timeline)


def _run(step, state, steps, specs, invariants, sinks, key, keyed, dt, chunk, profile, has_aux, batched, on_violation,
         postmortem, progress, budget, timeline, donate, start_step, clock, tracker) -> Run:
    from ._profile import check_windows

    end = start_step + steps
    windows = check_windows(profile, end, start_step) if profile is not None else ()
    state = _as_arrays(state)
    if keyed:
        key = jnp.asarray(key)

    # --- resolve what the step and the views produce (errors before any step runs) ------------
    schema = _resolve(step, specs, state, key, has_aux, keyed, batched, dt)
    watch = Watch(invariants, schema, on_violation)
    chunk = auto_chunk(schema, steps, budget) if chunk is None else int(chunk)
    chunk = max(1, min(chunk, steps)) if steps else 1
    dense = tuple(i for i, s in enumerate(specs) if s.schedule.is_every_step)
    sparse_idx = tuple(i for i, s in enumerate(specs) if not s.schedule.is_every_step)
    record_initial = start_step == 0
    use_donate = bool(donate) and not watch  # with invariants, chunk-start states are kept for the post-mortem
    n_state = len(jax.tree_util.tree_leaves(state))

    sinkset = SinkSet(sinks)
    sinkset.set_timeline(timeline)
    meta = {"provenance": provenance(),
            "run": {"driver": "run", "steps": steps, "start_step": start_step, "chunk": chunk, "dt": dt,
                    "has_aux": bool(has_aux), "batched": bool(batched), "keyed": keyed,
                    "on_violation": on_violation,
                    "invariants": [getattr(i, "name", repr(i)) for i in (invariants or ())]}}
    sinkset.open(schema, meta)

    bar = _progress(progress, steps)
    sparse = tuple((i, max(1, specs[i].schedule.max_in_span(chunk))) for i in sparse_idx)
    plan = _Plan(step, specs, dense, sparse, bool(has_aux), keyed, chunk)  # one program for every chunk
    fn = _chunk_donate if use_donate else _chunk
    trash = tuple(np.full(chunk, m, dtype=np.int32) for _, m in sparse)

    def one_step(st, k):  # the post-mortem replay: the run's own program, one step (never donating)
        return _chunk(plan, st, key, np.int32(k), np.int32(1), trash)[0]
    cur = _copy_tree(state) if use_donate else state
    written_step, written_state = start_step, cur if not use_donate else None
    cur_step = start_step
    status = "running"
    pending = None  # (k0, length, start_state, sparse steps, outputs, t_dispatched)
    starts: list = []  # recent (k0, chunk-start state) covering the last `postmortem` steps (no donation)
    init_frames = None
    pm_state = None  # the state at the first violating step, replayed for the post-mortem

    def found(new, pend) -> None:
        """New violations from one batch (earliest first): mark them on the timeline, save the
        post-mortem of the run's first violation, warn once per invariant in "warn" mode."""
        nonlocal pm_state
        for v in new:
            if timeline is not None:
                timeline.instant("invariants", v.invariant, args={"step": v.step, "record": v.record,
                                                                   "system": -1 if v.system is None else v.system})
        if new[0] is watch.first:
            pm_state = _replay(watch.first, pend, starts, one_step, postmortem, sinkset)
        if on_violation == "warn":
            for v in new:
                warn_violation(v.with_artifacts(sinkset.artifacts) or v, stacklevel=4)

    try:
        if bar is not None:
            bar.__enter__()
        if record_initial:
            idx = tuple(i for i, s in enumerate(specs) if start_step in s.schedule)
            if idx:
                init_frames = (idx, _views_jit(specs, idx, state))
        segs = _segments(start_step, end, chunk, windows)
        open_window = None
        stop = False
        for n, (k0, length, win) in enumerate(segs):
            slot_arrays, sparse_steps = [], []
            for i, m in plan.sparse:
                st, sl = _slots(specs[i].schedule, k0, length, m, chunk)
                sparse_steps.append(st)
                slot_arrays.append(sl)
            start_state = cur
            t0 = _now()
            if win is not None:
                if open_window is not win:
                    win.begin()
                    open_window = win
                with win.step(k0):
                    out = fn(plan, cur, key, np.int32(k0), np.int32(length), tuple(slot_arrays))
                    jax.block_until_ready(out[0])  # the step's device time belongs to its annotation
                if k0 == win.stop or k0 == end - 1:
                    win.end(block_on=out[0])
                    open_window = None
            else:
                out = fn(plan, cur, key, np.int32(k0), np.int32(length), tuple(slot_arrays))
            cur, cur_step = out[0], k0 + length
            if length < chunk:  # a short chunk: transfer only its rows
                out = (cur, {p: v[:length] for p, v in out[1].items()}, out[2])
            _start_copy(out[1:])
            t1 = _now()
            if timeline is not None:
                timeline.slice("dispatch", f"steps {k0}..{k0 + length}", t0, t1, {"k0": k0, "length": length})
            if pending is not None:
                new = _handle(pending, specs, sinkset, watch, timeline, init_frames)
                init_frames = None
                if new:
                    found(new, pending)
                    if on_violation == "raise":
                        stop = True
                        break
                if watch and watch.first is None:
                    starts.append((pending[0], pending[2]))
                    while len(starts) >= 2 and starts[1][0] <= k0 - postmortem:
                        starts.pop(0)
                written_step = pending[0] + pending[1]
                written_state = None if use_donate else start_state  # = state at the pending chunk's end
                if bar is not None:
                    bar.advance(written_step - start_step)
            pending = (k0, length, None if use_donate else start_state, sparse_steps, out[1:], t1)
        for w in windows:  # a violation inside a window stops the run there: stop the profiler too
            if w.active:
                w.end(block_on=cur)
        if not stop and pending is not None:
            new = _handle(pending, specs, sinkset, watch, timeline, init_frames)
            init_frames = None
            if new:
                found(new, pending)
                stop = on_violation == "raise"
            if not stop:
                written_step = pending[0] + pending[1]
                written_state = cur
                if bar is not None:
                    bar.advance(written_step - start_step)
        elif not stop and init_frames is not None:  # steps == 0: only the initial record
            frames = _initial(init_frames, specs, start_step)
            new = watch.check(frames)
            sinkset.write(watch.frames_to_write(frames, new))
            if new:
                found(new, (start_step, 0, state, [], None, None))
            written_state = cur
        violation = watch.first
        if violation is not None:
            status = "violated"
            if on_violation == "raise":  # the state and the frames end at the violating step
                cur = written_state = pm_state
                written_step = violation.step
            arts = sinkset.artifacts
            for w in windows:
                arts.update(w.artifacts)
            violation.with_artifacts(arts)
            sinkset.close("violated", steps_done=written_step, violation=violation.to_json())
        else:
            status = "complete"
            sinkset.close("complete", steps_done=end)
    except BaseException as exc:
        status = "stopped" if isinstance(exc, KeyboardInterrupt) else "failed"
        for w in windows:
            if w.active:
                try:
                    w.end()
                except Exception:
                    pass
        v = watch.first
        sinkset.close(status, steps_done=written_step, violation=None if v is None else v.to_json(),
                      raise_errors=False)
        state_step = written_step
        if written_state is None:  # donated: the newest state we still hold (frames may end earlier)
            written_state, state_step = (cur, cur_step) if not _deleted(cur) else (None, written_step)
        partial_run = Run(written_state, state_step,
                          make_timings(clock.elapsed(), state_step - start_step, tracker, state_leaves=n_state),
                          v, sinkset.artifacts, schema, chunk, status, sinkset)
        try:
            exc.jaxlog_run = partial_run
        except Exception:
            pass
        raise
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    if timeline is not None:
        for w in windows:
            try:
                w.add_to_timeline(timeline)
            except Exception:
                pass
    window_s = None
    if len(windows) == 1 and windows[0].done:
        try:
            window_s = windows[0].step_seconds()
        except Exception:
            window_s = None
    jax.block_until_ready(cur)
    timings = make_timings(clock.elapsed(), written_step - start_step, tracker, window_s, state_leaves=n_state)
    artifacts = sinkset.artifacts
    for w in windows:
        artifacts.update(w.artifacts)
    result = Run(cur, written_step, timings, violation, artifacts, schema, chunk, status, sinkset)
    if violation is not None:
        try:
            violation.jaxlog_run = result
        except Exception:
            pass
        if on_violation == "raise":
            raise violation
    return result


_RESOLVED: dict = {}


def _aval_key(tree):
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple((tuple(x.shape), str(x.dtype), bool(getattr(x, "weak_type", False))) for x in leaves)


def _resolve(step, specs, state, key, has_aux, keyed, batched, dt) -> Schema:
    """The run's schema; cached per (step, records, state shapes) like jit caches (tracing the
    step and every view costs milliseconds, which matters for short runs)."""
    ck = (step, specs, _aval_key(state), _aval_key(key), has_aux, keyed, batched, dt)
    try:
        hit = _RESOLVED.get(ck)
    except TypeError:  # an unhashable view: no cache
        ck, hit = None, None
    if hit is not None:
        return hit

    def traced_step():
        return _apply(step, has_aux, keyed, key, jnp.int32(0), state)

    try:
        out_shape = jax.eval_shape(traced_step)
    except JaxlogError:
        raise
    except Exception as e:
        raise JaxlogError(f"the step function failed on the state: {type(e).__name__}: {e}") from e
    _check_carry(state, out_shape[0])
    aux_fn = (lambda: traced_step()[1]) if has_aux else None
    schema = resolve_schema(specs, state, aux=aux_fn, batched=batched, dt=dt)
    if ck is not None:
        if len(_RESOLVED) >= 64:
            _RESOLVED.pop(next(iter(_RESOLVED)))
        _RESOLVED[ck] = schema
    return schema


def _as_arrays(state):
    """The state as device arrays; a leaf that cannot be one is an error naming it (jl.run carries
    the whole state through its device loop: configuration belongs in the step's closure)."""
    pairs, treedef = jax.tree_util.tree_flatten_with_path(state)
    out = []
    for kp, leaf in pairs:
        try:
            out.append(jnp.asarray(leaf))
        except (TypeError, ValueError) as e:
            where = jax.tree_util.keystr(kp) or "(the state itself)"
            raise JaxlogError(
                f"state leaf {where} is {type(leaf).__name__} {leaf!r:.60}, not an array: jl.run carries the "
                f"state on the device, so every leaf must be a numeric array (keep configuration such as "
                f"names or settings out of the state, e.g. in the step function's closure) ({e})"
            ) from None
    return jax.tree_util.tree_unflatten(treedef, out)


def _deleted(tree) -> bool:
    try:
        return any(leaf.is_deleted() for leaf in jax.tree_util.tree_leaves(tree))
    except Exception:
        return False


def _now() -> int:
    import time

    return time.perf_counter_ns()


def _check_carry(state, new_shape) -> None:
    a, ta = jax.tree_util.tree_flatten_with_path(state)
    b, tb = jax.tree_util.tree_flatten_with_path(new_shape)
    if ta != tb:
        raise JaxlogError(f"the step function changed the state's structure: {ta} -> {tb}")
    for (kp, x), (_, y) in zip(a, b):
        if tuple(x.shape) != tuple(y.shape) or x.dtype != y.dtype:
            raise JaxlogError(f"the step function changed state leaf {jax.tree_util.keystr(kp)}: "
                              f"{x.dtype}{list(x.shape)} -> {y.dtype}{list(y.shape)}")


def _progress(progress, steps):
    from ._loggers import ProgressLogger

    if progress is False:
        return None
    if isinstance(progress, ProgressLogger):
        return progress
    return ProgressLogger(steps, enabled=True if progress is True else None, desc="jaxlog")


def _initial(init_frames, specs, step0) -> Frames:
    idx, values = init_frames
    frames = Frames()
    steps = np.asarray([step0], dtype=np.int64)
    for p, v in _host(values).items():
        frames.add(p, steps, v[None])
    return frames


def _handle(pending, specs, sinkset, watch, timeline, init_frames) -> list:
    """Pull one chunk's outputs, build frames, check invariants, write. Returns the new violations."""
    k0, length, _, sparse_steps, outputs, t_dispatch = pending
    ys, bufs = outputs
    t0 = _now()
    ys, bufs = _host(ys), _host(bufs)
    t_ready = _now()
    frames = _initial(init_frames, specs, k0) if init_frames is not None else Frames()
    dense_steps = np.arange(k0 + 1, k0 + length + 1, dtype=np.int64)
    for p, v in ys.items():
        _add(frames, p, dense_steps, v)
    for st, buf in zip(sparse_steps, bufs):
        if len(st):
            for p, v in buf.items():
                _add(frames, p, st, v[: len(st)])
    new = watch.check(frames) if watch else []
    sinkset.write(watch.frames_to_write(frames, new))
    if timeline is not None:
        t1 = _now()
        timeline.slice("host", f"frames {k0 + 1}..{k0 + length}", t0, t1, {"k0": k0, "length": length})
        _counters(timeline, frames, t_dispatch, t_ready)
    return new


def _add(frames: Frames, path, steps, values):
    if path in frames.values:  # the initial frame of chunk 0
        frames.add(path, np.concatenate([frames.steps[path], steps]), np.concatenate([frames.values[path], values]))
    else:
        frames.add(path, steps, values)


def _counters(timeline, frames: Frames, t_start, t_end) -> None:
    for p in frames:
        v = frames.values[p]
        if v.ndim != 1 or not len(v) or not np.issubdtype(v.dtype, np.number) or np.iscomplexobj(v):
            continue
        ts = np.linspace(t_start, t_end, len(v)).astype(np.int64)
        try:
            timeline.counter_series(p, ts, v.astype(np.float64))
        except Exception:
            pass


def _replay(violation, pending, starts, one_step, n, sinkset):
    """The post-mortem of ``violation``: replay from the newest kept chunk-start state early enough
    for ``n`` states (the violating chunk's own start, or an earlier one when the violating step
    is fewer than ``n`` steps past it). Returns the state at the violating step."""
    k0, chunk_state = pending[0], pending[2]
    need = violation.step - n + 1
    if k0 > need and starts:
        early = [ks for ks in starts if ks[0] <= need]
        k0, chunk_state = early[-1] if early else starts[0]
    return _postmortem(violation, chunk_state, k0, one_step, n, sinkset)


def _postmortem(violation, chunk_state, k0, one_step, n, sinkset):
    """Replay from the chunk-start state one step at a time up to the violating step; attach the
    last ``n`` states. Returns the state at the violating step."""
    target = violation.step
    st = chunk_state
    keep = set(range(max(k0, target - n + 1), target + 1)) if n > 0 else set()
    snaps = {}
    if k0 in keep:
        snaps[k0] = state_paths(st)
    for k in range(k0, target):
        st = one_step(st, k)
        if k + 1 in keep:
            snaps[k + 1] = state_paths(st)
    impls = state_key_impls(st)
    for k in sorted(snaps):
        sinkset.attach("postmortem", k, snaps[k], key_impls=impls)
    return st
