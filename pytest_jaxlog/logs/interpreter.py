"""The collector: a jaxpr evaluated again in the current trace, with logged values pulled out.

Equations without logs inside are bound again unchanged, so the collected program computes exactly
what the original did. One that carries logs in a sub-jaxpr (a loop, a branch, a nested jit) is
rebuilt by its rule from :mod:`.rules`; a primitive without a rule is refused, naming the log.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from ..errors import JaxlogError
from .compat import bind, eqn_context
from .entries import Entry, Shape, flat
from .find import eqn_has_logs, sites_in_eqn
from .primitive import Site, log_p

__all__ = ["Interpreter", "LogEvent", "Rule"]

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
