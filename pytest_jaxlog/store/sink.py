"""The sink protocol: where frames go. Sinks are opened with the schema before the first frame.

``Sink`` declares everything a driver calls, so a driver never has to ask a sink what it
accepts: a sink subclasses it (or registers with ``Sink.register``) and gets the optional parts
(``set_timeline``, ``attach(..., key_impls=)``, ``close(..., summary=)``) from the base when it
does not need them. An object that implements only the original four methods (``open``,
``write``, ``attach(name, step, tree)``, ``close(status, steps_done=, violation=)``) without
subclassing is adapted once by :func:`as_sink`, which drops what it cannot take.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import JaxlogError
from ..record.frames import Frames, Schema

STATUSES = ("running", "complete", "stopped", "violated", "failed")
REQUIRED = ("open", "write", "attach", "close")  # what an object needs to be adapted as a sink


class Sink(abc.ABC):
    """Base of sinks. ``open``, ``write`` and ``close`` are required; the rest has defaults."""

    takes_shards = False  # whether it can keep a record sharded across processes (part files)

    @abc.abstractmethod
    def open(self, schema: Schema, meta: dict[str, Any]) -> None:
        """Called once, before any frame. ``meta``: provenance and run settings, JSON-able."""

    @abc.abstractmethod
    def write(self, frames: Frames) -> None:
        """Append a batch. May be asynchronous; raises a pending background error."""

    def attach(self, name: str, step: int, tree: dict[str, np.ndarray], *, key_impls: dict | None = None) -> None:
        """Store a named snapshot (post-mortem state at ``step``) beside the frames. ``key_impls``:
        the PRNG impl of each path holding key data. The default keeps nothing."""
        return None

    @abc.abstractmethod
    def close(self, status: str, *, steps_done: int, violation: dict | None = None,
              summary: dict | None = None) -> None:
        """Flush everything, write the final status (and the run's ``summary``: why it stopped,
        per-system steps), and raise any pending writer error."""

    def set_timeline(self, timeline: Any) -> None:
        """A Perfetto ``Timeline`` the sink may draw its own work on. The default ignores it."""
        return None

    @property
    def artifacts(self) -> dict[str, Path]:
        """Files this sink produced, by kind (e.g. ``{"trajectory": path}``)."""
        return {}

    @property
    def committed_step(self) -> int | None:
        """The last step whose frames a kill of the process would keep (a file sink's commits);
        None: the sink keeps nothing durable, or nothing yet. The progress bar shows it."""
        return None


class _FourMethodSink(Sink):
    """An object with the original four methods only, as a ``Sink``: what it cannot take
    (``key_impls``, ``summary``, a timeline) is not passed to it."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.takes_shards = bool(getattr(inner, "takes_shards", False))

    def open(self, schema: Schema, meta: dict[str, Any]) -> None:
        self.inner.open(schema, meta)

    def write(self, frames: Frames) -> None:
        self.inner.write(frames)

    def attach(self, name: str, step: int, tree: dict[str, np.ndarray], *, key_impls: dict | None = None) -> None:
        self.inner.attach(name, step, tree)

    def close(self, status: str, *, steps_done: int, violation: dict | None = None,
              summary: dict | None = None) -> None:
        self.inner.close(status, steps_done=steps_done, violation=violation)

    @property
    def artifacts(self) -> dict[str, Path]:
        return dict(getattr(self.inner, "artifacts", None) or {})

    def __repr__(self) -> str:
        return repr(self.inner)


def as_sink(obj: Any) -> Sink:
    """``obj`` itself when it is a ``Sink``; an object with the four original methods, adapted;
    anything else is one JaxlogError naming the missing method. (A logger, ``__enter__``,
    ``__exit__``, ``log``, is turned into a sink by the run's sink set: ``store.loggersink``.)"""
    if isinstance(obj, Sink):
        return obj
    for meth in REQUIRED:
        if not callable(getattr(obj, meth, None)):
            raise JaxlogError(f"sinks=: {obj!r} does not implement the Sink protocol (missing {meth}())")
    return _FourMethodSink(obj)
