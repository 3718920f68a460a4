"""What a traced function computes, as a key that compares and hashes: the identity of a kernel.

Why: a test suite builds its kernels and views anew in every test (factories, inline lambdas,
``functools.partial``), and a Python function object says nothing about what it computes. Two
functions whose traces give equal :class:`Program` keys compute the same thing on the same
arguments, so their runs may share one compiled program.

What the key holds, so that nothing that changes results is left out:

- the jaxpr's structure, read from its objects (printing it costs several times more): per
  equation its primitive, its operands (variables numbered in order of definition, so the key
  does not depend on how the function was traced; literals by their exact bytes) and its
  results' types (shape, dtype, weak type, sharding), in program order, nested jaxprs inside;
- every param: plain values as they are, arrays (a nested ``jit``'s captured constants) by a
  digest of their bytes, other objects compared by value where their type defines equality
  (dtypes, shardings, ``jl.log`` sites), else by identity, kept alive with the key (a
  ``custom_jvp`` rule, a callback: two rules of the same name are two rules);
- the input and output pytree structures (their node types included);
- the top-level constants (captured arrays): their types only where they are hoisted into
  arguments of the program (``hoisted``, per constant), their values otherwise.

``digest()`` is a text form of the same for files (a checkpoint's step identity): it cannot
keep objects, so it describes them by type and qualified name instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import re
import threading
from typing import Any, Callable, Iterator, NamedTuple, Protocol, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from ...errors import JaxlogError
from ...logs import calls_made, collect, jaxpr_has_logs
from .schema import LoggingView, Values, ValueSource
from .sharding import explicit_mesh, place

__all__ = ['Cache', 'KEEP', 'caches', 'clear_caches', 'register']

_PLAIN = (bool, int, float, complex, str, bytes, type(None), np.dtype)
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+|0x[0-9a-fA-F]{6,}")


class _Same:
    """A param compared by identity (its type defines no equality): kept alive with the key, so
    its id is its own while the key lives."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __repr__(self) -> str:
        fn = getattr(self.obj, "f", self.obj)  # a wrapped rule: the function inside
        name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        return f"<{getattr(fn, '__module__', '?')}.{name}>"


def value_of(x: Any) -> tuple:
    """An array's exact value as a comparable, hashable record: dtype, shape, digest of the
    bytes (typed PRNG keys: their key data and impl)."""
    impl = None
    if hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        impl, x = str(jax.random.key_impl(x)), jax.random.key_data(x)
    a = np.asarray(jax.device_get(x))
    return ("array", a.dtype.str, a.shape, impl, hashlib.blake2b(np.ascontiguousarray(a).tobytes(),
                                                                digest_size=20).hexdigest())


def aval_of(x: Any) -> tuple:
    """An argument's type as the program sees it: shape, dtype, weak type."""
    return ("aval", tuple(np.shape(x)), str(x.dtype), bool(getattr(x, "weak_type", False)))


class Program:
    """A traced function's identity (see the module's docs): equal keys, same computation."""

    __slots__ = ("parts", "_hash")

    def __init__(self, parts: tuple):
        self.parts = parts
        self._hash = hash(parts)

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, Program) and self._hash == other._hash
                                 and self.parts == other.parts)

    def __hash__(self) -> int:
        return self._hash

    def digest(self) -> str:
        """The key as a hex digest that a file can hold and another process recompute."""
        kind, in_tree, out_tree, consts, exact, same = self.parts
        desc = repr((kind, str(in_tree), str(out_tree), consts, [_describe(x) for x in exact], [repr(s) for s in same]))
        return hashlib.sha256(_ADDRESS.sub("", desc).encode()).hexdigest()


def _describe(x: Any) -> str:
    return repr(x) if isinstance(x, (tuple, *_PLAIN)) else f"{type(x).__qualname__}:{x!r}"


