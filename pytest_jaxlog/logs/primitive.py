"""The ``jaxlog_log`` primitive: returns its operands, and carries a log's static facts.

Its effect is that of ``jax.debug.callback`` only while a collector traces (``COLLECTING``):
effects are what JAX keeps through every transformation (partial evaluation under ``grad``,
``checkpoint``, ``scan`` linearization prune unused values otherwise). Otherwise it has no effect
and no user, so dead-code elimination drops it, and its lowering emits nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
from typing import Any, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core
from jax.interpreters import ad, mlir

from ..errors import JaxlogError
from ..record.records import check_name
from .compat import enclosing_traces, register_batcher, tracer_trace

__all__ = ['Site', 'log_p', 'COLLECTING', 'SHARD_REDUCTIONS', 'log', 'check_log_name', 'RESERVED_FIELDS', 'calls_made', 'probing', 'Unheard', 'unheard', 'unheard_count']

# how a log inside jax.shard_map comes out: "gather" one row per shard, or one value reduced over them
SHARD_REDUCTIONS = ("gather", "sum", "mean", "max", "min", "first")

# jit-cache-sensitive: kernels traced while collecting never share a jaxpr with kernels traced
# without (the primitive's effects differ between the two).
COLLECTING = jax.make_user_context(default_value=False)


@dataclasses.dataclass(frozen=True)
class Site:
    """Static facts about one ``jl.log`` call: its name, where it was called, what it carries."""

    name: str
    where: str
    capacity: int | None
    value_tree: Any  # treedef of the value
    index_names: tuple[str, ...]
    shards: str = "gather"  # inside jax.shard_map: one row per shard, or reduced over them (SHARD_REDUCTIONS)

    @property
    def n_value(self) -> int:
        return self.value_tree.num_leaves

    def __repr__(self) -> str:  # shows in printed jaxprs
        return f"{self.name}@{self.where}"


_EFFECTS: set | None = None


def _debug_effects() -> set:
    """The effect of ``jax.debug.callback``, taken from a traced callback (public API only): JAX
    keeps eqns with it through DCE, partial evaluation, remat and control flow, and never
    duplicates them into a recomputation."""
    global _EFFECTS
    if _EFFECTS is None:
        _EFFECTS = set(jax.make_jaxpr(lambda: jax.debug.callback(_noop))().effects)
    return _EFFECTS


def _noop(*_: Any) -> None:
    return None


log_p = jex_core.Primitive("jaxlog_log")
log_p.multiple_results = True


@log_p.def_impl
def _log_impl(*args, site, vmapped):
    del site, vmapped
    return args


@log_p.def_effectful_abstract_eval
def _log_abstract_eval(*avals, site, vmapped):
    del site, vmapped
    return avals, (_debug_effects() if COLLECTING.value else set())


def _log_lowering(ctx, *args, site, vmapped):
    del ctx, site, vmapped
    return args


mlir.register_lowering(log_p, _log_lowering)


def _log_jvp(primals, tangents, *, site, vmapped):
    return log_p.bind(*primals, site=site, vmapped=vmapped), tangents


ad.primitive_jvps[log_p] = _log_jvp


def _log_transpose(cts, *args, site, vmapped):
    del args, site, vmapped  # a log of a tangent: the cotangent passes through, nothing is logged
    return cts


ad.primitive_transposes[log_p] = _log_transpose


def _log_batch(size, args, dims, *, site, vmapped):
    """Mapped axis first on every operand (unmapped ones broadcast, those of a log that no operand
    of is mapped too): one row per system whatever the value depends on, so ``jl.spool(jax.vmap(f))``
    and a batched ``jl.run`` of ``jax.vmap(f)`` agree, and the collector knows where the system
    axes are (``vmapped`` leading axes, outermost vmap first)."""
    moved = [jnp.moveaxis(x, d, 0) if d is not None else jnp.broadcast_to(x, (size, *jnp.shape(x)))
             for x, d in zip(args, dims)]
    outs = log_p.bind(*moved, site=site, vmapped=vmapped + 1)
    return outs, [0] * len(outs)


register_batcher(log_p, _log_batch)

# ---------------------------------------------------------------------------------------------
# ``jl.log(name, value, **indices)``: check the arguments where they are given, bind the primitive.
#
# Each call also counts, per thread, the calls made (how an ordinary trace learns that a function
# logs) and those made while nothing collects them (``unheard``: values that will be lost, which a
# ``jl.Recorder`` reports). Traces made only to ask questions (``probing``) count as neither lost
# nor heard.

RESERVED_FIELDS = ("value", "valid", "count", "overflow")

# per thread: ``n`` jl.log calls made, ``probing`` depth, ``unheard`` calls nobody collected and
# ``last_unheard`` (name, where) of the latest of them
_CALLS = threading.local()


def calls_made() -> int:
    """``jl.log`` calls this thread's Python has made so far (while tracing, or eagerly)."""
    return getattr(_CALLS, "n", 0)


