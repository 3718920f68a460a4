"""One ``jl.run``, from its checked options to its :class:`~.result.Run`. Each phase hands the
next a value, so a phase can only run on what the earlier ones made:

:class:`Found` (what the step and views produce, the profile windows, the progress bar's names:
errors before any step runs) → :class:`Prepared` (the chunk program laid out for the capacity,
donation, where the small host values live, who writes what over several processes, the run
as the sinks record it) → :class:`Outputs` (the pipeline of invariants and sinks, the progress
bar, the checkpoints: opened when the run starts, closed with its status) and a :class:`Cursor`
(where the run is: the newest state dispatched, the frames handed over, the chunks in flight, why
it stops) → :class:`RunLoop` runs it: start (invariants bound, sinks opened unless late, a
resume's old frames) → loop (dispatch chunk ``i+1``, then pull and consume chunk ``i``: frames,
invariants, sinks, checkpoints) → drain (the chunks still in flight, invariants judged at the
end) → close (the sinks, with a status: an :class:`Ending`) → finish (timings, the Run). On an
error, ``fail`` closes the sinks saying why and makes the partial Run.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from ...errors import JaxlogError, Terminated, hide_frame_from_checks
from ...profiling.timeline import now_ns
from ...profiling.timings import CompileTracker
from ...profiling.window import check_windows
from ...record import records as runmeta
from ...record.frames import Schema
from ..checkpoints.checkpoint import check_against
from ..device import program
from ..device.chunks import (
    VIEW_BYTES,
    Chunk,
    Fill,
    Fills,
    Reader,
    Scalars,
    Segment,
    any_deleted,
    merge,
    one_set_in_flight,
    scalars_on,
    segments,
)
from ..device.plan import (Resolved, as_arrays, capacity_of, laid_out, placed_alike, programs_of, resolve_run,
                          signature_of)
from ..device.program import Lane, Plan
from ..prepare import sharding as shards
from ..prepare.config import RunConfig
from ..prepare.identity import placed
from ..prepare.sharding import StopVote
from .checkpointer import Checkpointer, replay, resume_into
from .loggers import ProgressLogger, progress_for_run
from .pipeline import Pipeline, Span
from .result import Run, make_run, run_timings
from .signals import Noted

__all__ = ['RunLoop', 'Found', 'Prepared', 'Outputs', 'Cursor', 'Ending']

DONATE_MIN_BYTES = 1 << 20  # states smaller than this are not donated (see ``run``'s ``donate``)


@jax.jit
def _copies(leaves: list) -> list:
    """Fresh buffers for the leaves, in one dispatch (a copy per leaf is an eager dispatch each,
    several times the cost, on every run that donates)."""
    return [jnp.copy(x) for x in leaves]


def _copy_tree(tree):
    """The state the run may donate: never the caller's arrays."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return jax.tree_util.tree_unflatten(treedef, _copies(leaves))


# -- the phases before any step: values -------------------------------------------------------------
@dataclass(frozen=True, eq=False)  # holds arrays: compared by identity
class Found:
    """What the step and the views produce on the state, checked against the checkpoint a resume
    continues from; the profile windows and the progress bar's record names checked too."""

    windows: tuple
    state: Any  # the initial state, as arrays
    resolved: Resolved
    programs: dict | None  # what the run's functions compute, for a checkpoint to keep and a resume to compare
    progress: ProgressLogger | None

    @classmethod
    def of(cls, cfg: RunConfig, state: Any) -> "Found":
        windows = check_windows(cfg.profile, cfg.end, cfg.start_step) if cfg.profile is not None else ()
        state = as_arrays(state)
        if cfg.resume is not None:  # what the file's run was, before the step is traced with other arguments
            check_against(cfg.resume, step_fn=cfg.step, schema=None, state=state, key=cfg.key, dt=cfg.dt,
                          invariants=cfg.invariants)
        resolved = resolve_run(cfg, state)
        programs = None if cfg.resume is None and cfg.checkpoint is None else programs_of(resolved)
        progress = progress_for_run(cfg.progress, cfg.steps, resolved.schema)  # names checked before any step
        if cfg.resume is not None:
            check_against(cfg.resume, step_fn=cfg.step, schema=resolved.schema, state=state, key=cfg.key, dt=cfg.dt,
                          invariants=cfg.invariants, programs=programs)
        return cls(windows=windows, state=state, resolved=resolved, programs=programs, progress=progress)


