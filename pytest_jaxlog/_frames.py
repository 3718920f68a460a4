"""The one frame format every driver produces and every sink and invariant consumes.

A ``Schema`` says what each leaf record is (path, per-frame shape, dtype, schedule); a ``Frames``
batch holds, for some leaf paths, the recorded steps and the values stacked along axis 0.
Values are host numpy arrays; PRNG keys arrive as their key data (``key_impl`` notes the impl).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ._errors import JaxlogError
from ._schedule import Schedule, schedule_from_json

FORMAT_VERSION = 1


@dataclass(frozen=True)
class LeafSpec:
    path: str  # "energy", "state/positions", "aux/ke"
    record: str  # the top-level record it came from: "energy", "state", "aux"
    shape: tuple[int, ...]  # per-frame shape (leading system axis included when batched)
    dtype: np.dtype  # host dtype (ml_dtypes.bfloat16 for bfloat16; uint32 key data for keys)
    schedule: Schedule
    key_impl: str | None = None  # name of the PRNG impl when the leaf is a typed key array

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

    def __post_init__(self):
        seen = set()
        for leaf in self.leaves:
            if leaf.path in seen:
                raise JaxlogError(f"duplicate record path {leaf.path!r}")
            seen.add(leaf.path)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(leaf.path for leaf in self.leaves)

    def __getitem__(self, path: str) -> LeafSpec:
        for leaf in self.leaves:
            if leaf.path == path:
                return leaf
        raise KeyError(path)

    def __contains__(self, path: str) -> bool:
        return any(leaf.path == path for leaf in self.leaves)

    def resolve(self, name: str) -> tuple[str, ...]:
        """Leaf paths named by ``name``: the leaf itself or every leaf under that prefix."""
        hits = tuple(p for p in self.paths if p == name or p.startswith(name + "/"))
        if not hits:
            raise JaxlogError(f"record {name!r} is not recorded; recorded: {', '.join(self.paths) or '(none)'}")
        return hits

    @property
    def n_systems(self) -> int | None:
        if not self.batched or not self.leaves:
            return None
        return self.leaves[0].shape[0] if self.leaves[0].shape else None

    def to_json(self) -> dict:
        return {"leaves": [leaf.to_json() for leaf in self.leaves], "batched": self.batched, "dt": self.dt}

    @classmethod
    def from_json(cls, data: dict) -> "Schema":
        return cls(tuple(LeafSpec.from_json(x) for x in data["leaves"]), data.get("batched", False), data.get("dt"))


@dataclass
class Frames:
    """A batch of recorded values: per leaf path, ``steps`` (int64, ascending) and ``values``."""

    steps: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, np.ndarray] = field(default_factory=dict)

    def add(self, path: str, steps: np.ndarray, values: np.ndarray) -> None:
        steps = np.asarray(steps, dtype=np.int64)
        if len(steps) != len(values):
            raise JaxlogError(f"record {path!r}: {len(steps)} steps but {len(values)} values")
        self.steps[path] = steps
        self.values[path] = values

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

    def until(self, step: int) -> "Frames":
        """The frames at steps <= ``step`` (what a sink keeps when a violation stops the run)."""
        out = Frames()
        for path, steps in self.steps.items():
            keep = steps <= step
            out.add(path, steps[keep], self.values[path][keep])
        return out


def dtype_name(dtype: np.dtype) -> str:
    return np.dtype(dtype).name


def dtype_from_name(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