def fingerprint(closed: Any, *, in_tree: Any, out_tree: Any, hoisted: tuple | bool, kind: str) -> Program:
    """The :class:`Program` of a traced function (``closed``: its ``ClosedJaxpr``), its
    top-level constants as types (``hoisted``, per constant or for all: arguments of the
    program) or values."""
    exact: list = []
    same: list = []
    _scan(closed.jaxpr, exact, same)
    if isinstance(hoisted, bool):
        hoisted = (hoisted,) * len(closed.consts)
    consts = tuple(aval_of(c) if h else value_of(c) for c, h in zip(closed.consts, hoisted))
    return Program((kind, in_tree, out_tree, consts, tuple(exact), tuple(same)))


def _scan(jaxpr: Any, exact: list, same: list) -> None:
    """The structure, literals and params of ``jaxpr`` and the jaxprs inside it, in program order."""
    ids: dict = {}

    def define(v: Any) -> tuple:
        return ids.setdefault(v, len(ids)), v.aval

    def use(v: Any) -> Any:
        if isinstance(v, jex_core.Literal):
            a = np.asarray(v.val, dtype=v.aval.dtype)  # type: ignore[attr-defined]  # a literal is an array value
            return "literal", a.dtype.str, a.shape, a.tobytes()
        return ids[v]

    exact.append(("jaxpr", tuple(map(define, jaxpr.constvars)), tuple(map(define, jaxpr.invars))))
    for eqn in jaxpr.eqns:
        exact.append((eqn.primitive.name, tuple(map(use, eqn.invars)), tuple(map(define, eqn.outvars))))
        for name in sorted(eqn.params):
            exact.append(name)
            _param(eqn.params[name], exact, same)
    exact.append(("out", tuple(map(use, jaxpr.outvars))))


def _param(p: Any, exact: list, same: list) -> None:
    if isinstance(p, jex_core.ClosedJaxpr):
        _scan(p.jaxpr, exact, same)
        exact.extend(value_of(c) for c in p.consts)
    elif isinstance(p, jex_core.Jaxpr):
        _scan(p, exact, same)
    elif isinstance(p, (tuple, list)):
        exact.append(("seq", len(p)))
        for x in p:
            _param(x, exact, same)
    elif isinstance(p, _PLAIN):
        exact.append(p)
    elif isinstance(p, (np.ndarray, np.generic, jax.Array)):
        exact.append(value_of(p))
    elif type(p).__eq__ is object.__eq__ or getattr(type(p), "__hash__", None) is None:
        same.append(_Same(p))  # no equality of its own, or unhashable: the object itself
    else:
        exact.append(p)

# ---------------------------------------------------------------------------------------------
# The driver's bounded caches: what a kernel's runs work out again and again (lanes, resolved
# plans, layouts, readers, signatures) is kept per kernel, for the kernels a test module runs.
#
# Why bounded and oldest-first: a suite runs hundreds of kernels, each with its traced step in the
# keys; keeping them all would hold every closure's arrays for the whole session. Why some keys
# name an object by ``id()`` (cached shapes, schemas, resolved runs: unhashable, or costly to
# hash): the entry's value keeps that object, so while the entry lives its id is its own.
#
# Why a lock: tests run ``jl.run`` from several threads (a thread pool of kernels, a server under
# test); evicting the oldest entry while another thread adds one raised ``KeyError`` and
# "dictionary changed size during iteration". Lookups take no lock (a dict lookup is atomic and
# stays correct while another thread changes the dict; it is the hot path of a warm run); every
# change does. A value is made outside the lock (tracing a step takes milliseconds and may run
# another run's code): two threads asking for the same new key both make it, and one is kept.

KEEP = 64  # entries per cache


class Clearable(Protocol):
    def clear(self) -> None: ...


C = TypeVar("C", bound=Clearable)


_ALL: list[Clearable] = []  # every cache of the driver, for clear_caches()
_ALL_LOCK = threading.Lock()


