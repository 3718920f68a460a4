"""One ``jl.run``, from its checked arguments to its :class:`~.result.Run`: an object whose
attributes are the run's state and whose methods are its phases, in the order they run:

resolve (what the step and views produce; errors before any step runs) → lay out (the chunk
program, donation, where the small host values live) → prepare (buffers, reader, checkpoints)
→ start (bind invariants, open sinks, resume) → loop (dispatch chunk ``i+1``, then pull and
consume chunk ``i``: frames, invariants, sinks, checkpoints) → drain (the chunks still in flight,
invariants judged at the end) → close (the sinks, with a status) → finish (timings, the Run).
On an error, ``fail`` closes the sinks saying why and makes the partial Run.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from ...errors import JaxlogError, Terminated, hide_frame_from_checks
from ...profiling.timeline import now_ns
from ...profiling.timings import CompileTracker
from ...profiling.window import check_windows
from ...record import records as runmeta
from ..checkpoints.checkpoint import check_against
from ..device import program
from ..device.chunks import (
    VIEW_BYTES,
    Chunk,
    Fill,
    Fills,
    Reader,
    Segment,
    any_deleted,
    merge,
    one_set_in_flight,
    scalars_on,
    segments,
)
from ..device.plan import as_arrays, laid_out, placed_alike, programs_of, signature_of
from ..prepare import sharding as shards
from ..prepare.identity import placed
from ..prepare.sharding import StopVote
from .checkpointer import Checkpointer, replay, resume_into
from .config import RunConfig, capacity_of, resolve_run
from .loggers import ProgressLogger, progress_for_run
from .pipeline import Pipeline, Span
from .result import Run, make_run, run_timings
from .signals import Noted

__all__ = ['RunLoop']

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
        self.resolve(state)
        self.lay_out()
        self.prepare()
        try:
            # from here on, whatever happens closes the sinks with a status saying why
            self.start()
            self.drain(stop=self.loop())
            self.close()
        except BaseException as exc:
            self.fail(exc)
            raise
        finally:
            self.clean_up()
        return self.finish()

    # -- resolve and lay out ----------------------------------------------------------------------
    def resolve(self, state: Any) -> None:
        """What the step and the views produce, checked against the checkpoint a resume continues from."""
        cfg = self.cfg
        self.windows = check_windows(cfg.profile, cfg.end, cfg.start_step) if cfg.profile is not None else ()
        self.state = state = as_arrays(state)
        if cfg.resume is not None:  # what the file's run was, before the step is traced with other arguments
            check_against(cfg.resume, step_fn=cfg.step, schema=None, state=state, key=cfg.key, dt=cfg.dt,
                          invariants=cfg.invariants)
        self.resolved = resolve_run(cfg, state)
        self.schema, self.shapes = self.resolved.schema, self.resolved.shapes
        # what the run's functions compute, for a checkpoint to keep and a resume to compare
        self.programs = None if cfg.resume is None and cfg.checkpoint is None else programs_of(self.resolved)
        self.progress = progress_for_run(cfg.progress, cfg.steps, self.schema)  # names checked before any step
        if cfg.resume is not None:
            check_against(cfg.resume, step_fn=cfg.step, schema=self.schema, state=state, key=cfg.key, dt=cfg.dt,
                          invariants=cfg.invariants, programs=self.programs)
        self.pipe = Pipeline(sinks=cfg.sinks, invariants=cfg.invariants, on_violation=cfg.on_violation,
                             timeline=cfg.timeline)

    def lay_out(self) -> None:
        """The chunk program and its arguments: capacity, layout, donation, placement."""
        cfg, state = self.cfg, self.state
        capacity = capacity_of(cfg, self.schema)
        self.chunk = max(1, min(capacity if cfg.chunk is None else cfg.chunk, cfg.steps)) if cfg.steps else 1
        self.lanes = self.resolved.plan.lanes  # views (those that log wrapped), aux, then the step's logs
        # a sharded state: the key and the until= stops live replicated on its mesh (see drive.prepare.sharding),
        # and the program makes each fresh set of buffers itself, laid out like the views
        self.mesh_rep = mesh_rep = shards.replicated_on(state)
        # one placement for every dispatch: a state committed throughout where anything is committed
        self.state = state = placed_alike(state, cfg.key, self.resolved.consts)
        self.leaves = leaves = jax.tree_util.tree_leaves(state)
        # one program, any length and chunk size, stepping in blocks (see program.blocks); scalar
        # records share row buffers unless the state is sharded
        platform = next(iter(leaves[0].devices())).platform if leaves else jax.default_backend()
        self.plan = plan = laid_out(self.resolved.plan, capacity, self.shapes,
                                    pack=mesh_rep is None and shards.process_count() == 1,
                                    block=program.block_for(platform))
        # with invariants, chunk-start states are kept for the post-mortem: no donation
        # with checkpoints, the state at each written step is kept for one (on a stop, too)
        # a small state is not donated: the copy that keeps the caller's arrays costs more than it saves
        self.use_donate = (cfg.donate and not cfg.invariants and cfg.checkpoint is None
                           and self.resolved.state_bytes >= DONATE_MIN_BYTES)
        self.fn = program.chunk_donate if self.use_donate else program.chunk
        self.device = next(iter(leaves[0].devices())) if leaves else None
        self.committed = bool(leaves) and getattr(leaves[0], "committed", False)
        self.key = shards.place(cfg.key, mesh_rep)
        consts = self.resolved.consts  # the functions' hoisted arrays: the chunk's last argument
        self.consts = placed(consts, mesh_rep or self.device) if self.committed else consts
        self.no_masks = tuple(np.zeros(plan.length, dtype=bool) for _ in plan.host_masks)
        batched_until = cfg.until is not None and plan.n_systems is not None
        # the dispatches' small host values, kept on the device where the other arguments are placed
        self.kept = scalars_on(self.device, self.committed, mesh_rep)
        # until=: where it stopped (each system), -1 while it goes on
        self.stopped = self.kept.one(np.full((plan.n_systems,) if batched_until else (), -1, np.int32))
        self.systems_done = np.full(plan.n_systems, -1, np.int64) if batched_until else None

    def describe(self) -> dict:
        """The run as the sinks record it; over several processes, who writes which block."""
        cfg = self.cfg
        meta = {"driver": "run", "steps": cfg.steps, "start_step": cfg.start_step, "chunk": self.chunk, "dt": cfg.dt,
                "has_aux": cfg.has_aux, "batched": cfg.batched is not False, "keyed": cfg.keyed,
                "until": cfg.until is not None}
        if cfg.checkpoint is not None:  # a file without a checkpoint yet can say the run meant to keep them
            meta["checkpoint"] = cfg.checkpoint.to_json()
        if cfg.meta:  # meta=: the run's own metadata, read back as traj.meta (see record.records)
            meta[runmeta.KEY] = cfg.meta
        self.layout = None  # a run over several processes: who writes which block of each record
        if shards.process_count() > 1:
            if cfg.resume is not None and cfg.resume.run_id is None:
                raise JaxlogError(f"resume from {cfg.resume.source.name}: the file was written by one process; in a "
                                  f"run over {shards.process_count()} processes resume a run of as many")
            plan = self.plan
            probe = program.abstract((self.state, None, self.key, program.control(0, 0, 0, 0),
                                      program.empty_counts(plan), self.no_masks, self.stopped, self.consts))
            self.layout = shards.Layout.of(self.fn.lower(plan, *probe).compile().output_shardings, plan, self.schema)
            self.layout.check_invariants(cfg.invariants, self.schema)
            self.layout.check_sinks(self.pipe.sinks.sinks)
            meta["processes"] = {"count": shards.process_count(), "index": jax.process_index(),
                                 "run_id": shards.shared_run_id() if cfg.resume is None else cfg.resume.run_id,
                                 "layout": self.layout.to_json()}
        return meta

    def prepare(self) -> None:
        """Buffers, reader, checkpoints, and the loop's starting point."""
        cfg, plan, leaves, device = self.cfg, self.plan, self.leaves, self.device
        self.meta = self.describe()
        self.checkpointer = None if cfg.checkpoint is None else Checkpointer.of(cfg, self.pipe, self.schema,
                                                                                self.state, self.programs)
        # buffers go where the state is committed (uncommitted: the default device, and uncommitted too, or
        # the program would compile again for the mix of committed and uncommitted arguments)
        platform = device.platform if device is not None else jax.default_backend()
        # large records on the CPU: one set in flight (one process, one device: see drive.device.chunks)
        one_set = self.layout is None and self.mesh_rep is None and one_set_in_flight(plan, self.shapes, platform)
        self.fills = Fills(plan, self.shapes, device if self.committed else None, cfg.budget,
                           0 if self.use_donate else self.resolved.state_bytes, close_at=cfg.checkpoint,
                           placement=leaves[0].sharding if self.committed else None, sharded=self.mesh_rep is not None,
                           each_chunk=self.layout is not None, one_set=one_set)
        self.reader = Reader.of(plan, self.shapes, platform, self.layout)
        self.chunk_program: tuple | None = None  # (jitted chunk, plan, its arguments' Signature), for run.compiled_chunk()
        self.program_bufs = False  # whether that chunk was given its buffers (a sharded run's first makes them)
        self.first_flags = ((program.RECORD_INITIAL if cfg.start_step == 0 else 0)
                            | (program.CHECK_INITIAL if cfg.until else 0))
        self.replay_bufs: list = []  # buffers the post-mortem replays write into
        self.bar: ProgressLogger | None = None
        self.cur, self.cur_step = self.state, cfg.start_step  # the newest state dispatched, and its step
        self.written_step, self.written_state = cfg.start_step, None  # where the frames handed over end
        self.stop_reason = "steps"
        self.inflight: list[Chunk] = []  # dispatched chunks not pulled yet, in step order
        self.starts: list = []  # recent (k0, chunk-start state) covering the last `postmortem` steps (no donation)
        self.pm_state = None  # the state at the first violating step, replayed for the post-mortem
        self.last: Fill | None = None  # the last set of buffers pulled
        self.t_loop: float | None = None
        self.compiling_s = 0.0  # what the dispatches that traced and compiled took: not stepping time
        self.compiled_once = False  # the run compiled its program (a later compile is a recompile)
        self.reasons: list[str] = []  # why each compile after the first happened (CompileEvent.reason)
        self.open_window = None  # the profile window whose steps are being dispatched
        self.masked_steps = 0  # loop slots the pulled sets ran beyond their steps (see program.blocks)
        self.saved_at = cfg.start_step  # the step of the newest checkpoint in the file
        # the sinks open once the first chunk is dispatched: a file is created while that chunk runs
        # (on a first run, once its program compiled), not before (milliseconds, as much as a short
        # run); a resume copies the old file's frames first
        self.open_late = (cfg.end > cfg.start_step or bool(self.first_flags)) and cfg.resume is None
        self.sinks_tried = False  # opening them was attempted (a failed attempt is not made again)
        self.checked_through = cfg.start_step  # the invariants have seen the frames up to here
        # over several processes: the votes on stopping (a SIGTERM in any process), by the first step of the
        # chunk each follows
        self.vote = StopVote(self.mesh_rep) if self.layout is not None else None
        self.votes: dict[int, Any] = {}

    # -- run ----------------------------------------------------------------------------------------
    def open_sinks(self) -> None:
        self.sinks_tried = True
        self.pipe.open_sinks(self.schema, self.meta)

    def start(self) -> None:
        """Invariants bound, the dispatches to make, sinks opened (unless late), a resume's old frames."""
        cfg, start_step = self.cfg, self.cfg.start_step
        self.pipe.bind(self.schema)
        if cfg.end > start_step:
            self.segs = segments(start_step, cfg.end, self.chunk, self.windows, cfg.checkpoint)
        else:  # no step to run: the initial state's frame (and until=) only
            self.segs = iter([Segment(start_step, 0, None)] if self.first_flags else [])
        if not self.open_late:
            self.open_sinks()
        if cfg.resume is not None:  # the old file's frames, checkpoints and invariants up to the checkpoint
            self.stopped = self.kept.one(resume_into(cfg, self.pipe, self.schema, np.asarray(self.stopped),
                                                     self.systems_done))
        self.cur = _copy_tree(self.state) if self.use_donate else self.state
        self.written_state = self.cur if not self.use_donate else None
        self.bar = self.pipe.progress = self.progress
        if self.bar is not None:
            self.bar.__enter__()

    def loop(self) -> bool:
        """Dispatch every segment, consuming the chunks that are due; True when a violation stopped
        the run (a stop by ``until`` ends the loop too)."""
        self.t_loop = time.perf_counter()
        for n_chunk, seg in enumerate(self.segs):
            self.act_on_signal()
            ahead = self.fills.ahead(seg.length)  # one set in flight: the set this chunk would not fit, pulled first
            ended = self.consume(ahead) if ahead else None
            if ended is not None:
                return ended == "violation"
            self.dispatch(n_chunk, seg)
            batch = self.fills.due()
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
        plan, fn, cur, stopped = self.plan, self.fn, self.cur, self.stopped
        masks = tuple(program.host_mask(self.lanes[i].schedule, k0, length, plan.length) for i in plan.host_masks)
        flags = self.first_flags if n_chunk == 0 else 0
        t0 = now_ns()
        bufs, row0, counts = self.fills.next(k0, length, flags)
        args = (plan, cur, bufs, self.key, self.kept.control(k0, length, row0, flags), self.kept(counts), masks,
                stopped, self.consts)
        if win is not None and self.open_window is not win:  # compiled before the window opens, never in a step
            self.compiling(n_chunk, args, lambda: fn.lower(*args).compile())
        out = self.compiling(n_chunk, args, lambda: fn(*args) if win is None else self.window_step(win, k0, args))
        if n_chunk == 0 and self.open_late:
            self.open_sinks()
        if self.chunk_program is None or (not self.program_bufs and bufs is not None):  # the program later chunks run
            # taken once the chunk runs (donated arguments keep their shapes and shardings)
            self.chunk_program = (fn, plan, signature_of(fn, plan, self.resolved, args[1:], [*self.leaves, self.key]))
            self.program_bufs = bufs is not None
        self.cur, self.cur_step, self.stopped = out["state"], k0 + length, out["stopped"]
        if self.vote is not None:
            self.stopped, vote = self.vote.cast(self.stopped, n_chunk, self.noted.signum if self.noted else 0)
            if vote is not None:
                self.votes[k0] = vote
        t1 = now_ns()
        if self.cfg.timeline is not None:
            self.cfg.timeline.slice("dispatch", f"steps {k0}..{k0 + length}", t0, t1, {"k0": k0, "length": length})
        self.inflight.append(Chunk(k0, length, None if self.use_donate else cur, stopped, t1))
        self.fills.dispatched(self.inflight[-1], out, self.reader)

    def compiling(self, n_chunk: int, args: tuple, call: Callable[[], Any]) -> Any:
        """``call()``, and if it traced and compiled (JAX's compile log grew), its seconds kept out
        of the stepping time and, after the run's first compilation, why it compiled again: the
        argument whose type or placement differs from the first dispatch's, or none."""
        seen, t_call = len(self.tracker.all_events), time.perf_counter()
        out = call()
        if len(self.tracker.all_events) > seen:
            self.compiling_s += time.perf_counter() - t_call
            if self.compiled_once:
                first = self.chunk_program[2] if self.chunk_program is not None else None
                self.reasons.append(program.Signature.of(args[1:]).differs(first, at=f"chunk {n_chunk}"))
            self.compiled_once = True
        return out

    def window_step(self, win: Any, k0: int, args: tuple) -> dict:
        """Work step ``k0`` of profile window ``win``: one dispatch inside its annotation."""
        if self.open_window is not win:
            win.begin()
            self.open_window = win
        with win.step(k0):
            out = self.fn(*args)
            jax.block_until_ready(out["state"])  # the step's device time belongs to its annotation
        if k0 == win.stop or k0 == self.cfg.end - 1:
            win.end(block_on=out["state"])
            self.open_window = None
        return out

    def one_step(self, carry, k):
        """The post-mortem replay: the run's own program, one step (never donating the state)."""
        plan = self.plan
        bufs = self.replay_bufs.pop() if self.replay_bufs else self.fills.spare()
        out = program.chunk(plan, carry[0], bufs, self.key, self.kept.control(k, 1, 0, 0),
                            self.kept(program.empty_counts(plan)), self.no_masks, carry[1], self.consts)
        self.replay_bufs.append(out["bufs"])
        return out["state"], out["stopped"]

    def found(self, new, batch: list[Fill]) -> None:
        """The post-mortem of the run's first violation, when this batch holds it: replayed from
        the start of the chunk that holds the violating step (or an earlier one)."""
        pipe = self.pipe
        if new[0] is pipe.first:  # (over several processes each stores its shards of the states, in its part)
            step = pipe.first.step
            chunks = [c for f in batch for c in f.chunks]
            at = next((c for c in chunks if c.k0 < step <= c.end), chunks[0])
            earlier = self.starts + [(c.k0, (c.start_state, c.start_stopped)) for c in chunks if c.k0 < at.k0]
            self.settle()
            self.pm_state = replay(pipe.first, at.k0, (at.start_state, at.start_stopped), earlier, self.one_step,
                                   self.cfg.postmortem, pipe.sinks, state_of=lambda c: c[0])[0]

    def pull(self, batch: list[Fill]) -> list:
        """Pull sets of buffers, feed their frames as one batch; note a stop by ``until``."""
        self.checked_through = -1  # a signal while the invariants take these frames leaves them past any step
        until, systems_done = self.cfg.until, self.systems_done
        reuse = self.fills.set_bytes < VIEW_BYTES
        for f in batch:
            bufs = self.reader.pull(f, reuse)
            self.masked_steps += f.slots - f.ran
            if bufs is not None:
                self.fills.give(bufs)
            if until is not None and self.stop_reason != "until":
                at = f.stopped_at
                if systems_done is not None:
                    systems_done[(systems_done < 0) & (at >= 0)] = at[(systems_done < 0) & (at >= 0)]
                if f.stopped_early or bool(np.all(at >= 0)):
                    self.stop_reason = "until"
        t_ready = now_ns()
        self.last = last = batch[-1]
        del self.inflight[:sum(len(f.chunks) for f in batch)]
        label = f"frames {batch[0].k0 + 1}..{last.end}"
        new = self.pipe.feed(merge(batch), label, span=Span(batch[0].chunks[0].t_dispatched, t_ready))
        self.checked_through = last.end
        return new

    def consume(self, batch: list[Fill]) -> str | None:
        """Pull and feed sets of buffers (with checkpoints one set at a time: a checkpoint follows
        the frames up to its step, and the invariants have seen nothing past it). Returns
        ``"violation"`` or ``"until"`` when the run stops here."""
        cfg, pipe = self.cfg, self.pipe
        # one set at a time past the budget too: pulling several large sets before feeding them
        # (and joining their frames) would hold each record two or three times
        alone = cfg.checkpoint is not None or self.fills.set_bytes * len(batch) > cfg.budget
        for group in ([f] for f in batch) if alone else [batch]:
            new = self.pull(group)
            if new:
                self.found(new, group)
                if cfg.on_violation == "raise":
                    return "violation"
            if pipe.checking and pipe.first is None:
                starts = self.starts
                starts.extend((c.k0, (c.start_state, c.start_stopped)) for f in group for c in f.chunks)
                newest = self.inflight[-1].k0 if self.inflight else self.last.end
                while len(starts) >= 2 and starts[1][0] <= newest - cfg.postmortem:
                    starts.pop(0)
            self.written_step = self.last.end
            if not self.use_donate:  # the state at the batch's end: the next chunk's start
                self.written_state = self.inflight[0].start_state if self.inflight else self.cur
            if cfg.checkpoint is not None and cfg.checkpoint.contains(self.written_step):
                self.saved_at = self.checkpointer.save(self.written_step, self.written_state,
                                                       self.last.out["stopped"], self.systems_done)
            if self.bar is not None:
                self.bar.saved(pipe.sinks.committed_step())
                self.bar.advance(self.written_step - cfg.start_step)
            if self.vote is not None:
                self.stop_if_asked(group)
            if self.stop_reason == "until":  # the chunks dispatched since ran no step
                self.fills.drop()
                self.cur_step = self.written_step
                return "until"
        return None

    def stop_if_asked(self, group: list[Fill]) -> None:
        """Over several processes: stop here, in every process alike, when a process was asked to
        (SIGTERM) before one of these chunks was dispatched; ``fail`` then checkpoints this step."""
        asked: dict[int, int] = {}
        for c in (c for f in group for c in f.chunks):
            vote = self.votes.pop(c.k0, None)
            if vote is not None:
                asked.update(self.vote.read(vote) if self.vote is not None else {})
        if asked:
            if self.noted is not None:
                self.noted.take()
            self.settle()
            stop = Terminated(next(iter(asked.values())))
            stop.add_note(f"[jaxlog] every process of the run stopped after step {self.written_step}: "
                          + ", ".join(f"process {p} received signal {s}" for p, s in sorted(asked.items())))
            raise stop

    def settle(self) -> None:
        """Over several processes: wait for every program dispatched (the chain of chunks and votes
        ends in ``stopped``), so that no program of the run is still to run when the next
        collective (a post-mortem replay, the caller's) is dispatched."""
        if self.vote is not None:
            jax.block_until_ready(self.stopped)

    def drain(self, stop: bool) -> None:
        """After the last dispatch: the chunks still in flight, then what is judged at the end."""
        for w in self.windows:  # a stop inside a window ends it there: stop the profiler too
            if w.active:
                w.end(block_on=self.cur)
        rest = [] if stop or self.stop_reason == "until" else self.fills.rest()
        if rest:
            stop = self.consume(rest) == "violation"
            if not stop:
                self.cur_step = self.written_step
        if not stop:
            pipe, last = self.pipe, self.last
            late = pipe.finish()  # judged at the end (an aggregate whose window the run ended before)
            if late and late[0] is pipe.first and last is not None and late[0].step >= last.k0:
                self.found(late, [last])

    def close(self) -> None:
        """Close the sinks with the run's status; with ``on_violation="raise"``, state and frames end
        at the violating step."""
        cfg, pipe = self.cfg, self.pipe
        self.violation = violation = pipe.first
        if self.systems_done is not None:
            self.systems_done[self.systems_done < 0] = self.written_step
        summary: dict[str, Any] = {"stop_reason": self.stop_reason,
                   "systems_done": None if self.systems_done is None else self.systems_done.tolist()}
        if self.systems_done is not None:  # what a finished system's rows hold after its stop
            summary["finished_systems"] = program.finished_systems()
        if violation is not None and cfg.on_violation == "raise" and self.pm_state is not None:
            # state and frames end at the violating step
            self.cur = self.written_state = self.pm_state
            self.written_step = violation.step
            summary["stop_reason"] = self.stop_reason = "violation"
        for w in self.windows:  # their steps past where the run stopped did no work (until=)
            w.settle(self.cur_step, self.written_step, self.stop_reason)
        self.window_artifacts = {k: v for w in self.windows for k, v in w.artifacts.items()}
        if violation is not None:
            self.status = "violated"
            pipe.close("violated", steps_done=self.written_step, artifacts=self.window_artifacts, summary=summary)
        else:
            self.status = "complete"
            pipe.close("complete", steps_done=self.written_step, summary=summary)

    # -- the way out --------------------------------------------------------------------------------
    def fail(self, exc: BaseException) -> None:
        """Close the sinks saying why the run stopped (one more checkpoint first, on a Ctrl-C), and
        make the partial Run (``exc.jaxlog_run``, for users)."""
        cfg, pipe = self.cfg, self.pipe
        status = "stopped" if isinstance(exc, KeyboardInterrupt) else "failed"
        for w in self.windows:
            w.abort(exc)
        # (only where the invariants stopped too: a signal between checking a chunk and counting it
        # written would save their state past the checkpoint's step)
        if (isinstance(exc, KeyboardInterrupt) and cfg.checkpoint is not None and pipe.opened
                and self.written_state is not None and self.written_step > self.saved_at
                and self.checked_through == self.written_step):
            try:  # one more checkpoint where the frames end, so the run can resume from there
                self.checkpointer.save(self.written_step, self.written_state,
                                       None if self.last is None else self.last.out["stopped"], self.systems_done)
            except BaseException as e:
                exc.add_note(f"[jaxlog] no checkpoint at step {self.written_step} on the way out: "
                             f"{type(e).__name__}: {e}")
        if self.open_late and not self.sinks_tried:  # stopped before they opened (a compile error, a Ctrl-C
            try:                                     # while compiling): the run is on record as any that failed
                self.open_sinks()
            except BaseException as e:
                exc.add_note(f"[jaxlog] the sinks could not record the run: {type(e).__name__}: {e}")
        if pipe.opened:
            pipe.close(status, steps_done=self.written_step, raise_errors=False,
                       summary={"stop_reason": "interrupted"}, reason=exc)
        state, state_step = self.written_state, self.written_step
        if state is None:  # donated: the newest state we still hold (frames may end earlier)
            state, state_step = (self.cur, self.cur_step) if not any_deleted(self.cur) else (None, self.written_step)
        timings = run_timings(self.tracker, time.perf_counter() - self.t_start, state_step - cfg.start_step,
                              state_leaves=self.leaves, programs=int(self.chunk_program is not None),
                              reasons=self.reasons)
        partial = self.make(state, state_step, timings, pipe.first, pipe.artifacts, status, "interrupted")
        exc.jaxlog_run = partial  # type: ignore[attr-defined]  # the user's handle on the partial run

    def clean_up(self) -> None:
        """Buffers back to the pool, the progress bar ended (where the run did, when ``until`` stopped it)."""
        for bufs in self.replay_bufs:
            self.fills.give(bufs)
        self.fills.close()
        if self.bar is not None:
            self.bar.saved(self.pipe.sinks.committed_step())  # the sinks are closed: their last commit
            if self.stop_reason == "until":  # stopped early on purpose: the bar ends where the run did
                self.bar.end_at(self.written_step - self.cfg.start_step)
            self.bar.__exit__(*sys.exc_info())

    def finish(self) -> Run:
        """Timings (the profile window's per-step seconds too) and the Run; a violation raised with
        ``on_violation="raise"``."""
        __tracebackhide__ = hide_frame_from_checks
        cfg, windows = self.cfg, self.windows
        if cfg.timeline is not None:
            for w in windows:
                w.add_to_timeline(cfg.timeline)
        window_s = None
        if len(windows) == 1 and windows[0].done:  # per-step seconds of the window's work steps that ran
            w = windows[0]
            ran = range(w.start, min(w.stop, self.written_step - 1) + 1)
            window_s = w.trace().step_seconds(ran) if len(ran) else None
        jax.block_until_ready(self.cur)
        self.settle()
        t_done = time.perf_counter()
        stepping_s = None if self.t_loop is None else t_done - self.t_loop - self.compiling_s
        timings = run_timings(self.tracker, t_done - self.t_start, self.written_step - cfg.start_step, window_s,
                              state_leaves=self.leaves, stepping_s=stepping_s, masked_steps=self.masked_steps,
                              reasons=self.reasons, window_slots=self.plan.slots,
                              programs=int(self.chunk_program is not None))  # one chunk program per run
        result = self.make(self.cur, self.written_step, timings, self.violation,
                           {**self.pipe.artifacts, **self.window_artifacts}, self.status, self.stop_reason)
        if self.violation is not None:
            self.violation.jaxlog_run = result
            if cfg.on_violation == "raise":
                raise self.violation
        return result

    def make(self, state: Any, steps_done: int, timings: Any, violation: Any, artifacts: dict, status: str,
             stop_reason: str) -> Run:
        """The run's Run (kept as ``result``), finished or partial."""
        self.result = make_run(state=state, steps_done=steps_done, timings=timings, violation=violation,
                               artifacts=artifacts, schema=self.schema, chunk=self.chunk, status=status,
                               stop_reason=stop_reason, systems_done=self.systems_done, sinks=self.pipe,
                               chunk_program=self.chunk_program, meta=self.cfg.meta)
        return self.result
