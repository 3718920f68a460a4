"""``jl.log``: name a value anywhere inside traced code; collect it only when someone listens.

``jl.log(name, value, **indices)`` binds ``jaxlog_log``, a primitive that returns its operands
unchanged and carries the name, the call site and an optional while-loop capacity as params.
Nothing else happens where it is called, so:

- **nobody collecting**: the primitive has no effects and no users, so JAX's dead-code
  elimination drops it (and whatever only fed it) before lowering; its lowering rule, should it
  survive, emits nothing. A jitted kernel with ``jl.log`` calls compiles to the same program as
  without them, and library code can keep its logs in production.
- **collecting** (:func:`collect`, used by ``jl.spool``, ``jl.run`` and ``jl.Recorder``): the
  function is traced to a jaxpr inside a jit-cache-sensitive context (``jax.make_user_context``)
  in which the primitive carries the effect of ``jax.debug.callback``. Effects are what JAX keeps
  through every transformation (partial evaluation under ``grad``, ``checkpoint``, ``scan``
  linearization prune unused values otherwise), and the separate cache context means a kernel
  traced for collection and the same kernel traced without never share a jaxpr. The jaxpr is then
  evaluated again by a small interpreter that rebuilds each control-flow primitive that contains
  logs with the public ``lax`` functions, threading the logged values out as extra outputs:

  =========================  ===============================================================
  where ``jl.log`` is         what comes out (leading axes added to the value)
  =========================  ===============================================================
  top level                  the value
  ``lax.scan`` / static       ``(length, ...)``, in the order of ``xs`` (as ``scan``'s ``ys``)
  ``fori_loop``
  ``lax.while_loop`` body     ``(capacity, ...)`` holding the first ``capacity`` iterations,
                             ``count`` (iterations run) and ``overflow`` (values were dropped)
  ``lax.cond`` / ``switch``   the taken branch's value; ``valid`` marks entries whose taken
                             branch did not log
  ``vmap``                   one row per system: the mapped axis first
  ``grad`` / ``jvp`` /        the primal values, once (a ``checkpoint``'s recomputation in the
  ``custom_vjp`` /            backward pass does not log again); derivatives are unchanged
  ``checkpoint``
  nested ``jit``             as if inlined
  =========================  ===============================================================

  Primitives without logs inside are bound again unchanged, so the collected program computes
  exactly what the original did, plus the logged values. Under ``vmap``, a ``cond`` whose
  predicate differs per system has become a select of both branches (so both branches' logs are
  collected), and a ``while_loop`` whose stopping test differs per system runs until the last one
  stops (rows past a system's own stop hold values computed from its stopped state).

Results, per name: the value itself when nothing else is known about it; otherwise a dict with
``"value"`` and the extra fields: each keyword index (``step=``...), ``"valid"`` (bool, same
leading axes as the value), ``"count"`` (int32; a tuple, outermost first, for nested while loops)
and ``"overflow"`` (bool, true when any value was dropped). A name logged at several places (or
by a function called twice) is stacked along a new leading axis, in program order.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import weakref
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jex_core
from jax.extend import source_info_util
from jax.extend.core import primitives as prims
from jax.interpreters import ad, batching, mlir

from ..errors import JaxlogError
from ..record.records import check_name

__all__ = ["log", "spool", "tap", "collect", "has_logs", "LogEvent", "RESERVED_FIELDS"]

RESERVED_FIELDS = ("value", "valid", "count", "overflow")

# jit-cache-sensitive: kernels traced while collecting never share a jaxpr with kernels traced
# without (the primitive's effects differ between the two).
_COLLECTING = jax.make_user_context(default_value=False)
# jl.log calls made by this thread's Python code (while tracing it): how resolving a run learns
# from an ordinary trace that a step logs nothing (see ``_logs_seen``)
_CALLS = threading.local()


# ---------------------------------------------------------------------------------------------
# the primitive
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Site:
    """Static facts about one ``jl.log`` call: its name, where it was called, what it carries."""

    name: str
    where: str
    capacity: int | None
    value_tree: Any  # treedef of the value
    index_names: tuple[str, ...]

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
    return avals, (_debug_effects() if _COLLECTING.value else set())


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


def _log_batch(axis_data, args, dims, *, site, vmapped):
    """Mapped axis first on every operand (unmapped ones broadcast): one row per system, and the
    collector knows where the system axes are (``vmapped`` leading axes, outermost vmap first)."""
    size = axis_data.size
    moved = [jnp.moveaxis(x, d, 0) if d is not None else jnp.broadcast_to(x, (size, *jnp.shape(x)))
             for x, d in zip(args, dims)]
    outs = log_p.bind(*moved, site=site, vmapped=vmapped + 1)
    return outs, [0] * len(outs)


batching.fancy_primitive_batchers[log_p] = _log_batch


# ---------------------------------------------------------------------------------------------
# jl.log
# ---------------------------------------------------------------------------------------------

_THIS_FILE = os.path.normcase(os.path.abspath(__file__))


def _caller() -> str:
    """``file:line`` of the code that called ``jl.log``."""
    f = sys._getframe(1)
    while f is not None and os.path.normcase(os.path.abspath(f.f_code.co_filename)) == _THIS_FILE:
        f = f.f_back
    if f is None:
        return "<unknown>"
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"


def _as_leaf(name: str, where: str, what: str, leaf: Any) -> Any:
    if isinstance(leaf, (str, bytes)) or leaf is None:
        raise JaxlogError(f"log {name!r} at {where}: {what} {leaf!r} is not an array "
                          "(log arrays or numbers; keep strings and objects out of logs)")
    try:
        arr = leaf if isinstance(leaf, jax.Array) else jnp.asarray(leaf)
    except (TypeError, ValueError) as e:
        raise JaxlogError(f"log {name!r} at {where}: {what} of type {type(leaf).__name__} is not an "
                          f"array ({e})") from None
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
    with jex_core.take_current_trace() as current:
        live = []
        t = current
        while t is not None and len(live) < 64:
            live.append(t)
            t = getattr(t, "parent_trace", None)
    for leaf in leaves:
        trace = getattr(leaf, "_trace", None) if isinstance(leaf, jax.core.Tracer) else None
        if trace is not None and not any(trace is t for t in live):
            raise JaxlogError(
                f"log {name!r} at {where}: the value is a tracer that escaped the transformation it was "
                f"made in (e.g. kept in a Python variable inside a lax.scan/jit/vmap body and logged "
                f"outside it); log it inside that body instead")


def _log_one(name: Any, value: Any, capacity: Any, indices: dict, where: str) -> None:
    check_name(name, "log name")
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
    _CALLS.n = getattr(_CALLS, "n", 0) + 1
    if _COLLECTING.value:
        _check_live(name, where, operands)
    site = Site(name, where, None if capacity is None else int(capacity), tree, tuple(indices))
    log_p.bind(*operands, site=site, vmapped=0)


def log(name: Any, value: Any = None, *, capacity: int | None = None, **indices: Any) -> Any:
    """Log ``value`` (any pytree of arrays) under ``name``; returns ``value`` unchanged.

    ``jl.log({"a": x, "b": y})`` logs several names at once. Keyword ``indices`` (``step=i``,
    ``episode=e``) are stored beside the value. ``capacity=K``: inside a ``lax.while_loop``, keep
    the first ``K`` iterations' values (the count of iterations and an overflow flag come with
    them). Free when nothing collects: the call is dropped when the code is compiled.
    """
    where = _caller()
    if isinstance(name, dict):
        if value is not None:
            raise JaxlogError(f"log at {where}: jl.log(dict) takes no value argument (the dict maps names to values)")
        for k, v in name.items():
            _log_one(k, v, capacity, indices, where)
        return name
    _log_one(name, value, capacity, indices, where)
    return value


# ---------------------------------------------------------------------------------------------
# finding logs in jaxprs
# ---------------------------------------------------------------------------------------------

_HAS_LOGS: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()
_HAS_LOGS_LOCK = threading.Lock()


def _jaxpr_has_logs(jaxpr: Any) -> bool:
    try:
        hit = _HAS_LOGS.get(jaxpr)
    except TypeError:
        hit = None
    if hit is not None:
        return hit
    found = any(_eqn_has_logs(e) for e in jaxpr.eqns)
    try:
        with _HAS_LOGS_LOCK:
            _HAS_LOGS[jaxpr] = found
    except TypeError:  # not weak-referenceable: recomputed next time, which is only slower
        pass
    return found


def _eqn_has_logs(eqn: Any) -> bool:
    if eqn.primitive is log_p:
        return True
    return any(_jaxpr_has_logs(j) for j in jex_core.jaxprs_in_params(eqn.params))


def _sites_in(jaxpr: Any) -> list[Site]:
    out = []
    for e in jaxpr.eqns:
        if e.primitive is log_p:
            out.append(e.params["site"])
        else:
            for j in jex_core.jaxprs_in_params(e.params):
                out += _sites_in(j)
    return out


def has_logs(fn: Callable, *args: Any, **kwargs: Any) -> bool:
    """Whether ``fn(*args, **kwargs)`` calls ``jl.log`` anywhere (traced, nothing runs)."""
    return _logs_seen(_trace(fn, args, kwargs, collecting=False))


class Shapes(NamedTuple):
    """What one ordinary trace of a function tells: its output's shapes, and whether it logs."""

    shapes: Any  # the output, as jax.ShapeDtypeStruct leaves
    logs: bool  # it calls jl.log (then its shapes leave out what it logs: trace it collecting)


