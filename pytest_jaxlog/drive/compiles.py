"""A run's timings from the compile tracker opened for the run (so ``compiles`` counts the
compilations that happened during this run: 0 when all was cached)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Sequence

from ..profiling.timings import CompileTracker, Timings, describe_avals


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
    ``masked_steps``: loop slots the run computed and threw away (see ``drive.program.blocks``);
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
