"""Frames a sink keeps past its ``write``: never views of a device's buffers.

Why: on the CPU the driver hands a large set of record buffers to the sinks as read-only views
(no copy, see ``drive.chunks.VIEW_BYTES``); a view keeps its whole set alive, unused rows
included. A sink that returns from ``write`` having used the frames costs nothing more; one that
keeps them (in memory, or queued for a writer thread) copies such a view, once, to what it
keeps: its own memory then matches the frames it holds, and the set is freed with the batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..record.frames import Frames

__all__ = ["device_view", "holds_device_views", "owned", "owned_frames", "copied_views"]


def device_view(values: Any) -> bool:
    """Whether ``values`` is a numpy view of memory exported through DLPack (a device buffer)."""
    if not isinstance(values, np.ndarray):
        return False
    root = values
    while isinstance(root.base, np.ndarray):
        root = root.base
    return root.base is not None and type(root.base).__name__ == "PyCapsule"


def owned(values: Any) -> Any:
    """``values``, or a copy of it when it is a view of a device buffer."""
    return np.array(values) if device_view(values) else values


def holds_device_views(frames: Frames) -> bool:
    """Whether a value of ``frames`` is a view of a device buffer."""
    return any(device_view(v) for v in frames.values.values())


def owned_frames(frames: Frames) -> Frames:
    """``frames`` itself, or (when a value is a view of a device buffer) a batch holding copies."""
    return copied_views(frames) if holds_device_views(frames) else frames


def copied_views(frames: Frames) -> Frames:
    """A batch of ``frames``' values with each view of a device buffer copied (for a caller that
    has already found one, ``holds_device_views``)."""
    out = Frames()
    for path, values in frames.values.items():
        out.add(path, frames.steps[path], owned(values))
    return out
