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
    """One run's per-chunk vote on stopping (see the module's doc). The vote is chained between
    the chunks: it takes the chunk's ``stopped`` output (the ``until=`` flags) and hands it on to
    the next chunk unchanged, so no process runs a vote before its chunk or a chunk before the
    vote before it (programs without a data dependency may run in either order, and two
    processes running their collectives in different orders would wait for each other forever)."""

    def __init__(self, replicated: Any) -> None:
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        self.chained = replicated is not None  # the run's small values live on the state's mesh
        mesh = replicated.mesh if self.chained else Mesh(np.array(jax.devices()), ("p",))
        self.split = NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names)))
        self.size = int(mesh.size)
        self.process_of = np.array([d.process_index for d in mesh.devices.flat])
        self.fn = _voting(NamedSharding(mesh, PartitionSpec()), self.chained)

    def cast(self, stopped: Any, signum: int) -> tuple[Any, Any]:
        """Dispatch this process's vote (``signum``: the signal asking it to stop, 0 for none) after
        the chunk whose ``stopped`` output it takes; returns what the next chunk takes instead,
        and the vote."""
        flags = jax.make_array_from_callback((self.size,), self.split,
                                             lambda index: np.full(len(range(self.size)[index[0]]), signum, np.int32))
        if not self.chained:
            return stopped, self.fn(flags)
        return self.fn(stopped, flags)

    def read(self, vote: Any) -> dict[int, int]:
        """The processes that asked to stop and their signals (waits for the vote's program)."""
        flags = np.asarray(vote.addressable_data(0))
        return {int(p): int(s) for p, s in zip(self.process_of, flags) if s}


@functools.lru_cache(maxsize=8)
def _voting(replicated: Any, chained: bool) -> Any:
    """The vote's program, compiled once per mesh (not once per run): every device's flag,
    gathered everywhere; chained, with ``stopped`` passed through (its value unchanged, but
    computed after the gathering: flags are never negative)."""
    import jax.numpy as jnp

    if not chained:
        return jax.jit(lambda flags: flags, out_shardings=replicated)
    return jax.jit(lambda stopped, flags: (jnp.where(jnp.min(flags) < 0, stopped - 1, stopped), flags),
                   out_shardings=(replicated, replicated))
