"""What the processes of a run agree on: every process must take the same decisions at the same
point (where to resume, when to stop), or the others wait forever in their next collective.

- ``gather``: a few integers from every process, at a point every process reaches (a resume's
  choice of checkpoint), through ``multihost_utils.process_allgather``.
- ``StopVote``: whether any process was asked to stop (SIGTERM), decided per chunk without
  stalling the pipeline: each chunk's dispatch is followed by a tiny program that gathers every
  device's flag (a replicated all-gather of one int per device) and is read when that chunk's
  frames are pulled, by which time it has run. Every process dispatches the same chunks and
  votes in the same order, so every process reads the same verdict for the same chunk.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np


def gather(values: list[int]) -> np.ndarray:
    """``[process, value]``: every process's ``values`` (the same count in each)."""
    from jax.experimental import multihost_utils

    mine = np.asarray(values, dtype=np.int64)
    return np.asarray(multihost_utils.process_allgather(mine)).reshape(jax.process_count(), len(values))


class StopVote:
    """One run's per-chunk vote on stopping (see the module's doc)."""

    def __init__(self) -> None:
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        devices = jax.devices()
        mesh = Mesh(np.array(devices), ("p",))
        self.split = NamedSharding(mesh, PartitionSpec("p"))
        self.local = jax.local_device_count()
        self.process_of = np.array([d.process_index for d in devices])
        self.fn = _gathering(NamedSharding(mesh, PartitionSpec()))

    def cast(self, signum: int) -> Any:
        """Dispatch this process's vote (``signum``: the signal asking it to stop, 0 for none)."""
        flags = np.full(self.local, signum, np.int32)
        return self.fn(jax.make_array_from_process_local_data(self.split, flags))

    def read(self, vote: Any) -> dict[int, int]:
        """The processes that asked to stop and their signals (waits for the vote's program)."""
        flags = np.asarray(vote.addressable_data(0))
        return {int(p): int(s) for p, s in zip(self.process_of, flags) if s}


@functools.lru_cache(maxsize=4)
def _gathering(replicated: Any) -> Any:
    """The vote's program, compiled once per mesh (not once per run)."""
    return jax.jit(lambda flags: flags, out_shardings=replicated)