@dataclass(frozen=True, eq=False)  # holds arrays: compared by identity
class Prepared:
    """The chunk program and its arguments, as every dispatch of the run takes them: the
    capacity and layout, donation, placement, the small host values kept on the device; over
    several processes, who writes which block of each record; the run as the sinks record it."""

    windows: tuple
    resolved: Resolved
    programs: dict | None
    state: Any  # the initial state, placed as every dispatch takes it (a state committed throughout where any is)
    leaves: list
    chunk: int
    plan: Plan  # laid out for the capacity
    mesh_rep: Any  # a sharded state's mesh, replicated: where the key and the until= stops live
    donate: bool
    fn: Any  # the chunk program, donating the state or not
    device: Any
    committed: bool
    key: Any
    consts: Any  # the functions' hoisted arrays: the chunk's last argument
    no_masks: tuple
    kept: Scalars  # the dispatches' small host values, kept on the device where the other arguments are placed
    stopped: Any  # until=: where it stopped (each system), -1 while it goes on: at the start
    first_flags: int
    layout: shards.Layout | None  # a run over several processes: who writes which block of each record
    meta: dict  # the run as the sinks record it

    @property
    def schema(self) -> Schema:
        return self.resolved.schema

    @property
    def shapes(self) -> tuple[dict, ...]:
        return self.resolved.shapes

    @property
    def lanes(self) -> tuple[Lane, ...]:
        """The views (those that log wrapped), aux, then the step's logs."""
        return self.resolved.plan.lanes

    @property
    def platform(self) -> str:
        return self.device.platform if self.device is not None else jax.default_backend()

    @classmethod
    def of(cls, cfg: RunConfig, found: Found, sinks: tuple) -> "Prepared":
        resolved = found.resolved
        capacity = capacity_of(cfg, resolved.schema)
        chunk = max(1, min(capacity if cfg.chunk is None else cfg.chunk, cfg.steps)) if cfg.steps else 1
        # a sharded state: the key and the until= stops live replicated on its mesh (see drive.prepare.sharding),
        # and the program makes each fresh set of buffers itself, laid out like the views
        mesh_rep = shards.replicated_on(found.state)
        # one placement for every dispatch: a state committed throughout where anything is committed
        state = placed_alike(found.state, cfg.key, resolved.consts)
        leaves = jax.tree_util.tree_leaves(state)
        device = next(iter(leaves[0].devices())) if leaves else None
        # one program, any length and chunk size, stepping in blocks (see program.blocks); scalar
        # records share row buffers unless the state is sharded
        plan = laid_out(resolved.plan, capacity, resolved.shapes, pack=mesh_rep is None and shards.process_count() == 1,
                        block=program.block_for(device.platform if device is not None else jax.default_backend()))
        # with invariants, chunk-start states are kept for the post-mortem: no donation
        # with checkpoints, the state at each written step is kept for one (on a stop, too)
        # a small state is not donated: the copy that keeps the caller's arrays costs more than it saves
        donate = (cfg.donate and not cfg.invariants and cfg.checkpoint is None
                  and resolved.state_bytes >= DONATE_MIN_BYTES)
        fn = program.chunk_donate if donate else program.chunk
        committed = bool(leaves) and getattr(leaves[0], "committed", False)
        key = shards.place(cfg.key, mesh_rep)
        consts = placed(resolved.consts, mesh_rep or device) if committed else resolved.consts
        no_masks = tuple(np.zeros(plan.length, dtype=bool) for _ in plan.host_masks)
        batched_until = cfg.until is not None and plan.n_systems is not None
        kept = scalars_on(device, committed, mesh_rep)
        stopped = kept.one(np.full((plan.n_systems,) if batched_until else (), -1, np.int32))
        layout = _layout(cfg, plan, fn, resolved.schema, sinks, probe=lambda: (
            state, None, key, program.control(0, 0, 0, 0), program.empty_counts(plan), no_masks, stopped, consts))
        first_flags = ((program.RECORD_INITIAL if cfg.start_step == 0 else 0)
                       | (program.CHECK_INITIAL if cfg.until else 0))
        return cls(windows=found.windows, resolved=resolved, programs=found.programs, state=state, leaves=leaves,
                   chunk=chunk, plan=plan, mesh_rep=mesh_rep, donate=donate, fn=fn, device=device, committed=committed,
                   key=key, consts=consts, no_masks=no_masks, kept=kept, stopped=stopped, first_flags=first_flags,
                   layout=layout, meta=_described(cfg, chunk, layout))


