"""A logger in ``sinks=``: an object with the Logger protocol's shape (``__enter__``,
``__exit__``, ``log(state, step)``, as kUPS's loggers have) fed by ``jl.run``.

Why the records and not the state: ``jl.run`` keeps the state on the device inside its compiled
loop (pulling it every step would cost the host round trip the driver exists to avoid), so what
reaches the host is what the run records. A logger gets, per recorded step, those records' values:
``log(views, step)``, ``views`` a dict of record path -> numpy value (the system axis first in
batched runs) holding the records scheduled (and kept, with ``when=``) at that step. It is called
on the host, after a chunk's frames are pulled, in step order; entered when the run's sinks open
and exited when they close: with no exception when the run completed or stopped at a violation,
with a ``JaxlogError`` saying how it ended when it failed or was interrupted.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..errors import JaxlogError, WriterError
from ..record.frames import Frames, Schema
from .dtypes import check_frames
from .owned import owned
from .sink import Sink

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
