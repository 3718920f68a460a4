"""What the sinks that feed a dashboard (TensorBoard, Weights & Biases, MLflow) share.

Metric keys: a scalar record is one key, and in batched runs one key per system
(``energy/system_3``). The three dashboards group their charts by the part of a key before its
first slash, so a record's systems sit together in the record's own section, and each system is
its own line that can be hidden, compared or smoothed on its own (a system column would need a
table, which none of them plots against the step).

The libraries behind W&B and MLflow are optional extras: a sink imports its library when it is
made, and a missing one is one ``JaxlogError`` naming the extra to install (``import
pytest_jaxlog`` never imports them).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ..errors import JaxlogError, WriterError
from ..record.frames import Frames, Schema
from .background import Background
from .dtypes import check_frames
from .owned import owned
from .scalars import real_paths, rows_by_step, scalar_paths
from .sink import Sink

__all__ = ["missing_extra", "metric_keys", "dashboard_paths", "StepMetrics", "step_metrics", "metric_frames", "Ending",
           "DashboardSink"]


def missing_extra(who: str, module: str, extra: str, exc: ImportError) -> JaxlogError:
    """The error for a sink whose optional library is not installed, naming the extra."""
    return JaxlogError(f"{who} needs the {module!r} package, which is not installed ({exc}); install the extra: "
                       f"pip install 'pytest-jaxlog[{extra}]'")


def dashboard_paths(schema: Schema, records: tuple[str, ...] | None, who: str, kind: str) -> tuple[str, ...]:
    """The records a dashboard sink shows: ``records=None``, every real scalar record (per system
    when batched); named records must be such."""
    return real_paths(schema, scalar_paths(schema, records, who, kind=kind), who)


def metric_keys(schema: Schema, paths: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """Per record path, its metric keys: the path itself, or ``<path>/system_<i>`` per system."""
    n = schema.n_systems if schema.batched else None
    return {p: (p,) if n is None else tuple(f"{p}/system_{i}" for i in range(n)) for p in paths}


@dataclasses.dataclass(frozen=True)
class StepMetrics:
    """The metrics of one recorded step: ``values`` by metric key, Python numbers (bools as 0/1,
    which the dashboards plot)."""

    step: int
    values: dict[str, int | float]


def _number(value: Any) -> int | float:
    return int(value) if isinstance(value, bool) else value


def step_metrics(frames: Frames, keys: dict[str, tuple[str, ...]], n_systems: int | None) -> list[StepMetrics]:
    """The batch as one :class:`StepMetrics` per recorded step, in step order, holding the records
    scheduled at that step."""
    out = []
    for step, rows in rows_by_step(frames, tuple(keys), n_systems):
        values = {keys[p][system]: _number(v) for system, row in enumerate(rows) for p, v in row.items()}
        out.append(StepMetrics(step, values))
    return out


def metric_frames(frames: Frames, paths: tuple[str, ...]) -> Frames:
    """The frames of ``paths`` alone, owned (not views of a device's buffers), to hand to a writer
    thread."""
    out = Frames()
    for p in paths:
        steps = frames.steps.get(p)
        if steps is not None and len(steps):
            out.add(p, steps, owned(frames.values[p]))
    return out


@dataclasses.dataclass(frozen=True)
class Ending:
    """How the run ended, as a sink's ``close`` is told."""

    status: str
    steps_done: int | None
    violation: dict | None
    summary: dict | None


class DashboardSink(Sink):
    """Base of the sinks that hand scalar records to a dashboard library: the library's calls run
    on a writer thread (a dashboard's client may block on its disk or its service process; the
    run's thread only hands the batch over), and its failures surface on the caller's thread.

    A subclass says how to start its run (``_start``, on the caller's thread, at ``open``), log
    steps' metrics (``_log``, on the writer thread) and end the run (``_finish``, at ``close``)."""

    kind = "a dashboard"  # in messages: what takes the records

    def __init__(self, records: list[str] | tuple[str, ...] | None, *, queue_bytes: int, stall_timeout_s: float):
        self.records = None if records is None else tuple(records)
        self.queue_bytes, self.stall_timeout_s = int(queue_bytes), float(stall_timeout_s)
        self.keys: dict[str, tuple[str, ...]] = {}
        self._schema: Schema | None = None
        self._n_systems: int | None = None
        self._last_steps: dict[str, int] = {}
        self._bg: Background | None = None

    def _start(self, schema: Schema, meta: dict[str, Any]) -> None:
        raise NotImplementedError

    def _log(self, metrics: list[StepMetrics]) -> None:
        raise NotImplementedError

    def _finish(self, ending: Ending) -> None:
        raise NotImplementedError

    def open(self, schema: Schema, meta: dict[str, Any]) -> None:
        if self._schema is not None:
            raise JaxlogError(f"{self!r}: a sink is opened once; make a new one per run")
        self.keys = metric_keys(schema, dashboard_paths(schema, self.records, repr(self), self.kind))
        self._schema = schema
        self._n_systems = schema.n_systems if schema.batched else None
        self._library("starting", self._start, schema, meta)
        self._bg = Background(repr(self), self._write_metrics, _nothing, queue_bytes=self.queue_bytes,
                              stall_s=self.stall_timeout_s)

    def write(self, frames: Frames) -> None:
        if self._bg is None:
            raise WriterError(f"{self!r} is {'closed' if self._schema is not None else 'not open'}, cannot write")
        check_frames(self._schema, frames, self._last_steps)
        mine = metric_frames(frames, tuple(self.keys))
        if mine:
            self._bg.put(mine, sum(v.nbytes + mine.steps[p].nbytes for p, v in mine.values.items()))

    def _write_metrics(self, frames: Frames) -> None:  # the writer thread
        self._log(step_metrics(frames, self.keys, self._n_systems))

    def close(self, status: str = "complete", *, steps_done: int | None = None, violation: dict | None = None,
              summary: dict | None = None) -> None:
        """Log what was handed over, then end the dashboard's run with the run's status (``failed``
        when logging failed, whose error is raised)."""
        bg, self._bg = self._bg, None
        if bg is None:
            return
        ending = Ending(status, steps_done, violation, summary)
        try:
            bg.close()
        except BaseException as exc:
            try:
                self._library("ending", self._finish, dataclasses.replace(ending, status="failed"))
            except Exception as also:
                exc.add_note(f"[jaxlog] {also}")
            raise
        self._library("ending", self._finish, ending)

    def _library(self, what: str, fn: Callable[..., None], *args: Any) -> None:
        """``fn(*args)``, the library's own errors turned into a ``WriterError`` naming the sink."""
        try:
            fn(*args)
        except JaxlogError:
            raise
        except Exception as exc:
            raise WriterError(f"{self!r}: {what} the {self.kind} run failed: {type(exc).__name__}: {exc}") from exc


def _nothing() -> None:
    return None