def _layout(cfg: RunConfig, plan: Plan, fn: Any, schema: Schema, sinks: tuple,
            probe: Callable[[], tuple]) -> shards.Layout | None:
    """Over several processes: who writes which block of each record (the invariants and sinks
    checked against it), read off the program compiled for the dispatch's arguments (``probe()``);
    None in a run of one process."""
    if shards.process_count() <= 1:
        return None
    if cfg.resume is not None and cfg.resume.run_id is None:
        raise JaxlogError(f"resume from {cfg.resume.source.name}: the file was written by one process; in a "
                          f"run over {shards.process_count()} processes resume a run of as many")
    layout = shards.Layout.of(fn.lower(plan, *program.abstract(probe())).compile().output_shardings, plan, schema)
    layout.check_invariants(cfg.invariants, schema)
    layout.check_sinks(sinks)
    return layout


def _described(cfg: RunConfig, chunk: int, layout: shards.Layout | None) -> dict:
    """The run as the sinks record it."""
    meta = {"driver": "run", "steps": cfg.steps, "start_step": cfg.start_step, "chunk": chunk, "dt": cfg.dt,
            "has_aux": cfg.has_aux, "batched": cfg.batched is not False, "keyed": cfg.keyed,
            "until": cfg.until is not None}
    if cfg.checkpoint is not None:  # a file without a checkpoint yet can say the run meant to keep them
        meta["checkpoint"] = cfg.checkpoint.to_json()
    if cfg.meta:  # meta=: the run's own metadata, read back as traj.meta (see record.records)
        meta[runmeta.KEY] = cfg.meta
    if layout is not None:
        meta["processes"] = {"count": shards.process_count(), "index": jax.process_index(),
                             "run_id": shards.shared_run_id() if cfg.resume is None else cfg.resume.run_id,
                             "layout": layout.to_json()}
    return meta


def _fills(cfg: RunConfig, prep: Prepared) -> Fills:
    """The run's sets of record buffers. They go where the state is committed (uncommitted: the
    default device, and uncommitted too, or the program would compile again for the mix of
    committed and uncommitted arguments); large records on the CPU: one set in flight (one
    process, one device: see drive.device.chunks)."""
    one_set = (prep.layout is None and prep.mesh_rep is None
               and one_set_in_flight(prep.plan, prep.shapes, prep.platform))
    return Fills(prep.plan, prep.shapes, prep.device if prep.committed else None, cfg.budget,
                 0 if prep.donate else prep.resolved.state_bytes, close_at=cfg.checkpoint,
                 placement=prep.leaves[0].sharding if prep.committed else None, sharded=prep.mesh_rep is not None,
                 each_chunk=prep.layout is not None, one_set=one_set)


# -- what the run writes to, and where it is --------------------------------------------------------
class Outputs:
    """Where the run's frames go: the pipeline (invariants, sinks, the timeline's host slices and
    counters), the progress bar, the checkpoints. The sinks open once the first chunk is
    dispatched: a file is created while that chunk runs (on a first run, once its program
    compiled), not before (milliseconds, as much as a short run); a resume copies the old file's
    frames first, so its sinks open at the start."""

    def __init__(self, cfg: RunConfig, pipe: Pipeline, progress: ProgressLogger | None, prep: Prepared):
        self.pipe, self.schema, self.meta, self.timeline = pipe, prep.schema, prep.meta, cfg.timeline
        self.checkpointer = None if cfg.checkpoint is None else Checkpointer.of(cfg, pipe, prep.schema, prep.state,
                                                                                prep.programs)
        self.progress = progress  # the bar, shown from the start (None: none)
        self.open_late = (cfg.end > cfg.start_step or bool(prep.first_flags)) and cfg.resume is None
        self.sinks_tried = False  # opening them was attempted (a failed attempt is not made again)

    def open_sinks(self) -> None:
        self.sinks_tried = True
        self.pipe.open_sinks(self.schema, self.meta)

    def start(self) -> None:
        """Invariants bound (errors before any sink is created), the sinks opened unless late."""
        self.pipe.bind(self.schema)
        if not self.open_late:
            self.open_sinks()

    def show_progress(self) -> None:
        self.pipe.progress = self.progress
        if self.progress is not None:
            self.progress.__enter__()

    def close(self, ending: "Ending", steps_done: int, summary: dict) -> None:
        if ending.violation is not None:
            self.pipe.close("violated", steps_done=steps_done, artifacts=ending.window_artifacts, summary=summary)
        else:
            self.pipe.close("complete", steps_done=steps_done, summary=summary)

    def fail(self, exc: BaseException, status: str, at: "Cursor", checkpoint_due: bool) -> None:
        """Close the sinks saying why the run stopped (one more checkpoint first, on a Ctrl-C,
        where ``checkpoint_due``); the notes on ``exc`` say what could not be done."""
        if checkpoint_due and self.checkpointer is not None and self.pipe.opened:
            try:  # one more checkpoint where the frames end, so the run can resume from there
                self.checkpointer.save(at.written_step, at.written_state,
                                       None if at.last is None else at.last.out["stopped"], at.systems_done)
            except BaseException as e:
                exc.add_note(f"[jaxlog] no checkpoint at step {at.written_step} on the way out: "
                             f"{type(e).__name__}: {e}")
        if self.open_late and not self.sinks_tried:  # stopped before they opened (a compile error, a Ctrl-C
            try:                                     # while compiling): the run is on record as any that failed
                self.open_sinks()
            except BaseException as e:
                exc.add_note(f"[jaxlog] the sinks could not record the run: {type(e).__name__}: {e}")
        if self.pipe.opened:
            self.pipe.close(status, steps_done=at.written_step, raise_errors=False,
                            summary={"stop_reason": "interrupted"}, reason=exc)

    def end_progress(self, saved: int | None, until_at: int | None) -> None:
        """The bar ended (where the run did, ``until_at``, when ``until`` stopped it)."""
        bar = self.pipe.progress
        if bar is not None:
            bar.saved(saved)
            if until_at is not None:
                bar.end_at(until_at)
            bar.__exit__(*sys.exc_info())