def register(cache: C) -> C:
    """Have :func:`clear_caches` clear ``cache`` too (a pool kept another way than :class:`Cache`)."""
    with _ALL_LOCK:
        _ALL.append(cache)
    return cache


def caches() -> list[Clearable]:
    """Every cache of the driver (to bound or inspect them)."""
    with _ALL_LOCK:
        return list(_ALL)


def clear_caches() -> None:
    """Forget everything the driver kept between runs (resolved kernels, layouts, readers, spare
    buffers...): the next run of each kernel works it out again. For memory held by kernels no
    longer run, and for tests of the caches themselves."""
    for cache in caches():
        cache.clear()


class Cache:
    """A map of at most ``keep`` entries, the oldest dropped first, safe to use from several
    threads. ``get`` and ``memo`` raise ``TypeError`` for an unhashable key, as a dict does
    (callers with keys that may not hash catch it and go without the cache)."""

    __slots__ = ("name", "keep", "_data", "_lock")

    def __init__(self, name: str, keep: int = KEEP):
        self.name = name
        self.keep = keep
        self._data: dict = {}
        self._lock = threading.Lock()
        register(self)

    def get(self, key: Any, default: Any = None) -> Any:
        return self._data.get(key, default)

    def put(self, key: Any, value: Any) -> Any:
        """``self[key] = value``, the oldest entries dropped past ``keep``; returns ``value``."""
        with self._lock:
            data = self._data
            if key not in data:
                while len(data) >= self.keep:
                    del data[next(iter(data))]
            data[key] = value
        return value

    def memo(self, key: Any, make: Callable[[], Any]) -> Any:
        """``self[key]``, made by ``make()`` and kept the first time it is asked for."""
        hit = self._data.get(key)
        return self.put(key, make()) if hit is None else hit

    def intern(self, value: Any) -> Any:
        """The one equal value kept already, or ``value`` (then kept): equal objects made
        again and again become the same one."""
        hit = self._data.get(value)
        if hit is not None:
            return hit
        with self._lock:
            hit = self._data.get(value)
            if hit is not None:
                return hit
            data = self._data
            while len(data) >= self.keep:
                del data[next(iter(data))]
            data[value] = value
        return value

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Cache({self.name!r}, {len(self._data)}/{self.keep})"

# ---------------------------------------------------------------------------------------------
# One compiled chunk program per distinct program, not per function object.
#
# Why: ``jl.run``'s chunk program is compiled per :class:`~.program.Plan`, and a plan holds the
# step, the views and the predicates. A test suite makes them anew in every test (a factory, an
# inline lambda, a ``functools.partial``), and JAX compares functions by identity: every test
# traced, lowered and compiled its program again (~200 ms each on a CPU). Here each user function
# is traced once per argument signature and replaced in the plan by a canonical callable that
# compares and hashes by what it computes (:class:`~.fingerprint.Program`), so equal programs give
# equal plans and one executable:
#
# - :class:`Kernel`: a function that captures arrays (a box, a table) and logs nothing. It is
#   evaluated from its jaxpr with the captured arrays *hoisted* into an argument of the chunk
#   program (``consts``), so runs that differ only in those arrays' values share the program.
#   Captured scalars (a time step as a 0-d array) stay constants of the program, as captured
#   Python numbers do (a program for each value: XLA folds them, and the program is the one the
#   function itself gives). The
#   chunk program binds each kernel's constants while it is traced (:func:`with_consts`); outside
#   (resolving shapes) a kernel uses its own;
# - :class:`Shared`: any other function (nothing captured, or it calls ``jl.log``: the log
#   collector interprets the function's own trace, so it is called as it is). Its key holds the
#   captured arrays' values; equal keys mean the same computation, so the plan may call the first
#   one seen. Inside the chunk program it is called as it is (the program is the one the function
#   itself gives); elsewhere (resolving the run's shapes) a function that logs nothing is
#   evaluated from its trace, and a view that logs from its collected trace
#   (:class:`CollectedView`): resolving a run runs no user code again.
#
# A function that cannot be traced alone stays as it is (the run reports its error as before).

