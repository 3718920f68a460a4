"""The built-in invariants as JSON, so a checkpoint can say which ones its run checked and a
resume can check them again without being told (``jl.resume`` without ``invariants=``).

Why only the built-ins: their arguments are numbers, record names and schedules, which JSON holds
whole; ``jl.invariant``'s predicate (and any subclass) is code, which a file must never hold (opening
one runs none). Such an invariant has no spec, and a resume asks for ``invariants=``.
"""

from __future__ import annotations

from typing import Any

from ..errors import JaxlogError
from ..record.schedule import schedule_from_json
from .aggregate import aggregate
from .checker import Invariant
from .invariants import bounded, conserved, finite, monotonic

__all__ = ["spec_of", "from_spec"]


def spec_of(inv: Any) -> dict | None:
    """``{"kind": ..., <its arguments>}``, or None for an invariant that is code (see above): only
    the built-in classes themselves, not subclasses, which may check otherwise."""
    kind = type(inv)
    if kind is finite:
        return {"kind": "finite", "records": list(inv.records)}
    if kind is bounded:
        return {"kind": "bounded", "record": inv.record, **inv.bounds._asdict()}
    if kind is conserved:
        return {"kind": "conserved", "record": inv.record, "rtol": inv.rtol, "atol": inv.atol}
    if kind is monotonic:
        return {"kind": "monotonic", "record": inv.record, "increasing": inv.increasing, "strict": inv.strict}
    if kind is aggregate:
        return {"kind": "aggregate", "record": inv.record, "reduce": inv.reduce, **inv.bounds._asdict(),
                "steps": None if inv.steps is None else inv.steps.to_json()}
    return None


def from_spec(spec: Any, name: str, where: str) -> Invariant:
    """The invariant ``spec`` describes, named ``name`` as the file's run named it (the name its
    saved state is matched by); a spec that is not one gives a ``JaxlogError`` naming ``where``."""
    try:
        kind = spec["kind"]
        if kind == "finite":
            inv: Invariant = finite(*spec["records"])
        elif kind == "bounded":
            inv = bounded(spec["record"], spec["lo"], spec["hi"], atol=spec["atol"])
        elif kind == "conserved":
            inv = conserved(spec["record"], rtol=spec["rtol"], atol=spec["atol"])
        elif kind == "monotonic":
            inv = monotonic(spec["record"], increasing=spec["increasing"], strict=spec["strict"])
        elif kind == "aggregate":
            steps = None if spec["steps"] is None else schedule_from_json(spec["steps"])
            inv = aggregate(spec["record"], spec["reduce"], lo=spec["lo"], hi=spec["hi"], steps=steps,
                            atol=spec["atol"])
        else:
            raise JaxlogError(f"unknown kind {kind!r}")
    except (JaxlogError, KeyError, TypeError, ValueError) as exc:
        cause = str(exc).removeprefix("[jaxlog] ")
        raise JaxlogError(f"{where}: invariant {name} cannot be rebuilt from the file ({type(exc).__name__}: "
                          f"{cause}); pass invariants= to jl.resume") from None
    inv.name = name
    return inv