def shapes_and_logs(fn: Callable, *args: Any) -> Shapes:
    """``jax.eval_shape(fn, *args)`` and :func:`has_logs` from one trace: a first run traces
    every view once, not once for each question."""
    traced = _trace(fn, args, {}, collecting=False)
    return Shapes(shapes=traced.shapes, logs=_logs_seen(traced))


def _logs_seen(traced: "_Traced") -> bool:
    """Whether a trace made without collecting saw ``jl.log``: its Python called it, or its
    program holds the primitive (a jitted function traced before, whose Python did not run
    again). Tracing without collecting shares JAX's caches with the chunk program's own trace
    (tracing while collecting misses them all, at twice the cost of a first trace); a trace that
    saw logs is made again, collecting."""
    return traced.calls > 0 or _jaxpr_has_logs(traced.closed.jaxpr)


# ---------------------------------------------------------------------------------------------
# the collector
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Entry:
    """One log occurrence on its way out: ``tree`` is ``{"value": ..., <index>: ..., "valid",
    "count" (tuple), "overflow"}``; ``lead`` the loop axes added so far (outermost first), and
    ``vmapped`` the number of system axes right after them on the value and index leaves."""

    site: Site
    tree: dict
    lead: tuple[int, ...] = ()
    vmapped: int = 0


