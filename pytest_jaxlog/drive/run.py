"""``jl.run``: the fast driver. Chunks of steps run on the device in one compiled loop (see
``drive.program``); records come out as device buffers and reach the host while the next chunk
runs. No host callbacks in the step.

Chunk ``i+1`` is dispatched before chunk ``i``'s outputs are pulled (JAX dispatch is async), so
host work (frames, invariants, sinks) overlaps device work. With ``until=``, the stop flag
travels from chunk to chunk on the device: the chunk dispatched ahead runs no step once it is set.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..check.invariants import as_list, check_on_violation
from ..errors import JaxlogError
from ..profiling.timeline import now_ns
from ..profiling.timings import CompileTracker
from ..profiling.window import check_windows
from ..record.frames import Schema
from ..record.records import AUX, LOG, check_name, normalize_records
from ..record.schedule import Schedule, as_schedule, check_count
from . import identity, program, shards
from .checkpoint import META, CheckpointMeta, ResumePoint, check_against, copy_attachments, copy_frames, key_record, state_leaves, \
    step_name
from .checkpoint import NAME as CHECKPOINT
from .compiles import run_timings
from .loggers import ProgressLogger
from .memo import memo, remember
from .pipeline import Pipeline, Span
from .postmortem import replay
from .chunks import Chunk, Fill, Fills, Reader, any_deleted, merge
from .program import Lane, Plan
from .signals import sigterm_as_interrupt
from .scalars import scalars_on
from .resolve import (AUX_SCHEDULE, LOG_SCHEDULE, log_schedules, n_systems_of, resolve, short_error,
                      state_key_impls, state_paths)

__all__ = ["run", "Run", "auto_chunk"]

DEFAULT_BUDGET = 64 * 2**20
CHUNK_CAP = 10_000
DONATE_MIN_BYTES = 1 << 20  # states smaller than this are not donated (see ``run``'s ``donate``)
STOP_REASONS = ("until", "steps", "violation", "interrupted")


@dataclass
class Run:
    """What ``jl.run`` returns: the state at ``steps_done``, the trajectory, timings, violation.

    ``stop_reason``: ``"until"`` (the ``until=`` predicate held), ``"steps"`` (all steps ran),
    ``"violation"`` (an invariant stopped it) or ``"interrupted"`` (an exception, Ctrl-C,
    SIGTERM). ``systems_done``: in batched runs with ``until=``, the step at which each system
    finished (``steps_done`` for those that never did)."""

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
    stop_reason: str = "steps"
    systems_done: np.ndarray | None = None
    _chunk_program: Any = field(default=None, repr=False)  # (jitted chunk, plan, its arguments' program.Signature)

    @property
    def trajectory(self) -> Any:
        """The recorded trajectory: loaded from the file sink if any, else in memory."""
        if self._trajectory is None:
            self._trajectory = self._sinks.trajectory()
        return self._trajectory

    def compiled_chunk(self) -> Any:
        """The chunk program this run dispatched, compiled (a ``jax.stages.Compiled``, from JAX's
        cache: nothing is compiled again). ``.as_text()`` is the program after XLA's passes, with
        the collectives a sharded state needs; ``.cost_analysis()``, ``.memory_analysis()``.
        For checking what a run costs on the devices; None when no chunk was dispatched."""
        if self._chunk_program is None:
            return None
        fn, plan, args = self._chunk_program
        return fn.lower(plan, *args.abstract()).compile()


def auto_chunk(schema: Schema, steps: int | None = None, budget_bytes: int = DEFAULT_BUDGET,
               cap: int = CHUNK_CAP) -> int:
    """The capacity ``chunk=None`` picks: most work steps per chunk.

    ``min(cap, budget_bytes // bytes_per_step)``, at least 2, where ``bytes_per_step`` is the
    recorded data one step adds (every-step leaves in full, sparser ones by their density). It
    does not depend on the run length (``steps`` is accepted and ignored), so runs of any length
    with the same kernel and records run one compiled program; a run shorter than the capacity
    runs one short chunk, and only its rows come to the host. The budget bounds device and host
    memory per chunk whatever the run length; the cap (10,000 steps) keeps the first frames and
    invariant checks coming while the run goes on; for long runs it gives a few hundred
    dispatches per million steps, which costs ~nothing.
    """
    per_step = 0.0
    for leaf in schema.leaves:
        nbytes = int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
        density = leaf.schedule.max_in_span(cap) / cap
        per_step += nbytes * density
    limit = cap if per_step <= 0 else int(budget_bytes // per_step)
    return int(max(2, min(cap, limit)))


def _capacity(cfg: "RunConfig", schema: Schema) -> int:
    """The program's capacity: :func:`auto_chunk`, whatever ``chunk=`` is (``chunk=`` is the number
    of steps per dispatch; short chunks fill one set of buffers together, see ``drive.chunks``), so
    runs with any chunk size and length share one executable. A ``chunk=`` beyond it (more steps
    per dispatch than the memory budget holds) gets a program of its own, of the chunk size or the
    run length if shorter; at least 2 rows either way (XLA folds a loop over one-row buffers into
    straight-line code, which changes the last bits of reductions)."""
    # schemas come from _resolve's cache: computed once
    auto = memo(_AUTO, (id(schema), cfg.budget), lambda: (schema, auto_chunk(schema, budget_bytes=cfg.budget)))[1]
    if cfg.chunk is None or cfg.chunk <= auto:
        return auto
    return max(2, min(cfg.chunk, cfg.steps))


class Segment(NamedTuple):
    """One dispatch of the chunk program: ``length`` work steps from ``k0``, inside profile
    ``window`` (its steps go one at a time) or not (None)."""

    k0: int
    length: int
    window: Any


def _segments(start: int, end: int, chunk: int, windows, checkpoint: Schedule | None = None) -> Iterator[Segment]:
    """The dispatches covering work steps start..end-1, made as the run goes (a ``chunk=1`` run
    of a million steps holds no list of a million); a chunk ends at every checkpoint step (the
    state there is a chunk's output)."""
    for seg in _chunks(start, end, chunk, windows):
        if checkpoint is None:
            yield seg
            continue
        k0, n = seg.k0, seg.length
        for c in checkpoint.steps_between(k0 + 1, k0 + n - 1):
            yield Segment(k0, int(c) - k0, seg.window)
            n -= int(c) - k0
            k0 = int(c)
        yield Segment(k0, n, seg.window)


def _chunks(start: int, end: int, chunk: int, windows) -> Iterator[Segment]:
    k = start
    for w in windows:
        lo, hi = max(w.start, start), min(w.stop, end - 1)
        if hi < lo:
            continue
        while k < lo:
            n = min(chunk, lo - k)
            yield Segment(k, n, None)
            k += n
        for j in range(lo, hi + 1):
            yield Segment(j, 1, w)
        k = hi + 1
    while k < end:
        n = min(chunk, end - k)
        yield Segment(k, n, None)
        k += n


@jax.jit
def _copies(leaves: list) -> list:
    """Fresh buffers for the leaves, in one dispatch (a copy per leaf is an eager dispatch each,
    several times the cost, on every run that donates)."""
    return [jnp.copy(x) for x in leaves]


def _copy_tree(tree):
    """The state the run may donate: never the caller's arrays."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return jax.tree_util.tree_unflatten(treedef, _copies(leaves))


@dataclass(frozen=True)
class RunConfig:
    """``jl.run``'s arguments, checked once: what the rest of the driver reads by name."""

    step: Callable
    steps: int
    start_step: int
    lanes: tuple[Lane, ...]
    invariants: tuple
    sinks: Any
    key: Any
    dt: float | None
    chunk: int | None
    profile: Any
    has_aux: bool
    batched: bool | int
    until: Callable | None
    on_violation: str
    postmortem: int
    progress: Any
    budget: int
    timeline: Any
    donate: bool
    checkpoint: Schedule | None = None
    resume: ResumePoint | None = None  # set by jl.resume
    logs: tuple[tuple[str, Schedule], ...] = ()  # logs=: (name, schedule); names not listed: every step
    log_capacity: int | None = None

    @property
    def keyed(self) -> bool:
        return self.key is not None

    @property
    def end(self) -> int:
        return self.start_step + self.steps


_LANES: dict = {}  # (record's items, has_aux, aux) -> lanes: what the last runs asked for


def _lanes(record: Any, has_aux: bool, aux: Any) -> tuple[Lane, ...]:
    """Views as lanes, then the aux leaves (all every step by default; ``aux=`` chooses which
    and on which schedule). Kept per ``record=`` contents (its views and records compared as
    the compiled program's cache compares them): a test suite's runs ask for the same ones
    again and again."""
    try:
        key = (None if record is None else tuple(record.items()), has_aux, aux)
        found = _LANES.get(key)
    except (TypeError, AttributeError):  # unhashable parts (an aux= dict), not a dict: made each time
        key, found = None, None
    if found is None:
        found = _make_lanes(record, has_aux, aux)
        if key is not None:
            remember(_LANES, key, found)
    return found


def _make_lanes(record: Any, has_aux: bool, aux: Any) -> tuple[Lane, ...]:
    lanes = [Lane(s.name, s.schedule, view=s.view, when=s.when) for s in normalize_records(record, reserved=(AUX, LOG))]
    if aux is not None and not has_aux:
        raise JaxlogError("aux= chooses aux leaves to record, but has_aux=False: the step returns only the state")
    if has_aux:
        if aux is None:
            lanes.append(Lane(AUX, AUX_SCHEDULE, aux_paths=(AUX,)))
        else:
            if isinstance(aux, str):
                aux = {aux: None}
            elif not isinstance(aux, Mapping):
                aux = {name: None for name in aux}
            by_schedule: dict[Schedule, list[str]] = {}
            for name, when in aux.items():
                if not isinstance(name, str) or not name or name.startswith("/") or name.endswith("/"):
                    raise JaxlogError(f"aux=: {name!r} is not an aux leaf name (e.g. 'acceptance_rate' or 'info/energy')")
                for part in name.split("/"):
                    check_name(part, "aux= name part")
                schedule = AUX_SCHEDULE if when is None else as_schedule(when, f"aux={{{name!r}: ...}}")
                by_schedule.setdefault(schedule, []).append(f"{AUX}/{name}")
            lanes += [Lane(AUX, s, aux_paths=tuple(paths)) for s, paths in by_schedule.items()]
    return tuple(lanes)


def run(step: Callable, state: Any, steps: int, *, record: Any = None, invariants: Any = (), sinks: Any = (),
        key: Any = None, dt: float | None = None, chunk: int | None = None, profile: Any = None, has_aux: bool = False,
        aux: Any = None, batched: bool | int = False, until: Callable | None = None, on_violation: str = "raise",
        postmortem: int = 3, progress: Any = None, chunk_budget_bytes: int = DEFAULT_BUDGET, timeline: Any = None,
        donate: bool = True, start_step: int = 0, logs: Any = None, log_capacity: int | None = None,
        checkpoint: Any = None, _resume: ResumePoint | None = None) -> Run:
    """Run up to ``steps`` applications of ``step`` on ``state`` on the device, recording as scheduled.

    ``step(state)``, or ``step(key_k, state)`` with ``key_k = fold_in(key, k)`` for the work of step
    ``k`` (batched runs: one key per system, ``fold_in(key_k, system)``, stacked, so a chain step
    is ``jax.vmap(chain_step)(keys, state)``). ``has_aux=True``: ``step`` returns ``(state, aux)``
    and aux leaves are recorded as ``"aux/<path>"`` from step ``start_step+1``: all of them every
    step, or those ``aux=`` names, on their schedules (``aux={"acceptance": jl.every(1),
    "energy": jl.every(10)}``; a list or a name: every step). ``batched=True``: the leading axis
    of the state's leaves is a system index (leaves without it, such as scalars, are shared by
    all systems; ``batched=<n>`` says how many systems there are when leaves disagree).

    ``until=pred``: ``pred(state)`` is checked on the device after every step (and on the initial
    state); the run stops at the first step where it holds, recording nothing past it; ``steps``
    is then a maximum. Batched: one bool per system; a finished system is frozen (its state no
    longer changes) and the run ends when all are done. ``run.stop_reason`` says why it stopped.

    Values the step logs with ``jl.log`` (anywhere inside it: a force function, a nested scan,
    a while loop) are recorded as ``"log/<name>"``, every step from ``start_step+1`` like aux, or on
    the schedules ``logs=`` gives (``logs={"positions": jl.every(10)}``, subsampled on the device);
    ``log_capacity``: the capacity of logs inside ``lax.while_loop`` that give none. A step without
    ``jl.log`` calls runs as it is; views that log are recorded with their logs.

    ``checkpoint=jl.every(n)``: at those steps the file sinks also keep what the run needs to go on
    (state, key, invariants' running state, ``until`` flags): ``jl.resume`` continues from the
    newest bit-for-bit. A Ctrl-C or SIGTERM then writes one more at the last chunk boundary.

    Steps are numbered from ``start_step`` (a resumed run continues the numbering and the key
    folding; its initial state is not recorded again). ``chunk=None``: see :func:`auto_chunk`.
    ``profile``: ProfileWindow(s) whose work steps run one dispatch each inside the trace.
    ``donate``: the carried state is donated to the device between chunks when nothing needs a
    chunk-start state again (no invariants, no checkpoints) and it takes 1 MiB or more (below
    that it saves nothing worth the copy that keeps the caller's arrays: the caller's arrays are
    never donated).

    Invariant violations: the post-mortem states of the last ``postmortem`` steps up to the run's
    first violating step are attached to the sinks (replayed from a kept chunk-start state), and
    the sinks are closed ``violated`` with that violation (artifact paths included).
    ``on_violation="raise"`` stops there: sinks get the frames up to the violating step, ``run.state``
    is the state at that step, and the violation is raised. ``"warn"`` (a JaxlogRuntimeWarning per
    invariant, at its first violation) and ``"record"`` go on to the end: every frame is written,
    ``run.violation`` is the first violation and ``steps_done`` the full count.
    ``run.timings.compiles`` counts the step function's compilations that happened during this run
    (distinct state signatures: 1 on a cold cache, 0 when all was compiled before).
    KeyboardInterrupt and other exceptions close the sinks (``stopped``/``failed``) and are
    re-raised with the partial :class:`Run` as ``exc.jaxlog_run``: its state is the state at the
    last step whose frames were written (``donate=False`` or invariants given), or, when the state
    was donated, the newest state computed (``steps_done`` then says which step it is; the sinks'
    ``steps_done`` is the last written step).
    """
    steps = check_count(steps, "steps", minimum=0)
    start_step = check_count(start_step, "start_step", minimum=0)
    if start_step + steps >= 2**31:
        raise JaxlogError(f"step numbers up to {start_step + steps} do not fit the int32 step counter")
    if chunk is not None:
        chunk = check_count(chunk, "chunk", minimum=1, none="or None")
    if not callable(step):
        swapped = " (step and state look swapped: jl.run(step, state, steps))" if callable(state) else ""
        raise JaxlogError(f"step must be callable, got {type(step).__name__}{swapped}")
    if until is not None and not callable(until):
        raise JaxlogError(f"until= must be a callable state -> bool, got {until!r}")
    if not isinstance(batched, bool):
        batched = check_count(batched, "batched (the number of systems, or True/False)", minimum=1)
    if log_capacity is not None:
        log_capacity = check_count(log_capacity, "log_capacity", minimum=1, none="or None")
    cfg = RunConfig(step=step, steps=steps, start_step=start_step, lanes=_lanes(record, bool(has_aux), aux),
                    invariants=as_list(invariants), sinks=sinks, key=None if key is None else jnp.asarray(key), dt=dt,
                    chunk=chunk, profile=profile, has_aux=bool(has_aux), batched=batched, until=until,
                    on_violation=check_on_violation(on_violation), postmortem=int(postmortem), progress=progress,
                    budget=int(chunk_budget_bytes), timeline=timeline, donate=bool(donate),
                    logs=log_schedules(logs), log_capacity=log_capacity,
                    checkpoint=None if checkpoint is None else as_schedule(checkpoint, "checkpoint="), resume=_resume)
    t0 = time.perf_counter()
    with sigterm_as_interrupt(), CompileTracker(program.chunk_impl, read_args=False) as tracker:
        try:
            return _run(cfg, state, t0, tracker)
        finally:
            if timeline is not None:
                tracker.add_to_timeline(timeline)


def _run(cfg: RunConfig, state: Any, t_start: float, tracker: CompileTracker) -> Run:
    start_step, end, key = cfg.start_step, cfg.end, cfg.key
    windows = check_windows(cfg.profile, end, start_step) if cfg.profile is not None else ()
    state = _as_arrays(state)

    # --- resolve what the step and the views produce (errors before any step runs) ------------
    if cfg.resume is not None:  # what the file's run was, before the step is traced with other arguments
        check_against(cfg.resume, step_fn=cfg.step, schema=None, state=state, key=cfg.key, dt=cfg.dt,
                      n_invariants=len(cfg.invariants))
    resolved = _resolve(cfg, state)
    plan, schema, shapes = resolved.plan, resolved.schema, resolved.shapes
    programs = None if cfg.resume is None and cfg.checkpoint is None else _programs(resolved)
    if cfg.resume is not None:
        check_against(cfg.resume, step_fn=cfg.step, schema=schema, state=state, key=cfg.key, dt=cfg.dt,
                      n_invariants=len(cfg.invariants), programs=programs)
    pipe = Pipeline(sinks=cfg.sinks, invariants=cfg.invariants, on_violation=cfg.on_violation,
                    timeline=cfg.timeline)
    capacity = _capacity(cfg, schema)
    chunk = max(1, min(capacity if cfg.chunk is None else cfg.chunk, cfg.steps)) if cfg.steps else 1
    lanes = plan.lanes  # the run's lanes: views (those that log wrapped), aux, then the step's logs
    # a sharded state: the key and the until= stops live replicated on its mesh (see drive.shards),
    # and the program makes each fresh set of buffers itself, laid out like the views
    mesh_rep = shards.replicated_on(state)
    # one program, any length; scalar records share row buffers unless the state is sharded
    plan = _laid_out(plan, capacity, shapes, pack=mesh_rep is None and shards.process_count() == 1)
    leaves = jax.tree_util.tree_leaves(state)
    # with invariants, chunk-start states are kept for the post-mortem: no donation
    # with checkpoints, the state at each written step is kept for one (on a stop, too)
    # a small state is not donated: the copy that keeps the caller's arrays costs more than it saves
    state_bytes = resolved.state_bytes
    use_donate = (cfg.donate and not cfg.invariants and cfg.checkpoint is None
                  and state_bytes >= DONATE_MIN_BYTES)
    fn = program.chunk_donate if use_donate else program.chunk
    device = next(iter(leaves[0].devices())) if leaves else None
    committed = bool(leaves) and getattr(leaves[0], "committed", False)
    key = shards.place(key, mesh_rep)
    consts = identity.placed(resolved.consts, mesh_rep or device) if committed else resolved.consts
    no_masks = tuple(np.zeros(plan.length, dtype=bool) for _ in plan.host_masks)
    batched_until = cfg.until is not None and plan.n_systems is not None

    # the dispatches' small host values, kept on the device where the other arguments are placed
    kept = scalars_on(device, committed, mesh_rep)
    stopped = kept.one(np.full((plan.n_systems,) if batched_until else (), -1, np.int32))  # until=: where it stopped
    meta = {"driver": "run", "steps": cfg.steps, "start_step": start_step, "chunk": chunk, "dt": cfg.dt,
            "has_aux": cfg.has_aux, "batched": cfg.batched is not False, "keyed": cfg.keyed,
            "until": cfg.until is not None}
    layout = None  # a run over several processes: who writes which block of each record
    if shards.process_count() > 1:
        if cfg.checkpoint is not None or cfg.resume is not None:
            raise JaxlogError("checkpoint= and jl.resume need the whole state on one host; in a run over "
                              f"{shards.process_count()} processes no process holds it")
        probe = program.abstract((state, None, key, program.control(0, 0, 0, 0), program.empty_counts(plan), no_masks,
                                  stopped, consts))
        layout = shards.Layout.of(fn.lower(plan, *probe).compile().output_shardings, plan, schema)
        layout.check_invariants(cfg.invariants, schema)
        layout.check_sinks(pipe.sinks.sinks)
        meta["processes"] = {"count": shards.process_count(), "index": jax.process_index(),
                             "run_id": shards.shared_run_id(), "layout": layout.to_json()}
    checkpointer = None if cfg.checkpoint is None else _Checkpointer.of(cfg, pipe, schema, state, programs)
    # buffers go where the state is committed (uncommitted: the default device, and uncommitted too, or
    # the program would compile again for the mix of committed and uncommitted arguments)
    fills = Fills(plan, shapes, device if committed else None, cfg.budget, 0 if use_donate else state_bytes,
                  close_at=cfg.checkpoint, placement=leaves[0].sharding if committed else None,
                  sharded=mesh_rep is not None)
    reader = Reader.of(plan, shapes, device.platform if device is not None else jax.default_backend(), layout)
    chunk_program = None  # (jitted chunk, plan, its arguments' Signature), for run.compiled_chunk()
    program_bufs = False  # whether that chunk was given its buffers (a sharded run's first makes them)
    first_flags = (program.RECORD_INITIAL if start_step == 0 else 0) | (program.CHECK_INITIAL if cfg.until else 0)
    replay_bufs: list = []

    def one_step(carry, k):  # the post-mortem replay: the run's own program, one step (never donating the state)
        bufs = replay_bufs.pop() if replay_bufs else fills.spare()
        out = program.chunk(plan, carry[0], bufs, key, kept.control(k, 1, 0, 0),
                            kept(program.empty_counts(plan)), no_masks, carry[1], consts)
        replay_bufs.append(out["bufs"])
        return out["state"], out["stopped"]

    bar = None
    cur = state
    written_step, written_state = start_step, None
    cur_step = start_step
    stop_reason = "steps"
    systems_done = np.full(plan.n_systems, -1, np.int64) if batched_until else None
    inflight: list[Chunk] = []  # dispatched chunks not pulled yet, in step order
    starts: list = []  # recent (k0, chunk-start state) covering the last `postmortem` steps (no donation)
    pm_state = None  # the state at the first violating step, replayed for the post-mortem
    last: Fill | None = None  # the last set of buffers pulled
    t_loop, first_call_s = None, 0.0  # when the device loop began; what its compiling first dispatch took
    saved_at = start_step  # the step of the newest checkpoint in the file
    # the sinks open once the first chunk is dispatched: a file is created while that chunk runs
    # (on a first run, once its program compiled), not before (milliseconds, as much as a short
    # run); a resume copies the old file's frames first
    open_late = (end > start_step or bool(first_flags)) and cfg.resume is None
    sinks_tried = False  # opening them was attempted (a failed attempt is not made again)

    def open_sinks() -> None:
        nonlocal sinks_tried
        sinks_tried = True
        pipe.open_sinks(schema, meta)

    checked_through = start_step  # the invariants have seen the frames up to here

    def found(new, batch: list[Fill]) -> None:
        """The post-mortem of the run's first violation, when this batch holds it: replayed from
        the start of the chunk that holds the violating step (or an earlier one)."""
        nonlocal pm_state
        if new[0] is pipe.first:  # over several processes no one holds the whole state: none is stored
            step = pipe.first.step
            chunks = [c for f in batch for c in f.chunks]
            at = next((c for c in chunks if c.k0 < step <= c.end), chunks[0])
            earlier = starts + [(c.k0, (c.start_state, c.start_stopped)) for c in chunks if c.k0 < at.k0]
            pm_state = replay(pipe.first, at.k0, (at.start_state, at.start_stopped), earlier, one_step,
                              cfg.postmortem if layout is None else 0, pipe.sinks, state_of=lambda c: c[0])[0]

    def pull(batch: list[Fill]) -> list:
        """Pull sets of buffers, feed their frames as one batch; note a stop by ``until``."""
        nonlocal stop_reason, last, checked_through
        checked_through = -1  # a signal while the invariants take these frames leaves them past any step
        for f in batch:
            fills.give(reader.pull(f))
            if cfg.until is not None and stop_reason != "until":
                at = f.stopped_at
                if systems_done is not None:
                    systems_done[(systems_done < 0) & (at >= 0)] = at[(systems_done < 0) & (at >= 0)]
                if f.stopped_early or bool(np.all(at >= 0)):
                    stop_reason = "until"
        t_ready = now_ns()
        last = batch[-1]
        del inflight[:sum(len(f.chunks) for f in batch)]
        label = f"frames {batch[0].k0 + 1}..{last.end}"
        new = pipe.feed(merge(batch), label, span=Span(batch[0].chunks[0].t_dispatched, t_ready))
        checked_through = last.end
        return new

    def consume(batch: list[Fill]) -> str | None:
        """Pull and feed sets of buffers (with checkpoints one set at a time: a checkpoint follows
        the frames up to its step, and the invariants have seen nothing past it). Returns
        ``"violation"`` or ``"until"`` when the run stops here."""
        nonlocal written_step, written_state, saved_at, cur_step
        for group in ([f] for f in batch) if cfg.checkpoint is not None else [batch]:
            new = pull(group)
            if new:
                found(new, group)
                if cfg.on_violation == "raise":
                    return "violation"
            if pipe.checking and pipe.first is None:
                starts.extend((c.k0, (c.start_state, c.start_stopped)) for f in group for c in f.chunks)
                newest = inflight[-1].k0 if inflight else last.end
                while len(starts) >= 2 and starts[1][0] <= newest - cfg.postmortem:
                    starts.pop(0)
            written_step = last.end
            if not use_donate:  # the state at the batch's end: the next chunk's start
                written_state = inflight[0].start_state if inflight else cur
            if cfg.checkpoint is not None and cfg.checkpoint.contains(written_step):
                saved_at = checkpointer.save(written_step, written_state, last.out["stopped"], systems_done)
            if bar is not None:
                bar.advance(written_step - start_step)
            if stop_reason == "until":  # the chunks dispatched since ran no step
                fills.drop()
                cur_step = written_step
                return "until"
        return None

    try:
        # from here on, whatever happens closes the sinks with a status saying why
        pipe.bind(schema)
        if end > start_step:
            segs = _segments(start_step, end, chunk, windows, cfg.checkpoint)
        else:  # no step to run: the initial state's frame (and until=) only
            segs = iter([Segment(start_step, 0, None)] if first_flags else [])
        if not open_late:
            open_sinks()
        if cfg.resume is not None:  # the old file's frames, checkpoints and invariants up to the checkpoint
            stopped = kept.one(_resume_into(cfg, pipe, schema, np.asarray(stopped), systems_done))
        cur = _copy_tree(state) if use_donate else state
        written_state = cur if not use_donate else None
        bar = pipe.progress = _progress(cfg.progress, cfg.steps)
        if bar is not None:
            bar.__enter__()
        stop = False
        open_window = None
        t_loop = time.perf_counter()
        for n_chunk, (k0, length, win) in enumerate(segs):
            masks = tuple(program.host_mask(lanes[i].schedule, k0, length, plan.length) for i in plan.host_masks)
            flags = first_flags if n_chunk == 0 else 0
            start_state, start_stopped = cur, stopped
            t0 = now_ns()
            bufs, row0, counts = fills.next(k0, length, flags)
            args = (plan, cur, bufs, key, kept.control(k0, length, row0, flags), kept(counts), masks, stopped, consts)
            compiles_before, t_call = (tracker.count, time.perf_counter()) if n_chunk == 0 else (0, 0.0)
            if win is not None:
                if open_window is not win:
                    win.begin()
                    open_window = win
                with win.step(k0):
                    out = fn(*args)
                    jax.block_until_ready(out["state"])  # the step's device time belongs to its annotation
                if k0 == win.stop or k0 == end - 1:
                    win.end(block_on=out["state"])
                    open_window = None
            else:
                out = fn(*args)
            if n_chunk == 0:  # the first dispatch: did it trace and compile the program?
                first_call_s = time.perf_counter() - t_call if tracker.count > compiles_before else 0.0
                if open_late:
                    open_sinks()
            if chunk_program is None or (not program_bufs and bufs is not None):  # the program later chunks run
                # taken once the chunk runs (donated arguments keep their shapes and shardings)
                chunk_program, program_bufs = (fn, plan, _signature(fn, plan, resolved, args[1:], [*leaves, key])), \
                    bufs is not None
            cur, cur_step, stopped = out["state"], k0 + length, out["stopped"]
            t1 = now_ns()
            if cfg.timeline is not None:
                cfg.timeline.slice("dispatch", f"steps {k0}..{k0 + length}", t0, t1, {"k0": k0, "length": length})
            inflight.append(Chunk(k0, length, None if use_donate else start_state, start_stopped, t1))
            fills.dispatched(inflight[-1], out, reader)
            batch = fills.due()
            if batch:
                ended = consume(batch)
                if ended is not None:
                    stop = ended == "violation"
                    break
        for w in windows:  # a stop inside a window ends it there: stop the profiler too
            if w.active:
                w.end(block_on=cur)
        rest = [] if stop or stop_reason == "until" else fills.rest()
        if rest:
            stop = consume(rest) == "violation"
            if not stop:
                cur_step = written_step
        if not stop:
            late = pipe.finish()  # judged at the end (an aggregate whose window the run ended before)
            if late and late[0] is pipe.first and last is not None and late[0].step >= last.k0:
                found(late, [last])
        violation = pipe.first
        window_artifacts = {k: v for w in windows for k, v in w.artifacts.items()}
        if systems_done is not None:
            systems_done[systems_done < 0] = written_step
        summary = {"stop_reason": stop_reason,
                   "systems_done": None if systems_done is None else systems_done.tolist()}
        if violation is not None:
            status = "violated"
            if cfg.on_violation == "raise" and pm_state is not None:  # state and frames end at the violating step
                cur = written_state = pm_state
                written_step = violation.step
                summary["stop_reason"] = stop_reason = "violation"
            pipe.close("violated", steps_done=written_step, artifacts=window_artifacts, summary=summary)
        else:
            status = "complete"
            pipe.close("complete", steps_done=written_step, summary=summary)
    except BaseException as exc:
        status = "stopped" if isinstance(exc, KeyboardInterrupt) else "failed"
        for w in windows:
            w.abort(exc)
        # (only where the invariants stopped too: a signal between checking a chunk and counting it
        # written would save their state past the checkpoint's step)
        if (isinstance(exc, KeyboardInterrupt) and cfg.checkpoint is not None and pipe.opened
                and written_state is not None and written_step > saved_at and checked_through == written_step):
            try:  # one more checkpoint where the frames end, so the run can resume from there
                checkpointer.save(written_step, written_state, None if last is None else last.out["stopped"],
                                  systems_done)
            except BaseException as e:
                exc.add_note(f"[jaxlog] no checkpoint at step {written_step} on the way out: {type(e).__name__}: {e}")
        if open_late and not sinks_tried:  # stopped before they opened (a compile error, a Ctrl-C while
            try:                          # compiling): the run is on record as any that failed
                open_sinks()
            except BaseException as e:
                exc.add_note(f"[jaxlog] the sinks could not record the run: {type(e).__name__}: {e}")
        if pipe.opened:
            pipe.close(status, steps_done=written_step, raise_errors=False, summary={"stop_reason": "interrupted"},
                       reason=exc)
        state_step = written_step
        if written_state is None:  # donated: the newest state we still hold (frames may end earlier)
            written_state, state_step = (cur, cur_step) if not any_deleted(cur) else (None, written_step)
        exc.jaxlog_run = Run(written_state, state_step,
                             run_timings(tracker, time.perf_counter() - t_start, state_step - start_step,
                                         state_leaves=leaves),
                             pipe.first, pipe.artifacts, schema, chunk, status, pipe, stop_reason="interrupted",
                             systems_done=systems_done, _chunk_program=chunk_program)
        raise
    finally:
        for bufs in replay_bufs:
            fills.give(bufs)
        fills.close()
        if bar is not None:
            if stop_reason == "until":  # stopped early on purpose: the bar ends where the run did
                bar.end_at(written_step - start_step)
            bar.__exit__(*sys.exc_info())
    if cfg.timeline is not None:
        for w in windows:
            w.add_to_timeline(cfg.timeline)
    window_s = None
    if len(windows) == 1 and windows[0].done:  # per-step seconds of the window's work steps that ran
        w = windows[0]
        ran = range(w.start, min(w.stop, written_step - 1) + 1)
        window_s = w.trace().step_seconds(ran) if len(ran) else None
    jax.block_until_ready(cur)
    t_done = time.perf_counter()
    stepping_s = None if t_loop is None else t_done - t_loop - first_call_s
    timings = run_timings(tracker, t_done - t_start, written_step - start_step, window_s, state_leaves=leaves,
                          stepping_s=stepping_s)
    result = Run(cur, written_step, timings, violation, {**pipe.artifacts, **window_artifacts}, schema, chunk,
                 status, pipe, stop_reason=stop_reason, systems_done=systems_done,
                 _chunk_program=chunk_program)
    if violation is not None:
        violation.jaxlog_run = result
        if cfg.on_violation == "raise":
            raise violation
    return result


@dataclasses.dataclass(frozen=True)
class _Checkpointer:
    """What every checkpoint of a run says the same (the key, the step function, the state's
    structure, the schema), worked out once per run: a checkpoint adds only what changed."""

    pipe: Pipeline
    template: CheckpointMeta
    key_impls: dict[str, str]
    until: bool

    @classmethod
    def of(cls, cfg: RunConfig, pipe: Pipeline, schema: Schema, state: Any,
           programs: dict | None) -> "_Checkpointer":
        key_data, key_impl = (None, None) if cfg.key is None else key_record(cfg.key)
        template = CheckpointMeta(step=0, step_fn=step_name(cfg.step), key=key_data, key_impl=key_impl,
                                  invariants=[], active=[], violation=None, done=None, systems_done=None,
                                  state_leaves=state_leaves(state), treedef=str(jax.tree_util.tree_structure(state)),
                                  x64=bool(jax.config.jax_enable_x64), schema=schema.to_json(), dt=cfg.dt,
                                  programs=programs)
        return cls(pipe, template, state_key_impls(state), cfg.until is not None)

    def save(self, step: int, state: Any, stopped: Any, systems_done: np.ndarray | None) -> int:
        """Attach a checkpoint at ``step`` (every frame up to it was handed to the sinks already);
        ``stopped``: where until= stopped the run (each system), -1 while it goes on, at that step."""
        saved = self.pipe.watch.save()
        meta = dataclasses.replace(
            self.template, step=step, invariants=saved["invariants"], active=saved["active"],
            violation=saved["violation"],
            done=None if stopped is None or not self.until else (np.asarray(stopped) >= 0).tolist(),
            systems_done=None if systems_done is None else systems_done.tolist())
        self.pipe.sinks.attach(CHECKPOINT, step, {**state_paths(state), META: meta.encode()}, key_impls=self.key_impls)
        return step


def _resume_into(cfg: RunConfig, pipe: Pipeline, schema: Schema, stopped: np.ndarray,
                 systems_done: np.ndarray | None) -> np.ndarray:
    """A resumed run's file starts as the old one up to the checkpoint: its frames, checkpoints and
    post-mortem states, the invariants' running state; returns where ``until`` had stopped the run
    (each system) there, -1 where it goes on."""
    point = cfg.resume
    copy_frames(point.source, point.step, schema, pipe.sinks.write)
    copy_attachments(point.source, point.step, pipe.sinks.attach)
    if pipe.watch:
        pipe.watch.restore({"invariants": point.meta.invariants, "active": point.meta.active,
                            "violation": point.meta.violation})
    if systems_done is not None and point.meta.systems_done is not None:
        systems_done[:] = point.meta.systems_done
    if point.meta.done is None:
        return stopped
    done = np.asarray(point.meta.done, bool)
    at = np.asarray(point.meta.systems_done if point.meta.systems_done is not None else np.full(done.shape, point.step))
    return np.where(done, at, -1).astype(np.int32).reshape(stopped.shape)


_RESOLVED: dict = {}
_SIGNATURES: dict = {}  # (program, plan, id(resolved)) -> (resolved, an uncommitted run's Signature)
_LAID_OUT: dict = {}  # (resolved plan, capacity, its shapes, pack) -> (shapes, the plan laid out, interned)
_AUTO: dict = {}  # (id(schema), budget) -> (schema, auto_chunk)


def _aval_key(tree):
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple((tuple(x.shape), x.dtype, bool(getattr(x, "weak_type", False))) for x in leaves)


class Resolved(NamedTuple):
    """What a kernel, its records and its state's types make of a run, worked out before any
    step runs; cached per (step, records, state shapes) like jit caches (tracing the step and
    every view costs milliseconds, which matters for short runs)."""

    plan: Plan  # without its chunk layout (see ``_laid_out``)
    schema: Schema
    shapes: tuple[dict, ...]  # per lane: leaf path -> frame ShapeDtypeStruct
    state_bytes: int  # device memory the state takes
    consts: tuple = ()  # the run's hoisted constants (the chunk's last argument, see drive.identity)


def _resolve(cfg: RunConfig, state) -> Resolved:
    """The run's :class:`Resolved`, from the cache when the step, records and state types were seen."""
    canon = identity.canonical(cfg.step, cfg.lanes, cfg.until, state, cfg.key,  # equal where they compute the same
                               lambda: n_systems_of(state, cfg.batched), cfg.log_capacity)
    ck = (canon.step, canon.lanes, _aval_key(state), _aval_key(cfg.key), cfg.has_aux, cfg.batched, canon.until,
          cfg.dt, cfg.logs, cfg.log_capacity)
    try:
        hit = _RESOLVED.get(ck)
    except TypeError:  # an unhashable view: no cache
        ck, hit = None, None
    if hit is not None:
        return hit if hit.consts is canon.consts else hit._replace(consts=canon.consts)
    plan = Plan(step=canon.step, lanes=canon.lanes, dense=(), compact=(), initial=(), host_masks=(), has_aux=cfg.has_aux,
                keyed=cfg.keyed, n_systems=n_systems_of(state, cfg.batched), until=canon.until, length=0,
                collect=True, log_capacity=cfg.log_capacity)

    def traced_step(st):  # through the collector: the step's output and what it logs
        return program.apply_logged(plan, cfg.key, jnp.int32(0), st)

    try:
        out_shape = program.logged_shapes(plan, cfg.key, jnp.int32(0), state)
    except JaxlogError:
        raise
    except Exception as e:
        raise JaxlogError(f"the step function failed on the state: {short_error(e)}{_hint(cfg)}") from None
    _check_carry(state, out_shape[0], cfg)
    if cfg.until is not None:
        try:
            jax.eval_shape(lambda st: program.until_flags(plan, st), state)
        except JaxlogError:
            raise
        except Exception as e:
            raise JaxlogError(f"until= failed on the state: {short_error(e)}") from None
    plan = dataclasses.replace(plan, lanes=_log_lanes(cfg, sorted(out_shape[2]), canon.lanes),
                               collect=bool(out_shape[2]))
    aux_fn = (lambda st: traced_step(st)[1]) if cfg.has_aux else None
    found = resolve(plan.lanes, state, aux=aux_fn, logs=lambda st: traced_step(st)[2], batched=cfg.batched,
                    dt=cfg.dt, log_capacity=cfg.log_capacity)
    plan, schema = dataclasses.replace(plan, lanes=found.lanes), found.schema
    shapes = tuple({leaf.path: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) for leaf in mine} for mine in found.per_lane)
    resolved = Resolved(plan, schema, shapes, sum(x.nbytes for x in jax.tree_util.tree_leaves(state)), canon.consts)
    return resolved if ck is None else remember(_RESOLVED, ck, resolved)


