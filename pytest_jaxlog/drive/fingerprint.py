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

import hashlib
import re
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex_core

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