@dataclass
class Cursor:
    """Where the run is: the newest state dispatched, the frames handed over, the chunks in flight
    and kept chunk-start states, why it stops."""

    cur: Any  # the newest state dispatched
    cur_step: int  # its step
    stopped: Any  # until=: where the run (each system) stopped, -1 while it goes on, after the newest chunk
    systems_done: np.ndarray | None  # batched until=: the step each system stopped at, -1 while it goes on
    written_step: int  # where the frames handed over end
    saved_at: int  # the step of the newest checkpoint in the file
    checked_through: int  # the invariants have seen the frames up to here
    written_state: Any = None  # the state at written_step (None: donated)
    stop_reason: str = "steps"
    inflight: list[Chunk] = field(default_factory=list)  # dispatched chunks not pulled yet, in step order
    starts: list = field(default_factory=list)  # recent (k0, chunk-start state) covering the last `postmortem` steps
    last: Fill | None = None  # the last set of buffers pulled
    pm_state: Any = None  # the state at the first violating step, replayed for the post-mortem
    masked_steps: int = 0  # loop slots the pulled sets ran beyond their steps (see program.blocks)
    votes: dict = field(default_factory=dict)  # over several processes: the votes on stopping, by the chunk's k0

    @classmethod
    def of(cls, cfg: RunConfig, prep: Prepared) -> "Cursor":
        batched_until = cfg.until is not None and prep.plan.n_systems is not None
        return cls(cur=prep.state, cur_step=cfg.start_step, stopped=prep.stopped,
                   systems_done=np.full(prep.plan.n_systems, -1, np.int64) if batched_until else None,
                   written_step=cfg.start_step, saved_at=cfg.start_step, checked_through=cfg.start_step)


@dataclass
class Compiles:
    """What the run's dispatches compiled: the program later chunks run (for ``run.compiled_chunk()``),
    the seconds compiling took (not stepping time), why each compile after the first happened."""

    chunk_program: tuple | None = None  # (jitted chunk, plan, its arguments' Signature)
    program_bufs: bool = False  # whether that chunk was given its buffers (a sharded run's first makes them)
    seconds: float = 0.0
    once: bool = False  # the run compiled its program (a later compile is a recompile)
    reasons: list[str] = field(default_factory=list)  # CompileEvent.reason of each recompile

    def timed(self, tracker: CompileTracker, n_chunk: int, args: tuple, call: Callable[[], Any]) -> Any:
        """``call()``, and if it traced and compiled (JAX's compile log grew), its seconds kept out
        of the stepping time and, after the run's first compilation, why it compiled again: the
        argument whose type or placement differs from the first dispatch's, or none."""
        seen, t_call = len(tracker.all_events), time.perf_counter()
        out = call()
        if len(tracker.all_events) > seen:
            self.seconds += time.perf_counter() - t_call
            if self.once:
                first = self.chunk_program[2] if self.chunk_program is not None else None
                self.reasons.append(program.Signature.of(args[1:]).differs(first, at=f"chunk {n_chunk}"))
            self.once = True
        return out

    def took(self, prep: Prepared, args: tuple, bufs: Any) -> None:
        """The program later chunks run, taken once a chunk runs (donated arguments keep their
        shapes and shardings)."""
        if self.chunk_program is None or (not self.program_bufs and bufs is not None):
            self.chunk_program = (prep.fn, prep.plan, signature_of(prep.fn, prep.plan, prep.resolved, args[1:],
                                                                   [*prep.leaves, prep.key]))
            self.program_bufs = bufs is not None


