"""Frames → invariants → sinks → timeline: the one path both drivers feed.

``jl.run`` hands it one chunk of frames at a time, ``jl.Recorder`` one flush; everything after
the frames exist (checking, cutting at a violation, writing, the timeline's host slices, counter
tracks and violation markers, warn-mode warnings, closing with a status) happens here, so the two
drivers cannot drift apart.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..check.invariants import as_list, check_on_violation, warn_violation
from ..profiling.timeline import now_ns
from ..record.frames import Frames, Schema, Shards, TimeOverflow
from ..store.provenance import provenance
from .sinkset import SinkSet
from .watch import Watch

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
