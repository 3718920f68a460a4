"""The one frame format every driver produces and every sink and invariant consumes.

A ``Schema`` says what each leaf record is (path, per-frame shape, dtype, schedule); a ``Frames``
batch holds, for some leaf paths, the recorded steps and the values stacked along axis 0.
Values are host numpy arrays; PRNG keys arrive as their key data (``key_impl`` notes the impl).
In a run over several processes, a record no process holds whole arrives as ``Shards``: the
blocks of it this process writes, with the layout of all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np

from ..errors import JaxlogError
from .records import is_record_path
from .schedule import Schedule, schedule_from_json
from .values import check_dt

FORMAT_VERSION = 1
MAX_RANK = 32  # numpy's limit on dimensions: a frame has fewer than this
MAX_SIZE = 2**40  # per dimension, what a file may say (a reader allocating from it stays sane)


class TimeOverflow(JaxlogError):
    """A frame's time (step × dt) that a float64 cannot hold; ``step``: the first such step."""

    def __init__(self, message: str, *, step: int):
        super().__init__(message)
        self.step = step


@dataclass(frozen=True)
class LeafSpec:
    path: str  # "energy", "state/positions", "aux/ke"
    record: str  # the top-level record it came from: "energy", "state", "aux"
    shape: tuple[int, ...]  # per-frame shape (leading system axis included when batched)
    dtype: np.dtype  # host dtype (ml_dtypes.bfloat16 for bfloat16; uint32 key data for keys)
    schedule: Schedule
    key_impl: str | None = None  # name of the PRNG impl when the leaf is a typed key array

    def __post_init__(self):
        """What a trajectory file cannot hold is refused here, when the run lays out its records,
        by the rules the reader applies to a file (``store.hdf5.trajectory``)."""
        if not is_record_path(self.path):
            raise JaxlogError(f"record path {self.path!r} is not a/b/c names (each not empty, '.' or '..')")
        if len(self.shape) >= MAX_RANK or not all(0 <= int(n) < MAX_SIZE for n in self.shape):
            raise JaxlogError(f"record {self.path!r}: frames of shape {tuple(self.shape)} cannot be stored (at most "
                              f"{MAX_RANK - 1} dimensions, each < 2**40)")

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "record": self.record,
            "shape": list(self.shape),
            "dtype": dtype_name(self.dtype),
            "schedule": self.schedule.to_json(),
            "key_impl": self.key_impl,
        }

    @classmethod
    def from_json(cls, data: dict) -> "LeafSpec":
        return cls(
            path=data["path"],
            record=data["record"],
            shape=tuple(data["shape"]),
            dtype=dtype_from_name(data["dtype"]),
            schedule=schedule_from_json(data["schedule"]),
            key_impl=data.get("key_impl"),
        )