@dataclasses.dataclass(frozen=True)
class _Shape:
    """An entry with its arrays flattened (what crosses a loop or branch boundary)."""

    site: Site
    treedef: Any
    lead: tuple[int, ...]
    vmapped: int
    avals: tuple  # ((shape, dtype), ...) of the leaves

    @classmethod
    def of(cls, e: _Entry) -> "_Shape":
        leaves = jax.tree_util.tree_leaves(e.tree)
        return cls(e.site, jax.tree_util.tree_structure(e.tree), e.lead, e.vmapped,
                   tuple((tuple(jnp.shape(x)), np.dtype(x.dtype)) for x in leaves))

    def build(self, leaves: list, lead: tuple[int, ...] | None = None) -> _Entry:
        return _Entry(self.site, jax.tree_util.tree_unflatten(self.treedef, list(leaves)),
                      self.lead if lead is None else lead, self.vmapped)

    def same(self, other: "_Shape") -> bool:
        return (self.treedef == other.treedef and self.lead == other.lead and self.vmapped == other.vmapped
                and self.avals == other.avals)

    def describe(self) -> str:
        return ", ".join(f"{d}{list(s)}" for s, d in self.avals)


def _flat(entries: list[_Entry]) -> tuple[list[_Shape], list]:
    shapes, leaves = [], []
    for e in entries:
        shapes.append(_Shape.of(e))
        leaves.append(jax.tree_util.tree_leaves(e.tree))
    return shapes, leaves


