"""What both drivers (``jl.run`` and ``jl.Recorder``) do with frames once they are on the host.

Sinks are opened together, fed in step order and always closed with a status; invariants are
checked per batch and the earliest violation wins; on a violation the sinks get the frames up
to the violating step only. Kept here so the two drivers cannot drift apart.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from ._errors import JaxlogError
from ._frames import Frames, Schema


_PROVENANCE: dict | None = None


def provenance() -> dict:
    """``_provenance.provenance()``, computed once per process (versions and devices do not
    change; the time is refreshed): package metadata lookups cost milliseconds per run."""
    global _PROVENANCE
    try:
        if _PROVENANCE is None:
            from ._provenance import provenance as prov

            _PROVENANCE = prov()
        out = dict(_PROVENANCE)
        if "time" in out:
            import datetime

            out["time"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        return out
    except Exception as e:  # provenance must never break a run
        return {"error": repr(e)}


def check_on_violation(value: str) -> str:
    if value not in ("raise", "warn", "record"):
        raise JaxlogError(f"on_violation must be 'raise', 'warn' or 'record', got {value!r}")
    return value


def bind_invariants(invariants: Any, schema: Schema) -> list[Any]:
    if invariants is None:
        return []
    if not isinstance(invariants, (list, tuple)):
        invariants = (invariants,)
    checkers = []
    for inv in invariants:
        if not hasattr(inv, "bind"):
            raise JaxlogError(f"invariants= takes jl.finite/bounded/conserved/monotonic/invariant objects, got {inv!r}")
        checkers.append(inv.bind(schema))
    return checkers


def first_violation(checkers: Sequence[Any], frames: Frames) -> Any:
    """The violation with the smallest step across checkers (ties: the first checker's)."""
    best = None
    for c in checkers:
        v = c.check(frames)
        if v is not None and (best is None or v.step < best.step):
            best = v
    return best


class SinkSet:
    """The run's sinks, opened and closed together (a MemorySink is added when none is given)."""

    def __init__(self, sinks: Any):
        from ._sinks import MemorySink

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
        self.closed = False
        self.status = "running"

    def set_timeline(self, timeline: Any) -> None:
        if timeline is None:
            return
        for s in self.sinks:
            fn = getattr(s, "set_timeline", None)
            if callable(fn):
                fn(timeline)

    def open(self, schema: Schema, meta: dict) -> None:
        for s in self.sinks:
            try:
                s.open(schema, meta)
            except BaseException:
                self.close("failed", steps_done=0, violation=None, raise_errors=False)
                raise
            self.opened.append(s)

    def write(self, frames: Frames) -> None:
        if frames:
            for s in self.opened:
                s.write(frames)

    def attach(self, name: str, step: int, tree: dict) -> None:
        for s in self.opened:
            s.attach(name, step, tree)

    def close(self, status: str, *, steps_done: int, violation: dict | None = None, raise_errors: bool = True) -> None:
        """Close every opened sink (even when one raises); re-raise the first error if asked."""
        if self.closed:
            return
        self.closed = True
        self.status = status
        first = None
        for s in self.opened:
            try:
                s.close(status, steps_done=int(steps_done), violation=violation)
            except BaseException as e:
                if first is None:
                    first = e
        if first is not None and raise_errors:
            raise first

    @property
    def artifacts(self) -> dict:
        out: dict = {}
        for s in self.sinks:
            try:
                out.update(dict(getattr(s, "artifacts", {}) or {}))
            except Exception:
                pass
        return out

    def trajectory(self) -> Any:
        """A file sink's trajectory (``jl.load``), else an in-memory one from a MemorySink."""
        from ._sinks import MemorySink

        for s in self.sinks:
            path = (getattr(s, "artifacts", {}) or {}).get("trajectory")
            if path is not None:
                from ._trajectory import load

                return load(path)
        for s in self.sinks:
            if isinstance(s, MemorySink):
                from ._trajectory import Trajectory

                return Trajectory.from_sink(s)
        raise JaxlogError("no trajectory: none of the sinks keeps one (add jl.MemorySink() or jl.HDF5Writer(path))")


def make_timings(wall_s: float, steps: int, tracker: Any, traces: int, window: Any = None) -> Any:
    """``_timings.Timings`` from the compile tracker; compiles fall back to our trace count."""
    from ._timings import Timings

    if tracker is not None:
        t = tracker.timings(wall_s, steps, window)
        if t.compiles == 0 and traces:
            t.compiles = traces
        return t
    return Timings(wall_s=float(wall_s), steps=int(steps), compiles=int(traces), window=window)


def compile_tracker(*names: str) -> Any:
    try:
        from ._timings import CompileTracker

        return CompileTracker(*names)
    except Exception:
        return None


class Clock:
    def __init__(self):
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0