_BOUND = threading.local()  # while a chunk program is traced: id(kernel) -> its constants (tracers)
_TRACED = Cache("traced functions")  # (id(fn), signature, log capacity) -> (fn, its canonical callable)
_CANONICAL = Cache("canonical plans")  # (id(step), id(lanes), id(until), signature, capacity) -> ((...), Canonical)
_KEY_AVALS = Cache("key types")  # (key type, number of systems) -> the type of the key a step gets


def step_key(key: Any, k: Any, n_systems: int | None) -> Any:
    """The key of the work of step ``k``: ``fold_in(key, k)``, and one per system in batched runs
    (``fold_in`` of it with the system index, stacked)."""
    kk = jax.random.fold_in(key, k)
    if n_systems is not None:
        kk = jax.vmap(lambda s: jax.random.fold_in(kk, s))(jnp.arange(n_systems, dtype=jnp.uint32))
    return kk


class Kernel:
    """A function that captures arrays, as its jaxpr with those arrays as an argument: equal
    to every kernel of the same program (see the module's docs). One object per place in a plan:
    the chunk program binds constants to places."""

    FIELDS = ("jaxpr", "in_tree", "out_tree", "consts", "program", "name", "baked")
    __slots__ = (*FIELDS, "__weakref__")  # jax.jit (eval_shape too) keeps a weak reference to a function

    def __init__(self, traced: "_Trace"):
        self.jaxpr, self.in_tree, self.out_tree = traced.closed.jaxpr, traced.in_tree, traced.out_tree
        self.program, self.name = traced.program, traced.name
        self.consts = tuple(c for c in traced.consts if _hoisted(c))  # the program's argument
        self.baked = tuple(None if _hoisted(c) else c for c in traced.consts)  # constants of the program

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Kernel) and other.program == self.program

    def __hash__(self) -> int:
        return hash(self.program)

    def __call__(self, *args: Any) -> Any:
        env = getattr(_BOUND, "env", None)
        hoisted = iter(self.consts if env is None else env.get(id(self), self.consts))
        return _evaluate(self, [next(hoisted) if c is None else c for c in self.baked], args)

    def __repr__(self) -> str:
        return f"Kernel({self.name})"


class Shared:
    """A function called as it is, equal to every function of the same program (its captured
    arrays' values included): a plan may hold the first one seen."""

    __slots__ = ("fn", "program", "name", "traced", "collected", "__weakref__")  # (see Kernel's)

    def __init__(self, fn: Callable, traced: "_Trace"):
        self.fn, self.program, self.name = fn, traced.program, traced.name
        logs = traced.program.parts[0] == "logs"
        self.traced = None if logs else traced  # its plain trace, where it is whole
        self.collected = traced if logs else None  # its collected trace: (output, logs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shared) and other.program == self.program

    def __hash__(self) -> int:
        return hash(self.program)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.traced is None or kwargs or getattr(_BOUND, "env", None) is not None:
            return self.fn(*args, **kwargs)
        return _evaluate(self.traced, self.traced.closed.consts, args)

    @property
    def __wrapped__(self) -> Callable:
        return self.fn

    def __repr__(self) -> str:
        return f"Shared({self.name})"


def _evaluate(traced: Any, consts: Any, args: tuple) -> Any:
    """A traced function (its ``jaxpr``, ``in_tree``, ``out_tree``, ``name``) evaluated on
    ``args`` with ``consts``: the primitives of its trace bound again."""
    flat, tree = jax.tree_util.tree_flatten(args)
    jaxpr = getattr(traced, "jaxpr", None) or traced.closed.jaxpr
    if tree != traced.in_tree or any(jnp.shape(x) != v.aval.shape or jnp.result_type(x) != v.aval.dtype
                                     for x, v in zip(flat, jaxpr.invars)):
        raise JaxlogError(f"{traced.name} was traced for other arguments than it is called with "
                          f"({traced.in_tree} vs {tree}): please report this")
    outs = jex_core.jaxpr_as_fun(jex_core.ClosedJaxpr(jaxpr, list(consts)))(*flat)
    return jax.tree_util.tree_unflatten(traced.out_tree, outs)