def _programs(resolved: Resolved) -> dict | None:
    """What the run's functions compute, as a checkpoint records it (see ``drive.identity``)."""
    plan = resolved.plan
    return identity.fingerprints(plan.step, plan.until, plan.lanes, resolved.consts)


def _signature(fn: Callable, plan: Plan, resolved: Resolved, args: tuple, given: list) -> program.Signature:
    """The chunk's argument signature, for ``run.compiled_chunk()``. When none of the arrays the
    caller gave (``given``: the state's leaves and the key) is committed, it follows from the
    program and what was resolved (their types; the buffers, the scalars and the masks are the
    plan's, placed like them), so it is read from the arguments once per kernel; otherwise every
    time (the shardings are the caller's)."""
    if any(getattr(x, "committed", False) for x in given):
        return program.Signature.of(args)
    return memo(_SIGNATURES, (fn, plan, id(resolved)), lambda: (resolved, program.Signature.of(args)))[1]


def _laid_out(plan: Plan, capacity: int, shapes: tuple[dict, ...], pack: bool) -> Plan:
    """``plan`` with the chunk layout for ``capacity``, interned; computed once per resolved plan
    and its leaves' shapes (a warm short run's host work is tens of microseconds a piece)."""
    return memo(_LAID_OUT, (plan, capacity, id(shapes), pack), lambda: (shapes, program.intern(
        dataclasses.replace(plan, **program.layout(plan.lanes, capacity, shapes, pack)))))[1]


