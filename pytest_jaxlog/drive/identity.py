"""One compiled chunk program per distinct program, not per function object.

Why: ``jl.run``'s chunk program is compiled per :class:`~.program.Plan`, and a plan holds the
step, the views and the predicates. A test suite makes them anew in every test (a factory, an
inline lambda, a ``functools.partial``), and JAX compares functions by identity: every test
traced, lowered and compiled its program again (~200 ms each on a CPU). Here each user function
is traced once per argument signature and replaced in the plan by a canonical callable that
compares and hashes by what it computes (:class:`~.fingerprint.Program`), so equal programs give
equal plans and one executable:

- :class:`Kernel`: a function that captures arrays (a box, a table) and logs nothing. It is
  evaluated from its jaxpr with the captured arrays *hoisted* into an argument of the chunk
  program (``consts``), so runs that differ only in those arrays' values share the program.
  Captured scalars (a time step as a 0-d array) stay constants of the program, as captured
  Python numbers do (a program for each value: XLA folds them, and the program is the one the
  function itself gives). The
  chunk program binds each kernel's constants while it is traced (:func:`with_consts`); outside
  (resolving shapes) a kernel uses its own;
- :class:`Shared`: any other function (nothing captured, or it calls ``jl.log``: the log
  collector interprets the function's own trace, so it is called as it is). Its key holds the
  captured arrays' values; equal keys mean the same computation, so the plan may call the first
  one seen. Inside the chunk program it is called as it is (the program is the one the function
  itself gives); elsewhere (resolving the run's shapes) a function that logs nothing is
  evaluated from its trace, and a view that logs from its collected trace
  (:class:`CollectedView`): resolving a run runs no user code again.

A function that cannot be traced alone stays as it is (the run reports its error as before).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Callable, Iterator, NamedTuple

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core

from ..errors import JaxlogError
from .fingerprint import Program, fingerprint, value_of
from ..logs import calls_made, collect, jaxpr_has_logs
from .memo import Cache
from .predicates import ValueSource, Values
from .resolve import LoggingView
from .shards import explicit_mesh, place

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
