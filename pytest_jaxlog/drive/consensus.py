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
import time
from typing import Any

import jax
import numpy as np


def gather(values: list[int]) -> np.ndarray:
    """``[process, value]``: every process's ``values`` (the same count in each)."""
    from jax.experimental import multihost_utils

    mine = np.asarray(values, dtype=np.int64)
    return np.asarray(multihost_utils.process_allgather(mine)).reshape(jax.process_count(), len(values))


VOTE_INTERVAL_S = 0.1  # a vote about this often: each costs a collective (milliseconds on CPU gloo)
MAX_SPACING = 1024  # chunks between two votes, at most


class StopVote:
    """One run's vote on stopping (see the module's doc), after some chunks: each vote also
    agrees how many chunks to dispatch before the next (every process proposes enough chunks
    for about ``VOTE_INTERVAL_S`` of its own work; the fewest proposed is taken), so every
    process votes after the same chunks.

    The vote is chained between the chunks: it takes the chunk's ``stopped`` output (the
    ``until=`` flags) and hands it on to the next chunk unchanged, so no process runs a vote
    before its chunk or a chunk before the vote before it (programs without a data dependency
    may run in either order, and two processes running their collectives in different orders
    would wait for each other forever)."""

    def __init__(self, replicated: Any) -> None:
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        self.chained = replicated is not None  # the run's small values live on the state's mesh
        mesh = replicated.mesh if self.chained else Mesh(np.array(jax.devices()), ("p",))
        self.split = NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names), None))
        self.size = int(mesh.size)
        self.process_of = np.array([d.process_index for d in mesh.devices.flat])
        self.fn = _voting(NamedSharding(mesh, PartitionSpec()), self.chained)
        self.spacing = 1  # chunks from one vote to the next, as last agreed
        self.due = 0  # the chunk (its number in the run) the next vote follows
        self.since = time.perf_counter()  # when the last vote was read

    def cast(self, stopped: Any, n_chunk: int, signum: int) -> tuple[Any, Any]:
        """After chunk ``n_chunk``: dispatch this process's vote when one is due (``signum``: the
        signal asking it to stop, 0 for none); returns what the next chunk takes as ``stopped``,
        and the vote (None where none is due)."""
        if n_chunk < self.due:
            return stopped, None
        proposed = min(MAX_SPACING, max(1, int(VOTE_INTERVAL_S / max(1e-6, self.per_chunk_s))))
        self.due = n_chunk + self.spacing
        row = np.array([signum, proposed], np.int32)
        flags = jax.make_array_from_callback((self.size, 2), self.split,
                                             lambda index: np.tile(row, (len(range(self.size)[index[0]]), 1)))
        if not self.chained:
            return stopped, self.fn(flags)
        return self.fn(stopped, flags)

    per_chunk_s = VOTE_INTERVAL_S  # this process's seconds per chunk, as last measured (none yet: vote each)

    def read(self, vote: Any) -> dict[int, int]:
        """The processes that asked to stop and their signals (waits for the vote's program);
        the spacing to the next vote, the same in every process, from then on."""
        flags = np.asarray(vote.addressable_data(0))
        now = time.perf_counter()
        self.per_chunk_s = (now - self.since) / max(1, self.spacing)
        self.since = now
        self.spacing = int(flags[:, 1].min())
        return {int(p): int(s) for p, (s, _) in zip(self.process_of, flags) if s}


@functools.lru_cache(maxsize=8)
def _voting(replicated: Any, chained: bool) -> Any:
    """The vote's program, compiled once per mesh (not once per run): every device's row,
    gathered everywhere; chained, with ``stopped`` passed through (its value unchanged, but
    computed after the gathering: signals are never negative)."""
    import jax.numpy as jnp

    if not chained:
        return jax.jit(lambda flags: flags, out_shardings=replicated)
    return jax.jit(lambda stopped, flags: (jnp.where(jnp.min(flags[:, 0]) < 0, stopped - 1, stopped), flags),
                   out_shardings=(replicated, replicated))
