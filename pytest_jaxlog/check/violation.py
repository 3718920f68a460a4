"""Values in violations and checker states as strict JSON (and as short text for messages).

Violations and checker states go into the trajectory file's JSON attributes, which must stay
valid JSON (no NaN literals) and must never need pickle: non-finite floats become the strings
``"nan"``/``"inf"``/``"-inf"``, complex numbers ``{"real", "imag"}``, arrays nested lists.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import JaxlogAssertionError, JaxlogError, JaxlogRuntimeWarning

_SPECIAL = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def fmt(v: Any) -> str:
    """Short human form of a value for messages (6 significant digits)."""
    if v is None:
        return "None"
    if isinstance(v, str):
        return v
    if isinstance(v, np.ndarray) and v.ndim > 0:
        return np.array2string(v, threshold=8, precision=6, separator=", ")
    if isinstance(v, np.ndarray):
        v = v.item()
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (complex, np.complexfloating)):
        v = complex(v)
        return f"({v.real:.6g}{v.imag:+.6g}j)"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {fmt(x)}" for k, x in v.items()) + "}"
    try:
        return f"{float(v):.6g}"
    except (TypeError, ValueError):  # not a number: its text is the best short form
        return str(v)


def encode(v: Any) -> Any:
    """JSON-able form: floats as floats, non-finite floats as "nan"/"inf"/"-inf", arrays as lists."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, np.ndarray):
        if v.ndim == 0:
            return encode(v.item())
        return [encode(x) for x in v]
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (complex, np.complexfloating)):
        v = complex(v)
        return {"real": encode(v.real), "imag": encode(v.imag)}
    if isinstance(v, (float, np.floating)) or hasattr(v, "__float__"):
        f = float(v)
        if math.isnan(f):
            return "nan"
        if math.isinf(f):
            return "inf" if f > 0 else "-inf"
        return f
    if isinstance(v, dict):
        return {str(k): encode(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [encode(x) for x in v]
    return str(v)


def decode(v: Any) -> Any:
    """Inverse of :func:`encode`: numeric lists come back as numpy arrays."""
    if v is None:
        return None
    if isinstance(v, str):
        return _SPECIAL.get(v, v)
    if isinstance(v, dict):
        if set(v) == {"real", "imag"}:
            return complex(decode(v["real"]), decode(v["imag"]))
        return {k: decode(x) for k, x in v.items()}
    if isinstance(v, list):
        items = [decode(x) for x in v]
        try:
            arr = np.asarray(items)
        except ValueError:  # ragged or mixed: the list itself is the value
            return items
        return arr if arr.dtype.kind in "biufc" else items
    return v


def decode_array(v: Any, dtype: Any, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """:func:`decode` into an array of ``dtype`` (and ``shape``, the leading axis free) for
    checker states, whose arrays must compare and concatenate like the live values did."""
    out = np.asarray(decode(v)).astype(dtype)
    if shape is not None:
        out = out.reshape((-1, *shape))
    return out

# ---------------------------------------------------------------------------------------------
# The failure of an invariant: where it broke (step, system, leaf, element), what was seen and
# expected, and the evidence, as a message a person can act on and as strict JSON for the file.
#
# Also what a driver does with one (``on_violation=``): raise it, warn with it, or only record it.

ON_VIOLATION = ("raise", "warn", "record")


class InvariantViolation(JaxlogAssertionError):
    """An invariant failed at ``step`` (and ``system`` in batched runs); the message says what to look at.

    A ``jl.JaxlogError`` and an ``AssertionError``: pytest shows it as a failed check. ``expected``
    is the reference value for ``conserved`` (``tolerance`` is the allowed ``atol + rtol*|ref|``)
    and a human string otherwise. ``recent`` lists the last few ``(step, value)`` recorded for the
    same record/system/element, up to and including ``step``. ``record`` is the leaf that broke;
    ``group`` the record group the invariant was given when that leaf is one of several under it
    (``conserved("energy")`` on ``energy/total``), so the message names both. ``name_leaf=False``
    leaves the leaf out of the location when the invariant's own name already says it.
    """

    def __init__(
        self,
        invariant: str,
        *,
        record: str,
        step: int,
        system: int | None = None,
        index: tuple[int, ...] | None = None,
        value: Any = None,
        expected: Any = None,
        tolerance: float | None = None,
        detail: str | None = None,
        recent: Sequence[tuple[int, Any]] = (),
        artifacts: dict[str, Any] | None = None,
        group: str | None = None,
        name_leaf: bool = True,
    ):
        self.invariant = invariant
        self.record = record
        self.step = int(step)
        self.system = None if system is None else int(system)
        self.index = None if index is None else tuple(int(i) for i in index)
        self.value = value
        self.expected = expected
        self.tolerance = None if tolerance is None else float(tolerance)
        self.detail = detail
        self.recent = [(int(s), v) for s, v in recent]
        self.artifacts = dict(artifacts or {})
        self.group = group
        self.name_leaf = bool(name_leaf or group is not None or index is not None)
        super().__init__(self._message())

    # -- message
    def _element(self) -> str:
        return "" if self.index is None else "[" + ", ".join(map(str, self.index)) + "]"

    def _location(self) -> str:
        out = f" at step {self.step}"
        if self.system is not None:
            out += f" (system {self.system})"
        if self.name_leaf:
            out += f" in {self.record}{self._element()}"
            if self.group is not None:
                out += f" (leaf of record group {self.group})"
        return out

    def _message(self) -> str:
        if self.tolerance is not None:
            expected = f"{fmt(self.expected)} ± {fmt(self.tolerance)}"
        else:
            expected = fmt(self.expected)
        head = f"[jaxlog] invariant {self.invariant} violated{self._location()}: value {fmt(self.value)}, expected {expected}"
        if self.detail:
            head += f" ({self.detail})"
        lines = [head]
        if self.recent:
            what = self.record + self._element()
            if self.system is not None:
                what += f" (system {self.system})"
            lines.append(f"  last recorded values of {what}:")
            width = max(len(str(s)) for s, _ in self.recent)
            lines.extend(f"    step {s:>{width}}: {fmt(v)}" for s, v in self.recent)
        for kind, path in self.artifacts.items():
            lines.append(f"  {kind}: {path}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.args[0] if self.args else self._message()

    def with_artifacts(self, artifacts: dict[str, Any], *, replace: bool = False) -> "InvariantViolation":
        """Add the files where the evidence lives (trajectory, trace) and refresh the message;
        ``replace=True``: these files instead of those named so far (the pytest plugin names the
        ones a person opens, as paths relative to the project, in place of the driver's)."""
        if replace:
            self.artifacts.clear()
        self.artifacts.update(artifacts or {})
        self.args = (self._message(),)
        return self

    # -- JSON (stored in the trajectory file; no pickle)
    def to_json(self) -> dict:
        return {
            "invariant": self.invariant,
            "record": self.record,
            "group": self.group,
            "name_leaf": self.name_leaf,
            "step": self.step,
            "system": self.system,
            "index": None if self.index is None else list(self.index),
            "value": encode(self.value),
            "expected": encode(self.expected),
            "tolerance": encode(self.tolerance),
            "detail": self.detail,
            "recent": [[s, encode(v)] for s, v in self.recent],
            "artifacts": {k: str(v) for k, v in self.artifacts.items()},
            "message": self._message(),
        }

    @classmethod
    def from_json(cls, data: dict) -> "InvariantViolation":
        index = data.get("index")
        return cls(
            data["invariant"],
            record=data["record"],
            step=data["step"],
            system=data.get("system"),
            index=None if index is None else tuple(index),
            value=decode(data.get("value")),
            expected=decode(data.get("expected")),
            tolerance=decode(data.get("tolerance")),
            detail=data.get("detail"),
            recent=[(s, decode(v)) for s, v in data.get("recent", [])],
            artifacts={k: Path(v) for k, v in (data.get("artifacts") or {}).items()},
            group=data.get("group"),
            name_leaf=data["name_leaf"] if "name_leaf" in data else _named_in(data),
        )

    def __reduce__(self):  # copy/deepcopy/multiprocessing without a custom pickle format
        return (InvariantViolation.from_json, (self.to_json(),))

    def __repr__(self) -> str:
        sys = "" if self.system is None else f", system={self.system}"
        return f"InvariantViolation({self.invariant!r}, record={self.record!r}, step={self.step}{sys})"


def _named_in(data: dict) -> bool:
    """Files written before ``name_leaf`` was stored: whether their message named the leaf."""
    return f" in {data['record']}" in str(data.get("message", f" in {data['record']}"))


def check_on_violation(mode: Any) -> str:
    """``on_violation=`` as given, or a JaxlogError listing the choices."""
    if mode not in ON_VIOLATION:
        raise JaxlogError(f"on_violation must be one of {', '.join(map(repr, ON_VIOLATION))}, got {mode!r}")
    return mode


def warn_violation(violation: InvariantViolation, stacklevel: int = 2) -> None:
    """``on_violation="warn"``: a JaxlogRuntimeWarning whose ``.violation`` is the InvariantViolation.

    To make such warnings fail a test, use pytest's ``-W error::pytest_jaxlog.JaxlogRuntimeWarning``
    (or ``filterwarnings`` in the config).
    """
    w = JaxlogRuntimeWarning(str(violation))
    w.violation = violation  # type: ignore[attr-defined]
    warnings.warn(w, stacklevel=stacklevel + 1)