class LogEvent(NamedTuple):
    """What a ``jl.tap`` callback receives for each ``jl.log`` executed (host numpy values)."""

    name: str
    value: Any
    indices: dict
    where: str


class _Interpreter:
    """Evaluates a jaxpr again in the current trace, pulling logged values out.

    ``tap is None``: collect (each log becomes an :class:`_Entry`). Otherwise each log calls
    ``tap`` on the host (``jax.debug.callback``) and nothing is collected.
    """

    def __init__(self, capacity: int | None = None, tap: Callable | None = None):
        self.capacity = capacity
        self.tap = tap

    # -- the generic loop ------------------------------------------------------------------
    def eval(self, jaxpr: Any, consts: Any, args: Any) -> tuple[list, list[_Entry]]:
        env: dict = {}

        def read(v):
            return v.val if isinstance(v, jex_core.Literal) else env[v]

        for v, x in zip(jaxpr.constvars, consts):
            env[v] = x
        for v, x in zip(jaxpr.invars, args):
            env[v] = x
        entries: list[_Entry] = []
        for eqn in jaxpr.eqns:
            invals = [read(v) for v in eqn.invars]
            if eqn.primitive is log_p:
                outs = self._log(eqn, invals, entries)
            elif not _eqn_has_logs(eqn):
                outs = _bind(eqn, invals)
            else:
                rule = _RULES.get(eqn.primitive)
                if rule is None:
                    sites = _sites_in_eqn(eqn)
                    s = sites[0]
                    raise JaxlogError(
                        f"log {s.name!r} at {s.where} is inside a {eqn.primitive} "
                        f"(a transformation logged values cannot be brought out of); log outside it, "
                        f"or return the value from it")
                with _eqn_context(eqn):
                    outs, sub = rule(self, eqn, invals)
                entries += sub
            for v, x in zip(eqn.outvars, outs):
                if not isinstance(v, jex_core.DropVar):
                    env[v] = x
        return [read(v) for v in jaxpr.outvars], entries

    def _log(self, eqn: Any, invals: list, entries: list[_Entry]) -> list:
        site: Site = eqn.params["site"]
        if self.tap is not None:
            cb = self.tap
            jax.debug.callback(lambda *xs: _tap_host(cb, site, xs), *invals, ordered=True)
            return invals
        n = site.n_value
        arrays = [jnp.asarray(x) for x in invals]  # literals (constants folded into the jaxpr) too
        tree = {"value": jax.tree_util.tree_unflatten(site.value_tree, arrays[:n])}
        tree.update(zip(site.index_names, arrays[n:]))
        entries.append(_Entry(site, tree, (), int(eqn.params["vmapped"])))
        return invals

    # -- shapes of what a body logs, without running it --------------------------------------
    def shapes_of(self, jaxpr: Any, consts: Any, args: list) -> list[_Shape]:
        found: list[list[_Shape]] = []

        def f(*a):
            _, entries = self.eval(jaxpr, consts, a)
            shapes, leaves = _flat(entries)
            found.append(shapes)
            return leaves

        jax.eval_shape(f, *args)
        return found[-1]


def _tap_host(callback: Callable, site: Site, xs: tuple) -> None:
    n = site.n_value
    value = jax.tree_util.tree_unflatten(site.value_tree, [np.asarray(x) for x in xs[:n]])
    indices = {k: np.asarray(x) for k, x in zip(site.index_names, xs[n:])}
    callback(LogEvent(site.name, value, indices, site.where))


