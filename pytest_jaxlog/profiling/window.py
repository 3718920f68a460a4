"""ProfileWindow: a JAX profiler trace of exactly the work steps ``start..stop`` (inclusive).

Step ``k``'s *work* is the application taking state ``k`` to ``k+1``. Every window step runs
inside ``jax.profiler.StepTraceAnnotation("jaxlog_step", step_num=k)``, so the trace itself says
which steps it holds (``load_trace(window.artifacts["jax_trace"]).steps()``).

Three ways to drive a window:

* ``jl.run(..., profile=ProfileWindow(5, 9, dir))``: the driver calls ``begin()``, dispatches each
  window step alone inside ``with window.step(k):``, then ``end(block_on=state)``.
* Hand-written loops, Logger protocol (kUPS: ``state = step(state); logger.log(state, k)``)::

      with ProfileWindow(5, 9, dir) as win:
          for k in range(n):
              with win.step(k):          # annotates k in 5..9, a no-op elsewhere
                  state = step(state)
              win.log(state, k)          # begins after step 4's log, ends after step 9's

  ``log`` arms one call early (``begin()`` at ``log(state, start - 1)``; ``start == 0`` begins
  at ``__enter__``) and ends at ``log(state, stop)`` after ``block_until_ready(state)``.
* The iterator, when no logger is around::

      for k in win.iterate(n):
          state = step(state)

  It begins before ``start``, annotates each window step, and ends after ``stop`` (blocking on
  every live JAX array, since it cannot see ``state``).

One profiler session per process: a second concurrent window, or a profiler started outside
pytest-jaxlog, is refused with a JaxlogError. Each window writes into its own session directory
``<dir>/<name>-<start>-<stop>-<pid>-<n>`` so windows in the same second never overwrite.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..errors import JaxlogError, JaxlogRuntimeWarning
from ..record.schedule import check_step
from .timeline import STEP_SLICE
from .trace import find_jax_trace, load_trace

__all__ = ["ProfileWindow", "check_windows", "active_window", "device_seconds"]

_registry_lock = threading.Lock()
_active: "ProfileWindow | None" = None
_counter = itertools.count()


def active_window() -> "ProfileWindow | None":
    """The window whose profiler session is running in this process, if any."""
    return _active


class ProfileWindow:
    """Capture a JAX profiler trace of work steps ``start..stop`` inclusive into ``dir``."""

    def __init__(self, start: int, stop: int, dir: str | os.PathLike, *, python_tracer_level: int = 0,
                 host_tracer_level: int = 2, name: str | None = None, create_perfetto_trace: bool = True):
        self.start = check_step(start, "ProfileWindow start")
        self.stop = check_step(stop, "ProfileWindow stop")
        if self.stop < self.start:
            raise JaxlogError(f"ProfileWindow stop ({stop}) is before start ({start})")
        self.dir = Path(dir)
        self.name = name or "window"
        if not self.name or any(c in self.name for c in "/\\\0"):
            raise JaxlogError(f"ProfileWindow name {name!r} cannot be used in a directory name")
        self.python_tracer_level = int(python_tracer_level)
        self.host_tracer_level = int(host_tracer_level)
        self.create_perfetto_trace = bool(create_perfetto_trace)
        self.session_dir: Path | None = None
        self.begin_ns: int | None = None
        self.end_ns: int | None = None
        self._state = "new"  # new -> active -> done
        self._open_steps = 0
        self._end_pending = False
        self._pending_block: Any = None
        self._artifacts: dict[str, Path] = {}
        self._annotated: list[int] = []
        self._opened: list[int] = []  # steps whose annotation is open now
        # the window's steps that did work, once the driver says where the run stopped (see
        # ``settle``); None: all of them (hand-written loops run every step they annotate)
        self.ran: range | None = None
        self.note: str | None = None  # what ``settle`` found: steps the run did not reach

    # -- description --------------------------------------------------------------------------
    @property
    def steps(self) -> range:
        """The work steps the window captures."""
        return range(self.start, self.stop + 1)

    def __contains__(self, k: object) -> bool:
        return isinstance(k, (int, np.integer)) and self.start <= int(k) <= self.stop

    def __len__(self) -> int:
        return self.stop - self.start + 1

    @property
    def active(self) -> bool:
        return self._state == "active"

    @property
    def done(self) -> bool:
        return self._state == "done"

    def __repr__(self) -> str:
        return f"ProfileWindow({self.start}, {self.stop}, {str(self.dir)!r}, name={self.name!r})"

    def describe(self) -> str:
        where = f" in {self.session_dir}" if self.session_dir else f" under {self.dir}"
        return f"{self.name!r} (steps {self.start}..{self.stop}{where})"

    @property
    def reached(self) -> bool:
        """Whether any of the window's steps did work (False: the run stopped before it)."""
        return self.ran is None or len(self.ran) > 0

    def settle(self, ran_to: int, steps_done: int, stop_reason: str) -> None:
        """The driver's last word: work steps up to ``ran_to - 1`` ran, and the run stopped at step
        ``steps_done`` for ``stop_reason``. A run stopped early (``until=``) may have dispatched
        window steps past its stop that did no work: they are left out of :attr:`ran`,
        :meth:`step_seconds` and the timeline, and :attr:`note` says so. A window the run did not
        reach keeps no trace (it would hold nothing that ran)."""
        ran = range(self.start, max(self.start, min(self.stop, ran_to - 1) + 1))
        self.ran = ran
        if len(ran) == len(self):
            return
        where = f"profile window {self.name!r} (steps {self.start}..{self.stop})"
        why = f"the run stopped at step {steps_done} ({stop_reason})"
        if not ran:
            self.note = f"{where} not reached: {why}; no step of it ran, nothing was profiled"
            if self.session_dir is not None:
                shutil.rmtree(self.session_dir, ignore_errors=True)
            self._artifacts = {}
        else:
            self.note = (f"{where} partly reached: {why}; only steps {ran.start}..{ran.stop - 1} ran and are "
                         f"reported (the trace's steps {ran.stop}..{self.stop} did no work)")

    def overlaps(self, other: "ProfileWindow") -> bool:
        return self.start <= other.stop and other.start <= self.stop

    # -- session ------------------------------------------------------------------------------
    def _new_session_dir(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        while True:
            d = self.dir / f"{self.name}-{self.start}-{self.stop}-{os.getpid()}-{next(_counter)}"
            try:
                d.mkdir()
                return d
            except FileExistsError:
                continue

    def begin(self) -> None:
        """Start the profiler session (JaxlogError if another one is running or this one ran)."""
        global _active
        import jax

        if self._state != "new":
            raise JaxlogError(f"ProfileWindow {self.describe()} was already {self._state}; "
                              "use a new ProfileWindow per capture")
        with _registry_lock:
            if _active is not None:
                raise JaxlogError(f"cannot start profile window {self.describe()}: window "
                                  f"{_active.describe()} is still capturing (one profiler session "
                                  "per process)")
            options = jax.profiler.ProfileOptions()
            options.python_tracer_level = self.python_tracer_level
            options.host_tracer_level = self.host_tracer_level
            session = self._new_session_dir()
            try:
                jax.profiler.start_trace(str(session), create_perfetto_trace=self.create_perfetto_trace,
                                         profiler_options=options)
            except RuntimeError as e:
                try:
                    session.rmdir()
                except OSError:
                    pass
                raise JaxlogError(f"cannot start profile window {self.describe()}: another profiler "
                                  f"session is already running in this process, not started by a "
                                  f"ProfileWindow (jax.profiler.start_trace / jax.profiler.trace?): {e}") from e
            self.session_dir = session
            self.begin_ns = time.perf_counter_ns()
            self._state = "active"
            _active = self

    def step(self, k: int) -> contextlib.AbstractContextManager:
        """Context manager for step ``k``'s work: a ``StepTraceAnnotation`` inside the window, a no-op outside.

        Inside the window the session must be running (JaxlogError otherwise: the step would be
        missing from the trace).
        """
        if k not in self:
            return contextlib.nullcontext()
        if self._state != "active":
            raise JaxlogError(f"profile window {self.describe()}: step {k} is in the window but the "
                              f"profiler is {'not started' if self._state == 'new' else 'already stopped'}; "
                              "call begin() (or log(state, start-1)) before it")
        return self._annotate(int(k))

    annotate = step

    @contextlib.contextmanager
    def _annotate(self, k: int) -> Iterator[None]:
        import jax

        self._open_steps += 1
        self._opened.append(k)
        try:
            with jax.profiler.StepTraceAnnotation(STEP_SLICE, step_num=k):
                yield
            self._annotated.append(k)
        finally:
            self._open_steps -= 1
            self._opened.remove(k)
            if self._open_steps == 0 and self._end_pending:
                block, self._pending_block = self._pending_block, None
                self._end_pending = False
                self.end(block_on=block)

    def end(self, block_on: Any = None) -> dict[str, Path]:
        """Wait for the device (``block_until_ready(block_on)``; every live array when None), stop the trace.

        Called while a step annotation is open, the stop is deferred to when it closes, so the
        last step is never cut out of the trace. Returns :attr:`artifacts`.
        """
        global _active
        import jax

        if self._state != "active":
            return self.artifacts
        if self._open_steps:
            self._end_pending = True
            self._pending_block = block_on
            return {}
        try:
            if block_on is None:
                jax.block_until_ready(jax.live_arrays())
            else:
                jax.block_until_ready(block_on)
        finally:
            try:
                jax.profiler.stop_trace()
            finally:
                self.end_ns = time.perf_counter_ns()
                self._state = "done"
                with _registry_lock:
                    if _active is self:
                        _active = None

        self._artifacts = find_jax_trace(self.session_dir) if self.session_dir else {}
        if self.session_dir is not None:
            self._artifacts["profile_dir"] = self.session_dir
        return self.artifacts

    def abort(self, exc: BaseException) -> None:
        """Stop the profiler on the way out of a failed run. The run's exception is the one to
        report: a failure to stop the trace is added to it as a note, not raised over it."""
        if not self.active:
            return
        try:
            self.end(block_on=())
        except Exception as e:
            exc.add_note(f"[jaxlog] profile window {self.describe()} did not stop cleanly: {type(e).__name__}: {e}")

    @property
    def artifacts(self) -> dict[str, Path]:
        """``{"jax_trace": perfetto_trace.json.gz (or *.trace.json.gz), "jax_trace_json", "xplane", "profile_dir"}``."""
        return dict(self._artifacts)

    trace_files = artifacts

    # -- reading back -------------------------------------------------------------------------
    def trace(self):
        """The window's JAX trace (:class:`~pytest_jaxlog._trace.Trace`)."""

        if "jax_trace" not in self._artifacts:
            raise JaxlogError(f"profile window {self.describe()} has no trace yet (state: {self._state})")
        return load_trace(self._artifacts["jax_trace"])

    def step_seconds(self) -> np.ndarray:
        """Per-step seconds of steps ``start..stop`` read from the trace (JaxlogError if one is missing);
        of those that ran, when the run stopped inside the window (see :meth:`settle`)."""
        return self.trace().step_seconds(self.steps if self.ran is None else self.ran)

    def add_to_timeline(self, timeline: Any, track: str = "window steps") -> None:
        """Copy the window's step slices onto a :class:`Timeline` (aligned at the session start):
        those of the steps that ran (see :meth:`settle`)."""
        if self.begin_ns is None or not self.reached:
            return
        trace = self.trace()
        for s in trace.slices(STEP_SLICE):
            k = s.args.get("step_num")
            if self.ran is not None and k is not None and int(k) not in self.ran:
                continue
            start = self.begin_ns + int(s.start_s * 1e9)
            timeline.slice(track, STEP_SLICE, start, start + int(s.dur_s * 1e9),
                           {"step_num": int(k) if k is not None else -1})

    # -- iterator -----------------------------------------------------------------------------
    def iterate(self, n: int | range, *, block_on: Any = None) -> Iterator[int]:
        """``for k in win.iterate(n): state = step(state)`` — yields work steps, profiling the window's.

        Begins before the window's first step, wraps each window step's body in its annotation
        and ends after the last one (blocking on ``block_on`` or every live array).
        """
        steps = range(n) if isinstance(n, (int, np.integer)) else n
        try:
            for k in steps:
                if k in self:
                    if self._state == "new":
                        self.begin()
                    with self.step(k):
                        yield k
                    if k == self.stop:
                        self.end(block_on=block_on)
                else:
                    yield k
        finally:
            if self.active and not self._open_steps:
                self.end(block_on=block_on)

    # -- Logger protocol ----------------------------------------------------------------------
    def __enter__(self) -> "ProfileWindow":
        if self.start == 0 and self._state == "new":
            self.begin()
        return self

    def log(self, state: Any, step: int) -> None:
        """Called after step ``step``'s work: arm at ``start - 1``, stop at ``stop``.

        Loops that label states as ``jl.run`` and ``jl.Recorder`` do (``log(state, k + 1)`` after
        work step ``k``: the state after ``k + 1`` applications) reach ``log(state, stop)`` before
        work step ``stop`` ran; when steps are annotated (``with win.step(k)``) and ``stop`` is
        not yet, the stop waits for the next ``log`` so that step is in the trace too.
        """
        step = int(step)
        if self._state == "new" and self.start - 1 <= step < self.stop:
            if step >= self.start:
                warnings.warn(f"[jaxlog] profile window {self.describe()} armed late at log(step={step}): "
                              f"steps {self.start}..{step} are not in the trace (log every step, or at "
                              f"least at step {self.start - 1})", JaxlogRuntimeWarning, stacklevel=2)
            self.begin()
        elif self._state == "active" and step >= self.stop:
            if (step == self.stop and self._annotated and self.stop not in self._annotated
                    and self.stop not in self._opened):
                return  # work step `stop` is still to come (state-after labels): stop at the next log
            self.end(block_on=state)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is not None:
            self.abort(exc)
        elif self.active:
            self.end()


def check_windows(windows: "ProfileWindow | Sequence[ProfileWindow] | None", steps: int | None = None,
                  first: int = 0) -> tuple[ProfileWindow, ...]:
    """Normalise ``profile=`` to a sorted tuple; JaxlogError on overlap, reuse or a window outside the run.

    The run does work steps ``first..steps-1`` (``steps`` is the last step number: ``first`` is the
    ``start_step`` of a resumed run); a window must lie inside them, or it would capture only part
    of its steps, or none, without a word.
    """
    if windows is None:
        return ()
    if isinstance(windows, ProfileWindow):
        windows = (windows,)
    ws: list[ProfileWindow] = []
    for w in windows:
        if not isinstance(w, ProfileWindow):
            raise JaxlogError(f"profile= takes ProfileWindow objects, got {w!r}")
        ws.append(w)
    ws.sort(key=lambda w: w.start)
    for a, b in zip(ws, ws[1:]):
        if a is b:
            raise JaxlogError(f"profile window {a.describe()} is given twice")
        if a.overlaps(b):
            raise JaxlogError(f"profile windows overlap: {a.describe()} and {b.describe()} "
                              f"(one profiler session at a time; make them disjoint)")
    for w in ws:
        if w.done or w.active:
            raise JaxlogError(f"profile window {w.describe()} was already used; make a new one per run")
        if steps is not None and (w.stop >= steps or w.start < first):
            where = f"ends at work step {w.stop}" if w.stop >= steps else f"starts at work step {w.start}"
            does = (f"does {steps} steps (work steps 0..{steps - 1})" if not first else
                    f"resumes at step {first} (work steps {first}..{steps - 1})")
            raise JaxlogError(f"profile window {w.describe()} {where} but the run {does}")
    return tuple(ws)


# ---------------------------------------------------------------------------------------------
# Device time: how long the accelerator worked on a call, read from a JAX profiler trace of it.
#
# Why: a wall-clock timing on a shared machine moves with the load, the Python around the call,
# dispatch and host round trips; the time the GPU spends in the call's kernels and copies moves
# much less, and it is what a change to the kernel's own code changes. The trace's device tracks
# say it (``Trace.device_busy_s``). The CPU backend has none: there the call's device time is not
# known, and saying so is better than passing wall time off as it.

def device_seconds(call: Callable[[], Any]) -> float:
    """Run ``call()`` under the JAX profiler, wait for its result, and return the seconds its
    devices were busy. ``JaxlogError`` where the trace has no device track (the CPU backend)
    or another profiler session is running."""
    import jax

    window = active_window()
    if window is not None:
        raise JaxlogError(f"device time: profile window {window.describe()} is capturing (one profiler session "
                          f"per process); time device work outside it")
    where = tempfile.mkdtemp(prefix="jaxlog-device-time-")
    try:
        try:
            jax.profiler.start_trace(where, create_perfetto_trace=True)
        except RuntimeError as e:
            raise JaxlogError(f"device time: another profiler session is running in this process: {e}") from e
        try:
            jax.block_until_ready(call())
        finally:
            jax.profiler.stop_trace()
        files = find_jax_trace(where)
        if "jax_trace" not in files:
            raise JaxlogError(f"device time: the profiler wrote no trace under {where}")
        busy = load_trace(files["jax_trace"]).device_busy_s()
    finally:
        shutil.rmtree(where, ignore_errors=True)
    if busy is None:
        raise JaxlogError(f"device time: the trace has no device track (JAX's backend is {jax.default_backend()!r}: "
                          f"its programs run on host threads); time wall-clock instead")
    return busy
