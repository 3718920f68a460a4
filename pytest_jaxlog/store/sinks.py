"""Sinks that need no file format of their own: memory, CSV rows, a callback, log lines through
Python's ``logging``, and an object shaped like a logger (kUPS's loggers)."""

from __future__ import annotations

import csv
import dataclasses
import logging
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import JaxlogError, WriterError
from ..record.frames import Frames, Schema
from ..record.schedule import Schedule
from ..record.schedule import every as every_n
from ..record.values import printable
from .dtypes import check_frames, check_leaf_dtype, to_host
from .protocol import Sink, owned, real_paths, rows_by_step, scalar_paths

# ---------------------------------------------------------------------------------------------
# ``LoggingSink``: one log line per recorded step through Python's ``logging``.
#
# Why logging and not print: the lines reach whatever the user configured (files, JSON handlers,
# pytest's captured log shown beside a failure) with a level to filter on, and cost nothing but a
# level check when nobody listens. Each line is one step: control characters and newlines in
# record names and values are escaped as the command line escapes them (``record.values``).

DEFAULT_LOGGER = "pytest_jaxlog"


class LoggingSink(Sink):
    """Sink logging ``step 1000: energy/total=-186.25 temperature=1.02`` per recorded step (one
    line per system in batched runs: ``step 1000 system 3: ...``).

    ``logger``: a ``logging.Logger``, a logger name, or None for ``"pytest_jaxlog"``.
    ``every``: log only these steps, an int (every n-th step) or a schedule (``jl.every(n)``,
    ``jl.at(...)``); by default every recorded step. ``records``: the scalar records shown (default:
    all real scalar records). ``fmt``: format of each value.
    """

    def __init__(self, logger: logging.Logger | str | None = None, level: int = logging.INFO, every: Any = None,
                 records: list[str] | tuple[str, ...] | None = None, fmt: str = ".6g"):
        if logger is None or isinstance(logger, str):
            logger = logging.getLogger(logger or DEFAULT_LOGGER)
        if not isinstance(logger, logging.Logger):
            raise JaxlogError(f"LoggingSink(logger={logger!r}): expected a logging.Logger, a logger name or None")
        if every is not None and not isinstance(every, Schedule):
            every = every_n(every)
        self.logger, self.level, self.every, self.fmt = logger, int(level), every, fmt
        self.records = None if records is None else tuple(records)
        self._schema: Schema | None = None
        self._paths: tuple[str, ...] = ()

    def open(self, schema: Schema, meta: dict[str, Any]) -> None:
        who = f"LoggingSink({self.logger.name})"
        self._paths = real_paths(schema, scalar_paths(schema, self.records, who, kind="LoggingSink"), who)
        self._schema = schema
        format(0.0, self.fmt)  # a bad fmt fails here, not mid-run

    def write(self, frames: Frames) -> None:
        assert self._schema is not None, "[jaxlog] LoggingSink.write before open"
        check_frames(self._schema, frames)
        if not self.logger.isEnabledFor(self.level):
            return
        batched = self._schema.batched
        for step, rows in rows_by_step(frames, self._paths, self._schema.n_systems if batched else None):
            if self.every is not None and not self.every.contains(step):
                continue
            for system, row in enumerate(rows):
                where = f"step {step} system {system}" if batched else f"step {step}"
                text = " ".join(f"{p}={format(v, self.fmt)}" for p, v in row.items())
                # names and values escaped: a record named "x\nstep 9: ok" or holding a terminal
                # escape neither forges a log line nor drives the terminal the log is shown on
                self.logger.log(self.level, "%s: %s", where, printable(text, newlines=False))

    def close(self, status: str = "complete", *, steps_done: int | None = None, violation: dict | None = None,
              summary: dict | None = None) -> None:
        if status != "complete" and self.logger.isEnabledFor(self.level):
            self.logger.log(self.level, "run %s after %s steps", status, steps_done)

    def __repr__(self) -> str:
        return f"LoggingSink({self.logger.name!r}, level={logging.getLevelName(self.level)})"

