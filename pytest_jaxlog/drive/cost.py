"""``run.cost``: what one step of a run's kernel and each of its recorded views cost, by XLA's
account (see ``profiling.cost``).

The step is compiled on its own, as the run calls it (its key folded in, its aux returned), for
the arguments the run's program was dispatched with (shapes, dtypes, shardings), but without
collecting its ``jl.log`` values: the kernel's own cost, whatever is recorded. Each view is
compiled on its own too, and reported apart: a view recorded every 100 steps costs a hundredth
of its figure per step, and a test usually wants to know which of the two moved.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from ..profiling.cost import Cost, cost
from . import program
from .resolve import WhenFlags


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
