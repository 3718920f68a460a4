"""Predicates that see what the step computed: ``until=`` and ``when=`` called as
``pred(state, values)``.

Why: an optimiser's gradient norm, a Metropolis step's acceptance, a solver's residual are
computed by the step, not held in the state; copying them into the state changes its structure
and every view of it. A predicate that takes a second argument gets them instead: ``values`` is
a read-only mapping of the step's aux and ``jl.log`` values by the record paths a run gives them
(``"aux/gnorm"``, ``"log/residual"``), for the step that produced the state, evaluated on the
device like a state predicate.

- The arity is read once from the callable's signature: two required positional parameters
  mean ``(state, values)``; one (or ``*args``) means ``(state)``, as before, so such predicates
  give the very same programs (parameters with defaults, as in ``lambda s, tol=1e-6: ...``,
  do not count).
- :class:`Values` is a pytree (its keys are its structure), so a predicate traced with it has a
  program identity like any other function (``drive.identity``): runs whose predicates compute
  the same share one program, others never do.
- The initial state was computed by no step: a values predicate is first asked about step 1
  (``until=`` is not checked on the initial state, ``when=`` does not keep its frame).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterator, Mapping, NamedTuple

import jax

from ..errors import JaxlogError
from ..record.records import AUX, LOG
from .resolve import flatten_view

__all__ = ["Values", "ValueSource", "takes_values", "step_values", "ask"]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def takes_values(fn: Callable | None, what: str) -> bool:
    """Whether ``fn`` is a ``(state, values)`` predicate (``what``: ``"until="``, ``"record 'x':
    when="``, for the error of one that requires more arguments)."""
    if fn is None:
        return False
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a callable without a signature (some builtins): called as (state)
        return False
    required = [p for p in sig.parameters.values() if p.kind in _POSITIONAL and p.default is p.empty]
    if len(required) > 2:
        raise JaxlogError(f"{what} {_name(fn)} requires {len(required)} arguments ({', '.join(p.name for p in required)}); "
                          f"a predicate takes (state) or (state, values), values being the step's aux and logs "
                          f"by record path")
    return len(required) == 2


def _name(fn: Callable) -> str:
    """A predicate's name for messages: a canonical callable's (``drive.identity``), or the
    function's own qualified name."""
    name = getattr(fn, "name", None)
    if isinstance(name, str):
        return name
    fn = getattr(fn, "func", fn)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


class Values(Mapping):
    """The step's aux and ``jl.log`` values by record path, as a predicate sees them: read only;
    a missing key is one :class:`JaxlogError` naming it, the predicate and the keys there are."""

    __slots__ = ("_items", "_what")

    def __init__(self, items: Mapping[str, Any], what: str = "a predicate"):
        self._items = dict(items)
        self._what = what

    def __getitem__(self, key: str) -> Any:
        try:
            return self._items[key]
        except (KeyError, TypeError):
            pass
        have = ", ".join(repr(k) for k in sorted(self._items)) or (
            "none: the step returns no aux (has_aux=True records it) and logs nothing with jl.log")
        hint = ""
        if isinstance(key, str) and not key.startswith((AUX + "/", LOG + "/")) and key not in (AUX, LOG):
            hint = f" (values are keyed by record path: 'aux/{key}' or 'log/{key}')"
        raise JaxlogError(f"{self._what}: the step computed no value {key!r}{hint}; it has: {have}")

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: str, default: Any = None) -> Any:
        return self._items.get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Values({', '.join(sorted(self._items))})"


def _flatten(v: Values) -> tuple[tuple, tuple]:
    keys = tuple(sorted(v._items))
    return tuple(v._items[k] for k in keys), keys


jax.tree_util.register_pytree_node(Values, _flatten, lambda keys, leaves: Values(dict(zip(keys, leaves))))


def step_values(aux: Any, logs: Any) -> dict[str, Any]:
    """``{record path: value}`` of what one step returned beside the state (``aux``, None
    without ``has_aux``) and logged (``logs``), with the paths its records get."""
    out = {} if aux is None else flatten_view(AUX, aux)
    if logs:
        out.update(flatten_view(LOG, logs))
    return out


def ask(pred: Callable, state: Any, values: Mapping[str, Any] | None, what: str) -> Any:
    """``pred(state, values)`` where the predicate takes values (``values`` not None), else
    ``pred(state)``."""
    if values is None:
        return pred(state)
    return pred(state, Values(values, f"{what} {_name(pred)}"))


class ValueSource(NamedTuple):
    """Where a run's predicates find the shapes of the step's values while they are traced for
    their program identity: ``shapes()`` (None where the step cannot be traced: the run reports
    that), ``key`` (what else they depend on, for caches), ``until``: whether ``until=`` takes them."""

    shapes: Callable[[], dict | None]
    key: Any
    until: bool
