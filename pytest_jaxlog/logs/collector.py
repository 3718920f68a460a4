"""The collector: a jaxpr evaluated again in the current trace with the logged values pulled out,
the rules that rebuild each primitive carrying sub-jaxprs when they log, where ``jl.log`` sits
in a jaxpr, and the structure logged values leave in."""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
import weakref
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jex_core
from jax.extend.core import primitives as prims

from ..errors import JaxlogError
from .compat import bind, eqn_context, remat_prevent_cse, scan_split, shard_map_params
from .primitive import Site, log_p

__all__ = ['Entry', 'Shape', 'flat', 'finish', 'jaxpr_has_logs', 'eqn_has_logs', 'sites_in', 'sites_in_eqn', 'Interpreter', 'LogEvent', 'Rule', 'RULES']

@dataclasses.dataclass
class Entry:
    """One log occurrence on its way out: ``tree`` is ``{"value": ..., <index>: ..., "valid",
    "count" (tuple), "overflow"}``; ``lead`` the loop axes added so far (outermost first), and
    ``vmapped`` the number of system axes right after them on the value and index leaves."""

    site: Site
    tree: dict
    lead: tuple[int, ...] = ()
    vmapped: int = 0


@dataclasses.dataclass(frozen=True)
class Shape:
    """An entry with its arrays flattened (what crosses a loop or branch boundary)."""

    site: Site
    treedef: Any
    lead: tuple[int, ...]
    vmapped: int
    avals: tuple  # ((shape, dtype), ...) of the leaves

    @classmethod
    def of(cls, e: Entry) -> "Shape":
        leaves = jax.tree_util.tree_leaves(e.tree)
        return cls(e.site, jax.tree_util.tree_structure(e.tree), e.lead, e.vmapped,
                   tuple((tuple(jnp.shape(x)), np.dtype(x.dtype)) for x in leaves))

    def build(self, leaves: list, lead: tuple[int, ...] | None = None) -> Entry:
        return Entry(self.site, jax.tree_util.tree_unflatten(self.treedef, list(leaves)),
                     self.lead if lead is None else lead, self.vmapped)

    def same(self, other: "Shape") -> bool:
        return (self.treedef == other.treedef and self.lead == other.lead and self.vmapped == other.vmapped
                and self.avals == other.avals)

    def describe(self) -> str:
        return ", ".join(f"{d}{list(s)}" for s, d in self.avals)


def flat(entries: list[Entry]) -> tuple[list[Shape], list]:
    shapes, leaves = [], []
    for e in entries:
        shapes.append(Shape.of(e))
        leaves.append(jax.tree_util.tree_leaves(e.tree))
    return shapes, leaves


def _check_same(name: str, group: list[Entry]) -> None:
    ref = Shape.of(group[0])
    for other in group[1:]:
        s = Shape.of(other)
        if not s.same(ref):
            raise JaxlogError(
                f"log {name!r} is logged with two different shapes or dtypes in one call: "
                f"{ref.describe()} at {group[0].site.where} (loop axes {list(ref.lead)}) and "
                f"{s.describe()} at {other.site.where} (loop axes {list(s.lead)}); use two names")


def finish(entries: list[Entry]) -> dict[str, Any]:
    """Group occurrences by name (stacked in program order), put system axes first, and give each
    name its documented structure."""
    groups: dict[str, list[Entry]] = {}
    for e in entries:
        groups.setdefault(e.site.name, []).append(e)
    out: dict[str, Any] = {}
    for name, group in groups.items():
        e = group[0]
        tree, lead = e.tree, e.lead
        if len(group) > 1:
            _check_same(name, group)
            tree = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *[g.tree for g in group])
            lead = (len(group), *lead)
        tree = dict(tree)
        if e.vmapped:
            n, v = len(lead), e.vmapped
            front = functools.partial(jnp.moveaxis, source=list(range(n, n + v)), destination=list(range(v)))
            tree["value"] = jax.tree_util.tree_map(front, tree["value"])
            for k in e.site.index_names:
                tree[k] = front(tree[k])
        if "count" in tree and len(tree["count"]) == 1:
            tree["count"] = tree["count"][0]
        out[name] = tree["value"] if set(tree) == {"value"} else tree
    return out

