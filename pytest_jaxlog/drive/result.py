"""What ``jl.run`` gives back: :class:`Run` (made only by :func:`make_run`), and
:class:`Outcome`, a run's result or its error as a value, for callers that handle both."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ..record.frames import Schema
from .cost import run_cost

__all__ = ["Run", "Outcome", "make_run", "STOP_REASONS"]

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
