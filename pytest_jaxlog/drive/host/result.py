"""A run's timings from the compile tracker opened for the run (so ``compiles`` counts the
compilations that happened during this run: 0 when all was cached)."""

from __future__ import annotations

import dataclasses
import functools
import threading
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ...profiling.cost import Cost, cost
from ...profiling.timings import CompileTracker, Timings, describe_avals
from ...record.frames import Schema
from ..device import program
from ..prepare.schema import WhenFlags

__all__ = ['Run', 'Outcome', 'make_run', 'STOP_REASONS']

def run_timings(tracker: CompileTracker, wall_s: float, steps: int, window: Any = None, *,
                state_leaves: Sequence[Any] | None = None, stepping_s: float | None = None,
                programs: int | None = None, masked_steps: int = 0, reasons: Sequence[str] = (),
                window_slots: int = 1) -> Timings:
    """``state_leaves`` (``jl.run``, whose tracked programs all take the state's leaves first and
    carry the step function): the compilations are this thread's (the run's own), and
    ``compiles`` counts every one of them: the same program compiled twice is two (a cache that
    did not hold it, a mix of committed and uncommitted arguments), which a count of distinct
    signatures would hide; ``from_cache`` counts those JAX loaded from its persistent compilation
    cache. A compilation whose arguments the tracker did not read
    (``CompileTracker(read_args=False)``) has the state's leaf types as its ``args``.
    ``reasons``: why the driver compiled again, for the compilations after the run's first, in
    order (see ``CompileEvent.reason``).
    ``programs``: the distinct programs the run dispatched, compiled now or earlier in this process
    (never fewer than it compiled: a program that compiled and then failed to run still counts).
    ``masked_steps``: loop slots the run computed and threw away (see ``drive.device.program.blocks``);
    ``window_slots``: the slots each profile-window step's dispatch computed."""
    if state_leaves is None:
        t = tracker.timings(wall_s, steps, window)
    else:
        thread = threading.current_thread().name
        mine = [ev if ev.args is not None else dataclasses.replace(ev, args=describe_avals(state_leaves))
                for ev in tracker.events if ev.thread == thread]
        mine = mine[:1] + [dataclasses.replace(ev, reason=why) if ev.reason is None and why is not None else ev
                           for ev, why in zip(mine[1:], [*reasons, *[None] * len(mine)])]
        t = tracker.timings(wall_s, steps, window, events=mine)
    t.stepping_s = stepping_s
    t.masked_steps = int(masked_steps)
    t.window_slots = int(window_slots)
    if programs is not None:
        t.programs = max(int(programs), t.compiled_programs)
    return t

# ---------------------------------------------------------------------------------------------
# ``run.cost``: what one step of a run's kernel and each of its recorded views cost, by XLA's
# account (see ``profiling.cost``).
#
# The step is compiled on its own, as the run calls it (its key folded in, its aux returned), for
# the arguments the run's program was dispatched with (shapes, dtypes, shardings), but without
# collecting its ``jl.log`` values: the kernel's own cost, whatever is recorded. Each view is
# compiled on its own too, and reported apart: a view recorded every 100 steps costs a hundredth
# of its figure per step, and a test usually wants to know which of the two moved.

def run_cost(chunk_program: Any) -> Cost | None:
    """The cost of a run from the chunk program it dispatched (``Run._chunk_program``: the jitted
    chunk, its plan and its arguments' signature); None when no chunk ran."""
    if chunk_program is None:
        return None
    _, plan, signature = chunk_program
    args = signature.abstract()  # (state, buffers, key, control, counts, masks, stopped)
    state, key = args[0], args[2]
    bare = dataclasses.replace(plan, collect=False)

    def one_step(key, k, st):
        new, aux, _ = program.apply_logged(bare, key, k, st)
        return new, aux

    # every view of the state (one kept by what the step computed too; not such a when='s flags,
    # which are no view of the state)
    views = {lane.name: cost(lambda st, lane=lane: lane.read(st, None), state)
             for lane in plan.lanes if lane.view is not None and not (lane.when_values and isinstance(lane.view, WhenFlags))}
    step = cost(one_step, key, jax.ShapeDtypeStruct((), jnp.int32), state)
    return dataclasses.replace(step, views=views)

