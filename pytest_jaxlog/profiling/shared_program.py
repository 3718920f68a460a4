"""Whether a benchmark's reference runs the kernel's own program, which makes it useless as a
yardstick for the kernel's regressions.

Why it matters: a ratio to a reference cancels whatever slows both alike. That is the point for
the machine's load, and the trap for a reference built from the kernel under test (the same step,
the step applied twice, a scan of it): a regression of the kernel's code slows the reference as
much, the ratio does not move, and a gate relative to it passes a kernel that got twice as slow.
A reference must share no code with the kernel for the ratio to show the kernel's own changes.

How it is told: both are traced (``jax.make_jaxpr``, no compiling, no running) to the sequence of
their operations, each written as its primitive, parameters and operand types, with ``jit`` and
other call wrappers inlined (a jitted step is the same program as the plain one) and loops kept
as markers around their bodies (a scan of the step holds the step's operations in a row). The
reference shares the kernel's program when the two sequences are equal, or when either holds the
other whole, in a row, with at least ``MIN_SHARED`` operations (a lone multiply in common is not
a shared program). Programs that cannot be traced (a reference that is not a JAX function) are
not judged.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

__all__ = ["shared_program", "operations"]

MIN_SHARED = 4
_INLINED = {"jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr",
            "checkpoint", "remat", "remat2", "custom_lin"}
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+|0x[0-9a-fA-F]{6,}")


def operations(fn: Callable, *args: Any) -> list[str]:
    """``fn(*args)`` as the sequence of its operations (module doc); raises whatever tracing raises."""
    import jax

    return _flatten(jax.make_jaxpr(fn)(*args).jaxpr)


def _flatten(jaxpr: Any) -> list[str]:
    from jax.extend.core import jaxprs_in_params

    out: list[str] = []
    for eqn in jaxpr.eqns:
        subs = list(jaxprs_in_params(eqn.params))
        name = eqn.primitive.name
        if subs and name in _INLINED:
            for sub in subs:
                out += _flatten(sub)
            continue
        text = f"{name}[{_params(eqn.params)}]({_operands(eqn.invars)})->({_operands(eqn.outvars)})"
        if not subs:
            out.append(text)
            continue
        out.append(text + "{")
        for sub in subs:
            out += _flatten(sub)
            out.append("|")
        out.append("}")
    return out


def _params(params: dict) -> str:
    from jax.extend.core import ClosedJaxpr, Jaxpr

    def plain(v: Any) -> bool:
        if isinstance(v, (ClosedJaxpr, Jaxpr)):
            return False
        return not (isinstance(v, (tuple, list)) and any(isinstance(x, (ClosedJaxpr, Jaxpr)) for x in v))

    return ",".join(f"{k}={_ADDRESS.sub('', str(v))}" for k, v in sorted(params.items()) if plain(v))


def _operands(vs: Sequence[Any]) -> str:
    from jax.extend.core import Literal

    return ",".join(f"{v.aval}={v.val!r}" if isinstance(v, Literal) else str(v.aval) for v in vs)


def _holds(big: list[str], small: list[str]) -> bool:
    """Whether ``small`` occurs in ``big`` in a row (Knuth-Morris-Pratt: linear in their lengths)."""
    if not small or len(small) > len(big):
        return False
    fail = [0] * len(small)
    k = 0
    for i in range(1, len(small)):
        while k and small[i] != small[k]:
            k = fail[k - 1]
        if small[i] == small[k]:
            k += 1
        fail[i] = k
    k = 0
    for x in big:
        while k and x != small[k]:
            k = fail[k - 1]
        if x == small[k]:
            k += 1
            if k == len(small):
                return True
    return False


def shared_program(kernel: Callable[[], list[str]], reference: Callable[[], list[str]]) -> str | None:
    """Why the reference is not independent of the kernel (a sentence), or None: independent, or
    not known (either could not be traced). ``kernel``/``reference`` give their operations."""
    try:
        mine, theirs = kernel(), reference()
    except Exception:  # not traceable as a JAX function: nothing to judge
        return None
    work = [op for op in mine if op not in ("|", "}")]
    if not work:
        return None
    if mine == theirs:
        return "the reference runs the same program as the kernel's step"
    if len(work) >= MIN_SHARED and _holds(theirs, mine):
        return f"the reference runs the kernel's whole step inside it ({len(work)} operations)"
    ref_work = [op for op in theirs if op not in ("|", "}")]
    if len(ref_work) >= MIN_SHARED and _holds(mine, theirs):
        return f"the kernel's step runs the reference's whole program inside it ({len(ref_work)} operations)"
    return None