def _sites_in_eqn(eqn: Any) -> list[Site]:
    out = []
    for j in jex_core.jaxprs_in_params(eqn.params):
        out += _sites_in(j)
    return out


def _eqn_context(eqn: Any):
    name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
    return source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack)


def _bind(eqn: Any, invals: list) -> list:
    """What ``jax.core.eval_jaxpr`` does for one equation: bind it again, with its source info."""
    params = eqn.primitive.get_bind_params(eqn.params)
    with _eqn_context(eqn), eqn.ctx.manager:
        out = eqn.primitive.bind(*invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


# -- rules for primitives that contain logs ----------------------------------------------------


def _scan_rule(it: _Interpreter, eqn: Any, invals: list) -> tuple[list, list[_Entry]]:
    p = eqn.params
    if "ft_in" in p:  # jax >= 0.11: the operands' grouping is a flat tree of (consts, carry, xs)
        groups = p["ft_in"].unpack()
        nc, ncarry = len(groups[0]), len(groups[1])
    else:
        nc, ncarry = p["num_consts"], p["num_carry"]
    consts, init, xs = invals[:nc], invals[nc:nc + ncarry], invals[nc + ncarry:]
    body = p["jaxpr"]
    found: list[list[_Shape]] = []

    def fn(carry, x):
        outs, entries = it.eval(body.jaxpr, body.consts, [*consts, *carry, *x])
        shapes, leaves = _flat(entries)
        found.append(shapes)
        return outs[:ncarry], (outs[ncarry:], leaves)

    carry, (ys, stacked) = lax.scan(fn, list(init), list(xs), length=p["length"], reverse=p["reverse"],
                                    unroll=p["unroll"])
    length = p["length"]
    entries = [s.build(lv, (length, *s.lead)) for s, lv in zip(found[-1], stacked)]
    return [*carry, *ys], entries


def _capacity(it: _Interpreter, site: Site) -> int:
    k = site.capacity if site.capacity is not None else it.capacity
    if k is None:
        raise JaxlogError(
            f"log {site.name!r} at {site.where} is inside a lax.while_loop, whose number of iterations is "
            f"not known before it runs: give it a capacity, jl.log(..., capacity=K) (the first K "
            f"iterations are kept, with their count and an overflow flag), or a default: "
            f"jl.spool(f, capacity=K), jl.run(..., log_capacity=K)")
    return int(k)


def _while_rule(it: _Interpreter, eqn: Any, invals: list) -> tuple[list, list[_Entry]]:
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, init = invals[:cn], invals[cn:cn + bn], invals[cn + bn:]
    cj, bj = p["cond_jaxpr"], p["body_jaxpr"]
    if it.tap is None and _jaxpr_has_logs(cj.jaxpr):
        s = _sites_in(cj.jaxpr)[0]
        raise JaxlogError(f"log {s.name!r} at {s.where} is inside a lax.while_loop's cond_fun, which runs "
                          f"once more than the body: log in the body instead")

    def cond_fn(c):
        outs, _ = it.eval(cj.jaxpr, cj.consts, [*cconsts, *c[0]])
        return outs[0]

    shapes = it.shapes_of(bj.jaxpr, bj.consts, [*bconsts, *init]) if it.tap is None else []
    if not shapes:
        def plain_body(c):
            outs, _ = it.eval(bj.jaxpr, bj.consts, [*bconsts, *c[0]])
            return (outs,)

        (out,) = lax.while_loop(cond_fn, plain_body, (list(init),))
        return list(out), []

    caps = [_capacity(it, s.site) for s in shapes]
    bufs0 = [[jnp.zeros((k + 1, *shape), dtype) for shape, dtype in s.avals] for s, k in zip(shapes, caps)]

    def body_fn(c):
        carry, i, bufs = c
        outs, entries = it.eval(bj.jaxpr, bj.consts, [*bconsts, *carry])
        _, leaves = _flat(entries)
        new = []
        for k, buf, lv in zip(caps, bufs, leaves):
            slot = jnp.minimum(i, k)  # row k is a trash row: values past the capacity are dropped
            new.append([lax.dynamic_update_index_in_dim(b, x, slot, 0) for b, x in zip(buf, lv)])
        return outs, i + 1, new

    out, count, bufs = lax.while_loop(cond_fn, body_fn, (list(init), jnp.int32(0), bufs0))
    entries = []
    for s, k, buf in zip(shapes, caps, bufs):
        e = s.build([b[:k] for b in buf], (k, *s.lead))
        tree = dict(e.tree)
        inner_count = tree.pop("count", ())
        inner_over = tree.pop("overflow", None)
        over = count > k
        if inner_over is not None:
            over = over | jnp.any(inner_over)
        tree["count"] = (count, *inner_count)
        tree["overflow"] = over
        e.tree = tree
        entries.append(e)
    return list(out), entries


def _cond_rule(it: _Interpreter, eqn: Any, invals: list) -> tuple[list, list[_Entry]]:
    index, ops = invals[0], invals[1:]
    branches = eqn.params["branches"]
    if it.tap is not None:
        def tap_branch(b):
            return lambda *a: it.eval(b.jaxpr, b.consts, a)[0]

        return list(lax.switch(index, [tap_branch(b) for b in branches], *ops)), []

    # entries are matched across branches by (name, occurrence): the k-th log of a name in one
    # branch is the k-th in another
    keyed: list[dict] = []
    order: list[tuple[str, int]] = []
    for b in branches:
        d = {}
        for k, s in _keyed(it.shapes_of(b.jaxpr, b.consts, list(ops))):
            d[k] = s
            if k not in order:
                order.append(k)
        keyed.append(d)
    specs: dict = {}
    with_valid: dict = {}
    for k in order:
        present = [d[k] for d in keyed if k in d]
        ref = _strip_valid(present[0])
        for s in present[1:]:
            if not _strip_valid(s).same(ref):
                raise JaxlogError(
                    f"log {k[0]!r} is logged with different shapes or dtypes in the branches of one "
                    f"lax.cond/switch: {ref.describe()} at {ref.site.where} vs {_strip_valid(s).describe()} "
                    f"at {s.site.where}; use two names")
        specs[k] = ref
        with_valid[k] = len(present) < len(keyed) or any(_strip_valid(s) is not s for s in present)

    def make(b):
        def fn(*a):
            outs, entries = it.eval(b.jaxpr, b.consts, a)
            by_key = dict(_keyed(entries))
            per_key = []
            for k in order:
                spec, e = specs[k], by_key.get(k)
                if e is None:  # this branch does not log it: zeros, marked invalid
                    leaves = [jnp.zeros(shape, dtype) for shape, dtype in spec.avals]
                    valid = jnp.zeros(spec.lead, bool)
                else:
                    tree = dict(e.tree)
                    valid = tree.pop("valid", None)
                    valid = jnp.ones(spec.lead, bool) if valid is None else valid
                    leaves = jax.tree_util.tree_leaves(tree)
                per_key.append((leaves, valid if with_valid[k] else None))
            return outs, per_key

        return fn

    outs, per_key = lax.switch(index, [make(b) for b in branches], *ops)
    entries = []
    for k, (leaves, valid) in zip(order, per_key):
        e = specs[k].build(leaves)
        if valid is not None:
            e.tree = {**e.tree, "valid": valid}
        entries.append(e)
    return list(outs), entries


def _keyed(items: list) -> list:
    """``[((name, k), item)]``: the k-th occurrence of each name, in order."""
    seen: dict[str, int] = {}
    out = []
    for x in items:
        n = seen.get(x.site.name, 0)
        seen[x.site.name] = n + 1
        out.append(((x.site.name, n), x))
    return out


def _strip_valid(s: _Shape) -> _Shape:
    """The shape of an entry without its ``valid`` field (branches agree on everything else)."""
    tree = jax.tree_util.tree_unflatten(s.treedef, list(range(s.treedef.num_leaves)))
    if "valid" not in tree:
        return s
    del tree["valid"]
    keep = jax.tree_util.tree_leaves(tree)
    return _Shape(s.site, jax.tree_util.tree_structure(tree), s.lead, s.vmapped, tuple(s.avals[i] for i in keep))


def _inline_rule(param: str, closed: bool):
    def rule(it: _Interpreter, eqn: Any, invals: list) -> tuple[list, list[_Entry]]:
        j = eqn.params[param]
        if closed:
            return it.eval(j.jaxpr, j.consts, invals)
        return it.eval(j, [], invals)

    return rule


def _remat_rule(it: _Interpreter, eqn: Any, invals: list) -> tuple[list, list[_Entry]]:
    p = eqn.params
    found: list[list[_Shape]] = []

    def fn(*a):
        outs, entries = it.eval(p["jaxpr"], [], a)
        shapes, leaves = _flat(entries)
        found.append(shapes)
        return outs, leaves

    prevent = p["prevent_cse"]
    prevent = bool(prevent) if isinstance(prevent, bool) else any(prevent)
    outs, leaves = jax.checkpoint(fn, prevent_cse=prevent, policy=p["policy"])(*invals)
    return list(outs), [s.build(lv) for s, lv in zip(found[-1], leaves)]


_RULES: dict = {
    prims.scan_p: _scan_rule,
    prims.while_p: _while_rule,
    prims.cond_p: _cond_rule,
    prims.jit_p: _inline_rule("jaxpr", True),
    prims.closed_call_p: _inline_rule("call_jaxpr", True),
    prims.call_p: _inline_rule("call_jaxpr", False),
    prims.custom_jvp_call_p: _inline_rule("call_jaxpr", True),
    prims.custom_vjp_call_p: _inline_rule("call_jaxpr", True),
    prims.remat_p: _remat_rule,
}


# ---------------------------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------------------------


def _finish(entries: list[_Entry]) -> dict[str, Any]:
    """Group occurrences by name (stacked in program order), put system axes first, and give each
    name its documented structure."""
    groups: dict[str, list[_Entry]] = {}
    for e in entries:
        groups.setdefault(e.site.name, []).append(e)
    out: dict[str, Any] = {}
    for name, group in groups.items():
        e = group[0]
        tree, lead = e.tree, e.lead
        if len(group) > 1:
            ref = _Shape.of(e)
            for other in group[1:]:
                s = _Shape.of(other)
                if not s.same(ref):
                    raise JaxlogError(
                        f"log {name!r} is logged with two different shapes or dtypes in one call: "
                        f"{ref.describe()} at {e.site.where} (loop axes {list(ref.lead)}) and "
                        f"{s.describe()} at {other.site.where} (loop axes {list(s.lead)}); use two names")
            tree = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *[g.tree for g in group])
            lead = (len(group), *lead)
        tree = dict(tree)
        if e.vmapped:
            n, v = len(lead), e.vmapped
            src, dst = list(range(n, n + v)), list(range(v))

            def front(x):
                return jnp.moveaxis(x, src, dst)  # noqa: B023  (called within this iteration)

            tree["value"] = jax.tree_util.tree_map(front, tree["value"])
            for k in e.site.index_names:
                tree[k] = front(tree[k])
        if "count" in tree and len(tree["count"]) == 1:
            tree["count"] = tree["count"][0]
        out[name] = tree["value"] if set(tree) == {"value"} else tree
    return out