@dataclasses.dataclass(frozen=True)
class CollectedView(LoggingView):
    """A view that logs, as resolving a run sees it: evaluated from its collected trace outside
    the chunk program (no user code runs again), collected as any ``LoggingView`` inside."""

    collected: Any = dataclasses.field(default=None, compare=False)  # its collected _Trace

    def __call__(self, state: Any) -> tuple[Any, dict]:
        if getattr(_BOUND, "env", None) is not None or self.collected is None:
            return super().__call__(state)
        return _evaluate(self.collected, self.collected.closed.consts, (state,))


class _Trace(NamedTuple):
    closed: Any
    in_tree: Any
    out_tree: Any
    consts: tuple  # the captured arrays, as device arrays
    program: Program
    name: str


def _name(fn: Callable) -> str:
    fn = getattr(fn, "func", fn)  # functools.partial: the function it calls
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def _canonical_one(fn: Callable, args: tuple, signature: tuple, capacity: int | None) -> Callable:
    """``fn``'s canonical callable for arguments of these types, traced once per function
    object and signature; ``fn`` itself where it cannot be traced alone (its error comes later,
    from resolving the run, as before)."""
    def make() -> tuple:
        try:
            return fn, _canonical_new(fn, args, capacity)
        except Exception:  # not traceable here: the run's own checks say why
            return fn, fn
    return _TRACED.memo((id(fn), signature, capacity), make)[1]


def _canonical_new(fn: Callable, args: tuple, capacity: int | None) -> Callable:
    in_tree = jax.tree_util.tree_structure(args)
    before = calls_made()
    closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    if calls_made() > before or jaxpr_has_logs(closed.jaxpr):
        # it logs: its identity is that of what it computes and logs, collected (a plain trace
        # may have pruned logs under grad or remat), its captured arrays by value
        closed, shape = jax.make_jaxpr(collect(fn, capacity=capacity), return_shape=True)(*args)
        traced = _Trace(closed, in_tree, jax.tree_util.tree_structure(shape), (),
                        fingerprint(closed, in_tree=in_tree, out_tree=jax.tree_util.tree_structure(shape),
                                    hoisted=False, kind="logs"), _name(fn))
        return Shared(fn, traced)
    out_tree = jax.tree_util.tree_structure(shape)
    consts = tuple(jnp.asarray(c) for c in closed.consts)
    hoisted = tuple(map(_hoisted, consts))
    traced = _Trace(closed, in_tree, out_tree, consts,
                    fingerprint(closed, in_tree=in_tree, out_tree=out_tree, hoisted=hoisted, kind="jaxpr"), _name(fn))
    return Kernel(traced) if any(hoisted) else Shared(fn, traced)


def _struct(x: Any) -> jax.ShapeDtypeStruct:
    """A state leaf's type for tracing the run's functions: on a mesh of explicit axes its
    sharding is part of the type, and a function traced without it computes unsharded values
    (evaluated from that trace in the chunk program, a masked sharded value came out unsharded,
    and its row no longer fit the record's buffer)."""
    sharding = getattr(x, "sharding", None)
    if explicit_mesh(sharding) is not None:
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _hoisted(const: Any) -> bool:
    """Whether a captured array becomes an argument of the program: arrays, not scalars."""
    return const.size > 1


class Canonical(NamedTuple):
    """A run's step, lanes and ``until=`` as canonical callables, and the hoisted constants of
    its kernels (in :func:`slots` order: what the chunk program's ``consts`` argument holds)."""

    step: Callable
    lanes: tuple
    until: Callable | None
    consts: tuple