@dataclass(frozen=True)
class Schema:
    leaves: tuple[LeafSpec, ...]
    batched: bool = False
    dt: float | None = None
    # a ragged batch (jl.run(segments=ids)): rows per graph, graphs in order (the ids, sorted, are
    # graph g repeated segments[g] times), so the file alone splits a row record by graph
    segments: tuple[int, ...] | None = None
    # lookups by path, made once (see __post_init__)
    _by_path: dict = field(init=False, repr=False, compare=False)
    _paths: tuple = field(init=False, repr=False, compare=False)
    _groups: set = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        check_dt(self.dt)
        if self.segments is not None:
            if not self.batched or not self.segments or not all(type(n) is int and 0 < n < MAX_SIZE for n in self.segments):
                raise JaxlogError(f"segments {self.segments!r:.200} are not rows per graph of a batched run (a "
                                  f"non-empty list of positive sizes)")
        seen: dict[str, LeafSpec] = {}
        for leaf in self.leaves:
            if leaf.path in seen:
                raise JaxlogError(f"duplicate record path {leaf.path!r}")
            seen[leaf.path] = leaf
        # lookups by path in constant time (a part file of a multi-process run holds thousands of leaves)
        object.__setattr__(self, "_by_path", seen)
        object.__setattr__(self, "_paths", tuple(seen))
        object.__setattr__(self, "_groups", {p[:i] for p in seen for i, c in enumerate(p) if c == "/"})

    @property
    def paths(self) -> tuple[str, ...]:
        return self._paths

    def __getitem__(self, path: str) -> LeafSpec:
        return self._by_path[path]

    def __contains__(self, path: str) -> bool:
        return isinstance(path, str) and path in self._by_path

    def resolve(self, name: str) -> tuple[str, ...]:
        """Leaf paths named by ``name``: the leaf itself or every leaf under that prefix."""
        if name in self._by_path and name not in self._groups:
            return (name,)
        hits = tuple(p for p in self.paths if p == name or p.startswith(name + "/"))
        if not hits:
            raise JaxlogError(f"record {name!r} is not recorded; recorded: {', '.join(self.paths) or '(none)'}")
        return hits

    @property
    def n_systems(self) -> int | None:
        if self.segments is not None:
            return len(self.segments)
        if not self.batched or not self.leaves:
            return None
        return self.leaves[0].shape[0] if self.leaves[0].shape else None

    def by_rows(self, leaf: LeafSpec) -> bool:
        """Whether ``leaf`` leads with a ragged batch's rows (one per atom) rather than its graphs.
        Where every graph has one row the two axes are one, and the leaf counts as per graph."""
        if self.segments is None or not leaf.shape:
            return False
        rows = sum(self.segments)
        return rows != len(self.segments) and leaf.shape[0] == rows

    def row_place(self, row: int) -> tuple[int, int]:
        """``(graph, index within the graph)`` of row ``row`` of a ragged batch."""
        assert self.segments is not None
        ends = np.cumsum(self.segments)
        graph = int(np.searchsorted(ends, row, side="right"))
        return graph, int(row - (ends[graph] - self.segments[graph]))

    def to_json(self) -> dict:
        out = {"leaves": [leaf.to_json() for leaf in self.leaves], "batched": self.batched, "dt": self.dt}
        if self.segments is not None:
            out["segments"] = list(self.segments)
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Schema":
        segments = data.get("segments")
        return cls(tuple(LeafSpec.from_json(x) for x in data["leaves"]), data.get("batched", False), data.get("dt"),
                   None if segments is None else tuple(segments))


@dataclass(frozen=True)
class Block:
    """One block of a record's per-frame value: ``index`` is ``(start, stop)`` per axis of the
    global value; ``owner`` the process that writes it (the lowest one holding it)."""

    index: tuple[tuple[int, int], ...]
    owner: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in self.index)

    @property
    def slices(self) -> tuple[slice, ...]:
        return tuple(slice(a, b) for a, b in self.index)

    def to_json(self) -> dict:
        return {"index": [list(ab) for ab in self.index], "owner": self.owner}

    @classmethod
    def from_json(cls, data: dict) -> "Block":
        return cls(tuple((int(a), int(b)) for a, b in data["index"]), int(data["owner"]))


@dataclass(frozen=True)
class Shards:
    """Frames of a record sharded across processes, as one process holds them: ``blocks`` is the
    layout of the whole per-frame value (``value_shape``), ``local`` the values of the blocks this
    process writes (block number -> ``[frames, *block shape]``). Indexing selects frames, like
    an array's axis 0; nothing here assembles the global value (no process could)."""

    value_shape: tuple[int, ...]  # the global per-frame shape
    dtype: np.dtype
    blocks: tuple[Block, ...]
    local: dict[int, np.ndarray]
    frames: int

    def __len__(self) -> int:
        return self.frames

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.frames, *self.value_shape)

    @property
    def ndim(self) -> int:
        return 1 + len(self.value_shape)

    def __getitem__(self, index) -> "Shards":
        if isinstance(index, (int, np.integer)) or (isinstance(index, tuple)):
            raise JaxlogError("sharded frames are selected by frames only (a slice, a mask or step positions)")
        n = len(np.arange(self.frames)[index])
        return Shards(self.value_shape, self.dtype, self.blocks, {b: v[index] for b, v in self.local.items()}, n)