# ---------------------------------------------------------------------------------------------
# Where ``jl.log`` is in a jaxpr (nested ones included): what the interpreter leaves alone, and
# the sites an error about a log names.

_HAS_LOGS: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()
_HAS_LOGS_LOCK = threading.Lock()


def jaxpr_has_logs(jaxpr: Any) -> bool:
    try:
        hit = _HAS_LOGS.get(jaxpr)
    except TypeError:
        hit = None
    if hit is not None:
        return hit
    found = any(eqn_has_logs(e) for e in jaxpr.eqns)
    try:
        with _HAS_LOGS_LOCK:
            _HAS_LOGS[jaxpr] = found
    except TypeError:  # not weak-referenceable: recomputed next time, which is only slower
        pass
    return found


def eqn_has_logs(eqn: Any) -> bool:
    if eqn.primitive is log_p:
        return True
    return any(jaxpr_has_logs(j) for j in jex_core.jaxprs_in_params(eqn.params))


def sites_in(jaxpr: Any) -> list[Site]:
    out = []
    for e in jaxpr.eqns:
        if e.primitive is log_p:
            out.append(e.params["site"])
        else:
            out += sites_in_eqn(e)
    return out


def sites_in_eqn(eqn: Any) -> list[Site]:
    out = []
    for j in jex_core.jaxprs_in_params(eqn.params):
        out += sites_in(j)
    return out

# ---------------------------------------------------------------------------------------------
# The collector: a jaxpr evaluated again in the current trace, with logged values pulled out.
#
# Equations without logs inside are bound again unchanged, so the collected program computes exactly
# what the original did. One that carries logs in a sub-jaxpr (a loop, a branch, a nested jit) is
# rebuilt by its rule from :mod:`.rules`; a primitive without a rule is refused, naming the log.

# a rule rebuilds one equation whose sub-jaxprs log: (interpreter, eqn, input values) -> (outputs, entries)
Rule = Callable[["Interpreter", Any, list], "tuple[list, list[Entry]]"]


class LogEvent(NamedTuple):
    """What a ``jl.tap`` callback receives for each ``jl.log`` executed (host numpy values)."""

    name: str
    value: Any
    indices: dict
    where: str


class Interpreter:
    """Evaluates a jaxpr again in the current trace, pulling logged values out.

    ``tap is None``: collect (each log becomes an :class:`Entry`). Otherwise each log calls
    ``tap`` on the host (``jax.debug.callback``) and nothing is collected. ``rules``: how each
    primitive that carries sub-jaxprs is rebuilt.
    """

    def __init__(self, rules: dict[Any, Rule], capacity: int | None = None, tap: Callable | None = None):
        self.rules = rules
        self.capacity = capacity
        self.tap = tap

    def eval(self, jaxpr: Any, consts: Any, args: Any) -> tuple[list, list[Entry]]:
        env: dict = {}

        def read(v):
            return v.val if isinstance(v, jex_core.Literal) else env[v]

        for v, x in zip(jaxpr.constvars, consts):
            env[v] = x
        for v, x in zip(jaxpr.invars, args):
            env[v] = x
        entries: list[Entry] = []
        for eqn in jaxpr.eqns:
            invals = [read(v) for v in eqn.invars]
            if eqn.primitive is log_p:
                outs = self._log(eqn, invals, entries)
            elif not eqn_has_logs(eqn):
                outs = bind(eqn, invals)
            else:
                with eqn_context(eqn):
                    outs, sub = self._rule(eqn)(self, eqn, invals)
                entries += sub
            for v, x in zip(eqn.outvars, outs):
                if not isinstance(v, jex_core.DropVar):
                    env[v] = x
        return [read(v) for v in jaxpr.outvars], entries

    def _rule(self, eqn: Any) -> Rule:
        rule = self.rules.get(eqn.primitive) or self.rules.get(str(eqn.primitive))  # (no public handle: by name)
        if rule is None:
            s = sites_in_eqn(eqn)[0]
            raise JaxlogError(
                f"log {s.name!r} at {s.where} is inside a {eqn.primitive} "
                f"(a transformation logged values cannot be brought out of); log outside it, "
                f"or return the value from it")
        return rule

    def _log(self, eqn: Any, invals: list, entries: list[Entry]) -> list:
        site: Site = eqn.params["site"]
        if self.tap is not None:
            cb = self.tap
            jax.debug.callback(lambda *xs: _tap_host(cb, site, xs), *invals, ordered=True)
            return invals
        n = site.n_value
        arrays = [jnp.asarray(x) for x in invals]  # literals (constants folded into the jaxpr) too
        tree = {"value": jax.tree_util.tree_unflatten(site.value_tree, arrays[:n])}
        tree.update(zip(site.index_names, arrays[n:]))
        entries.append(Entry(site, tree, (), int(eqn.params["vmapped"])))
        return invals

    def shapes_of(self, jaxpr: Any, consts: Any, args: list) -> list[Shape]:
        """The shapes of what a body logs, without running it."""
        found: list[list[Shape]] = []

        def f(*a):
            _, entries = self.eval(jaxpr, consts, a)
            shapes, leaves = flat(entries)
            found.append(shapes)
            return leaves

        jax.eval_shape(f, *args)
        return found[-1]