@contextlib.contextmanager
def probing() -> Iterator[None]:
    """A trace made to learn shapes or whether a function logs: its calls are not lost values."""
    _CALLS.probing = getattr(_CALLS, "probing", 0) + 1
    try:
        yield
    finally:
        _CALLS.probing -= 1


class Unheard(NamedTuple):
    """``jl.log`` calls this thread made while nothing collected them, and the latest one."""

    calls: int
    name: str | None
    where: str | None


def unheard() -> Unheard:
    last = getattr(_CALLS, "last_unheard", (None, None))
    return Unheard(unheard_count(), *last)


def unheard_count() -> int:
    """``unheard().calls``, cheap enough for every ``Recorder.log``."""
    return getattr(_CALLS, "unheard", 0)


_THIS_FILE = os.path.normcase(os.path.abspath(__file__))


def _caller() -> str:
    """``file:line`` of the code that called ``jl.log``."""
    f = sys._getframe(1)
    while f is not None and os.path.normcase(os.path.abspath(f.f_code.co_filename)) == _THIS_FILE:
        f = f.f_back
    if f is None:
        return "<unknown>"
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"


_META_ADVICE = ("a string or other Python value that describes the run (a configuration, a convergence "
                "message) goes in jl.run(..., meta={...}), kept as JSON in the file and read back as traj.meta; "
                "a message chosen inside the step is logged as an int code, its texts kept in meta= "
                "(docs/log.md)")


