"""A run's timings from the compile tracker opened for the run (so ``compiles`` counts the
compilations that happened during this run: 0 when all was cached)."""

from __future__ import annotations

from typing import Any

from ..profiling.timings import CompileTracker, Timings


def run_timings(tracker: CompileTracker, wall_s: float, steps: int, window: Any = None, *,
                state_leaves: int | None = None, stepping_s: float | None = None) -> Timings:
    """``state_leaves=n`` (``jl.run``): the tracked programs all take the state's ``n`` leaves first
    and carry the step function; ``compiles`` counts the distinct state signatures they were
    compiled for, so the program and the post-mortem replay of one kernel count once, while every
    new state shape/dtype/weak type counts again; ``from_cache`` counts the signatures whose
    programs all came from JAX's persistent compilation cache."""
    t = tracker.timings(wall_s, steps, window)
    t.stepping_s = stepping_s
    if state_leaves is not None:
        by_sig: dict = {}
        for i, ev in enumerate(t.compile_events):
            by_sig.setdefault(ev.args[:state_leaves] if ev.args is not None else ("?", i), []).append(ev)
        t.compiles = len(by_sig)
        t.from_cache = sum(all(ev.cached for ev in evs) for evs in by_sig.values())
    return t
