"""Ragged batches: ``jl.run(..., segments=ids)``, graphs of different sizes packed along one axis.

``ids[r]`` is the graph of row ``r`` of the packed leaves (atoms, nodes). The ids must be sorted
(graph 0's rows, then graph 1's, ...) and name every graph ``0..G-1``: that is how packed graph
batches are laid out (a ``batch_idx``/``batch`` vector), it makes a row's index within its graph
its distance from the graph's first row, and the batch is then told by its sizes alone, which is
what a trajectory file keeps (``Schema.segments``). The sizes are part of the compiled program (a
finished graph's rows are frozen through a gather by a constant index): each packing compiles its
own, as a new state shape would."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np

from ..errors import JaxlogError

__all__ = ["Segments", "as_segments"]


@dataclasses.dataclass(frozen=True)
class Segments:
    """A ragged batch by its graphs' sizes (rows per graph, graphs in order): equal sizes, equal
    batches, so it hashes and compares as part of a compiled program's plan."""

    counts: tuple[int, ...]

    @property
    def n_graphs(self) -> int:
        return len(self.counts)

    @property
    def n_rows(self) -> int:
        return sum(self.counts)

    @functools.cached_property
    def ids(self) -> np.ndarray:
        """Each row's graph (int32), read only."""
        out = np.repeat(np.arange(self.n_graphs, dtype=np.int32), self.counts)
        out.flags.writeable = False
        return out

    def rows_of(self, graph: int) -> slice:
        start = sum(self.counts[:graph])
        return slice(start, start + self.counts[graph])

    def leading(self, n: int) -> str | None:
        """What a leaf leading with ``n`` is in this batch: ``"graphs"``, ``"rows"`` or None
        (neither: shared by all graphs). Where every graph has one row, rows are graphs."""
        if n == self.n_graphs:
            return "graphs"
        return "rows" if n == self.n_rows else None


def as_segments(ids: Any, batched: Any) -> Segments:
    """``segments=`` checked once, before anything is traced: one clear error per way it can be
    wrong (what it must be, where it is not). ``batched``: ``jl.run``'s, which may say nothing
    more than the ids do."""
    if isinstance(ids, jax.core.Tracer):
        raise JaxlogError("segments= is a tracer: the graph of each row must be known on the host when the run is "
                          "set up (pass a concrete numpy or jax array)")
    try:
        arr = np.asarray(jax.device_get(ids))
    except Exception as e:  # noqa: BLE001  (any object that is no array: said as such)
        raise JaxlogError(f"segments= must be an int array of each row's graph, got {type(ids).__name__} ({e})") from None
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise JaxlogError(f"segments= must be an int array of each row's graph (shape [rows], values 0..G-1), "
                          f"got dtype {arr.dtype}")
    if arr.ndim != 1 or arr.size == 0:
        raise JaxlogError(f"segments= must be one graph id per row, shape [rows] with rows >= 1, "
                          f"got shape {list(arr.shape)}")
    arr = arr.astype(np.int64)
    if arr[0] != 0:
        raise JaxlogError(f"segments=: graphs are numbered from 0, and the first row's graph is {int(arr[0])} "
                          f"(every graph 0..G-1 needs at least one row)")
    step = np.diff(arr)
    back = np.flatnonzero(step < 0)
    if back.size:
        r = int(back[0]) + 1
        raise JaxlogError(f"segments= must be sorted (each graph's rows together, graph 0 first): row {r} is of "
                          f"graph {int(arr[r])} after row {r - 1} of graph {int(arr[r - 1])}; order the packed "
                          f"leaves by graph (a stable argsort of the ids)")
    gap = np.flatnonzero(step > 1)
    if gap.size:
        r = int(gap[0]) + 1
        raise JaxlogError(f"segments=: graph {int(arr[r - 1]) + 1} has no rows (row {r - 1} is of graph "
                          f"{int(arr[r - 1])}, row {r} of graph {int(arr[r])}); every graph 0..G-1 needs at least "
                          f"one row")
    counts = tuple(int(n) for n in np.bincount(arr))
    if batched is not True and batched is not False and batched is not None and int(batched) != len(counts):
        raise JaxlogError(f"segments= holds {len(counts)} graphs, but batched={batched!r} says {int(batched)} "
                          f"systems: segments= makes each graph a system; leave batched= out")
    return Segments(counts)
