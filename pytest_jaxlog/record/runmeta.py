"""A run's metadata: ``jl.run(..., meta={...})``, JSON kept with the trajectory.

Why: what describes a run but is no array (a configuration, a solver's convergence message, a
dataset's name) has no place in records, and ``jl.log`` takes arrays only. It is stored in the
file with the run's own description (the ``/jaxlog`` ``meta`` attribute, as JSON: H5MD tools
ignore it, ``traj.meta`` reads it back), as ``{"run": {"driver": ..., "meta": {...}}}``, and
listed in the manifest.

Values are JSON as written: strings, numbers (finite), bools, None, lists and dicts with string
keys. Anything else is refused where it is given, naming the key, not turned into its ``repr``;
the JSON text is bounded (``MAX_BYTES``), and so is what a reader accepts of a file's
description (``READ_MAX_BYTES``: a hostile file cannot make the reader allocate more).
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..errors import JaxlogError

__all__ = ["check_meta", "run_meta", "described_run", "MAX_BYTES", "READ_MAX_BYTES", "KEY"]

KEY = "meta"  # the key of the run's metadata in the description sinks get (and the file keeps)
MAX_BYTES = 1 << 20  # the JSON text of a run's metadata: a description, not data
READ_MAX_BYTES = 16 << 20  # the description attribute a reader accepts: metadata, layout of processes and all

_ADVICE = "JSON values: strings, numbers, bools, None, lists, dicts with string keys"


def check_meta(meta: Any, where: str = "meta=") -> dict:
    """``meta`` as a plain JSON dict (tuples as lists, numpy scalars as numbers), or one
    :class:`JaxlogError` naming the key whose value is not JSON."""
    if not isinstance(meta, dict):
        raise JaxlogError(f"{where} must be a dict of {_ADVICE}, got {type(meta).__name__}")
    out = _plain(meta, "", where)
    size = len(json.dumps(out).encode())
    if size > MAX_BYTES:
        raise JaxlogError(f"{where} is {size} bytes of JSON, more than {MAX_BYTES} a run's metadata may take: "
                          f"arrays and long data belong in records, jl.log or an artifact file")
    return out


def _plain(value: Any, path: str, where: str) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise JaxlogError(f"{where} {path or '(the value)'!r} is {value}, which JSON cannot hold")
        return value
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == () and getattr(value, "dtype", None) is not None:
        if getattr(value.dtype, "kind", None) in ("b", "i", "u", "f"):  # a numpy or jax scalar number
            return _plain(item(), path, where)
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise JaxlogError(f"{where} key {k!r} under {path or '(the top)'!r} is a {type(k).__name__}; JSON "
                                  f"object keys are strings")
            out[k] = _plain(v, f"{path}/{k}" if path else k, where)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{path}[{i}]", where) for i, v in enumerate(value)]
    raise JaxlogError(f"{where} {path or '(the value)'!r} is a {type(value).__name__}, not JSON ({_ADVICE}); "
                      f"arrays belong in records or jl.log")


def run_meta(description: dict) -> dict:
    """A run's metadata from the description its sinks got (``traj.meta``): ``{}`` for a run
    given none. A description no driver wrote (a sink opened by hand with its caller's own
    dict) is that caller's metadata as it is."""
    run = described_run(description)
    if run is None:
        return dict(description)
    meta = run.get(KEY)
    return dict(meta) if isinstance(meta, dict) else {}


def described_run(description: dict) -> dict | None:
    """The run's part of a description a driver wrote (``{"run": {"driver": ...}}``), else None."""
    run = description.get("run")
    return run if isinstance(run, dict) and "driver" in run else None
