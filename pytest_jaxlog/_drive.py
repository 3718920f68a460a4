"""What both drivers (``jl.run`` and ``jl.Recorder``) do with frames once they are on the host.

Sinks are opened together, fed in step order and always closed with a status; invariants are
checked per batch (``Watch``, on ``_invariants.check_all``) and the earliest violation is the
run's; with ``on_violation="raise"`` the sinks get the frames up to the violating step only.
Kept here so the two drivers cannot drift apart.
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


class Watch:
    """The invariants of one run, checked batch by batch; both drivers use it.

    ``on_violation="raise"``: :func:`_invariants.check_all` on every batch; the earliest
    violation stops the run. ``"warn"``/``"record"``: the run goes on, and each invariant is
    checked until its own first violation, which is kept (and warned about once, by the driver).
    ``first`` is the run's earliest violation (batches arrive in step order, so it is the first
    one found).
    """

    def __init__(self, invariants: Any, schema: Schema, mode: str):
        from ._invariants import bind_all

        self.mode = mode
        self.checkers = bind_all(invariants, schema)
        self.first: Any = None
        self.found: list = []  # the first violation of each invariant that broke, in order found
        self._active = list(self.checkers)

    def __bool__(self) -> bool:
        return bool(self.checkers)

    @property
    def watching(self) -> bool:
        """Whether a later batch can still produce a new violation."""
        return bool(self._active) and not (self.mode == "raise" and self.first is not None)

    def check(self, frames: Frames) -> list:
        """New violations in this batch, earliest first (ties: the invariant listed first)."""
        from ._invariants import check_all

        if not self.watching:
            return []
        if self.mode == "raise":
            v = check_all(self._active, frames)
            new = [] if v is None else [v]
        else:
            new = []
            for c in list(self._active):
                v = check_all((c,), frames)
                if v is not None:
                    new.append(v)
                    self._active.remove(c)
            new.sort(key=lambda v: v.step)  # stable: ties keep the listed order
        if new and self.first is None:
            self.first = new[0]
        self.found.extend(new)
        return new

    def frames_to_write(self, frames: Frames, new: list) -> Frames:
        """``raise`` stops at the violating step: the sinks get frames up to and including it."""
        if new and self.mode == "raise":
            return frames.until(new[0].step)
        return frames


def _takes_key_impls(fn: Any) -> bool:
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "key_impls" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


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
        self._through: dict[int, int] = {}  # per sink: the last step of the frames it accepted
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
            last = frames.last_step
            for s in self.opened:
                s.write(frames)
                self._through[id(s)] = last  # what this sink holds, if a later one fails

    def attach(self, name: str, step: int, tree: dict, *, key_impls: dict | None = None) -> None:
        """``key_impls``: PRNG impl per path of ``tree`` holding key data, for the sinks that take
        it (``attach(..., key_impls=)``: HDF5Writer, MemorySink); other sinks get the plain call."""
        for s in self.opened:
            if key_impls and _takes_key_impls(s.attach):
                s.attach(name, step, tree, key_impls=key_impls)
            else:
                s.attach(name, step, tree)

    def close(self, status: str, *, steps_done: int, violation: dict | None = None, raise_errors: bool = True) -> None:
        """Close every opened sink (even when one raises); re-raise the first error if asked."""
        if self.closed:
            return
        self.closed = True
        self.status = status
        first = None
        for s in self.opened:
            # a sink that accepted a batch a later sink then failed on holds more than the run wrote:
            # its steps_done says so (every scheduled frame up to it is in that sink)
            done = max(int(steps_done), self._through.get(id(s), -1))
            try:
                s.close(status, steps_done=done, violation=violation)
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


def make_timings(wall_s: float, steps: int, tracker: Any, window: Any = None, *,
                 state_leaves: int | None = None) -> Any:
    """``_timings.Timings`` of a run from its compile tracker (opened for the run only, so
    ``compiles`` counts compilations that happened during this run: 0 when all was cached).

    ``state_leaves=n`` (``jl.run``): the tracked programs all take the state's ``n`` leaves first
    and carry the step function; ``compiles`` counts the distinct state signatures they were
    compiled for, so the per-chunk-length programs and the post-mortem replay of one kernel
    count once, while every new state shape/dtype/weak type counts again.
    """
    from ._timings import Timings

    if tracker is None:
        return Timings(wall_s=float(wall_s), steps=int(steps), window=window)
    t = tracker.timings(wall_s, steps, window)
    if state_leaves is not None:
        sigs = {ev.args[:state_leaves] if ev.args is not None else ("?", i)
                for i, ev in enumerate(t.compile_events)}
        t.compiles = len(sigs)
    return t


def compile_tracker(*names: str, exclude: Sequence[str] = ()) -> Any:
    """An open-able ``CompileTracker`` for these functions (all but ``exclude`` when none named)."""
    try:
        from ._timings import CompileTracker

        return CompileTracker(*names, exclude=exclude)
    except Exception:
        return None


def add_compiles(tracker: Any, timeline: Any) -> None:
    """The run's compilations as slices on the timeline's "compile" track."""
    if tracker is None or timeline is None:
        return
    try:
        tracker.add_to_timeline(timeline)
    except Exception:
        pass


class Clock:
    def __init__(self):
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0
