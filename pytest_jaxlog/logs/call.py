"""``jl.log(name, value, **indices)``: check the arguments where they are given, bind the primitive.

Each call also counts, per thread, the calls made (how an ordinary trace learns that a function
logs) and those made while nothing collects them (``unheard``: values that will be lost, which a
``jl.Recorder`` reports). Traces made only to ask questions (``probing``) count as neither lost
nor heard.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import JaxlogError
from ..record.records import check_name
from .compat import enclosing_traces, tracer_trace
from .primitive import COLLECTING, SHARD_REDUCTIONS, Site, log_p

__all__ = ["log", "check_log_name", "RESERVED_FIELDS", "calls_made", "probing", "Unheard", "unheard", "unheard_count"]

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
