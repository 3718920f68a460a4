"""What a golden file says of itself: the comparison options ``check_golden`` checks it with and
the platform it was made on (``/jaxlog`` attribute ``golden``, written when it is created or
regenerated).

Why: a golden is only half a reference without its tolerance. ``jaxlog diff`` of a fresh run
against it at the CLI's default tolerance reported differences the test accepts; with the
tolerance in the file, both compare the same way. The platform (backend, device kind, jax
version, x64) says why a golden made elsewhere may differ, and with ``jax_range`` (the jax
versions the golden stands for) which platform's entry it is (``golden_entries``). Files written
before this existed have no such attribute and are compared as before. JSON only, validated when
read: a field that is there but not what it should be (a NaN or negative tolerance, a record
name that is not a string) is one ``JaxlogError`` naming the file and the field, since a gate
that silently loses its tolerance or records compares something else than it says.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import JaxlogError
from ..record.schedule import schedule_from_json

PLATFORM_KEYS = ("backend", "device_kind", "jax", "x64")


def platform(provenance: dict) -> dict:
    """The platform fields of a provenance record (``jl.Trajectory.provenance``)."""
    return {k: provenance.get(k) for k in PLATFORM_KEYS}


def describe(options: dict[str, Any], provenance: dict, jax_range: dict | None = None) -> dict[str, Any]:
    """The ``golden`` attribute for comparison ``options`` (rtol, atol, records, steps, equal_nan,
    defaults applied), the provenance of the run the golden is made from and the jax versions it
    stands for (``{"from": "0.10.2", "below": "0.11"}``; None: the running jax's minor series)."""
    records = options.get("records")
    made = platform(provenance)
    return {
        "rtol": float(options["rtol"]),
        "atol": float(options["atol"]),
        "records": None if records is None else [records] if isinstance(records, str) else list(records),
        "steps": _steps_json(options.get("steps")),
        "equal_nan": bool(options.get("equal_nan", True)),
        "tolerances": _tolerances_json(options.get("tolerances")),
        "platform": made,
        "jax_range": jax_range or minor_series(made.get("jax")),
    }


def minor_series(version: Any) -> dict | None:
    """``{"from": "0.12.0.1", "below": "0.13"}``: the versions of ``version``'s minor series from it
    on (XLA's numerics change between minor releases); None for an unknown version."""
    parts = version_tuple(version)
    if parts is None:
        return None
    major, minor = (parts + (0, 0))[:2]
    return {"from": str(version), "below": f"{major}.{minor + 1}"}


def version_tuple(version: Any) -> tuple[int, ...] | None:
    """``"0.12.0.1"`` -> ``(0, 12, 0, 1)``; the numeric release part only (``0.5.0.dev1`` -> (0, 5, 0));
    None when it does not start with a number."""
    if not isinstance(version, str):
        return None
    out: list[int] = []
    for part in version.split("."):
        digits = ""
        for c in part:
            if not c.isdigit():
                break
            digits += c
        if not digits:
            break
        out.append(int(digits))
        if len(digits) < len(part):
            break
    return tuple(out) or None


def options(info: dict[str, Any], where: str = "golden") -> dict[str, Any]:
    """The comparison options a golden's ``golden`` attribute stores (those it holds), validated:
    a field present but not of its kind (a tolerance NaN, infinite or negative, a record that is
    not a name) is a JaxlogError naming ``where`` (the file) and the field."""
    out: dict[str, Any] = {}
    for key in ("rtol", "atol"):
        value = info.get(key)
        if value is None:
            continue
        if not _is_number(value) or not math.isfinite(value) or value < 0:
            raise invalid(where, key, value, "a finite number >= 0")
        out[key] = float(value)
    records = info.get("records")
    if records is not None:
        if not (isinstance(records, list) and records and all(isinstance(r, str) and r for r in records)):
            raise invalid(where, "records", records, "a list of record names")
        out["records"] = list(records)
    if info.get("steps") is not None:
        steps = _steps_from_json(info["steps"])
        if steps is None:
            raise invalid(where, "steps", info["steps"], "a slice, step numbers or a schedule")
        out["steps"] = steps
    if info.get("tolerances") is not None:
        out["tolerances"] = _tolerances_read(info["tolerances"], where)
    if info.get("equal_nan") is not None:
        if not isinstance(info["equal_nan"], bool):
            raise invalid(where, "equal_nan", info["equal_nan"], "true or false")
        out["equal_nan"] = info["equal_nan"]
    stored_platform(info, where)  # the rest of the attribute is validated on the same read
    stored_range(info, where)
    return out


def _tolerances_json(tolerances: Any) -> dict | None:
    """Per-record tolerances (and what else a calibration keeps of each record: its spread) as JSON."""
    if tolerances is None:
        return None
    return {str(k): {str(n): float(v) for n, v in entry.items()} for k, entry in tolerances.items()}


def _tolerances_read(doc: Any, where: str) -> dict:
    """Stored per-record tolerances: ``{record: {"rtol": x, "atol": y, ...}}``, every figure finite, >= 0."""
    if not isinstance(doc, dict):
        raise invalid(where, "tolerances", doc, 'an object {record: {"rtol": ..., "atol": ...}}')
    for record, entry in doc.items():
        if not isinstance(entry, dict) or not entry:
            raise invalid(where, f"tolerances.{record}", entry, 'an object {"rtol": ..., "atol": ...}')
        for name, value in entry.items():
            if not _is_number(value) or not math.isfinite(value) or value < 0:
                raise invalid(where, f"tolerances.{record}.{name}", value, "a finite number >= 0")
    return {record: dict(entry) for record, entry in doc.items()}


def stored_platform(info: dict[str, Any], where: str = "golden") -> dict | None:
    """The platform a golden's attribute says it was made on, validated (None when it says none)."""
    made = info.get("platform")
    if made is None:
        return None
    kinds = {"backend": str, "device_kind": str, "jax": str, "x64": bool}
    if not isinstance(made, dict):
        raise invalid(where, "platform", made, "an object (backend, device_kind, jax, x64)")
    for key, kind in kinds.items():
        if made.get(key) is not None and not isinstance(made[key], kind):
            raise invalid(where, f"platform.{key}", made[key], f"a {kind.__name__}")
    return {k: made.get(k) for k in PLATFORM_KEYS}


def stored_range(info: dict[str, Any], where: str = "golden") -> dict | None:
    """The jax versions a golden stands for (``{"from", "below"}``), validated; None when absent."""
    doc = info.get("jax_range")
    if doc is None:
        return None
    if not (isinstance(doc, dict) and all(version_tuple(doc.get(k)) is not None for k in ("from", "below"))):
        raise invalid(where, "jax_range", doc, 'an object {"from": VERSION, "below": VERSION}')
    return {"from": doc["from"], "below": doc["below"]}


def invalid(where: str, field: str, value: Any, wanted: str) -> JaxlogError:
    """The error for a stored field that is not what it should be."""
    return JaxlogError(f"[jaxlog] {where}: stored field {field!r} is {value!r:.80}, expected {wanted}; "
                       "fix the file or regenerate it with --jaxlog-regen")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


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
