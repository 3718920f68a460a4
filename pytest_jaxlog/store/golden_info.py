"""What a golden file says of itself: the comparison options ``check_golden`` checks it with and
the platform it was made on (``/jaxlog`` attribute ``golden``, written when it is created or
regenerated).

Why: a golden is only half a reference without its tolerance. ``jaxlog diff`` of a fresh run
against it at the CLI's default tolerance reported differences the test accepts; with the
tolerance in the file, both compare the same way. The platform (backend, device kind, jax
version, x64) says why a golden made elsewhere may differ. Files written before this existed
have no such attribute and are compared as before. JSON only, read back defensively: a field
that is not what it should be reads as absent.
"""

from __future__ import annotations

from typing import Any

from ..errors import JaxlogError
from ..record.schedule import schedule_from_json

PLATFORM_KEYS = ("backend", "device_kind", "jax", "x64")


def platform(provenance: dict) -> dict:
    """The platform fields of a provenance record (``jl.Trajectory.provenance``)."""
    return {k: provenance.get(k) for k in PLATFORM_KEYS}


def describe(options: dict[str, Any], provenance: dict) -> dict[str, Any]:
    """The ``golden`` attribute for comparison ``options`` (rtol, atol, records, steps, equal_nan,
    defaults applied) and the provenance of the run the golden is made from."""
    records = options.get("records")
    return {
        "rtol": float(options["rtol"]),
        "atol": float(options["atol"]),
        "records": None if records is None else [records] if isinstance(records, str) else list(records),
        "steps": _steps_json(options.get("steps")),
        "equal_nan": bool(options.get("equal_nan", True)),
        "platform": platform(provenance),
    }


def options(info: dict[str, Any]) -> dict[str, Any]:
    """The comparison options a golden's ``golden`` attribute stores (only those it holds, valid)."""
    out: dict[str, Any] = {}
    for key in ("rtol", "atol"):
        value = info.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            out[key] = float(value)
    records = info.get("records")
    if isinstance(records, list) and records and all(isinstance(r, str) and r for r in records):
        out["records"] = list(records)
    steps = _steps_from_json(info.get("steps"))
    if steps is not None:
        out["steps"] = steps
    if isinstance(info.get("equal_nan"), bool):
        out["equal_nan"] = info["equal_nan"]
    return out


def platform_line(p: dict) -> str:
    """``backend 'cpu', device kind 'cpu', jax 0.10.2, x64 off``."""
    x64 = p.get("x64")
    return (f"backend {p.get('backend')!r}, device kind {p.get('device_kind')!r}, jax {p.get('jax')}, "
            f"x64 {'?' if x64 is None else 'on' if x64 else 'off'}")


def _steps_json(steps: Any) -> Any:
    """``steps=`` as JSON: a slice or range, step numbers, or a schedule; None when not given."""
    if steps is None:
        return None
    if isinstance(steps, (slice, range)):
        return {"slice": [steps.start, steps.stop, steps.step]}
    if hasattr(steps, "to_json"):
        return {"schedule": steps.to_json()}
    if not hasattr(steps, "__iter__"):  # one step number (numpy integers too)
        return {"steps": [int(steps)]}
    return {"steps": [int(s) for s in steps]}


def _steps_from_json(doc: Any) -> Any:
    if not isinstance(doc, dict):
        return None
    bounds = doc.get("slice")
    if isinstance(bounds, list) and len(bounds) == 3 and all(b is None or _is_int(b) for b in bounds):
        return slice(*bounds)
    steps = doc.get("steps")
    if isinstance(steps, list) and steps and all(_is_int(s) and s >= 0 for s in steps):
        return list(steps)
    if isinstance(doc.get("schedule"), dict):
        try:
            return schedule_from_json(doc["schedule"])
        except (JaxlogError, TypeError, ValueError, KeyError):  # damaged: absent, as any other bad field
            return None
    return None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