def _log_lanes(cfg: RunConfig, logged: list[str], lanes: tuple[Lane, ...]) -> tuple[Lane, ...]:
    """The run's lanes once the step's logs are known: its views and aux selections, then lanes
    for the names the step logs, grouped by schedule (``logs=``; the rest every step). Views
    that call ``jl.log`` are found (and wrapped) as they are resolved."""
    named = dict(cfg.logs)
    unknown = sorted(set(named) - set(logged))
    if unknown:
        raise JaxlogError(f"logs= names {unknown}, but the step never logs them with jl.log "
                          f"(it logs: {', '.join(logged) or 'nothing'})")
    by_schedule: dict[Schedule, list[str]] = {}
    for name in logged:
        by_schedule.setdefault(named.get(name, LOG_SCHEDULE), []).append(f"{LOG}/{name}")
    return (*lanes, *(Lane(LOG, sched, log_paths=tuple(paths)) for sched, paths in by_schedule.items()))


def _hint(cfg: RunConfig) -> str:
    """What commonly goes wrong calling the step, said once."""
    if cfg.keyed:
        return " (with key=, the step is called as step(key, state))"
    return ""


def _as_arrays(state):
    """The state as device arrays with strong types; a leaf that cannot be one is an error
    naming it (jl.run carries the whole state through its device loop: configuration belongs in
    the step's closure). Weak types (Python scalars, ``jnp.asarray(1.0)``) are made strong once,
    here, so the first chunk and the later ones compile to one program."""
    if all(isinstance(x, jax.Array) and not getattr(x, "weak_type", True) and not x.is_deleted()
           for x in jax.tree_util.tree_leaves(state)):
        return state  # (a test's runs mostly pass such states: nothing to look at leaf by leaf)
    pairs, treedef = jax.tree_util.tree_flatten_with_path(state)
    out = []
    for kp, leaf in pairs:
        if isinstance(leaf, jax.Array) and leaf.is_deleted():
            raise JaxlogError(f"state leaf {jax.tree_util.keystr(kp) or '(the state itself)'} was deleted (donated to "
                              f"an earlier jitted call?): pass a live array")
        if isinstance(leaf, jax.Array) and not getattr(leaf, "weak_type", True):  # already what the loop carries
            out.append(leaf)
            continue
        try:
            arr = jnp.asarray(leaf)
            out.append(jnp.asarray(arr, dtype=arr.dtype) if getattr(arr, "weak_type", False) else arr)
        except (TypeError, ValueError) as e:
            where = jax.tree_util.keystr(kp) or "(the state itself)"
            raise JaxlogError(
                f"state leaf {where} is {type(leaf).__name__} {leaf!r:.60}, not an array: jl.run carries the "
                f"state on the device, so every leaf must be a numeric array (keep configuration such as "
                f"names or settings out of the state, e.g. in the step function's closure) ({e})"
            ) from None
    return jax.tree_util.tree_unflatten(treedef, out)


def _check_carry(state, new_shape, cfg: RunConfig) -> None:
    a, ta = jax.tree_util.tree_flatten_with_path(state)
    if not cfg.has_aux and isinstance(new_shape, tuple) and len(new_shape) == 2:
        if jax.tree_util.tree_structure(new_shape[0]) == ta:
            raise JaxlogError("the step function returns a pair (state, something): pass has_aux=True to record "
                              "the second part as aux, or return only the state")
    b, tb = jax.tree_util.tree_flatten_with_path(new_shape)
    if ta != tb:
        raise JaxlogError(f"the step function changed the state's structure: {ta} -> {tb}")
    for (kp, x), (_, y) in zip(a, b):
        if tuple(x.shape) != tuple(y.shape) or x.dtype != y.dtype:
            raise JaxlogError(f"the step function changed state leaf {jax.tree_util.keystr(kp)}: "
                              f"{x.dtype}{list(x.shape)} -> {y.dtype}{list(y.shape)}")


def _progress(progress, steps):
    if progress is False:
        return None
    if isinstance(progress, ProgressLogger):
        return progress
    return ProgressLogger(steps, enabled=True if progress is True else None, desc="jaxlog")