# ---------------------------------------------------------------------------------------------
# entry points
# ---------------------------------------------------------------------------------------------


def _is_dynamic(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic, bool, int, float, complex)) or hasattr(x, "__jax_array__")


class _Traced(NamedTuple):
    closed: Any
    shapes: Any  # the output, as jax.ShapeDtypeStruct leaves
    dynamic: list
    calls: int  # jl.log calls its Python made

    @property
    def out_tree(self) -> Any:
        return jax.tree_util.tree_structure(self.shapes)


def _trace(fn: Callable, args: tuple, kwargs: dict, collecting: bool = True) -> _Traced:
    """``fn`` traced (for collection, or ``collecting=False`` as an ordinary trace); non-array
    leaves of the arguments are closed over."""
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    dyn_idx = [i for i, x in enumerate(leaves) if _is_dynamic(x)]
    dynamic = [leaves[i] for i in dyn_idx]

    def flat(*dyn):
        full = list(leaves)
        for i, x in zip(dyn_idx, dyn):
            full[i] = x
        a, k = jax.tree_util.tree_unflatten(treedef, full)
        return fn(*a, **k)

    before = getattr(_CALLS, "n", 0)
    with _COLLECTING(collecting):
        closed, shape = jax.make_jaxpr(flat, return_shape=True)(*dynamic)
    shapes = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), [
        jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in closed.out_avals])
    return _Traced(closed, shapes, dynamic, getattr(_CALLS, "n", 0) - before)


