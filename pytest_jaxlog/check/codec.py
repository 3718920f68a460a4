"""Values in violations and checker states as strict JSON (and as short text for messages).

Violations and checker states go into the trajectory file's JSON attributes, which must stay
valid JSON (no NaN literals) and must never need pickle: non-finite floats become the strings
``"nan"``/``"inf"``/``"-inf"``, complex numbers ``{"real", "imag"}``, arrays nested lists.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

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
