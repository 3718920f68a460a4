"""What a ``jl.run`` recording large arrays holds in memory, at most: the bound that
``docs/memory.md`` states, ``benchmarks/memory.py`` prints beside what it measures and
``tests/test_memory_bound.py`` holds the driver to.

Why a formula and not a number: what a run holds is its record buffers (a *set* per chunk in
flight, sized by the chunk budget) and what the sinks keep (the HDF5 writer's queue, bounded in
bytes), and each of those follows from the record's size, the budget and the queue's bound. The
kernel's own memory (its state, what XLA needs to compute a step) is not counted: it is the
same without recording anything.

- One set: every-step records take ``C + 1`` rows (row 0 holds the initial frame of the run's
  first set), and a row more where the device loop steps in blocks of several slots (a GPU's:
  a masked slot past a full set's end writes it, ``program.Plan.rows``),
  ``C = max(2, min(10,000, budget // bytes recorded per step))``; a record kept every ``k``
  steps takes ``ceil(C / k) + 2`` slots.
- On an accelerator: at most ``SETS_IN_FLIGHT`` sets on the device (the one being filled by the
  running chunk, the one the host is reading); on the host the set being read, once transferred
  whole, plus what the sink holds; a frame the HDF5 writer has queued is a view of its set's host
  copy and keeps it alive, up to 3 times the frame (a sparse record's set has 2 slots more than
  its frames).
- On the CPU backend the device's memory is the host's. A step recording ``ONE_SET_BYTES`` or
  more keeps one set in flight (``drive.chunks``: a set is pulled, its frames handed to the sinks
  and the set freed, before the next chunk runs in a fresh one): the set plus what the sink
  holds. Smaller records keep two in flight, and one more set (the host reads a set of
  ``drive.chunks.VIEW_BYTES`` or more through views, and it is freed with its frames: JAX's CPU
  client may free it only once the next set exists), plus what the sink holds.
- The HDF5 writer holds at most ``max(queue_bytes, one step's record)`` of frames handed over and
  not yet written (``store.bytequeue``; a batch read through views of the buffers is copied,
  ``store.owned``, once the queue has room for it); writing a chunk of its file takes HDF5 two
  buffers of the chunk's size (the checksum filter's copy and its output), and a chunk holds at
  most ``store.hdf5.FRAME_CHUNK_BYTES`` (a larger frame is cut into several). A sink that keeps
  nothing holds nothing; ``jl.MemorySink`` keeps every frame (no bound: it grows with the run).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ..record.schedule import every as every_step
from ..store.hdf5 import FRAME_CHUNK_BYTES, QUEUE_BYTES
from .chunks import ONE_SET_BYTES
from .program import block_for
from .resolution import DEFAULT_BUDGET, capacity_for, step_bytes

__all__ = ["Bound", "bound", "set_bytes", "SETS_IN_FLIGHT", "HDF5_CHUNK", "ONE_SET_BYTES"]

SETS_IN_FLIGHT = 2  # the set the running chunk fills and the one the host reads (one: large records on the CPU)
HDF5_CHUNK = FRAME_CHUNK_BYTES  # the HDF5 writer's chunks are no larger than this


class Bound(NamedTuple):
    """Bytes a run holds beyond its kernel's own, at most (None: grows with the run)."""

    set_bytes: int  # one set of record buffers
    device: int  # on the device
    host: int | None  # on the host (on the CPU backend: the device's share included)


def set_bytes(record_bytes: int, every: int = 1, budget: int = DEFAULT_BUDGET, platform: str = "cpu") -> int:
    """Bytes of one set of record buffers for a single record of ``record_bytes`` a frame, kept
    every ``every`` steps, under a chunk budget of ``budget`` bytes, on ``platform``."""
    capacity = capacity_for(step_bytes(record_bytes, every_step(every)), budget)
    if every == 1:
        return (capacity + (1 if block_for(platform) == 1 else 2)) * record_bytes
    return (math.ceil(capacity / every) + 2) * record_bytes


def bound(record_bytes: int, *, every: int = 1, sink: str = "drop", platform: str = "cpu",
          budget: int = DEFAULT_BUDGET, queue_bytes: int = QUEUE_BYTES) -> Bound:
    """The most a run recording one array of ``record_bytes`` every ``every`` steps into ``sink``
    (``"drop"``: a sink keeping nothing, ``"hdf5"``, ``"memory"``) holds, on ``platform``'s device
    and on the host."""
    one = set_bytes(record_bytes, every, budget, platform)
    if platform == "cpu":
        device = one if record_bytes >= ONE_SET_BYTES else SETS_IN_FLIGHT * one
    else:
        device = SETS_IN_FLIGHT * one
    if sink == "memory":
        return Bound(one, device, None)
    held = 0 if sink == "drop" else max(queue_bytes, record_bytes) + 2 * HDF5_CHUNK
    if platform == "cpu":
        late = 0 if record_bytes >= ONE_SET_BYTES else one  # two sets in flight, and one freed late
        return Bound(one, device, device + late + held)
    # an accelerator's set comes to the host whole, and a queued frame keeps that copy alive: up
    # to 3 slots a frame (a sparse record's set: the initial frame's slot and a spare)
    pinned = 0 if sink == "drop" else 2 * max(queue_bytes, record_bytes)
    return Bound(one, device, one + held + pinned)