def collect(fn: Callable, *, capacity: int | None = None) -> Callable:
    """``collect(fn)(*args, **kwargs) -> (out, logs)``: ``fn``'s output and what it logged.

    A transformation like ``jax.vmap``: use it inside ``jax.jit`` (``jl.spool`` does). ``capacity``:
    the default while-loop capacity for logs that give none.
    """
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer))
                                 or capacity < 1):
        raise JaxlogError(f"log capacity must be an int >= 1 or None, got {capacity!r}")

    def collected(*args: Any, **kwargs: Any) -> tuple[Any, dict]:
        traced = _trace(fn, args, kwargs)
        closed, out_tree, dynamic = traced.closed, traced.out_tree, traced.dynamic
        if not _jaxpr_has_logs(closed.jaxpr):
            outs = jex_core.jaxpr_as_fun(closed)(*dynamic)
            return jax.tree_util.tree_unflatten(out_tree, outs), {}
        outs, entries = _Interpreter(capacity=capacity).eval(closed.jaxpr, closed.consts, dynamic)
        return jax.tree_util.tree_unflatten(out_tree, outs), _finish(entries)

    collected.__wrapped__ = fn  # type: ignore[attr-defined]
    return collected


def collected_shapes(fn: Callable, *args: Any, capacity: int | None = None) -> tuple[Any, dict]:
    """``jax.eval_shape(collect(fn, capacity=capacity), *args)``. A ``fn`` that logs nothing is
    traced once, without collecting (see ``_logs_seen``), and takes its shapes from that trace:
    evaluating the program again under ``eval_shape`` cost several times the trace (tens of
    milliseconds of every first ``jl.run``). One that logs is traced again, collecting."""
    plain = shapes_and_logs(fn, *args)
    if not plain.logs:
        return plain.shapes, {}
    return jax.eval_shape(collect(fn, capacity=capacity), *args)


def _tapped(fn: Callable, callback: Callable) -> Callable:
    def tapped(*args: Any, **kwargs: Any) -> Any:
        traced = _trace(fn, args, kwargs)
        outs, _ = _Interpreter(tap=callback).eval(traced.closed.jaxpr, traced.closed.consts, traced.dynamic)
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
        static = tuple((True, None) if _is_dynamic(x) else (False, x) for x in leaves)
        try:
            hash(static)
        except TypeError:
            bad = next(x for d, x in static if not d and not _hashable(x))
            raise JaxlogError(f"{self.what}: argument leaf {bad!r:.60} is neither an array nor hashable "
                              f"(close over it instead, e.g. functools.partial)") from None
        return self._jit(treedef, static, *[x for x in leaves if _is_dynamic(x)])


def _hashable(x: Any) -> bool:
    try:
        hash(x)
        return True
    except TypeError:
        return False


def spool(fn: Callable, *, capacity: int | None = None) -> Callable:
    """``jl.spool(f)(*args) -> (out, logs)``: one compiled call of ``f`` and everything it logged.

    ``logs`` maps each name to its values (see the module docs for loops, branches and vmap).
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
