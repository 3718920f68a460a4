"""Which frames an index into a record selects, so that only those are read from disk.

``traj[name, index]`` has numpy's semantics on the record's ``[frames, *shape]`` array. A file
holds up to millions of frames, so the frame-axis part of the index (an int, a slice, an int or
bool array) is turned into the frames to read, in increasing order (what h5py and the part
files read), and the index that, applied to those frames alone, gives ``values[index]``:
trailing indices (``traj["x", 2:4, 1]``), advanced indices broadcasting together and
out-of-range errors behave exactly as on the whole array. Anything else on the frame axis
(``...``, ``None``, a mask over several axes) selects every frame and lets numpy index them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class FrameSelection(NamedTuple):
    """``rows``: the frames to read (a slice with a positive step, an increasing index array, or
    None for all of them); ``index``: what to apply to the array of those frames."""

    rows: slice | np.ndarray | None
    index: Any


def select_frames(index: Any, n: int) -> FrameSelection:
    """The frames ``index`` selects among ``n``, and the index into them (``()`` for none)."""
    if index is None:
        return FrameSelection(None, ())
    if isinstance(index, tuple):
        first, rest = (index[0], index[1:]) if index else (slice(None), ())
    else:
        first, rest = index, ()
    if first is Ellipsis or first is None:
        return FrameSelection(None, index)
    if isinstance(first, (int, np.integer)) and not isinstance(first, (bool, np.bool_)):
        i = int(first)
        if not -n <= i < n:
            raise IndexError(f"frame index {i} out of range for {n} frames")
        return FrameSelection(slice(i % n, i % n + 1), (0, *rest))
    if isinstance(first, slice):
        start, stop, step = first.indices(n)
        if step > 0:
            return FrameSelection(slice(start, stop, step) if stop > start else slice(0, 0), (slice(None), *rest))
        return FrameSelection(np.arange(start, stop, step)[::-1], (slice(None, None, -1), *rest))
    arr = np.asarray(first)
    if arr.dtype == np.bool_:
        if arr.ndim != 1:  # a mask over more than the frame axis: numpy applies it to every frame
            return FrameSelection(None, index)
        if len(arr) != n:
            raise IndexError(f"boolean frame index of length {len(arr)} for {n} frames")
        arr = np.flatnonzero(arr)
    idx = np.arange(n)[arr]  # IndexError for out-of-range entries, like numpy
    rows, inverse = np.unique(idx, return_inverse=True)
    return FrameSelection(rows, (inverse.reshape(idx.shape), *rest))


def row_numbers(rows: slice | np.ndarray | None, n: int) -> np.ndarray:
    """A selection's frames as an index array."""
    if rows is None:
        return np.arange(n)
    if isinstance(rows, slice):
        return np.arange(n)[rows]
    return rows
