"""Where ``jl.log`` is in a jaxpr (nested ones included): what the interpreter leaves alone, and
the sites an error about a log names."""

from __future__ import annotations

import threading
import weakref
from typing import Any

from jax.extend import core as jex_core

from .primitive import Site, log_p

__all__ = ["jaxpr_has_logs", "eqn_has_logs", "sites_in", "sites_in_eqn"]

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