def _tap_host(callback: Callable, site: Site, xs: tuple) -> None:
    n = site.n_value
    value = jax.tree_util.tree_unflatten(site.value_tree, [np.asarray(x) for x in xs[:n]])
    indices = {k: np.asarray(x) for k, x in zip(site.index_names, xs[n:])}
    callback(LogEvent(site.name, value, indices, site.where))

# ---------------------------------------------------------------------------------------------
# How each primitive that carries sub-jaxprs is rebuilt when its sub-jaxprs log: a registry
# keyed by primitive (``RULES``), each rule built from the public ``lax`` functions, threading the
# logged values out as extra outputs. A primitive missing here is refused by the interpreter.

RULES: dict[Any, Rule] = {}


def rule(*primitives: Any) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for p in primitives:
            RULES[p] = fn
        return fn

    return register


@rule(prims.scan_p)
def _scan(it: Interpreter, eqn: Any, invals: list) -> tuple[list, list[Entry]]:
    p = eqn.params
    split = scan_split(p)
    nc, ncarry = split.consts, split.carry
    consts, init, xs = invals[:nc], invals[nc:nc + ncarry], invals[nc + ncarry:]
    body = p["jaxpr"]
    found: list[list[Shape]] = []

    def fn(carry, x):
        outs, entries = it.eval(body.jaxpr, body.consts, [*consts, *carry, *x])
        shapes, leaves = flat(entries)
        found.append(shapes)
        return outs[:ncarry], (outs[ncarry:], leaves)

    carry, (ys, stacked) = lax.scan(fn, list(init), list(xs), length=p["length"], reverse=p["reverse"],
                                    unroll=p["unroll"])
    length = p["length"]
    entries = [s.build(lv, (length, *s.lead)) for s, lv in zip(found[-1], stacked)]
    return [*carry, *ys], entries


def _capacity(it: Interpreter, site: Site) -> int:
    k = site.capacity if site.capacity is not None else it.capacity
    if k is None:
        raise JaxlogError(
            f"log {site.name!r} at {site.where} is inside a lax.while_loop, whose number of iterations is "
            f"not known before it runs: give it a capacity, jl.log(..., capacity=K) (the first K "
            f"iterations are kept, with their count and an overflow flag), or a default: "
            f"jl.spool(f, capacity=K), jl.run(..., log_capacity=K)")
    return int(k)


