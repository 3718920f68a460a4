"""One system of a batched trajectory, read as a trajectory of its own (``traj.system(i)``).

A batched run records one row per step for all systems together; a row holds system ``i``'s data
unless ``until=`` had stopped it before (``traj.live``) or a per-system ``when=`` kept the row for
other systems only (its flags are recorded as ``"when/<record>"``). So a chain's accepted samples
read back as that chain's own sequence, as a loop running it alone would have recorded them.
Reads stay lazy: only the rows of system ``i`` are read from a file.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..errors import JaxlogError
from ..record.frames import Schema
from ..record.numbers import is_integer
from .trajectory import Trajectory

WHEN = "when"  # as drive.resolve.WHEN: "when/<record>" holds a record's per-system when= flags


class SystemTrajectory(Trajectory):
    """System ``system`` of ``parent``: its leaves without the system axis, its rows only. The
    stored states (checkpoints, post-mortem) are the whole batch's: read them from the parent."""

    def __init__(self, parent: Trajectory, system: int):
        n = parent.schema.n_systems
        if n is None:
            raise JaxlogError(f"{parent.path or 'the trajectory'} is not of a batched run: it has no systems "
                              f"(traj.system(i) reads one system of a run with batched=True)")
        if not is_integer(system) or not -n <= system < n:
            raise JaxlogError(f"traj.system({system!r}): the run has {n} systems (0..{n - 1})")
        leaves = tuple(dataclasses.replace(leaf, shape=tuple(leaf.shape[1:])) for leaf in parent.schema.leaves)
        super().__init__(Schema(leaves, batched=False, dt=parent.schema.dt), parent._info, path=parent.path,
                         attachments={})
        self.parent, self.system_index = parent, int(system) % n
        self._rows_of: dict[str, np.ndarray] = {}

    @property
    def steps_done(self) -> int:
        done = self.parent.systems_done
        return int(done[self.system_index]) if done is not None else self.parent.steps_done

    def live(self, name: str, index: Any = None) -> np.ndarray:
        return np.ones((len(self.steps(name, index)), 1), bool)

    def __repr__(self) -> str:
        return f"<system {self.system_index} of {self.parent!r}>"

    def _rows(self, path: str) -> np.ndarray:
        """The parent's rows of leaf ``path`` that hold this system's data."""
        if path not in self._rows_of:
            keep = self.parent.live(path)[:, self.system_index]
            record = self.schema[path].record
            flags = f"{WHEN}/{record.removeprefix(WHEN + '/')}"
            if flags in self.parent.schema:
                keep = keep & np.asarray(self.parent._values(flags, None), bool)[:, self.system_index]
            self._rows_of[path] = np.flatnonzero(keep)
        return self._rows_of[path]

    def _read(self, path: str, what: str, index: Any) -> np.ndarray | None:
        first, rest = (index[0], index[1:]) if isinstance(index, tuple) else (index, ())
        rows = self._rows(path)
        sel = rows if first is None else rows[first]
        if what == "value":
            out = self.parent._values(path, sel)
            out = out[(slice(None),) * np.ndim(sel) + (self.system_index,)]
        elif what == "step":
            out = self.parent._steps(path, sel)
        else:
            out = self.parent._file_read(path, what, sel) if self.parent._frames is None else None
        return out[rest] if rest and out is not None else out

    def _values(self, path: str, index: Any) -> np.ndarray:
        return self._read(path, "value", index)

    def _steps(self, path: str, index: Any) -> np.ndarray:
        return self._read(path, "step", index)

    def _file_read(self, path: str, what: str, index: Any) -> np.ndarray | None:
        return self._read(path, what, index)