# ---------------------------------------------------------------------------------------------
# Sinks that need no file format of their own: memory, CSV rows, a user callback.

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
        # device's buffers excepted: see store.protocol).
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
        from .hdf5.trajectory import Trajectory

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

# ---------------------------------------------------------------------------------------------
# A logger in ``sinks=``: an object with the Logger protocol's shape (``__enter__``,
# ``__exit__``, ``log(state, step)``, as kUPS's loggers have) fed by ``jl.run``.
#
# Why the records and not the state: ``jl.run`` keeps the state on the device inside its compiled
# loop (pulling it every step would cost the host round trip the driver exists to avoid), so what
# reaches the host is what the run records. A logger gets, per recorded step, those records' values:
# ``log(views, step)``, ``views`` a dict of record path -> numpy value (the system axis first in
# batched runs) holding the records scheduled (and kept, with ``when=``) at that step. It is called
# on the host, after a chunk's frames are pulled, in step order; entered when the run's sinks open
# and exited when they close: with no exception when the run completed or stopped at a violation,
# with a ``JaxlogError`` saying how it ended when it failed or was interrupted.

ADAPTER = """\
    def feed(step, rows):
        logger.log(rows, step)
    jl.run(..., sinks=[jl.CallbackSink(feed, rows=True)])"""
LOGGER_METHODS = ("__enter__", "__exit__", "log")


def is_logger_shaped(obj: Any) -> bool:
    """Whether ``obj`` looks like a logger rather than a sink: it has ``log`` and no ``open``."""
    return callable(getattr(obj, "log", None)) and not callable(getattr(obj, "open", None))


@dataclasses.dataclass(frozen=True)
class StepViews:
    """One recorded step's values: ``views``, record path -> value, the records recorded then."""

    step: int
    views: dict[str, np.ndarray]


def views_by_step(frames: Frames) -> list[StepViews]:
    """The batch as one :class:`StepViews` per recorded step, in step order."""
    present = [p for p in frames if len(frames.steps[p])]
    if not present:
        return []
    steps = np.unique(np.concatenate([frames.steps[p] for p in present]))
    table: list[dict[str, np.ndarray]] = [{} for _ in steps]
    for p in present:
        values = owned(frames.values[p])
        for i, row in enumerate(np.searchsorted(steps, frames.steps[p]).tolist()):
            table[row][p] = values[i]
    return [StepViews(step, views) for step, views in zip(steps.tolist(), table)]


class LoggerSink(Sink):
    """A logger (``__enter__``, ``__exit__``, ``log(views, step)``) as a sink; see the module."""

    def __init__(self, logger: Any):
        missing = [m for m in LOGGER_METHODS if not callable(getattr(logger, m, None))]
        if missing:
            raise JaxlogError(
                f"sinks=: {logger!r} has log() but not {', '.join(m + '()' for m in missing)}: it is neither a sink "
                f"(open, write, close) nor a logger (__enter__, __exit__, log(state, step)); to feed it the scalar "
                f"records of each recorded step:\n{ADAPTER}")
        self.logger = logger
        self._schema: Schema | None = None
        self._last_steps: dict[str, int] = {}
        self._entered = False

    def open(self, schema: Schema, meta: dict[str, Any]) -> None:
        self._schema = schema
        self._call("__enter__", self.logger.__enter__)
        self._entered = True

    def write(self, frames: Frames) -> None:
        check_frames(self._schema, frames, self._last_steps)
        for at in views_by_step(frames):
            self._call("log", self.logger.log, at.views, at.step)

    def close(self, status: str, *, steps_done: int, violation: dict | None = None,
              summary: dict | None = None) -> None:
        if not self._entered:
            return
        self._entered = False
        if status in ("complete", "violated"):
            self._call("__exit__", self.logger.__exit__, None, None, None)
            return
        ended = JaxlogError(f"the run ended {status} after step {steps_done}")
        self._call("__exit__", self.logger.__exit__, type(ended), ended, None)

    def _call(self, what: str, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:
            raise WriterError(f"{self.logger!r}.{what} raised {type(exc).__name__}: {exc}") from exc

    def __repr__(self) -> str:
        return f"LoggerSink({self.logger!r})"
