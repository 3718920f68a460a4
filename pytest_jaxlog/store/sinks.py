"""Sinks that need no file format of their own: memory, CSV rows, a user callback."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..store.dtypes import check_frames, check_leaf_dtype, to_host
from ..errors import JaxlogError, WriterError
from ..record.frames import Frames, Schema
from .owned import owned
from .sink import Sink
from .scalars import rows_by_step, scalar_paths


class MemorySink(Sink):
    """Keeps every frame in host memory; ``run.trajectory`` uses it when no file sink is given."""

    def __init__(self):
        self.schema: Schema | None = None
        self.meta: dict[str, Any] = {}
        self.status = "running"
        self.steps_done = 0
        self.violation: dict | None = None
        self.summary: dict | None = None  # the run's stop reason and per-system steps, at close
        self.attachments: dict[str, dict[int, dict[str, np.ndarray]]] = {}
        self.attachment_key_impls: dict[str, dict[str, str]] = {}  # name -> path -> PRNG impl
        self._steps: dict[str, list[np.ndarray]] = {}
        self._values: dict[str, list[np.ndarray]] = {}
        self._times: dict[str, list[np.ndarray]] = {}  # frames that came with their own times
        self._last_steps: dict[str, int] = {}

    def open(self, schema: Schema, meta: dict[str, Any]) -> None:
        self.schema, self.meta = schema, dict(meta)
        self._steps = {p: [] for p in schema.paths}
        self._values = {p: [] for p in schema.paths}
        self._times = {}
        self._last_steps = {}
        for leaf in schema.leaves:
            check_leaf_dtype(leaf.path, leaf.dtype)

    def write(self, frames: Frames) -> None:
        # No copy: the driver hands over fresh host arrays it does not mutate (views of a
        # device's buffers excepted: see store.owned).
        assert self.schema is not None, "[jaxlog] MemorySink.write before open"
        check_frames(self.schema, frames, self._last_steps)
        for path in frames:
            if len(frames.steps[path]):
                self._steps[path].append(frames.steps[path])
                self._values[path].append(owned(frames.values[path]))
                if path in frames.times:
                    self._times.setdefault(path, []).append(frames.times[path])

    def attach(self, name: str, step: int, tree: dict[str, np.ndarray], *, key_impls: dict[str, str] | None = None) -> None:
        """Keep a snapshot; typed key arrays become key data with their impl noted (``key_impls``
        names the impl of arrays that already are key data)."""
        snapshot = {}
        for k, v in tree.items():
            snapshot[k], impl = to_host(v, k)
            impl = impl or (key_impls or {}).get(k)
            if impl is not None:
                self.attachment_key_impls.setdefault(name, {})[k] = impl
        self.attachments.setdefault(name, {})[int(step)] = snapshot

    def close(self, status: str, *, steps_done: int, violation: dict | None = None, summary: dict | None = None) -> None:
        self.status, self.steps_done, self.violation, self.summary = status, int(steps_done), violation, summary

    @property
    def artifacts(self) -> dict[str, Path]:
        return {}

    def frames(self) -> Frames:
        """Everything written so far, one array per leaf path."""
        out = Frames()
        assert self.schema is not None, "[jaxlog] MemorySink was never opened"
        for leaf in self.schema.leaves:
            steps, values = self._steps[leaf.path], self._values[leaf.path]
            times = self._times.get(leaf.path)
            if len(steps) == 1:
                out.add(leaf.path, steps[0], values[0], None if times is None else times[0])
            elif steps:
                out.add(leaf.path, np.concatenate(steps), np.concatenate(values),
                        None if times is None else np.concatenate(times))
            else:
                out.add(leaf.path, np.zeros(0, np.int64), np.zeros((0, *leaf.shape), leaf.dtype))
        return out

    @property
    def trajectory(self):
        """The recorded frames as a ``Trajectory`` (a snapshot)."""
        from ..store.trajectory import Trajectory

        return Trajectory.from_sink(self)


def _cell(value: Any) -> str:
    """Exact text for a scalar: repr of the Python float round-trips float64 bit for bit."""
    if isinstance(value, (np.bool_, bool)):
        return "1" if value else "0"
    if isinstance(value, np.integer):
        return str(int(value))
    if isinstance(value, np.complexfloating):
        return repr(complex(value))
    return repr(float(value))


class CSVWriter(Sink):
    """Scalar records as CSV rows: one per recorded step (and per system when batched).

    Columns: ``step``, ``system`` (batched), ``time`` (with dt), then one per record. A record
    not scheduled at a row's step leaves its cell empty. Rows are flushed as frames arrive.
    ``records=None`` takes every scalar record; naming a non-scalar record is an error.
    """

    def __init__(self, path: str | os.PathLike, records: list[str] | tuple[str, ...] | None = None):
        self.path = Path(path)
        self.records = None if records is None else tuple(records)
        self.columns: tuple[str, ...] = ()
        self._fh = None
        self._writer = None
        self._schema: Schema | None = None
        self._last_steps: dict[str, int] = {}

    def open(self, schema: Schema, meta: dict[str, Any]) -> None:
        paths = scalar_paths(schema, self.records, f"CSVWriter({self.path})")
        self._schema = schema
        self.columns = tuple(["step"] + (["system"] if schema.batched else []) +
                             (["time"] if schema.dt is not None else []) + list(paths))
        self._paths = paths
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "w", newline="")
        self._writer = csv.writer(self._fh)
        self._writer.writerow(self.columns)
        self._fh.flush()

    def write(self, frames: Frames) -> None:
        assert self._schema is not None and self._fh is not None, "[jaxlog] CSVWriter.write before open"
        check_frames(self._schema, frames, self._last_steps)
        present = [p for p in self._paths if p in frames.values and len(frames.steps[p])]
        if not present:
            return
        all_steps = np.unique(np.concatenate([frames.steps[p] for p in present]))
        n_sys = self._schema.n_systems if self._schema.batched else None
        n = len(all_steps)
        dt = self._schema.dt
        times = {} if dt is None else {int(k): t for p in present
                                       for k, t in zip(frames.steps[p], frames.times_of([p], frames.steps[p], dt))}
        # per column, the cell text of each row (step-major, then system)
        width = n_sys or 1
        columns = []
        for p in self._paths:
            cells = [""] * (n * width)
            if p in present:
                pos = np.searchsorted(all_steps, frames.steps[p])
                vals = frames.values[p].reshape(len(pos), width)
                for i, row in zip(pos.tolist(), vals):
                    cells[i * width:(i + 1) * width] = [_cell(v) for v in row]
            columns.append(cells)
        lead = []
        for step in all_steps.tolist():
            for s_ in range(width):
                cell = [str(step)]
                if n_sys is not None:
                    cell.append(str(s_))
                if dt is not None:
                    cell.append(repr(float(times[step])))
                lead.append(cell)
        rows = [lead[r] + [col[r] for col in columns] for r in range(n * width)]
        try:
            self._writer.writerows(rows)
            self._fh.flush()
        except OSError as exc:
            raise WriterError(f"writing {self.path} failed: {exc}") from exc

    def attach(self, name: str, step: int, tree: dict[str, np.ndarray], *, key_impls: dict | None = None) -> None:
        """Snapshots are not tabular: CSV ignores them."""

    def close(self, status: str = "complete", *, steps_done: int | None = None, violation: dict | None = None,
              summary: dict | None = None) -> None:
        if self._fh is not None and not self._fh.closed:
            self._fh.close()

    @property
    def artifacts(self) -> dict[str, Path]:
        return {"csv": self.path}


ROW_FIELDS = ("step", "system")  # what a CallbackSink row holds besides the records


class CallbackSink(Sink):
    """Calls ``fn(frames)`` per batch (and ``on_open(schema, meta)``, ``on_close(status, steps_done,
    violation)`` if given). An exception in a callback surfaces as WriterError, chained.

    ``rows=True``: calls ``fn(step, rows)`` per recorded step instead, ``rows`` one dict per system
    (one in unbatched runs) of the scalar records scheduled at that step, as Python numbers, each
    also holding its ``step`` and, in batched runs, its ``system`` (so a row handed on alone still
    says where it belongs)."""

    def __init__(self, fn: Callable[..., Any], *, rows: bool = False, on_open: Callable | None = None,
                 on_close: Callable | None = None, on_attach: Callable | None = None):
        if not callable(fn):
            raise JaxlogError(f"CallbackSink(fn): fn must be callable, got {fn!r}")
        self.fn, self.on_open, self.on_close, self.on_attach = fn, on_open, on_close, on_attach
        self.rows = bool(rows)
        self.schema: Schema | None = None
        self._paths: tuple[str, ...] = ()

    def _call(self, what: str, f: Callable, *args: Any, **kwargs: Any) -> None:
        try:
            f(*args, **kwargs)
        except Exception as exc:
            name = getattr(f, "__qualname__", repr(f))
            raise WriterError(f"CallbackSink {what} callback {name} raised {type(exc).__name__}: {exc}") from exc

    def open(self, schema: Schema, meta: dict[str, Any]) -> None:
        self.schema = schema
        if self.rows:
            name = getattr(self.fn, "__qualname__", repr(self.fn))
            self._paths = scalar_paths(schema, None, f"CallbackSink({name}, rows=True)")
            taken = [p for p in self._paths if p in ROW_FIELDS]
            if taken:
                raise JaxlogError(f"CallbackSink({name}, rows=True): record {taken[0]!r} has the name of a row's own "
                                  f"field ({', '.join(ROW_FIELDS)}); rename the record")
        if self.on_open is not None:
            self._call("on_open", self.on_open, schema, meta)

    def write(self, frames: Frames) -> None:
        if self.schema is not None:
            check_frames(self.schema, frames)
        if not self.rows:
            self._call("write", self.fn, frames)
            return
        n_systems = self.schema.n_systems if self.schema is not None and self.schema.batched else None
        for step, rows in rows_by_step(frames, self._paths, n_systems):
            if n_systems is None:
                rows = [{"step": step, **row} for row in rows]
            else:
                rows = [{"step": step, "system": system, **row} for system, row in enumerate(rows)]
            self._call("write", self.fn, step, rows)

    def attach(self, name: str, step: int, tree: dict[str, np.ndarray], *, key_impls: dict | None = None) -> None:
        if self.on_attach is not None:
            self._call("on_attach", self.on_attach, name, step, tree)

    def close(self, status: str = "complete", *, steps_done: int | None = None, violation: dict | None = None,
              summary: dict | None = None) -> None:
        if self.on_close is not None:
            self._call("on_close", self.on_close, status, steps_done, violation)

    @property
    def artifacts(self) -> dict[str, Path]:
        return {}