# ---------------------------------------------------------------------------------------------
# What ``jl.run`` gives back: :class:`Run` (made only by :func:`make_run`), and
# :class:`Outcome`, a run's result or its error as a value, for callers that handle both.

STOP_REASONS = ("until", "steps", "violation", "interrupted")


@dataclass
class Run:
    """What ``jl.run`` returns: the state at ``steps_done``, the trajectory, timings, violation.

    ``stop_reason``: ``"until"`` (the ``until=`` predicate held), ``"steps"`` (all steps ran),
    ``"violation"`` (an invariant stopped it) or ``"interrupted"`` (an exception, Ctrl-C,
    SIGTERM). ``systems_done``: in batched runs with ``until=``, the step at which each system
    finished (``steps_done`` for those that never did). ``meta``: what ``meta=`` gave (``{}``
    without it; a resumed run's, the file's)."""

    state: Any
    steps_done: int
    timings: Any
    violation: Any = None
    artifacts: dict = field(default_factory=dict)
    schema: Schema | None = None
    chunk: int | None = None
    status: str = "complete"
    stop_reason: str = "steps"
    systems_done: np.ndarray | None = None
    meta: dict = field(default_factory=dict)  # meta=: the run's JSON metadata, as the file keeps it
    resumed_from: int | None = None  # jl.resume: the checkpoint's step the run continued from
    # the driver's, set by make_run: the run's sinks, its trajectory once read, and the chunk
    # program it dispatched (jitted chunk, plan, its arguments' program.Signature)
    _sinks: Any = field(default=None, init=False, repr=False, compare=False)
    _trajectory: Any = field(default=None, init=False, repr=False, compare=False)
    _chunk_program: Any = field(default=None, init=False, repr=False, compare=False)

    @property
    def trajectory(self) -> Any:
        """The recorded trajectory: loaded from the file sink if any, else in memory."""
        if self._trajectory is None:
            self._trajectory = self._sinks.trajectory()
        return self._trajectory

    @functools.cached_property
    def cost(self) -> Any:
        """XLA's cost of one step and of each view at one recorded step (``jl.Cost``); compiled on first use."""
        return run_cost(self._chunk_program)

    @functools.cached_property
    def compiled(self) -> Any:
        """The chunk program this run dispatched, as a ``jax.stages.Compiled`` (see
        :meth:`compiled_chunk`): ``run.compiled.as_text()`` shows the loops XLA made of it, the
        blocks of steps with their ``known_trip_count``."""
        return self.compiled_chunk()

    def compiled_chunk(self) -> Any:
        """The chunk program this run dispatched, compiled (a ``jax.stages.Compiled``, from JAX's
        cache: nothing is compiled again). ``.as_text()`` is the program after XLA's passes, with
        the collectives a sharded state needs; ``.cost_analysis()``, ``.memory_analysis()``.
        For checking what a run costs on the devices; None when no chunk was dispatched."""
        if self._chunk_program is None:
            return None
        fn, plan, args = self._chunk_program
        return fn.lower(plan, *args.abstract()).compile()


def make_run(*, state: Any, steps_done: int, timings: Any, violation: Any, artifacts: dict, schema: Schema,
             chunk: int, status: str, stop_reason: str, systems_done: np.ndarray | None, sinks: Any,
             chunk_program: Any, meta: dict | None = None) -> Run:
    """The one place a :class:`Run` is made, finished or partial: with the sinks its trajectory
    is read from and the chunk program ``compiled_chunk()`` compiles."""
    run = Run(state, steps_done, timings, violation, artifacts, schema, chunk, status, stop_reason=stop_reason,
              systems_done=systems_done, meta=dict(meta or {}))
    run._sinks, run._chunk_program = sinks, chunk_program
    return run


class Outcome(NamedTuple):
    """A run's end as a value: its :class:`Run` and no error, or the error it raised with the
    partial run (None when it failed before a run began: bad arguments, a step that does not
    trace). The error also carries the partial run as ``error.jaxlog_run``, for users."""

    run: Run | None
    error: BaseException | None
