"""The run's sinks, opened together, fed in step order and always closed with a status."""

from __future__ import annotations

import inspect
from typing import Any

from ..errors import JaxlogError
from ..record.frames import Frames, Schema
from ..store.hdf5 import HDF5Writer
from ..store.parts import PartsWriter, processes_of
from ..store.sinks import MemorySink
from ..store.trajectory import Trajectory, load
from .memo import Cache


def _takes(fn: Any, name: str) -> bool:
    """Whether ``fn`` accepts keyword ``name`` (optional sink features: sinks written against an
    older protocol get the plain call). Answered once per function (a signature costs ~0.1 ms)."""
    target = getattr(fn, "__func__", fn)
    try:
        found = _TAKES.get((target, name))
    except TypeError:  # an unhashable callable: asked each time
        return _signature_takes(fn, name)
    if found is None:
        found = _TAKES.put((target, name), _signature_takes(fn, name))
    return found


_TAKES = Cache("sink signatures", keep=256)  # a bound: sinks built with per-instance methods


def _signature_takes(fn: Any, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


class SinkSet:
    """The run's sinks, opened and closed together (a MemorySink is added when none is given)."""

    def __init__(self, sinks: Any):
        if sinks is None:
            sinks = ()
        if not isinstance(sinks, (list, tuple)):
            sinks = (sinks,)
        for s in sinks:
            for meth in ("open", "write", "attach", "close"):
                if not callable(getattr(s, meth, None)):
                    raise JaxlogError(f"sinks=: {s!r} does not implement the Sink protocol (missing {meth}())")
        self.own_memory = None
        if not sinks:
            self.own_memory = MemorySink()
            sinks = (self.own_memory,)
        self.sinks = tuple(sinks)
        self.opened: list[Any] = []
        self._through: dict[int, int] = {}  # per sink: the last step of the frames it accepted
        self.closed = False
        self._timeline = None

    def set_timeline(self, timeline: Any) -> None:
        if timeline is None:
            return
        self._timeline = timeline
        for s in self.sinks:
            fn = getattr(s, "set_timeline", None)
            if callable(fn):
                fn(timeline)

    def open(self, schema: Schema, meta: dict) -> None:
        if processes_of(meta) is not None:  # a run over several processes: each writes its part of a file
            self.sinks = tuple(PartsWriter(s) if isinstance(s, HDF5Writer) else s for s in self.sinks)
            if self._timeline is not None:
                for s in self.sinks:
                    if isinstance(s, PartsWriter):
                        s.set_timeline(self._timeline)
        for s in self.sinks:
            try:
                s.open(schema, meta)
            except BaseException as exc:
                status = "stopped" if isinstance(exc, KeyboardInterrupt) else "failed"
                also = self.close(status, steps_done=0, violation=None, raise_errors=False)
                if also is not None:
                    exc.add_note(f"[jaxlog] closing the sinks opened before it also failed: {type(also).__name__}: {also}")
                raise
            self.opened.append(s)

    def write(self, frames: Frames) -> None:
        if frames:  # frames sharded across processes only reach sinks that take them (shards.Layout.check_sinks)
            last = frames.last_step
            for s in self.opened:
                s.write(frames)
                self._through[id(s)] = last  # what this sink holds, if a later one fails

    def attach(self, name: str, step: int, tree: dict, *, key_impls: dict | None = None) -> None:
        """``key_impls``: PRNG impl per path of ``tree`` holding key data, for the sinks that take
        it (``attach(..., key_impls=)``: HDF5Writer, MemorySink); other sinks get the plain call."""
        for s in self.opened:
            if key_impls and _takes(s.attach, "key_impls"):
                s.attach(name, step, tree, key_impls=key_impls)
            else:
                s.attach(name, step, tree)

    def close(self, status: str, *, steps_done: int, violation: dict | None = None, summary: dict | None = None,
              raise_errors: bool = True) -> BaseException | None:
        """Close every opened sink (even when one raises); re-raise the first error, or, with
        ``raise_errors=False`` (closing after another failure), return it for the caller to report."""
        if self.closed:
            return None
        self.closed = True
        first = None
        for s in self.opened:
            # a sink that accepted a batch a later sink then failed on holds more than the run wrote:
            # its steps_done says so (every scheduled frame up to it is in that sink)
            done = max(int(steps_done), self._through.get(id(s), -1))
            try:
                if summary is not None and _takes(s.close, "summary"):
                    s.close(status, steps_done=done, violation=violation, summary=summary)
                else:
                    s.close(status, steps_done=done, violation=violation)
            except BaseException as e:
                if first is None:
                    first = e
        if first is not None and raise_errors:
            raise first
        return first

    @property
    def artifacts(self) -> dict:
        out: dict = {}
        for s in self.sinks:
            out.update(dict(getattr(s, "artifacts", None) or {}))
        return out

    def trajectory(self) -> Any:
        """A file sink's trajectory (``jl.load``), else an in-memory one from a MemorySink."""
        for s in self.sinks:
            path = (getattr(s, "artifacts", {}) or {}).get("trajectory")
            if path is not None:
                return load(path)
        for s in self.sinks:
            if isinstance(s, MemorySink):
                return Trajectory.from_sink(s)
        raise JaxlogError("no trajectory: none of the sinks keeps one (add jl.MemorySink() or jl.HDF5Writer(path))")