@dataclass(frozen=True)
class Ending:
    """How the run ended, as its sinks were closed."""

    status: str
    violation: Any
    window_artifacts: dict


class RunLoop:
    """One run. ``go(state)`` runs it and returns its Run (or raises: the violation with
    ``on_violation="raise"``, or whatever stopped it); ``result`` is the Run made, finished or
    partial (None when the run failed before its sinks were bound)."""

    def __init__(self, cfg: RunConfig, tracker: CompileTracker, t_start: float):
        self.cfg, self.tracker, self.t_start = cfg, tracker, t_start
        self.result: Run | None = None
        self.noted: Noted | None = None  # SIGTERM noted, acted on at a chunk boundary (set by the run's caller)

    def go(self, state: Any) -> Run:
        __tracebackhide__ = hide_frame_from_checks
        cfg = self.cfg
        found = Found.of(cfg, state)
        pipe = Pipeline(sinks=cfg.sinks, invariants=cfg.invariants, on_violation=cfg.on_violation,
                        timeline=cfg.timeline)
        self.prep = prep = Prepared.of(cfg, found, pipe.sinks.sinks)
        self.out = Outputs(cfg, pipe, found.progress, prep)
        self.fills = _fills(cfg, prep)
        self.reader = Reader.of(prep.plan, prep.shapes, prep.platform, prep.layout)
        self.at, self.compiles = Cursor.of(cfg, prep), Compiles()
        self.replay_bufs: list = []  # buffers the post-mortem replays write into
        self.open_window = None  # the profile window whose steps are being dispatched
        self.t_loop: float | None = None
        # over several processes: the votes on stopping (a SIGTERM in any process)
        self.vote = StopVote(prep.mesh_rep) if prep.layout is not None else None
        try:
            # from here on, whatever happens closes the sinks with a status saying why
            self.start()
            self.drain(stop=self.loop())
            ending = self.close()
        except BaseException as exc:
            self.fail(exc)
            raise
        finally:
            self.clean_up()
        return self.finish(ending)

    # -- run ----------------------------------------------------------------------------------------
    def start(self) -> None:
        """Invariants bound, the dispatches to make, sinks opened (unless late), a resume's old frames."""
        cfg, prep, at, out = self.cfg, self.prep, self.at, self.out
        out.start()
        if cfg.end > cfg.start_step:
            self.segs = segments(cfg.start_step, cfg.end, prep.chunk, prep.windows, cfg.checkpoint)
        else:  # no step to run: the initial state's frame (and until=) only
            self.segs = iter([Segment(cfg.start_step, 0, None)] if prep.first_flags else [])
        if cfg.resume is not None:  # the old file's frames, checkpoints and invariants up to the checkpoint
            at.stopped = prep.kept.one(resume_into(cfg, out.pipe, prep.schema, np.asarray(at.stopped),
                                                   at.systems_done))
        at.cur = _copy_tree(prep.state) if prep.donate else prep.state
        at.written_state = at.cur if not prep.donate else None
        out.show_progress()

    def loop(self) -> bool:
        """Dispatch every segment, consuming the chunks that are due; True when a violation stopped
        the run (a stop by ``until`` ends the loop too)."""
        self.t_loop = time.perf_counter()
        fills = self.fills
        for n_chunk, seg in enumerate(self.segs):
            self.act_on_signal()
            ahead = fills.ahead(seg.length)  # one set in flight: the set this chunk would not fit, pulled first
            ended = self.consume(ahead) if ahead else None
            if ended is not None:
                return ended == "violation"
            self.dispatch(n_chunk, seg)
            batch = fills.due()
            if batch:
                ended = self.consume(batch)
                if ended is not None:
                    return ended == "violation"
        self.act_on_signal()
        return False

    def act_on_signal(self) -> None:
        """A chunk boundary: stop for a SIGTERM noted since the last (``drive.host.signals``: the handler
        never raises), as for Ctrl-C; over several processes the vote decides (``stop_if_asked``)."""
        if self.noted is not None and self.vote is None:
            self.noted.act()

    def dispatch(self, n_chunk: int, seg: Segment) -> None:
        """Dispatch one segment of the chunk program (asynchronously; a window's steps wait for theirs)."""
        k0, length, win = seg
        prep, at = self.prep, self.at
        plan, fn, cur, stopped, kept = prep.plan, prep.fn, at.cur, at.stopped, prep.kept
        lanes = prep.lanes
        masks = tuple(program.host_mask(lanes[i].schedule, k0, length, plan.length) for i in plan.host_masks)
        flags = prep.first_flags if n_chunk == 0 else 0
        t0 = now_ns()
        bufs, row0, counts = self.fills.next(k0, length, flags)
        args = (plan, cur, bufs, prep.key, kept.control(k0, length, row0, flags), kept(counts), masks,
                stopped, prep.consts)
        if win is not None and self.open_window is not win:  # compiled before the window opens, never in a step
            self.compiles.timed(self.tracker, n_chunk, args, lambda: fn.lower(*args).compile())
        out = self.compiles.timed(self.tracker, n_chunk, args,
                                  lambda: fn(*args) if win is None else self.window_step(win, k0, args))
        if n_chunk == 0 and self.out.open_late:
            self.out.open_sinks()
        self.compiles.took(prep, args, bufs)  # the program later chunks run
        at.cur, at.cur_step, at.stopped = out["state"], k0 + length, out["stopped"]
        if self.vote is not None:
            at.stopped, vote = self.vote.cast(at.stopped, n_chunk, self.noted.signum if self.noted else 0)
            if vote is not None:
                at.votes[k0] = vote
        t1 = now_ns()
        if self.cfg.timeline is not None:
            self.cfg.timeline.slice("dispatch", f"steps {k0}..{k0 + length}", t0, t1, {"k0": k0, "length": length})
        at.inflight.append(Chunk(k0, length, None if prep.donate else cur, stopped, t1))
        self.fills.dispatched(at.inflight[-1], out, self.reader)

    def window_step(self, win: Any, k0: int, args: tuple) -> dict:
        """Work step ``k0`` of profile window ``win``: one dispatch inside its annotation."""
        if self.open_window is not win:
            win.begin()
            self.open_window = win
        with win.step(k0):
            out = self.prep.fn(*args)
            jax.block_until_ready(out["state"])  # the step's device time belongs to its annotation
        if k0 == win.stop or k0 == self.cfg.end - 1:
            win.end(block_on=out["state"])
            self.open_window = None
        return out

    def one_step(self, carry, k):
        """The post-mortem replay: the run's own program, one step (never donating the state)."""
        prep = self.prep
        plan = prep.plan
        bufs = self.replay_bufs.pop() if self.replay_bufs else self.fills.spare()
        out = program.chunk(plan, carry[0], bufs, prep.key, prep.kept.control(k, 1, 0, 0),
                            prep.kept(program.empty_counts(plan)), prep.no_masks, carry[1], prep.consts)
        self.replay_bufs.append(out["bufs"])
        return out["state"], out["stopped"]

    def post_mortem(self, new, batch: list[Fill]) -> None:
        """The post-mortem of the run's first violation, when this batch holds it: replayed from
        the start of the chunk that holds the violating step (or an earlier one)."""
        pipe = self.out.pipe
        if new[0] is pipe.first:  # (over several processes each stores its shards of the states, in its part)
            step = pipe.first.step
            chunks = [c for f in batch for c in f.chunks]
            at = next((c for c in chunks if c.k0 < step <= c.end), chunks[0])
            earlier = self.at.starts + [(c.k0, (c.start_state, c.start_stopped)) for c in chunks if c.k0 < at.k0]
            self.settle()
            self.at.pm_state = replay(pipe.first, at.k0, (at.start_state, at.start_stopped), earlier, self.one_step,
                                      self.cfg.postmortem, pipe.sinks, state_of=lambda c: c[0])[0]

    def pull(self, batch: list[Fill]) -> list:
        """Pull sets of buffers, feed their frames as one batch; note a stop by ``until``."""
        at = self.at
        at.checked_through = -1  # a signal while the invariants take these frames leaves them past any step
        until, systems_done = self.cfg.until, at.systems_done
        reuse = self.fills.set_bytes < VIEW_BYTES
        for f in batch:
            bufs = self.reader.pull(f, reuse)
            at.masked_steps += f.slots - f.ran
            if bufs is not None:
                self.fills.give(bufs)
            if until is not None and at.stop_reason != "until":
                stopped_at = f.stopped_at
                if systems_done is not None:
                    newly = (systems_done < 0) & (stopped_at >= 0)
                    systems_done[newly] = stopped_at[newly]
                if f.stopped_early or bool(np.all(stopped_at >= 0)):
                    at.stop_reason = "until"
        t_ready = now_ns()
        at.last = last = batch[-1]
        del at.inflight[:sum(len(f.chunks) for f in batch)]
        label = f"frames {batch[0].k0 + 1}..{last.end}"
        new = self.out.pipe.feed(merge(batch), label, span=Span(batch[0].chunks[0].t_dispatched, t_ready))
        at.checked_through = last.end
        return new

    def consume(self, batch: list[Fill]) -> str | None:
        """Pull and feed sets of buffers (with checkpoints one set at a time: a checkpoint follows
        the frames up to its step, and the invariants have seen nothing past it). Returns
        ``"violation"`` or ``"until"`` when the run stops here."""
        cfg, at, pipe, checkpointer = self.cfg, self.at, self.out.pipe, self.out.checkpointer
        # one set at a time past the budget too: pulling several large sets before feeding them
        # (and joining their frames) would hold each record two or three times
        alone = cfg.checkpoint is not None or self.fills.set_bytes * len(batch) > cfg.budget
        for group in ([f] for f in batch) if alone else [batch]:
            new = self.pull(group)
            if new:
                self.post_mortem(new, group)
                if cfg.on_violation == "raise":
                    return "violation"
            if pipe.checking and pipe.first is None:
                starts = at.starts
                starts.extend((c.k0, (c.start_state, c.start_stopped)) for f in group for c in f.chunks)
                newest = at.inflight[-1].k0 if at.inflight else at.last.end
                while len(starts) >= 2 and starts[1][0] <= newest - cfg.postmortem:
                    starts.pop(0)
            at.written_step = at.last.end
            if not self.prep.donate:  # the state at the batch's end: the next chunk's start
                at.written_state = at.inflight[0].start_state if at.inflight else at.cur
            if checkpointer is not None and cfg.checkpoint.contains(at.written_step):
                at.saved_at = checkpointer.save(at.written_step, at.written_state, at.last.out["stopped"],
                                                at.systems_done)
            if pipe.progress is not None:
                pipe.progress.saved(pipe.sinks.committed_step())
                pipe.progress.advance(at.written_step - cfg.start_step)
            if self.vote is not None:
                self.stop_if_asked(group)
            if at.stop_reason == "until":  # the chunks dispatched since ran no step
                self.fills.drop()
                at.cur_step = at.written_step
                return "until"
        return None

    def stop_if_asked(self, group: list[Fill]) -> None:
        """Over several processes: stop here, in every process alike, when a process was asked to
        (SIGTERM) before one of these chunks was dispatched; ``fail`` then checkpoints this step."""
        asked: dict[int, int] = {}
        for c in (c for f in group for c in f.chunks):
            vote = self.at.votes.pop(c.k0, None)
            if vote is not None:
                asked.update(self.vote.read(vote) if self.vote is not None else {})
        if asked:
            if self.noted is not None:
                self.noted.take()
            self.settle()
            stop = Terminated(next(iter(asked.values())))
            stop.add_note(f"[jaxlog] every process of the run stopped after step {self.at.written_step}: "
                          + ", ".join(f"process {p} received signal {s}" for p, s in sorted(asked.items())))
            raise stop

    def settle(self) -> None:
        """Over several processes: wait for every program dispatched (the chain of chunks and votes
        ends in ``stopped``), so that no program of the run is still to run when the next
        collective (a post-mortem replay, the caller's) is dispatched."""
        if self.vote is not None:
            jax.block_until_ready(self.at.stopped)

    def drain(self, stop: bool) -> None:
        """After the last dispatch: the chunks still in flight, then what is judged at the end."""
        at = self.at
        for w in self.prep.windows:  # a stop inside a window ends it there: stop the profiler too
            if w.active:
                w.end(block_on=at.cur)
        rest = [] if stop or at.stop_reason == "until" else self.fills.rest()
        if rest:
            stop = self.consume(rest) == "violation"
            if not stop:
                at.cur_step = at.written_step
        if not stop:
            pipe, last = self.out.pipe, at.last
            late = pipe.finish()  # judged at the end (an aggregate whose window the run ended before)
            if late and late[0] is pipe.first and last is not None and late[0].step >= last.k0:
                self.post_mortem(late, [last])

    def close(self) -> Ending:
        """Close the sinks with the run's status; with ``on_violation="raise"``, state and frames end
        at the violating step."""
        cfg, at = self.cfg, self.at
        violation = self.out.pipe.first
        if at.systems_done is not None:
            at.systems_done[at.systems_done < 0] = at.written_step
        summary: dict[str, Any] = {"stop_reason": at.stop_reason,
                   "systems_done": None if at.systems_done is None else at.systems_done.tolist()}
        if at.systems_done is not None:  # what a finished system's rows hold after its stop
            summary["finished_systems"] = program.finished_systems()
        if violation is not None and cfg.on_violation == "raise" and at.pm_state is not None:
            # state and frames end at the violating step
            at.cur = at.written_state = at.pm_state
            at.written_step = violation.step
            summary["stop_reason"] = at.stop_reason = "violation"
        for w in self.prep.windows:  # their steps past where the run stopped did no work (until=)
            w.settle(at.cur_step, at.written_step, at.stop_reason)
        ending = Ending(status="complete" if violation is None else "violated", violation=violation,
                        window_artifacts={k: v for w in self.prep.windows for k, v in w.artifacts.items()})
        self.out.close(ending, at.written_step, summary)
        return ending

    # -- the way out --------------------------------------------------------------------------------
    def fail(self, exc: BaseException) -> None:
        """Close the sinks saying why the run stopped (one more checkpoint first, on a Ctrl-C), and
        make the partial Run (``exc.jaxlog_run``, for users)."""
        cfg, at = self.cfg, self.at
        status = "stopped" if isinstance(exc, KeyboardInterrupt) else "failed"
        for w in self.prep.windows:
            w.abort(exc)
        # (only where the invariants stopped too: a signal between checking a chunk and counting it
        # written would save their state past the checkpoint's step)
        self.out.fail(exc, status, at, checkpoint_due=(
            isinstance(exc, KeyboardInterrupt) and at.written_state is not None and at.written_step > at.saved_at
            and at.checked_through == at.written_step))
        state, state_step = at.written_state, at.written_step
        if state is None:  # donated: the newest state we still hold (frames may end earlier)
            state, state_step = (at.cur, at.cur_step) if not any_deleted(at.cur) else (None, at.written_step)
        timings = run_timings(self.tracker, time.perf_counter() - self.t_start, state_step - cfg.start_step,
                              state_leaves=self.prep.leaves, programs=int(self.compiles.chunk_program is not None),
                              reasons=self.compiles.reasons)
        pipe = self.out.pipe
        partial = self.make(state, state_step, timings, pipe.first, pipe.artifacts, status, "interrupted")
        exc.jaxlog_run = partial  # type: ignore[attr-defined]  # the user's handle on the partial run

    def clean_up(self) -> None:
        """Buffers back to the pool, the progress bar ended (where the run did, when ``until`` stopped it)."""
        for bufs in self.replay_bufs:
            self.fills.give(bufs)
        self.fills.close()
        at = self.at
        if self.out.pipe.progress is not None:  # the sinks are closed: their last commit
            self.out.end_progress(self.out.pipe.sinks.committed_step(),
                                  at.written_step - self.cfg.start_step if at.stop_reason == "until" else None)

    def finish(self, ending: Ending) -> Run:
        """Timings (the profile window's per-step seconds too) and the Run; a violation raised with
        ``on_violation="raise"``."""
        __tracebackhide__ = hide_frame_from_checks
        cfg, windows, at, compiles = self.cfg, self.prep.windows, self.at, self.compiles
        if cfg.timeline is not None:
            for w in windows:
                w.add_to_timeline(cfg.timeline)
        window_s = None
        if len(windows) == 1 and windows[0].done:  # per-step seconds of the window's work steps that ran
            w = windows[0]
            ran = range(w.start, min(w.stop, at.written_step - 1) + 1)
            window_s = w.trace().step_seconds(ran) if len(ran) else None
        jax.block_until_ready(at.cur)
        self.settle()
        t_done = time.perf_counter()
        stepping_s = None if self.t_loop is None else t_done - self.t_loop - compiles.seconds
        timings = run_timings(self.tracker, t_done - self.t_start, at.written_step - cfg.start_step, window_s,
                              state_leaves=self.prep.leaves, stepping_s=stepping_s, masked_steps=at.masked_steps,
                              reasons=compiles.reasons, window_slots=self.prep.plan.slots,
                              programs=int(compiles.chunk_program is not None))  # one chunk program per run
        violation = ending.violation
        result = self.make(at.cur, at.written_step, timings, violation,
                           {**self.out.pipe.artifacts, **ending.window_artifacts}, ending.status, at.stop_reason)
        if violation is not None:
            violation.jaxlog_run = result
            if cfg.on_violation == "raise":
                raise violation
        return result

    def make(self, state: Any, steps_done: int, timings: Any, violation: Any, artifacts: dict, status: str,
             stop_reason: str) -> Run:
        """The run's Run (kept as ``result``), finished or partial."""
        self.result = make_run(state=state, steps_done=steps_done, timings=timings, violation=violation,
                               artifacts=artifacts, schema=self.prep.schema, chunk=self.prep.chunk, status=status,
                               stop_reason=stop_reason, systems_done=self.at.systems_done, sinks=self.out.pipe,
                               chunk_program=self.compiles.chunk_program, meta=self.cfg.meta)
        return self.result
