"""A function traced to a jaxpr, collecting or not, and what an ordinary trace tells about it."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, NamedTuple

import jax
import numpy as np
from jax.extend import core as jex_core

from ..errors import JaxlogError
from .collector import RULES, Interpreter, LogEvent, finish, jaxpr_has_logs
from .primitive import COLLECTING, calls_made, probing

__all__ = ['Traced', 'trace', 'is_dynamic', 'has_logs', 'Shapes', 'shapes_and_logs', 'collect', 'collected_shapes', 'spool', 'tap']

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

# ---------------------------------------------------------------------------------------------
# The public verbs: ``collect`` (a transformation, used by every driver), ``jl.spool`` (one
# compiled call, returning what it logged) and ``jl.tap`` (each log to a host callback).

def _check_capacity(capacity: Any) -> None:
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer))
                                 or capacity < 1):
        raise JaxlogError(f"log capacity must be an int >= 1 or None, got {capacity!r}")


def collect(fn: Callable, *, capacity: int | None = None) -> Callable:
    """``collect(fn)(*args, **kwargs) -> (out, logs)``: ``fn``'s output and what it logged.

    A transformation like ``jax.vmap``: use it inside ``jax.jit`` (``jl.spool`` does). ``capacity``:
    the default while-loop capacity for logs that give none.
    """
    _check_capacity(capacity)

    def collected(*args: Any, **kwargs: Any) -> tuple[Any, dict]:
        traced = trace(fn, args, kwargs)
        closed, out_tree, dynamic = traced.closed, traced.out_tree, traced.dynamic
        if not jaxpr_has_logs(closed.jaxpr):
            outs = jex_core.jaxpr_as_fun(closed)(*dynamic)
            return jax.tree_util.tree_unflatten(out_tree, outs), {}
        outs, entries = Interpreter(RULES, capacity=capacity).eval(closed.jaxpr, closed.consts, dynamic)
        return jax.tree_util.tree_unflatten(out_tree, outs), finish(entries)

    collected.__wrapped__ = fn  # type: ignore[attr-defined]
    return collected


def collected_shapes(fn: Callable, *args: Any, capacity: int | None = None) -> tuple[Any, dict]:
    """``jax.eval_shape(collect(fn, capacity=capacity), *args)``. A ``fn`` that logs nothing is
    traced once, without collecting (see ``trace._logs_seen``), and takes its shapes from that
    trace: evaluating the program again under ``eval_shape`` cost several times the trace (tens of
    milliseconds of every first ``jl.run``). One that logs is traced again, collecting."""
    plain = shapes_and_logs(fn, *args)
    if not plain.logs:
        return plain.shapes, {}
    return jax.eval_shape(collect(fn, capacity=capacity), *args)


def _tapped(fn: Callable, callback: Callable) -> Callable:
    def tapped(*args: Any, **kwargs: Any) -> Any:
        traced = trace(fn, args, kwargs)
        outs, _ = Interpreter(RULES, tap=callback).eval(traced.closed.jaxpr, traced.closed.consts, traced.dynamic)
        return jax.tree_util.tree_unflatten(traced.out_tree, outs)

    return tapped


class _Jitted:
    """``fn`` compiled once per argument signature; non-array leaves are static (hashable)."""

    def __init__(self, inner: Callable, what: str):
        self.inner = inner
        self.what = what
        self._jit = jax.jit(self._call, static_argnums=(0, 1))

    def _call(self, treedef, static, *dyn):
        leaves = []
        dyn_it = iter(dyn)
        for is_dyn, s in static:
            leaves.append(next(dyn_it) if is_dyn else s)
        a, k = jax.tree_util.tree_unflatten(treedef, leaves)
        return self.inner(*a, **k)

    def __call__(self, *args, **kwargs):
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        static = tuple((True, None) if is_dynamic(x) else (False, x) for x in leaves)
        try:
            hash(static)
        except TypeError:
            bad = next(x for d, x in static if not d and not _hashable(x))
            raise JaxlogError(f"{self.what}: argument leaf {bad!r:.60} is neither an array nor hashable "
                              f"(close over it instead, e.g. functools.partial)") from None
        return self._jit(treedef, static, *[x for x in leaves if is_dynamic(x)])


def _hashable(x: Any) -> bool:
    try:
        hash(x)
        return True
    except TypeError:
        return False


def spool(fn: Callable, *, capacity: int | None = None) -> Callable:
    """``jl.spool(f)(*args) -> (out, logs)``: one compiled call of ``f`` and everything it logged.

    ``logs`` maps each name to its values (see the package docs for loops, branches and vmap).
    Compiled once per argument shapes, like ``jax.jit``; ``capacity`` is the default capacity of
    logs inside ``lax.while_loop``.
    """
    if not callable(fn):
        raise JaxlogError(f"spool: expected a callable, got {fn!r}")
    return _Jitted(collect(fn, capacity=capacity), "jl.spool")


def tap(fn: Callable, callback: Callable[[LogEvent], Any]) -> Callable:
    """``jl.tap(f, callback)(*args) -> out``: calls ``callback(LogEvent(name, value, indices,
    where))`` on the host for every ``jl.log`` as it executes, loops included.

    For interactive debugging only: each log is a device-to-host round trip inside the compiled
    program (per-step host callbacks measured 5-150x the bare kernel). To keep values, use
    ``jl.spool`` or ``jl.run``.
    """
    if not callable(fn) or not callable(callback):
        raise JaxlogError(f"tap: expected a function and a callback, got {fn!r}, {callback!r}")
    return _Jitted(_tapped(fn, callback), "jl.tap")