def concat_values(a, b):
    """Two batches of one record's values, one after the other (arrays, or Shards of one layout)."""
    if isinstance(a, Shards) or isinstance(b, Shards):
        if not (isinstance(a, Shards) and isinstance(b, Shards) and a.blocks == b.blocks):
            raise JaxlogError("frames of one record arrived in two block layouts; a record keeps one layout")
        return Shards(a.value_shape, a.dtype, a.blocks, {k: np.concatenate([a.local[k], b.local[k]]) for k in a.local},
                      a.frames + b.frames)
    return np.concatenate([a, b])


@dataclass
class Frames:
    """A batch of recorded values: per leaf path, ``steps`` (int64, ascending) and ``values``;
    ``times`` (float64), only for the paths whose frames came with their own times
    (``jl.from_arrays(time=...)``): sinks store those as given, and step × dt for the others."""

    steps: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, np.ndarray] = field(default_factory=dict)
    times: dict[str, np.ndarray] = field(default_factory=dict)

    def add(self, path: str, steps: np.ndarray, values: np.ndarray, times: np.ndarray | None = None) -> None:
        steps = np.asarray(steps, dtype=np.int64)
        if len(steps) != len(values) or (times is not None and len(times) != len(steps)):
            raise JaxlogError(f"record {path!r}: {len(steps)} steps but {len(values)} values"
                              + ("" if times is None else f" and {len(times)} times"))
        self.steps[path] = steps
        self.values[path] = values
        if times is not None:
            self.times[path] = np.asarray(times, dtype=np.float64)

    def times_of(self, paths: Iterable[str], steps: np.ndarray, dt: float) -> np.ndarray:
        """The times of ``steps``, the frames of ``paths`` (leaves recorded together, at the same
        steps): as given for any of them, else step × dt."""
        given = next((self.times[p] for p in paths if p in self.times), None)
        return given if given is not None else steps * dt

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def __bool__(self) -> bool:
        return any(len(s) for s in self.steps.values())

    @property
    def last_step(self) -> int | None:
        ends = [int(s[-1]) for s in self.steps.values() if len(s)]
        return max(ends) if ends else None

    def check_times(self, dt: float | None) -> None:
        """Every frame's time (step × dt, a float64) finite, checked before any sink gets the
        batch: a huge ``dt`` would otherwise store ``inf`` times with nothing but a warning.
        :class:`TimeOverflow` names the first step (over all records) whose time does not fit."""
        if not dt:
            return
        first_step, first_path = None, ""
        for path, steps in self.steps.items():  # steps only grow: the last one bounds a record's times
            if len(steps) and not math.isfinite(float(steps[-1]) * dt):
                with np.errstate(over="ignore"):
                    step = int(steps[~np.isfinite(steps.astype(np.float64) * dt)][0])
                if first_step is None or step < first_step:
                    first_step, first_path = step, path
        if first_step is not None:
            raise TimeOverflow(f"record {first_path!r}, step {first_step}: its time, step × dt = {first_step} × {dt!r}, "
                               f"overflows a float64, which a trajectory file cannot hold (give a smaller dt)",
                               step=first_step)

    def until(self, step: int) -> "Frames":
        """The frames at steps <= ``step`` (what a sink keeps when a violation stops the run)."""
        out = Frames()
        for path, steps in self.steps.items():
            keep = steps <= step
            times = self.times.get(path)
            out.add(path, steps[keep], self.values[path][keep], None if times is None else times[keep])
        return out


def dtype_name(dtype: np.dtype) -> str:
    return np.dtype(dtype).name


def dtype_from_name(name: str) -> np.dtype:
    """The dtype a schema or file names: an ml_dtypes type (public name) or a numpy dtype string."""
    import ml_dtypes

    try:
        if isinstance(name, str) and not name.startswith("_") and isinstance(getattr(ml_dtypes, name, None), type):
            return np.dtype(getattr(ml_dtypes, name))
        return np.dtype(name)
    except (TypeError, ValueError) as exc:
        raise JaxlogError(f"unknown dtype {name!r} in file ({exc})") from None