def canonical(step: Callable, lanes: tuple, until: Callable | None, state: Any, key: Any,
              n_systems: Callable[[], int | None], capacity: int | None,
              values: ValueSource | None = None) -> Canonical:
    """The run's functions as canonical callables, traced on ``state``'s types (the step with
    its per-step key's first, where ``key`` is given; ``n_systems()``: the batched run's number
    of systems; predicates that take the step's values with ``values``' shapes too). Kept per
    function objects and signature: a run with the same objects traces nothing again."""
    leaves, treedef = jax.tree_util.tree_flatten(state)
    avals = (treedef, tuple(jax.typeof(x) for x in leaves))
    n = None if key is None else n_systems()  # the step's key: one per system in batched runs
    sig = (avals, None if key is None else (jax.typeof(key), n))

    def make() -> tuple:
        st = jax.tree_util.tree_unflatten(treedef, [_struct(x) for x in leaves])
        step_args: tuple = (st,)
        if key is not None:
            step_args = (_KEY_AVALS.memo(sig[1], lambda: jax.eval_shape(lambda kk: step_key(kk, 0, n), key)), st)
        one = lambda fn, args: _canonical_one(fn, args, (sig, len(args)), capacity)  # noqa: E731
        pred = _predicates(st, sig, capacity, values, lanes)
        # a fresh kernel per place in the plan: the chunk program binds constants to places
        new_lanes = tuple(dataclasses.replace(
            ln, view=None if ln.view is None else _as_view(_placed(one(ln.view, (st,))), capacity),
            when=None if ln.when is None else _placed(pred(ln.when, ln.when_values))) for ln in lanes)
        new_step = _placed(one(step, step_args))
        new_until = None if until is None else _placed(pred(until, values is not None and values.until))
        consts = tuple(k.consts for k in slots(new_step, new_until, new_lanes))
        return (step, lanes, until), Canonical(new_step, new_lanes, new_until, consts)

    return _CANONICAL.memo((id(step), id(lanes), id(until), sig, capacity, None if values is None else values.key),
                           make)[1]


def _predicates(st: Any, sig: tuple, capacity: int | None, values: ValueSource | None,
                lanes: tuple) -> Callable[[Callable, bool], Callable]:
    """``(predicate, takes values) -> its canonical callable``: a state predicate traced on the
    state, a values one on the state and the step's values (their shapes found once, where some
    predicate takes them); one whose values cannot be found stays as it is (the run says why)."""
    shapes = None
    if values is not None and (values.until or any(ln.when_values for ln in lanes)):
        shapes = values.shapes()

    def pred(fn: Callable, takes: bool) -> Callable:
        if not takes:
            return _canonical_one(fn, (st,), (sig, 1), capacity)
        if shapes is None:
            return fn
        typed = tuple((k, tuple(v.shape), str(v.dtype)) for k, v in sorted(shapes.items()))
        return _canonical_one(fn, (st, Values(shapes)), (sig, 2, typed), capacity)
    return pred


def _as_view(fn: Callable, capacity: int | None) -> Callable:
    """A view that logs as resolving the run finds it: a ``LoggingView``, here one that knows its
    collected trace."""
    if isinstance(fn, Shared) and fn.collected is not None:
        return CollectedView(fn, capacity, collected=fn.collected)
    return fn


def _placed(fn: Callable) -> Callable:
    """A kernel of its own for one place in a plan (other callables as they are)."""
    if not isinstance(fn, Kernel):
        return fn
    new = object.__new__(Kernel)
    for name in Kernel.FIELDS:
        setattr(new, name, getattr(fn, name))
    return new


def slots(step: Callable, until: Callable | None, lanes: tuple) -> Iterator[Kernel]:
    """A plan's kernels in the order the chunk program's ``consts`` argument holds their
    constants: the step, ``until=``, then each lane's view and ``when=``. Equal plans list equal
    kernels in the same order."""
    views = [getattr(ln.view, "view", ln.view) if isinstance(ln.view, LoggingView) else ln.view for ln in lanes]
    for fn in (step, until, *(f for ln, v in zip(lanes, views) for f in (v, ln.when))):
        if isinstance(fn, Kernel):
            yield fn


