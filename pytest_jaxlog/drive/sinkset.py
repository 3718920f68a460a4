"""The run's sinks, opened together, fed in step order and always closed with a status."""

from __future__ import annotations

from typing import Any

from ..errors import JaxlogError
from ..record.frames import Frames, Schema
from ..store.hdf5 import HDF5Writer
from ..store.parts import PartsWriter, PartTree, processes_of
from ..store.loggersink import LoggerSink, is_logger_shaped
from ..store.sink import Sink, as_sink
from ..store.sinks import MemorySink
from ..store.trajectory import Trajectory, load


def _not_a_recorder(sink: Any) -> Any:
    """A logger in ``sinks=`` gets what a run records (``store.loggersink``); a ``jl.Recorder``,
    which records views of the states it is given, is refused, with what to do instead."""
    from .recorder import Recorder  # it feeds a SinkSet itself

    if isinstance(sink, Recorder):
        raise JaxlogError("sinks=: a jl.Recorder records the states of a loop written by hand; a run records its "
                          "own views: give the views to record= and the recorder's sinks to sinks=")
    return sink


class SinkSet:
    """The run's sinks, opened and closed together (a MemorySink is added when none is given)."""

    def __init__(self, sinks: Any):
        if sinks is None:
            sinks = ()
        if not isinstance(sinks, (list, tuple)):
            sinks = (sinks,)
        sinks = tuple(LoggerSink(s) if is_logger_shaped(s) else as_sink(s) for s in map(_not_a_recorder, sinks))
        self.own_memory = None
        if not sinks:
            self.own_memory = MemorySink()
            sinks = (self.own_memory,)
        self.sinks: tuple[Sink, ...] = sinks
        self.opened: list[Sink] = []
        self._through: dict[int, int] = {}  # per sink: the last step of the frames it accepted
        self.closed = False
        self._timeline = None

    def set_timeline(self, timeline: Any) -> None:
        if timeline is None:
            return
        self._timeline = timeline
        for s in self.sinks:
            s.set_timeline(timeline)

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
        """``key_impls``: PRNG impl per path of ``tree`` holding key data (``Sink.attach``). A
        ``PartTree`` (one process's blocks of a sharded state) goes only to the sinks that keep
        parts (the others keep whole values)."""
        for s in self.opened:
            if isinstance(tree, PartTree) and not getattr(s, "takes_shards", False):
                continue
            s.attach(name, step, tree, key_impls=key_impls)

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
                s.close(status, steps_done=done, violation=violation, summary=summary)
            except BaseException as e:
                if first is None:
                    first = e
        if first is not None and raise_errors:
            raise first
        return first

    def committed_step(self) -> int | None:
        """The last step every durable sink has on disk (None: no sink says, or none has yet)."""
        steps = [getattr(s, "committed_step", None) for s in self.opened]
        steps = [int(x) for x in steps if x is not None]
        return min(steps) if steps else None

    @property
    def artifacts(self) -> dict:
        out: dict = {}
        for s in self.sinks:
            out.update(s.artifacts)
        return out

    def trajectory(self) -> Any:
        """A file sink's trajectory (``jl.load``), else an in-memory one from a MemorySink."""
        for s in self.sinks:
            path = s.artifacts.get("trajectory")
            if path is not None:
                return load(path)
        for s in self.sinks:
            if isinstance(s, MemorySink):
                return Trajectory.from_sink(s)
        raise JaxlogError("no trajectory: none of the sinks keeps one (add jl.MemorySink() or jl.HDF5Writer(path))")