@rule(prims.while_p)
def _while(it: Interpreter, eqn: Any, invals: list) -> tuple[list, list[Entry]]:
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, init = invals[:cn], invals[cn:cn + bn], invals[cn + bn:]
    cj, bj = p["cond_jaxpr"], p["body_jaxpr"]
    if it.tap is None and jaxpr_has_logs(cj.jaxpr):
        s = sites_in(cj.jaxpr)[0]
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
        _, leaves = flat(entries)
        new = []
        for k, buf, lv in zip(caps, bufs, leaves):
            slot = jnp.minimum(i, k)  # row k is a trash row: values past the capacity are dropped
            new.append([lax.dynamic_update_index_in_dim(b, x, slot, 0) for b, x in zip(buf, lv)])
        return outs, i + 1, new

    out, count, bufs = lax.while_loop(cond_fn, body_fn, (list(init), jnp.int32(0), bufs0))
    return list(out), [_counted(s.build([b[:k] for b in buf], (k, *s.lead)), count, k)
                       for s, k, buf in zip(shapes, caps, bufs)]


def _counted(e: Entry, count: Any, capacity: int) -> Entry:
    """A while loop's entry with its iteration count (outermost loop first) and overflow flag."""
    tree = dict(e.tree)
    inner_count = tree.pop("count", ())
    inner_over = tree.pop("overflow", None)
    over = count > capacity
    if inner_over is not None:
        over = over | jnp.any(inner_over)
    tree["count"] = (count, *inner_count)
    tree["overflow"] = over
    e.tree = tree
    return e


@rule(prims.cond_p)
def _cond(it: Interpreter, eqn: Any, invals: list) -> tuple[list, list[Entry]]:
    index, ops = invals[0], invals[1:]
    branches = eqn.params["branches"]
    if it.tap is not None:
        def tap_branch(b):
            return lambda *a: it.eval(b.jaxpr, b.consts, a)[0]

        return list(lax.switch(index, [tap_branch(b) for b in branches], *ops)), []

    specs, with_valid = _branch_specs(it, branches, ops)
    order = list(specs)

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


def _branch_specs(it: Interpreter, branches: Any, ops: list) -> tuple[dict, dict]:
    """What the branches log, matched by (name, occurrence) (the k-th log of a name in one branch
    is the k-th in another): the shape of each, in order, and whether it needs a ``valid`` field
    (some branch does not log it)."""
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
    return specs, with_valid


def _keyed(items: list) -> list:
    """``[((name, k), item)]``: the k-th occurrence of each name, in order."""
    seen: dict[str, int] = {}
    out = []
    for x in items:
        n = seen.get(x.site.name, 0)
        seen[x.site.name] = n + 1
        out.append(((x.site.name, n), x))
    return out


def _strip_valid(s: Shape) -> Shape:
    """The shape of an entry without its ``valid`` field (branches agree on everything else)."""
    tree = jax.tree_util.tree_unflatten(s.treedef, list(range(s.treedef.num_leaves)))
    if "valid" not in tree:
        return s
    del tree["valid"]
    keep = jax.tree_util.tree_leaves(tree)
    return Shape(s.site, jax.tree_util.tree_structure(tree), s.lead, s.vmapped, tuple(s.avals[i] for i in keep))


def _inline(param: str, closed: bool) -> Rule:
    """A call (nested jit, closed call): its body evaluated in place, as if inlined."""
    def inline(it: Interpreter, eqn: Any, invals: list) -> tuple[list, list[Entry]]:
        j = eqn.params[param]
        if closed:
            return it.eval(j.jaxpr, j.consts, invals)
        return it.eval(j, [], invals)

    return inline


rule(prims.jit_p)(_inline("jaxpr", True))
rule(prims.closed_call_p)(_inline("call_jaxpr", True))
rule(prims.call_p)(_inline("call_jaxpr", False))


@rule(prims.custom_jvp_call_p, prims.custom_vjp_call_p)
def _custom(it: Interpreter, eqn: Any, invals: list) -> tuple[list, list[Entry]]:
    """A function with its own derivative rule: its outputs come from the equation bound again
    unchanged (so differentiating them uses the rule), the logs from its body evaluated beside it
    (inlining the body instead would differentiate the body and drop the rule). The body's
    outputs there are unused; XLA merges the two forward computations."""
    outs = bind(eqn, invals)
    j = eqn.params["call_jaxpr"]
    if it.tap is not None:
        it.eval(j.jaxpr, j.consts, invals)
        return outs, []
    found: list[list[Shape]] = []

    def body_logs(*a):
        _, entries = it.eval(j.jaxpr, j.consts, a)
        shapes, leaves = flat(entries)
        found.append(shapes)
        return leaves

    leaves = _differentiated_by_body(body_logs, sites_in(j.jaxpr)[0], str(eqn.primitive))(*invals)
    return outs, [s.build(lv) for s, lv in zip(found[-1], leaves)]


