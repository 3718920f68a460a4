"""The sink protocol: where frames go, what every sink may use. Sinks are opened with the schema
before the first frame; the frames a sink keeps past its ``write`` are never views of a device's
buffers; the sinks written for people and simple tools share which records are scalars."""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from ..errors import JaxlogError
from ..record.frames import Frames, Schema

__all__ = ['device_view', 'holds_device_views', 'owned', 'owned_frames', 'copied_views']

STATUSES = ("running", "complete", "stopped", "violated", "failed")
REQUIRED = ("open", "write", "attach", "close")  # what an object needs to be adapted as a sink


class Sink(abc.ABC):
    """Base of sinks. ``open``, ``write`` and ``close`` are required; the rest has defaults."""

    takes_shards = False  # whether it can keep a record sharded across processes (part files)
    takes_processes = False  # whether a run over several processes can feed it: see ``for_processes``

    def for_processes(self) -> "Sink":
        """The sink a run over several processes feeds in this one's place, in each process (an
        ``HDF5Writer`` becomes a part file per process and an index, ``store.hdf5.parts``). Only
        for sinks that set ``takes_processes``: the others keep whole records, so such a run
        keeps them only for records every process holds whole."""
        raise NotImplementedError(f"{type(self).__name__} cannot be fed by several processes")

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
    ``__exit__``, ``log``, is turned into a sink by the run's sink set: ``store.sinks``.)"""
    if isinstance(obj, Sink):
        return obj
    for meth in REQUIRED:
        if not callable(getattr(obj, meth, None)):
            raise JaxlogError(f"sinks=: {obj!r} does not implement the Sink protocol (missing {meth}())")
    return _FourMethodSink(obj)

# ---------------------------------------------------------------------------------------------
# Which records are scalars (one number per step, per system when batched), shared by the sinks
# written for people and simple tools: CSV rows, TensorBoard, log lines, row callbacks.

def scalar_paths(schema: Schema, records: Iterable[str] | None, who: str, *, kind: str = "CSV",
                 advice: str = "write it with HDF5Writer") -> tuple[str, ...]:
    """The leaf paths a scalar sink writes: ``records=None`` takes every scalar record (none is an
    error), named records must all be scalar (``who`` and ``kind`` name the sink in the message)."""
    base = () if not schema.batched else (schema.n_systems,)

    def scalar(path: str) -> bool:
        return tuple(schema[path].shape) == base

    if records is None:
        paths = tuple(p for p in schema.paths if scalar(p))
        if not paths:
            raise JaxlogError(f"{who}: no scalar records to write (recorded: {', '.join(schema.paths) or '(none)'})")
        return paths
    paths = tuple(p for name in records for p in _resolve(schema, name, who, kind, scalar))
    for p in paths:
        if not scalar(p):
            per = "per system " if schema.batched else ""
            raise JaxlogError(
                f"{who}: record {p!r} has shape {tuple(schema[p].shape)}; {kind} takes "
                f"scalar records only ({per}shape {base}); {advice}"
            )
    return paths


def _resolve(schema: Schema, name: str, who: str, kind: str, scalar: Any) -> tuple[str, ...]:
    """The leaf paths ``name`` stands for; an unknown name is refused naming the argument that gave
    it (``who``) and the names it could take instead."""
    try:
        return schema.resolve(name)
    except JaxlogError as e:
        valid = ", ".join(p for p in schema.paths if scalar(p)) or "(none: record a scalar)"
        cause = str(e).removeprefix("[jaxlog] ")
        raise JaxlogError(f"{who}: {cause}; {kind} takes the names of scalar records: {valid}") from None


def real_paths(schema: Schema, paths: tuple[str, ...], who: str) -> tuple[str, ...]:
    """Keep the paths of real numbers; a named complex or key record is an error."""
    for p in paths:
        leaf = schema[p]
        if leaf.key_impl is not None or np.dtype(leaf.dtype).kind not in "biuf":
            raise JaxlogError(f"{who}: record {p!r} has dtype {leaf.dtype}; only real numbers can be shown")
    return paths


def rows_by_step(frames: Frames, paths: tuple[str, ...], n_systems: int | None) -> list[tuple[int, list[dict]]]:
    """The batch as ``(step, rows)`` in step order: one row (``{path: value}``, Python numbers) per
    system, holding the records scheduled at that step."""
    present = [p for p in paths if p in frames.values and len(frames.steps[p])]
    if not present:
        return []
    steps = np.unique(np.concatenate([frames.steps[p] for p in present]))
    width = n_systems or 1
    table: list[list[dict[str, Any]]] = [[{} for _ in range(width)] for _ in steps]
    for p in present:
        pos = np.searchsorted(steps, frames.steps[p])
        values = frames.values[p].reshape(len(pos), width).tolist()
        for i, row in zip(pos.tolist(), values):
            for system, value in enumerate(row):
                table[i][system][p] = value
    return list(zip(steps.tolist(), table))

# ---------------------------------------------------------------------------------------------
# Frames a sink keeps past its ``write``: never views of a device's buffers.
#
# Why: on the CPU the driver hands a large set of record buffers to the sinks as read-only views
# (no copy, see ``drive.device.chunks.VIEW_BYTES``); a view keeps its whole set alive, unused rows
# included. A sink that returns from ``write`` having used the frames costs nothing more; one that
# keeps them (in memory, or queued for a writer thread) copies such a view, once, to what it
# keeps: its own memory then matches the frames it holds, and the set is freed with the batch.

def device_view(values: Any) -> bool:
    """Whether ``values`` is a numpy view of memory exported through DLPack (a device buffer)."""
    if not isinstance(values, np.ndarray):
        return False
    root = values
    while isinstance(root.base, np.ndarray):
        root = root.base
    return root.base is not None and type(root.base).__name__ == "PyCapsule"


def owned(values: Any) -> Any:
    """``values``, or a copy of it when it is a view of a device buffer."""
    return np.array(values) if device_view(values) else values


def holds_device_views(frames: Frames) -> bool:
    """Whether a value of ``frames`` is a view of a device buffer."""
    return any(device_view(v) for v in frames.values.values())


def owned_frames(frames: Frames) -> Frames:
    """``frames`` itself, or (when a value is a view of a device buffer) a batch holding copies."""
    return copied_views(frames) if holds_device_views(frames) else frames


def copied_views(frames: Frames) -> Frames:
    """A batch of ``frames``' values with each view of a device buffer copied (for a caller that
    has already found one, ``holds_device_views``)."""
    out = Frames()
    for path, values in frames.values.items():
        out.add(path, frames.steps[path], owned(values))
    return out
