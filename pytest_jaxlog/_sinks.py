"""Sinks that need no file format of their own: memory, CSV rows, a user callback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ._frames import Frames, Schema


class MemorySink:
    """Keeps every frame in host memory; ``run.trajectory`` uses it when no file sink is given."""

    def __init__(self):
        self.schema: Schema | None = None
        self.meta: dict[str, Any] = {}
        self.status = "running"
        self.steps_done = 0
        self.violation: dict | None = None
        self.attachments: dict[str, dict[int, dict[str, np.ndarray]]] = {}
        self._steps: dict[str, list[np.ndarray]] = {}
        self._values: dict[str, list[np.ndarray]] = {}

    def open(self, schema: Schema, meta: dict[str, Any]) -> None:
        self.schema, self.meta = schema, dict(meta)
        self._steps = {p: [] for p in schema.paths}
        self._values = {p: [] for p in schema.paths}

    def write(self, frames: Frames) -> None:
        for path in frames:
            self._steps[path].append(frames.steps[path])
            self._values[path].append(np.array(frames.values[path], copy=True))

    def attach(self, name: str, step: int, tree: dict[str, np.ndarray]) -> None:
        self.attachments.setdefault(name, {})[int(step)] = {k: np.array(v) for k, v in tree.items()}

    def close(self, status: str, *, steps_done: int, violation: dict | None = None) -> None:
        self.status, self.steps_done, self.violation = status, int(steps_done), violation

    @property
    def artifacts(self) -> dict[str, Path]:
        return {}

    def frames(self) -> Frames:
        """Everything written so far, one array per leaf path."""
        out = Frames()
        assert self.schema is not None, "[jaxlog] MemorySink was never opened"
        for leaf in self.schema.leaves:
            steps, values = self._steps[leaf.path], self._values[leaf.path]
            if steps:
                out.add(leaf.path, np.concatenate(steps), np.concatenate(values))
            else:
                out.add(leaf.path, np.zeros(0, np.int64), np.zeros((0, *leaf.shape), leaf.dtype))
        return out
