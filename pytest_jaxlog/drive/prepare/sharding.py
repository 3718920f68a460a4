"""Sharded states and runs over several processes, on JAX's own distribution.

- The run's own small inputs (the key, the ``until=`` flags) are put on the state's mesh,
  replicated, from the host, once: a chunk then never moves anything between devices (an
  uncommitted array on device 0 would be copied to every device at every dispatch).
- The host pulls a record buffer shard by shard: JAX assembles an array a process holds whole
  on the host from each device's copy (nothing is gathered on one device first), and a
  process that holds only some blocks of a record pulls just those.
- In a run over several processes (``jax.distributed``) each process runs the same program on
  its own devices. Which process writes which block of a record (``Layout``) follows from the
  compiled chunk program's output shardings, the same in every process: each distinct block is
  written once, by the lowest process holding it, so a replicated record is written by process 0.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from ...errors import JaxlogError
from ...record.frames import Block, Schema, Shards
from .schema import is_key


def explicit_mesh(sharding: Any) -> Any:
    """The mesh of ``sharding`` where some of its axes are explicit (``jax.make_mesh``'s default:
    a value's type then carries its sharding, and a row is written only into a buffer of the same
    mesh and sharding), else None."""
    from jax.sharding import AxisType

    mesh = getattr(sharding, "mesh", None)
    return mesh if mesh is not None and AxisType.Explicit in tuple(getattr(mesh, "axis_types", ())) else None


def replicated_on(state: Any) -> Any:
    """A sharding replicating a value on the mesh of the state's first leaf sharded over several
    devices (a ``NamedSharding``), or over a mesh of explicit axes of any size (its values' types
    carry the mesh: a record buffer must be made on it, even on one device); None for a state on
    one device."""
    from jax.sharding import NamedSharding, PartitionSpec

    for leaf in jax.tree_util.tree_leaves(state):
        s = getattr(leaf, "sharding", None)
        if isinstance(s, NamedSharding) and (s.mesh.size > 1 or explicit_mesh(s) is not None):
            return NamedSharding(s.mesh, PartitionSpec())
    return None


def place(value: Any, sharding: Any) -> Any:
    """``value`` on ``sharding``, copied from the host (typed PRNG keys through their key data)."""
    if sharding is None or value is None:
        return value
    if hasattr(value, "dtype") and is_key(value.dtype):
        data = np.asarray(jax.random.key_data(value))
        return jax.random.wrap_key_data(jax.device_put(data, sharding), impl=jax.random.key_impl(value))
    return jax.device_put(np.asarray(value), sharding)


def process_count() -> int:
    return jax.process_count()


def shared_run_id() -> str:
    """A random id every process of the run agrees on (process 0's, broadcast): a part file is
    read only with the index of its own run."""
    from jax.experimental import multihost_utils

    mine = np.frombuffer(os.urandom(16), dtype=np.uint8)
    return bytes(np.asarray(multihost_utils.broadcast_one_to_all(mine), dtype=np.uint8)).hex()


def _norm(index: tuple, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    out = []
    for sl, n in zip(index, shape):
        start, stop, step = sl.indices(n)
        if step != 1:
            raise JaxlogError(f"a shard index with a stride ({sl}) is not a block")
        out.append((start, stop))
    return tuple(out)


@dataclass(frozen=True)
class RecordLayout:
    """One record's blocks (the same in every process), and this process's part in them."""

    shape: tuple[int, ...]  # per-frame shape
    blocks: tuple[Block, ...]
    held: frozenset  # block numbers some device of this process holds
    everywhere: bool  # every process holds every block (the same whole value)

    @property
    def whole_here(self) -> bool:
        return len(self.held) == len(self.blocks)

    @functools.cached_property
    def mine(self) -> tuple[int, ...]:
        """The blocks this process writes (asked for every pull of every record: worked out once)."""
        me = jax.process_index()
        return tuple(b for b, blk in enumerate(self.blocks) if blk.owner == me)

    def pull(self, x: Any) -> Any:
        """A buffer ``[frames, *shape]`` on the host: a numpy array when this process holds it
        whole, else the ``Shards`` of the blocks it writes."""
        if self.whole_here:
            return np.asarray(x)
        local = {}
        want = {self.blocks[b].index: b for b in self.mine}
        for shard in x.addressable_shards:
            b = want.get(_norm(shard.index[1:], self.shape))
            if b is not None and b not in local:
                local[b] = np.asarray(shard.data)
        return self._shards(x, local, int(x.shape[0]))

    def _shards(self, x: Any, local: dict, frames: int) -> Shards:
        missing = sorted(set(self.mine) - set(local))
        if missing:
            raise JaxlogError(f"an array laid out as {x.sharding} does not hold blocks {missing} of a record where this "
                              f"process writes them ({[self.blocks[b].index for b in missing]})")
        return Shards(self.shape, np.dtype(x.dtype), self.blocks, local, frames)


def record_layout(path: str, sharding: Any, rows: int, shape: tuple[int, ...]) -> RecordLayout:
    """The blocks of a record from its buffer's sharding (``[rows, *shape]``)."""
    me = jax.process_index()
    by_index: dict[tuple, set] = {}
    for device, index in sharding.devices_indices_map((rows, *shape)).items():
        full = _norm(index, (rows, *shape))
        if full[0] != (0, rows):
            raise JaxlogError(f"record {path!r}: the compiled program splits its buffer along the step axis "
                              f"across devices ({sharding}); shard the state's leaves, not the steps")
        by_index.setdefault(full[1:], set()).add(device.process_index)
    ordered = sorted(by_index.items())
    blocks = tuple(Block(index, min(procs)) for index, procs in ordered)
    held = frozenset(b for b, (_, procs) in enumerate(ordered) if me in procs)
    everywhere = all(len(procs) == jax.process_count() for _, procs in ordered)
    return RecordLayout(tuple(shape), blocks, held, everywhere)


class Layout:
    """Every record's blocks in a run over several processes, from the compiled chunk program."""

    def __init__(self, records: dict[str, RecordLayout]):
        self.records = records

    @classmethod
    def of(cls, out_shardings: dict, plan: Any, schema: Schema) -> "Layout":
        """From the chunk program's output shardings: its record buffers (``bufs``: row buffers
        of ``plan.rows`` rows, compact ones of their slots)."""
        shapes = {leaf.path: tuple(leaf.shape) for leaf in schema.leaves}
        bufs = out_shardings["bufs"]
        records = {}
        for path, s in bufs["dense"].items():
            records[path] = record_layout(path, s, plan.rows, shapes[path])
        for (_, m), (vals, _) in zip(plan.compact, bufs["compact"]):
            for path, s in vals.items():
                records[path] = record_layout(path, s, m, shapes[path])
        return cls(records)

    def to_json(self) -> dict:
        return {p: [b.to_json() for b in r.blocks] for p, r in self.records.items()}

    def check_sinks(self, sinks: Any) -> None:
        """Before the run, in every process alike: a sink that keeps whole records (all but the
        HDF5 writer, which writes each process's part) cannot take one sharded across processes."""
        split = [p for p, r in self.records.items() if not r.everywhere]
        for s in sinks:
            if split and not getattr(s, "takes_shards", False) and not getattr(s, "takes_processes", False):
                raise JaxlogError(
                    f"record {split[0]!r} is sharded across processes (each process holds only part of it), which "
                    f"{type(s).__name__} cannot keep: record it with jl.HDF5Writer(path) (each process writes its "
                    f"part and jl.load(path) reads the whole run), or record a value every process holds whole "
                    f"(a reduction)")

    def check_invariants(self, invariants: Any, schema: Schema) -> None:
        """Before the run: every process must judge alike (one stopping at a violation while the
        others go on would leave them waiting in a collective), so invariants check only records
        every process holds whole."""
        for inv in invariants:
            for leaf in inv.leaves(schema):
                r = self.records.get(leaf.path)
                if r is not None and not r.everywhere:
                    raise JaxlogError(
                        f"invariant {inv.name}: record {leaf.path!r} is sharded across processes, and each process "
                        f"holds only part of it; in a run over several processes invariants check records every "
                        f"process holds whole: record a reduction of it (e.g. jnp.all(jnp.isfinite(x)) or "
                        f"jnp.max(jnp.abs(x))) and check that")

    def pull(self, path: str, x: Any) -> Any:
        return self.records[path].pull(x)

# ---------------------------------------------------------------------------------------------
# What the processes of a run agree on: every process must take the same decisions at the same
# point (where to resume, when to stop), or the others wait forever in their next collective.
#
# - ``gather``: a few integers from every process, at a point every process reaches (a resume's
#   choice of checkpoint), through ``multihost_utils.process_allgather``.
# - ``StopVote``: whether any process was asked to stop (SIGTERM), decided per chunk without
#   stalling the pipeline: each chunk's dispatch is followed by a tiny program that gathers every
#   device's flag (a replicated all-gather of one int per device) and is read when that chunk's
#   frames are pulled, by which time it has run. Every process dispatches the same chunks and
#   votes in the same order, so every process reads the same verdict for the same chunk.

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