def _as_leaf(name: str, where: str, what: str, leaf: Any) -> Any:
    if isinstance(leaf, (str, bytes)) or leaf is None:
        raise JaxlogError(f"log {name!r} at {where}: {what} {leaf!r:.60} is not an array "
                          f"(log arrays or numbers; keep strings and objects out of logs: {_META_ADVICE})")
    try:
        arr = leaf if isinstance(leaf, jax.Array) else jnp.asarray(leaf)
    except (TypeError, ValueError) as e:
        raise JaxlogError(f"log {name!r} at {where}: {what} of type {type(leaf).__name__} is not an "
                          f"array ({e}; {_META_ADVICE})") from None
    if jax.dtypes.issubdtype(arr.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(arr)
    dt = np.dtype(arr.dtype)
    if not (dt == np.bool_ or np.issubdtype(dt, np.number)):
        raise JaxlogError(f"log {name!r} at {where}: {what} has dtype {dt}, not a number or bool")
    return arr


def _check_live(name: str, where: str, leaves: list) -> None:
    """A tracer from a finished trace (stored in a Python list inside a ``scan`` body and logged
    outside it, say) would be taken as a constant by JAX and fail, or silently be wrong, later.
    Its trace is not among the traces enclosing this call: say so here, with the log's name."""
    live = enclosing_traces()
    for leaf in leaves:
        trace = tracer_trace(leaf)
        if trace is not None and not any(trace is t for t in live):
            raise JaxlogError(
                f"log {name!r} at {where}: the value is a tracer that escaped the transformation it was "
                f"made in (e.g. kept in a Python variable inside a lax.scan/jit/vmap body and logged "
                f"outside it); log it inside that body instead")


def _count(name: str, where: str, collecting: bool) -> None:
    _CALLS.n = calls_made() + 1
    if not collecting and not getattr(_CALLS, "probing", 0):
        _CALLS.unheard = getattr(_CALLS, "unheard", 0) + 1
        _CALLS.last_unheard = (name, where)


def check_log_name(name: Any, where: str) -> str:
    """A log's name: one path component, as a record's is; the advice fits logs (a dict value
    nests names), not views."""
    try:
        return check_name(name)
    except JaxlogError:
        pass
    advice = "use a non-empty string without '/', not starting with a space"
    if isinstance(name, str) and name.strip("/"):
        head, _, rest = name.strip("/").partition("/")
        if rest:
            advice = (f"a log's name is one part; to nest, log a dict under the first part: jl.log({head!r}, "
                      f"{{{rest!r}: value}}) is recorded as 'log/{head}/{rest}' (and chosen in logs= as {head!r})")
    raise JaxlogError(f"{where}: log name {name!r} is invalid: {advice}")


def _log_one(name: Any, value: Any, capacity: Any, indices: dict, where: str, shards: str = "gather") -> None:
    check_log_name(name, f"log at {where}")
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer))
                                 or capacity < 1):
        raise JaxlogError(f"log {name!r} at {where}: capacity must be an int >= 1, got {capacity!r}")
    leaves, tree = jax.tree_util.tree_flatten(value)
    if not leaves:
        raise JaxlogError(f"log {name!r} at {where}: the value holds no arrays (got {value!r})")
    leaves = [_as_leaf(name, where, "value leaf", x) for x in leaves]
    idx = []
    for k, v in indices.items():
        if k in RESERVED_FIELDS:
            raise JaxlogError(f"log {name!r} at {where}: index name {k!r} is reserved "
                              f"({', '.join(RESERVED_FIELDS)} are fields of collected logs)")
        idx.append(_as_leaf(name, where, f"index {k}=", v))
    operands = [*leaves, *idx]
    collecting = COLLECTING.value
    _count(name, where, collecting)
    if collecting:
        _check_live(name, where, operands)
    if shards not in SHARD_REDUCTIONS:
        raise JaxlogError(f"log {name!r} at {where}: shards= is one of {', '.join(map(repr, SHARD_REDUCTIONS))}, "
                          f"got {shards!r}")
    site = Site(name, where, None if capacity is None else int(capacity), tree, tuple(indices), shards)
    log_p.bind(*operands, site=site, vmapped=0)


def log(name: Any, value: Any = None, *, capacity: int | None = None, shards: str = "gather", **indices: Any) -> Any:
    """Log ``value`` (any pytree of arrays) under ``name``; returns ``value`` unchanged.

    ``jl.log({"a": x, "b": y})`` logs several names at once. Keyword ``indices`` (``step=i``,
    ``episode=e``) are stored beside the value. ``capacity=K``: inside a ``lax.while_loop``, keep
    the first ``K`` iterations' values (the count of iterations and an overflow flag come with
    them). ``shards=``: inside a ``jax.shard_map``ped function, ``"gather"`` (one row per shard,
    in the mesh's order) or one value reduced over the shards: ``"sum"``, ``"mean"``, ``"max"``,
    ``"min"``, ``"first"`` (a value each shard already holds whole, after a ``psum``); outside a
    ``shard_map`` it changes nothing. Free when nothing collects: the call is dropped when the code
    is compiled.
    """
    where = _caller()
    if isinstance(name, dict):
        if value is not None:
            raise JaxlogError(f"log at {where}: jl.log(dict) takes no value argument (the dict maps names to values)")
        for k, v in name.items():
            _log_one(k, v, capacity, indices, where, shards)
        return name
    _log_one(name, value, capacity, indices, where, shards)
    return value
