"""A function traced to a jaxpr, collecting or not, and what an ordinary trace tells about it."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from .call import calls_made, probing
from .find import jaxpr_has_logs
from .primitive import COLLECTING

__all__ = ["Traced", "trace", "is_dynamic", "has_logs", "Shapes", "shapes_and_logs"]


def is_dynamic(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic, bool, int, float, complex)) or hasattr(x, "__jax_array__")


class Traced(NamedTuple):
    closed: Any
    shapes: Any  # the output, as jax.ShapeDtypeStruct leaves
    dynamic: list
    calls: int  # jl.log calls its Python made

    @property
    def out_tree(self) -> Any:
        return jax.tree_util.tree_structure(self.shapes)


def trace(fn: Callable, args: tuple, kwargs: dict, collecting: bool = True) -> Traced:
    """``fn`` traced (for collection, or ``collecting=False`` as an ordinary trace, made to ask
    questions: its logs are not lost values); non-array leaves of the arguments are closed over."""
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    dyn_idx = [i for i, x in enumerate(leaves) if is_dynamic(x)]
    dynamic = [leaves[i] for i in dyn_idx]

    def flat(*dyn):
        full = list(leaves)
        for i, x in zip(dyn_idx, dyn):
            full[i] = x
        a, k = jax.tree_util.tree_unflatten(treedef, full)
        return fn(*a, **k)

    before = calls_made()
    with COLLECTING(collecting), (contextlib.nullcontext() if collecting else probing()):
        closed, shape = jax.make_jaxpr(flat, return_shape=True)(*dynamic)
    shapes = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), [
        jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in closed.out_avals])
    return Traced(closed, shapes, dynamic, calls_made() - before)


def has_logs(fn: Callable, *args: Any, **kwargs: Any) -> bool:
    """Whether ``fn(*args, **kwargs)`` calls ``jl.log`` anywhere (traced, nothing runs)."""
    return _logs_seen(trace(fn, args, kwargs, collecting=False))


class Shapes(NamedTuple):
    """What one ordinary trace of a function tells: its output's shapes, and whether it logs."""

    shapes: Any  # the output, as jax.ShapeDtypeStruct leaves
    logs: bool  # it calls jl.log (then its shapes leave out what it logs: trace it collecting)


def shapes_and_logs(fn: Callable, *args: Any) -> Shapes:
    """``jax.eval_shape(fn, *args)`` and :func:`has_logs` from one trace: a first run traces
    every view once, not once for each question."""
    traced = trace(fn, args, {}, collecting=False)
    return Shapes(shapes=traced.shapes, logs=_logs_seen(traced))


def _logs_seen(traced: Traced) -> bool:
    """Whether a trace made without collecting saw ``jl.log``: its Python called it, or its
    program holds the primitive (a jitted function traced before, whose Python did not run
    again). Tracing without collecting shares JAX's caches with the chunk program's own trace
    (tracing while collecting misses them all, at twice the cost of a first trace); a trace that
    saw logs is made again, collecting."""
    return traced.calls > 0 or jaxpr_has_logs(traced.closed.jaxpr)