def _differentiated_by_body(body_logs: Callable, site: Site, what: str) -> Callable:
    """``body_logs`` whose derivatives are its own (the logged values' true ones); a body JAX
    cannot differentiate (a callback, say: the reason for many custom rules) is refused when
    something differentiates it, naming the log, instead of failing inside JAX."""
    fn = jax.custom_jvp(body_logs)

    def jvp(primals, tangents):
        try:
            return jax.jvp(body_logs, primals, tangents)
        except Exception as e:
            raise JaxlogError(
                f"log {site.name!r} at {site.where} is inside a {what} whose body cannot be differentiated "
                f"({type(e).__name__}: {str(e)[:300]}); the function's own rule gives its outputs' "
                f"derivatives, but not the logged values': log them outside the function, or return them "
                f"from it") from e

    fn.defjvp(jvp)
    return fn


@rule(prims.remat_p)
def _remat(it: Interpreter, eqn: Any, invals: list) -> tuple[list, list[Entry]]:
    p = eqn.params
    found: list[list[Shape]] = []

    def fn(*a):
        outs, entries = it.eval(p["jaxpr"], [], a)
        shapes, leaves = flat(entries)
        found.append(shapes)
        return outs, leaves

    outs, leaves = jax.checkpoint(fn, prevent_cse=remat_prevent_cse(p), policy=p["policy"])(*invals)
    return list(outs), [s.build(lv) for s, lv in zip(found[-1], leaves)]


@rule("shard_map")
def _shard_map(it: Interpreter, eqn: Any, invals: list) -> tuple[list, list[Entry]]:
    """A ``jax.shard_map``ped function: mapped again with its logs as extra outputs, each shard's
    values gathered along a new leading axis (one row per shard, in the mesh's order: a per-shard
    value stays per shard; a value reduced inside, a ``psum``, comes once per shard, equal)."""
    sm = shard_map_params(eqn.params)
    body = eqn.params["jaxpr"]
    found: list[list[Shape]] = []

    def inner(*args):
        outs, entries = it.eval(body, [], list(args))
        shapes, leaves = flat(entries)
        found.append(shapes)
        return tuple(outs), [[jnp.expand_dims(x, 0) for x in lv] for lv in leaves]

    spec = jax.sharding.PartitionSpec(sm.axis_names)
    mapped = jax.shard_map(inner, mesh=sm.mesh, in_specs=sm.in_specs, out_specs=(sm.out_specs, spec),
                           check_vma=sm.check_vma, axis_names=set(sm.axis_names))
    outs, gathered = mapped(*invals)
    shards = math.prod(sm.mesh.shape[a] for a in sm.axis_names)
    return list(outs), [s.build(lv, (shards, *s.lead)) if s.site.shards == "gather"
                        else s.build([_over_shards(s.site.shards, x) for x in lv]) for s, lv in zip(found[-1], gathered)]


def _over_shards(how: str, x: Any) -> Any:
    """One value from a log's rows of the shards (axis 0), as ``jl.log(..., shards=how)`` asks."""
    if how == "first":  # shard 0's row, by a reduction: a slice of an axis sharded over explicit mesh axes is refused
        first = (jnp.arange(x.shape[0]) == 0).reshape((-1,) + (1,) * (x.ndim - 1))
        return jnp.sum(jnp.where(first, x, jnp.zeros_like(x)), axis=0).astype(x.dtype)
    if how == "sum":
        return jnp.sum(x, axis=0)
    if how == "mean":
        return jnp.mean(x, axis=0)
    return jnp.max(x, axis=0) if how == "max" else jnp.min(x, axis=0)
