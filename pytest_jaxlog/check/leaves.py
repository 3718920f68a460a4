"""Reading one leaf's frames the way every invariant needs: which kind of numbers it holds, values
in a dtype numpy compares exactly, and the first violating frame, system and element of a mask.

The search order (frame first, then system, then element) is what makes a violation's location
independent of how the run split its steps into batches.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..record.frames import LeafSpec


def leaf_kind(leaf: LeafSpec) -> str:
    """'key', 'bool', 'int', 'float', 'complex' or 'other' (bfloat16 and other ml_dtypes floats are 'float')."""
    if leaf.key_impl is not None:
        return "key"
    dt = np.dtype(leaf.dtype)
    if dt.kind == "b":
        return "bool"
    if dt.kind in "iu":
        return "int"
    if dt.kind == "f":
        return "float"
    if dt.kind == "c":
        return "complex"
    import ml_dtypes

    try:  # bfloat16, float8_*: numpy kind 'V'
        ml_dtypes.finfo(dt)
    except ValueError:  # not a float type ml_dtypes knows: nothing numeric to check
        return "other"
    return "float"


def numeric_dtype(leaf: LeafSpec) -> np.dtype:
    """The dtype values of ``leaf`` are compared in: float64 for floats (bfloat16 included),
    complex128 for complex, the leaf's own dtype otherwise."""
    kind = leaf_kind(leaf)
    if kind == "float":
        return np.dtype(np.float64)
    if kind == "complex":
        return np.dtype(np.complex128)
    return np.dtype(leaf.dtype)


def as_numeric(leaf: LeafSpec, values: np.ndarray) -> np.ndarray:
    """``values`` in :func:`numeric_dtype` (no copy when already there)."""
    return np.asarray(values).astype(numeric_dtype(leaf), copy=False)


def isnan(v: Any) -> bool:
    try:
        return bool(np.any(np.isnan(v)))
    except TypeError:  # ints, bools, strings: never NaN
        return False


def scalar(v: Any) -> Any:
    """A 0-d array or numpy scalar as a Python number; anything else unchanged."""
    if isinstance(v, np.ndarray) and v.ndim == 0:
        return v.item()
    if isinstance(v, np.generic):
        return v.item()
    return v


class Spot(NamedTuple):
    """Where in a batch a mask first says "violated"."""

    frame: int
    system: int | None
    index: tuple[int, ...] | None


def locate(mask: np.ndarray, batched: bool) -> Spot | None:
    """First violating frame; then the first system at that frame; then the first element.

    ``mask`` is (n_frames, *leaf_shape) with True where violated. With ``batched``, axis 1 is the
    system axis.
    """
    n = mask.shape[0]
    if n == 0:
        return None
    per_frame = mask.reshape(n, -1).any(axis=1)
    f = int(np.argmax(per_frame))
    if not per_frame[f]:
        return None
    row = mask[f]
    system = None
    if batched and row.ndim >= 1:
        per_sys = row.reshape(row.shape[0], -1).any(axis=1)
        system = int(np.argmax(per_sys))
        row = row[system]
    if row.ndim == 0:
        return Spot(f, system, None)
    elem = int(np.argmax(row.ravel()))
    return Spot(f, system, tuple(int(i) for i in np.unravel_index(elem, row.shape)))


def pick(values: np.ndarray, system: int | None, index: tuple[int, ...] | None) -> np.ndarray:
    """values[:, system, *index] (values: (n, *leaf_shape)); the frame axis stays."""
    out = values
    if system is not None:
        out = out[:, system]
    if index is not None:
        out = out[(slice(None), *index)]
    return out


def element(values: np.ndarray, system: int | None, index: tuple[int, ...] | None) -> Any:
    """values[system, *index] of one frame (no frame axis) as a Python number."""
    return scalar(pick(np.asarray(values)[None], system, index)[0])