@contextlib.contextmanager
def bound(plan: Any, consts: tuple) -> Iterator[None]:
    """While the chunk program is traced: the plan's kernels evaluate with ``consts`` (the
    program's argument), not with the constants of the run that first traced it."""
    prev = getattr(_BOUND, "env", None)
    env = dict(prev or {})
    env.update((id(k), tuple(c)) for k, c in zip(slots(plan.step, plan.until, plan.lanes), consts))
    _BOUND.env = env
    try:
        yield
    finally:
        _BOUND.env = prev


_PLACED = Cache("placed constants")  # (id(consts), placement) -> (consts, them placed)


def placed(consts: tuple, where: Any) -> tuple:
    """A run's hoisted constants where its committed state is (``where``: a device, or a
    sharded state's replicated sharding), copied from the host as the run's other small
    arguments are (a device-to-device copy is what a transfer guard forbids); kept per
    constants and placement."""
    if not consts:
        return consts
    return _PLACED.memo((id(consts), where),
                lambda: (consts, tuple(tuple(place(c, where) for c in k) for k in consts)))[1]


def fingerprints(step: Callable, until: Callable | None, lanes: tuple, consts: tuple) -> dict[str, dict] | None:
    """What a checkpoint records of the run's functions: per function (``step``, ``until``,
    ``record <name>``, ``when <name>``) its program's digest and its hoisted constants' digest
    (values), with its name for messages. None where a function has no canonical form."""
    kernel_consts = {id(k): c for k, c in zip(slots(step, until, lanes), consts)}
    out: dict[str, dict] = {}
    named = [("step", step), ("until", until)]
    for ln in lanes:
        if ln.view is not None:
            named.append((f"record {ln.name}", ln.view.view if isinstance(ln.view, LoggingView) else ln.view))
        if ln.when is not None:
            named.append((f"when {ln.name}", ln.when))
    for what, fn in named:
        if fn is None:
            continue
        if not isinstance(fn, (Kernel, Shared)):
            return None
        values = [value_of(c) for c in kernel_consts.get(id(fn), ())]
        out[what] = {"name": fn.name, "program": fn.program.digest(), "constants": repr(values)}
    return out


def differences(old: dict, new: dict) -> list[str]:
    """What differs between two runs' :func:`fingerprints`, for a refused resume."""
    out = []
    for what in sorted(set(old) | set(new), key=lambda w: (w != "step", w)):
        a, b = old.get(what), new.get(what)
        if a is None or b is None:
            out.append(f"{what}: {'none' if b is None else b['name']} here, "
                       f"{'none' if a is None else a['name']} in the checkpoint's run")
        elif a["program"] != b["program"]:
            out.append(f"the {what}'s program differs from the one that wrote the checkpoint: its traced "
                       f"computation (constants baked into it included) is not the same ({b['name']} here, "
                       f"{a['name']} there)")
        elif a["constants"] != b["constants"]:
            out.append(f"the {what}'s program differs from the one that wrote the checkpoint: the arrays it "
                       f"captures hold other values ({b['name']})")
    return out


def with_consts(impl: Callable) -> Callable:
    """The chunk program ``impl`` taking the kernels' constants as its last argument."""
    def chunk_impl(plan: Any, *args: Any) -> Any:
        *rest, consts = args
        with bound(plan, consts):
            return impl(plan, *rest)
    # its name is the program's (compile trackers count it by name), its signature its own
    chunk_impl.__name__, chunk_impl.__qualname__, chunk_impl.__doc__ = impl.__name__, impl.__qualname__, impl.__doc__
    chunk_impl.__module__ = impl.__module__
    return chunk_impl
