"""The run's sinks, opened together, fed in step order and always closed with a status."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ...check.invariants import (
    InvariantViolation,
    as_list,
    bind_all,
    check_all,
    check_on_violation,
    finish_all,
    restore_all,
    save_all,
    warn_violation,
)
from ...errors import JaxlogError
from ...profiling.timeline import now_ns
from ...record.frames import Frames, Schema, Shards, TimeOverflow
from ...store.hdf5.layout import provenance
from ...store.hdf5.parts import PartTree, processes_of
from ...store.hdf5.trajectory import Trajectory, load
from ...store.protocol import Sink, as_sink
from ...store.sinks import LoggerSink, MemorySink, is_logger_shaped


def _not_a_recorder(sink: Any) -> Any:
    """A logger in ``sinks=`` gets what a run records (``store.sinks``); a ``jl.Recorder``,
    which records views of the states it is given, is refused, with what to do instead."""
    if getattr(sink, "feeds_sinks", False):
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
            given = self.sinks
            self.sinks = tuple(s.for_processes() if s.takes_processes else s for s in given)
            if self._timeline is not None:
                for s, was in zip(self.sinks, given):
                    if s is not was:
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

# ---------------------------------------------------------------------------------------------
# The invariants of one run, checked batch by batch in step order.

class Watch:
    """``on_violation="raise"``: every invariant on every batch; the earliest violation stops the
    run. ``"warn"``/``"record"``: the run goes on, and each invariant is checked until its own
    first violation. ``first`` is the run's earliest violation (batches arrive in step order, so
    it is the first one found)."""

    def __init__(self, invariants: Any, schema: Schema, mode: str):
        self.mode = mode
        self.checkers = bind_all(invariants, schema)
        self.first: Any = None
        self._active = list(self.checkers)

    def __bool__(self) -> bool:
        return bool(self.checkers)

    @property
    def watching(self) -> bool:
        """Whether a later batch can still produce a new violation."""
        return bool(self._active) and not (self.mode == "raise" and self.first is not None)

    def check(self, frames: Frames) -> list:
        """New violations in this batch, earliest first (ties: the invariant listed first)."""
        return self._judge(lambda checkers: check_all(checkers, frames))

    def finish(self) -> list:
        """The run ended: the violations only the end decides (an aggregate whose window the run
        ended before), earliest first."""
        return self._judge(finish_all)

    def _judge(self, judge) -> list:
        """``judge(checkers)``: the earliest violation among them, or None. With ``raise`` the
        run stops at the first, so all are judged together; otherwise each invariant is judged on
        its own and leaves the watch at its first violation."""
        if not self.watching:
            return []
        if self.mode == "raise":
            v = judge(self._active)
            new = [] if v is None else [v]
        else:
            new = []
            for c in list(self._active):
                v = judge((c,))
                if v is not None:
                    new.append(v)
                    self._active.remove(c)
            new.sort(key=lambda v: v.step)  # stable: ties keep the listed order
        if new and self.first is None:
            self.first = new[0]
        return new

    def save(self) -> dict:
        """The running state of every invariant, which are still checked, and the first violation
        (a checkpoint's share of the invariants), as JSON."""
        return {"invariants": save_all(self.checkers), "active": [self.checkers.index(c) for c in self._active],
                "violation": None if self.first is None else self.first.to_json()}

    def restore(self, saved: dict) -> None:
        """Continue from :meth:`save` of a run with the same invariants."""
        restore_all(self.checkers, saved["invariants"])
        self._active = [self.checkers[i] for i in saved["active"]]
        self.first = None if saved["violation"] is None else InvariantViolation.from_json(saved["violation"])

    def frames_to_write(self, frames: Frames, new: list) -> Frames:
        """``raise`` stops at the violating step: the sinks get frames up to and including it."""
        if new and self.mode == "raise":
            return frames.until(new[0].step)
        return frames

# ---------------------------------------------------------------------------------------------
# Frames → invariants → sinks → timeline: the one path both drivers feed.
#
# ``jl.run`` hands it one chunk of frames at a time, ``jl.Recorder`` one flush; everything after
# the frames exist (checking, cutting at a violation, writing, the timeline's host slices, counter
# tracks and violation markers, warn-mode warnings, closing with a status) happens here, so the two
# drivers cannot drift apart.

MAX_SYSTEM_COUNTERS = 16  # batched scalar records: a counter track per system, for the first systems

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Span:
    """When a batch was computed on the device: its values are spread evenly over the span on the
    timeline's counter tracks (``jl.run`` knows when a chunk was dispatched and when it was ready,
    not when each step ran)."""

    start_ns: int
    end_ns: int

    def times(self, n: int) -> np.ndarray:
        return np.linspace(self.start_ns, self.end_ns, n).astype(np.int64)


class Pipeline:
    """One run's consumers of frames. ``feed`` returns the batch's new violations (earliest first);
    what a driver does about them (stop, replay a post-mortem, halt logging) is its own business."""

    def __init__(self, *, sinks: Any, invariants: Any, on_violation: str, timeline: Any = None):
        self.invariants = as_list(invariants)
        self.on_violation = check_on_violation(on_violation)
        self.timeline = timeline
        self.progress: Any = None  # a ProgressLogger shown the latest recorded values (set by jl.run)
        self.sinks = SinkSet(sinks)
        self.sinks.set_timeline(timeline)
        self.watch: Watch | None = None
        self.schema: Schema | None = None

    def open(self, schema: Schema, run_meta: dict, *, bind: bool = True) -> None:
        """Bind the invariants (errors before any sink is created) and open the sinks.
        ``bind=False``: a run that recorded nothing (a Recorder never given a state) has nothing
        to check the invariants' records against."""
        self.bind(schema, bind=bind)
        self.open_sinks(schema, run_meta)

    def bind(self, schema: Schema, *, bind: bool = True) -> None:
        """Bind the invariants to the schema: an invariant naming a record that is not recorded
        fails here, before any sink is created or any step runs."""
        self.watch = Watch(self.invariants if bind else (), schema, self.on_violation)

    def open_sinks(self, schema: Schema, run_meta: dict) -> None:
        """Open the sinks (after :meth:`bind`)."""
        meta = {"provenance": provenance(),
                "run": {**run_meta, "on_violation": self.on_violation,
                        "invariants": [getattr(i, "name", repr(i)) for i in self.invariants]}}
        self.sinks.open(schema, meta)
        self.schema = schema

    @property
    def opened(self) -> bool:
        return self.schema is not None

    @property
    def checking(self) -> bool:
        """Whether any invariant is bound (the drivers keep chunk-start states only then)."""
        return bool(self.watch)

    @property
    def first(self) -> Any:
        """The run's first violation, or None."""
        return None if self.watch is None else self.watch.first

    def feed(self, frames: Frames, label: str, *, span: Span | None = None,
             times: Mapping[str, np.ndarray] | None = None, check: bool = True) -> list:
        """Check, write (up to the violating step with ``on_violation="raise"``) and put on the
        timeline one batch of frames. ``span`` or per-path ``times`` place the counter values."""
        t0 = now_ns()
        if self.schema is not None:
            try:
                frames.check_times(self.schema.dt)
            except TimeOverflow as exc:  # the frames before it are checked and written: it loses no data
                new = self.feed(frames.until(exc.step - 1), label, span=span, times=times, check=check)
                if new and self.on_violation == "raise":
                    return new  # an earlier violation stops the run first
                raise
        new = self.watch.check(frames) if (check and self.watch) else []
        written = self.watch.frames_to_write(frames, new) if new else frames
        self.sinks.write(written)
        if self.timeline is not None:
            self.timeline.slice("host", label, t0, now_ns())
            self._counters(written, span, times)
        if self.progress is not None:
            self.progress.show(written)
        self._report(new)
        return new

    def finish(self) -> list:
        """After the last batch: the violations only the end of the run decides (an aggregate
        whose window the run ended before). Nothing is cut: the frames are written already."""
        new = self.watch.finish() if self.watch else []
        self._report(new)
        return new

    def _report(self, new: list) -> None:
        """Violation markers on the timeline; in ``warn`` mode one warning per invariant."""
        if self.timeline is not None:
            for v in new:
                self.timeline.instant("invariants", v.invariant, args={
                    "step": v.step, "record": v.record, "system": -1 if v.system is None else v.system})
        if new and self.on_violation == "warn":
            for v in new:
                warn_violation(v.with_artifacts(self.sinks.artifacts) or v, stacklevel=_user_stacklevel())

    def close(self, status: str, *, steps_done: int, artifacts: Mapping | None = None, summary: dict | None = None,
              raise_errors: bool = True, reason: BaseException | None = None) -> None:
        """Close the sinks with ``status``; the run's first violation (with the artifact paths, the
        profile windows' included) goes into the files whatever the status, and so does the run's
        ``summary`` (why it stopped, per-system steps) for the sinks that keep one."""
        v = self.first
        if v is not None:
            v.with_artifacts({**self.sinks.artifacts, **dict(artifacts or {})})
        also = self.sinks.close(status, steps_done=steps_done, violation=None if v is None else v.to_json(),
                                summary=summary, raise_errors=raise_errors)
        if also is not None and reason is not None:  # closing after ``reason``: say what else failed
            reason.add_note(f"[jaxlog] closing the sinks also failed: {type(also).__name__}: {also}")

    @property
    def closed(self) -> bool:
        return self.sinks.closed

    @property
    def artifacts(self) -> dict:
        return self.sinks.artifacts

    def trajectory(self) -> Any:
        return self.sinks.trajectory()

    def _counters(self, frames: Frames, span: Span | None, times: Mapping[str, np.ndarray] | None) -> None:
        """A counter track per scalar record (per system, for the first systems of a batched run),
        for the frames written: nothing past a violating step."""
        batched = self.schema is not None and self.schema.batched
        for p in frames:
            v = frames.values[p]
            if isinstance(v, Shards):  # part of a record (a run over several processes): no one series
                continue
            if not len(v) or np.iscomplexobj(v) or not (np.issubdtype(v.dtype, np.number) or v.dtype == np.bool_):
                continue
            if times is not None:
                ts = times.get(p)
                if ts is None:
                    continue
                ts = ts[: len(v)]
            elif span is not None:
                ts = span.times(len(v))
            else:
                continue
            if v.ndim == 1:
                self.timeline.counter_series(p, ts, v.astype(np.float64), steps=frames.steps[p])
            elif batched and v.ndim == 2:
                for s in range(min(v.shape[1], MAX_SYSTEM_COUNTERS)):
                    self.timeline.counter_series(f"{p}[system {s}]", ts, v[:, s].astype(np.float64),
                                                 steps=frames.steps[p])


def _user_stacklevel() -> int:
    """``warnings.warn`` stacklevel (as seen from ``warn_violation``'s caller) of the first frame
    outside this package: a warning points at the user's ``jl.run``/``log`` line, however deep
    the drivers call."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR + os.sep):
        frame = frame.f_back
        level += 1
    return level
