"""The ``jaxlog`` fixture's object: ``jl.run``/``jl.Recorder`` wired to one test's artifact
directory, with the marker/option defaults, and ``check_golden`` against the golden directory.

It reports to the session only through ``TestState`` (``note_violation``, ``note_run``,
``add_artifacts``, ``notes``, ``goldens``) and offers it ``refresh()``; jax, h5py and perfetto
are imported inside the methods that run kernels.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..errors import JaxlogError, JaxlogRuntimeWarning
from .options import Settings, parse_profile
from .session import PROFILE_DETAILS, JaxlogSession, TestState

_UNSET: Any = object()
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


@dataclass
class OpenRecorder:
    """A recorder handed to the test: its files and timeline are gathered when it has exited."""

    recorder: Any
    writer: Any
    stem: str
    timeline: Any


@dataclass
class OpenWindow:
    """A profile window handed to the test (its trace is gathered at teardown)."""

    window: Any
    stem: str


@dataclass
class PendingTimeline:
    """One of our timelines not written yet: the run it belongs to and where it goes."""

    timeline: Any
    name: str
    path: Path


class JaxlogFixture:
    """The ``jaxlog`` fixture: ``jl.run``/``jl.Recorder`` wired to this test's artifact directory."""

    def __init__(self, session: JaxlogSession, state: TestState, directory: Path | None = None):
        self._session = session
        self._state = state
        self._dir = Path(directory) if directory is not None else state.dir
        self._stems: dict[str, str] = {}  # run name -> file stem
        self._goldens: set[Path] = set()
        self._open: list[OpenRecorder | OpenWindow] = []  # closed at teardown
        self._timelines: list[PendingTimeline] = []
        self._artifacts: dict[str, Path] = {}
        self._timed: list[Any] = []  # runs/recorders whose timings are noted (by identity)
        self.runs: list[Any] = []
        state.fixtures.append(self)

    # -- paths -----------------------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        """This test's (or example's) artifact directory, created on first use."""
        self._dir.mkdir(parents=True, exist_ok=True)
        return self._dir

    @property
    def settings(self) -> Settings:
        return self._state.settings

    @property
    def artifacts(self) -> dict[str, Path]:
        """Files written so far, by kind (``trajectory``, ``timeline``, ``jax_trace``, ...; ``<name>:<kind>``
        for runs other than the first): includes recorders and windows whose ``with`` block has exited."""
        self.refresh()
        return self._artifacts

    def _label(self, name: str) -> str:
        """The run's name in notes and the report: ``example-<n>/<name>`` inside a hypothesis example."""
        return name if self._dir == self._state.dir else f"{self._dir.name}/{name}"

    def _name(self, name: str | None) -> str:
        """A new run's name (``trajectory``, ``trajectory-1``, ... or ``name``), registered with its file stem."""
        if name is not None:
            if not _NAME.fullmatch(name) or name.startswith("."):
                raise JaxlogError(f"name={name!r}: use letters, digits, '_', '-', '.' (it names files)")
            if name in self._stems:
                raise JaxlogError(f"name={name!r} already used by another run in this test")
        else:
            name, n = "trajectory", 1
            while name in self._stems:
                name = f"trajectory-{n}"
                n += 1
        self._stems[name] = file_stem(name)
        return name

    def _file(self, name: str, suffix: str) -> Path:
        return self.dir / f"{self._stems.get(name) or file_stem(name)}{suffix}"

    def _add(self, artifacts: dict[str, Path], name: str) -> None:
        for kind, path in artifacts.items():
            key = kind if name == "trajectory" else f"{name}:{kind}"
            self._artifacts[key] = Path(path)
        self._state.add_artifacts(artifacts, self._label(name))

    def _window(self, profile: Any, name: str, steps: Any = None, start_step: Any = 0) -> Any:
        """The run's ProfileWindow. An explicit ``profile=`` is used as given (jl.run rejects one past the
        run). The default from the marker/option applies to every run of the test, short ones included:
        a window outside the run's work steps is skipped, one that sticks out is clipped, with a note
        (report section, manifest, terminal summary) instead of an error."""
        from ..profiling.window import ProfileWindow

        default = profile is _UNSET
        if default:
            profile = self.settings.profile
        if profile is None or isinstance(profile, ProfileWindow):
            return profile
        start, stop = parse_profile(profile, f"{self._state.nodeid}: profile=")  # type: ignore[misc]
        if default:
            try:
                lo = int(start_step)
                hi = lo + int(steps) - 1  # the run's work steps lo..hi
            except (TypeError, ValueError):  # bad steps/start_step: jl.run reports them
                lo = hi = None
            if lo is not None and (start < lo or stop > hi):
                what = f"profile window {start}:{stop} ({self.settings.profile_source})"
                label = self._label(name)
                steps_text = f"work steps {lo}..{hi}" if hi >= lo else "no work steps"
                if stop < lo or start > hi:
                    self._state.notes.append(f"{what} skipped for run {label!r}: it has {steps_text}")
                    return None
                start, stop = max(start, lo), min(stop, hi)
                self._state.notes.append(f"{what} clipped to {start}:{stop} for run {label!r}: it has {steps_text}")
        return ProfileWindow(start, stop, self._file(name, f"{process_suffix()}-profile"))

    def _timeline(self, name: str) -> Any:
        from ..profiling.timeline import Timeline

        tl = Timeline()
        self._timelines.append(PendingTimeline(tl, name, self._file(name, f"{process_suffix()}.pftrace")))
        return tl

    def _write_timeline(self, tl: Any) -> None:
        pending = next((p for p in self._timelines if p.timeline is tl), None)
        if pending is None:  # not ours, or written already
            return
        self._timelines.remove(pending)
        try:
            written = tl.write(pending.path)
        except Exception as e:  # a broken trace must not hide the test's own outcome: warned, not raised
            warnings.warn(JaxlogRuntimeWarning(
                f"[jaxlog] could not write timeline {self._session.display(pending.path)}: {e!r}"), stacklevel=3)
            return
        self._add({"timeline": Path(written or pending.path)}, pending.name)

    def _run_files(self, name: str | None) -> dict[str, Path]:
        """The files of run ``name`` by plain kind (``trajectory``, ``timeline``, ...); all when None."""
        if name is None:
            return dict(self._artifacts)
        if name == "trajectory":
            return {k: p for k, p in self._artifacts.items() if ":" not in k}
        return {k.split(":", 1)[1]: p for k, p in self._artifacts.items() if k.startswith(f"{name}:")}

    def _note_violation(self, violation: Any, name: str) -> None:
        """A violation of one of our runs: its message and JSON name that run's files (not other runs')."""
        if violation is None:
            return
        self._plot(violation, name)
        self._name_files(violation, name)
        self._state.note_violation(violation, self._run_files(name))

    def _name_files(self, violation: Any, name: str) -> None:
        """The message names the files a person opens, once each, as the session shows paths: the
        manifest lists every file (the JAX profile's other forms and folder included), and the
        test's report section names only what the message does not."""
        files = self._run_files(name)
        if files and hasattr(violation, "with_artifacts"):
            violation.with_artifacts({k: self._session.display(p) for k, p in files.items()
                                      if k not in PROFILE_DETAILS}, replace=True)

    def _plot(self, violation: Any, name: str) -> None:
        """A PNG of the violation beside its run's files (manifest artifact ``plot``); without
        matplotlib, a note in the failure's report says how to get one."""
        from ..check.plots import HOW_TO_PLOT, have_matplotlib, plot_violation
        from ..store.hdf5.trajectory import load

        trajectory = self._run_files(name).get("trajectory")
        if trajectory is None or not hasattr(violation, "record"):
            return
        if not have_matplotlib():
            self._state.notes.append(f"no plot of the violation: {HOW_TO_PLOT}")
            return
        try:
            plot = plot_violation(load(trajectory), violation, self._file(name, "-violation.png"))
        except Exception as e:  # a plot that cannot be drawn must not hide the test's own failure
            warnings.warn(JaxlogRuntimeWarning(f"[jaxlog] could not plot the violation: {e!r}"), stacklevel=3)
            return
        self._add({"plot": plot}, name)

    def _note_timings(self, obj: Any, name: str) -> None:
        if obj is None or any(o is obj for o in self._timed):
            return
        self._timed.append(obj)
        self._state.note_run(self._label(name), obj)

    # -- drivers ---------------------------------------------------------------------------------
    def run(self, step: Any, state: Any, steps: int, *, name: str | None = None, sinks: Any = (),
            profile: Any = _UNSET, progress: Any = _UNSET, chunk: Any = _UNSET, on_violation: Any = _UNSET,
            writer_kwargs: dict | None = None, **kwargs: Any) -> Any:
        """``jl.run`` writing ``<dir>/<name or trajectory[-i]>.h5`` and a ``.pftrace`` timeline; the profile
        window, progress bar, chunk size and violation policy default to the marker/options."""
        from ..check.violation import InvariantViolation
        from ..drive.run import run_outcome
        from ..errors import hide_frame_from_checks
        from ..store.hdf5.writer import HDF5Writer

        __tracebackhide__ = hide_frame_from_checks
        name = self._name(name)
        writer = HDF5Writer(self._file(name, ".h5"), **(writer_kwargs or {}))
        window = self._window(profile, name, steps, kwargs.get("start_step", 0))
        timeline = kwargs.pop("timeline", None)
        own_timeline = timeline is None
        if own_timeline:
            timeline = self._timeline(name)
        kwargs.update(
            sinks=(writer, *tuple(sinks)),
            profile=window,
            progress=self.settings.progress if progress is _UNSET else progress,
            chunk=self.settings.chunk if chunk is _UNSET else chunk,
            on_violation=self.settings.on_violation if on_violation is _UNSET else on_violation,
            timeline=timeline,
        )
        with warnings.catch_warnings(record=True) as caught:
            # jl.run's warnings (on_violation="warn") point at its caller, which is this method: caught here and
            # re-emitted below at the test's line. The user's filters still apply (-W error raises in the run).
            outcome = run_outcome(step, state, steps, **kwargs)
        result = outcome.run  # on an error (InvariantViolation, a test failure, or anything else): the partial run
        if outcome.error is not None and result is None:  # raised before the run was made: its arguments
            outcome.error.jaxlog_before_start = True  # type: ignore[attr-defined]
        note = _stopped_before(window, result)
        if note is None and window is not None:
            note = window.note  # a window the run stopped inside (until=): no phantom steps
        if note:
            self._state.notes.append(f"run {self._label(name)!r}: {note}")
        self._collect(writer, window, result, name)
        if own_timeline:
            self._write_timeline(timeline)
        self._note_timings(result, name)
        for w in caught:  # on_violation="warn": the warning names the files as the failure would
            warned = getattr(w.message, "violation", None)
            if isinstance(warned, InvariantViolation):
                self._name_files(warned, name)
        if outcome.error is not None:
            if isinstance(outcome.error, InvariantViolation):
                self._note_violation(outcome.error, name)
            _reemit(caught)
            raise outcome.error
        self._note_violation(result.violation, name)
        _reemit(caught)
        self.runs.append(result)
        return result

    def resume(self, step: Any, steps: int, *, name: str | None = None, path: Any = None, progress: Any = _UNSET,
               chunk: Any = _UNSET, on_violation: Any = _UNSET, **kwargs: Any) -> Any:
        """``jl.resume`` of this test's run ``name`` (``<dir>/<name or trajectory>.h5``), or of the file
        ``path``: the resumed run is this test's (its timings, violation and files, and a manifest entry
        saying the step it resumed from); progress, chunk and violation policy default to the
        marker/options as for ``run``."""
        from ..check.violation import InvariantViolation
        from ..drive.resume import resume as jl_resume
        from ..errors import hide_frame_from_checks

        __tracebackhide__ = hide_frame_from_checks
        if path is not None or (name or "trajectory") not in self._stems:
            name = self._name(name)
        name = name or "trajectory"
        target = Path(path) if path is not None else self._file(name, ".h5")
        timeline = kwargs.pop("timeline", None)
        own_timeline = timeline is None
        if own_timeline:
            timeline = self._timeline(name)
        kwargs.update(progress=self.settings.progress if progress is _UNSET else progress,
                      chunk=self.settings.chunk if chunk is _UNSET else chunk,
                      on_violation=self.settings.on_violation if on_violation is _UNSET else on_violation,
                      timeline=timeline)
        error = None
        with warnings.catch_warnings(record=True) as caught:
            try:
                result = jl_resume(target, step, steps, **kwargs)
            except BaseException as e:
                result, error = getattr(e, "jaxlog_run", None), e
        self._collect(None, None, result, name)
        if own_timeline:
            self._write_timeline(timeline)
        self._note_timings(result, name)
        _reemit(caught)
        if error is not None:
            if isinstance(error, InvariantViolation):
                self._note_violation(error, name)
            raise error
        self._note_violation(result.violation, name)
        self.runs.append(result)
        return result

    def from_arrays(self, records: Any, *, name: str | None = None, sinks: Any = (), on_violation: Any = _UNSET,
                    writer_kwargs: dict | None = None, **kwargs: Any) -> Any:
        """``jl.from_arrays`` writing ``<dir>/<name or trajectory[-i]>.h5``: arrays computed elsewhere
        checked and stored as this test's run (goldens, plots and reports as for ``run``)."""
        from ..drive.arrays import from_arrays as jl_from_arrays
        from ..store.hdf5.writer import HDF5Writer

        name = self._name(name)
        writer = HDF5Writer(self._file(name, ".h5"), **(writer_kwargs or {}))
        kwargs.update(sinks=(writer, *tuple(sinks)),
                      on_violation=self.settings.on_violation if on_violation is _UNSET else on_violation)
        caught: list = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                result = jl_from_arrays(records, **kwargs)
        except BaseException as e:
            self._collect(writer, None, getattr(e, "jaxlog_run", None), name)
            if isinstance(e, AssertionError) and hasattr(e, "invariant"):
                self._note_violation(e, name)
            _reemit(caught)
            raise
        _reemit(caught)
        self._collect(writer, None, result, name)
        self._note_violation(result.violation, name)
        self.runs.append(result)
        return result

    def _collect(self, writer: Any, window: Any, result: Any, name: str) -> None:
        arts: dict[str, Path] = {}
        for src in (writer, window, result):
            found = getattr(src, "artifacts", None) if src is not None else None
            if found:
                arts.update({k: Path(v) for k, v in dict(found).items()})
        self._add({k: p for k, p in arts.items() if p.exists()}, name)

    def recorder(self, record: Any = None, *, name: str | None = None, sinks: Any = (), on_violation: Any = _UNSET,
                 writer_kwargs: dict | None = None, **kwargs: Any) -> Any:
        """A ``jl.Recorder`` (Logger protocol, for hand-written loops) writing ``<dir>/<name>.h5``.
        Use it as a context manager; artifacts are gathered when it exits or at teardown."""
        from ..drive.host.recorder import Recorder
        from ..store.hdf5.writer import HDF5Writer

        name = self._name(name)
        writer = HDF5Writer(self._file(name, ".h5"), **(writer_kwargs or {}))
        if "timeline" not in kwargs:
            kwargs["timeline"] = self._timeline(name)
        rec = Recorder(
            record,
            sinks=(writer, *tuple(sinks)),
            on_violation=self.settings.on_violation if on_violation is _UNSET else on_violation,
            **kwargs,
        )
        self._open.append(OpenRecorder(rec, writer, name, kwargs["timeline"]))
        return rec

    def profile_window(self, start: int | None = None, stop: int | None = None, *, name: str = "profile") -> Any:
        """A ``jl.ProfileWindow`` into this test's directory (default window: marker/option)."""
        from ..profiling.window import ProfileWindow

        if start is None or stop is None:
            if self.settings.profile is None:
                raise JaxlogError(f"{self._state.nodeid}: profile_window() needs start, stop (no marker/option window)")
            start, stop = self.settings.profile
        win = ProfileWindow(start, stop, self.dir / file_stem(name))
        self._open.append(OpenWindow(win, name))
        return win

    def check_golden(self, run: Any, name: str | None = None, **options: Any) -> str:
        """Compare ``run`` with ``<jaxlog_golden_dir>/<test id>[--name].h5``; ``--jaxlog-regen`` (re)writes it,
        ``--jaxlog-create-goldens`` writes it when missing. ``options``: those of ``jl.assert_trajectory_close``
        (``rtol=1e-7, atol=0.0, records=None, steps=None, equal_nan=True``). Returns ok|regenerated|created."""
        from .goldens import check

        __tracebackhide__ = True
        return check(self._session, self._state, self._goldens, run, name, options)

    def check_cost(self, run: Any, rtol: float = 0.0, metrics: Any = None, *, name: str | None = None) -> str:
        """Compare ``run.cost`` (or a ``jl.Cost``) with this platform's entry in
        ``<jaxlog_golden_dir>/<test id>[--name].cost.json``; ``jl.CostRegression`` names each metric that moved
        beyond ``rtol`` (either way). ``--jaxlog-regen``/``--jaxlog-create-goldens`` as for ``check_golden``."""
        from .goldens import check_cost

        __tracebackhide__ = True
        return check_cost(self._session, self._state, self._goldens, run, rtol, metrics, name)

    def check_ess(self, values: Any, record: str | None = None, *, per: Any = None, unit: str | None = None,
                  name: str | None = None, sigmas: float = 3.0, chain_axis: int | None = None,
                  inconclusive: str = "fail") -> str:
        """Compare the effective sample size per unit of cost (``per`` gradient evaluations by default,
        ``unit="s"`` for seconds) of ``values`` (a run or trajectory and its ``record``, draws with
        ``chain_axis``, a ``jl.EffectiveSampleSize``, or a ``jl.EssRate`` without ``per``) with
        ``<jaxlog_golden_dir>/<test id>[--name].ess.json``: fails where it is below the stored rate by more
        than ``sigmas`` combined standard errors, and where the errors are too large to tell (unless
        ``inconclusive="pass"``). ``--jaxlog-regen``/``--jaxlog-create-goldens`` as for ``check_golden``."""
        from .goldens import check_ess

        __tracebackhide__ = True
        return check_ess(self._session, self._state, self._goldens, values, record, per, unit, name, sigmas,
                         chain_axis, inconclusive)

    def benchmark(self, step: Any, state: Any, steps: int, *, reference: Any = None, name: str | None = None,
                  **kwargs: Any) -> Any:
        """``jl.benchmark`` (warm timings, interleaved with ``reference``'s, with a confidence interval on the
        ratio and a verdict); its figures go into the test's report section and manifest entry, saved and compared
        across sessions by ``--jaxlog-benchmark-save/-compare`` under ``name`` (default ``benchmark``,
        ``benchmark-1``...). Compared, it repeats until the comparison can tell too."""
        from ..drive.benchmark import benchmark

        __tracebackhide__ = True
        baselines = self._session.baselines
        name = baselines.name_for(self._state, name)
        result = baselines.settle(benchmark(step, state, steps, reference=reference,
                                            decided=baselines.decider(self._state, name), **kwargs))
        self._state.notes.append(f"benchmark: {result.describe()}")
        self._session.baselines.note(self._state, name, result)
        return result

    def load(self, name: str | None = None) -> Any:
        """``jl.load`` of this test's trajectory ``name`` (default: the first)."""
        from ..store.hdf5.trajectory import load

        return load(self._file(name or "trajectory", ".h5"))

    def refresh(self) -> None:
        """Gather the files and violations of recorders and windows so far (idempotent)."""
        for entry in self._open:
            if isinstance(entry, OpenRecorder):
                rec = entry.recorder
                self._collect(entry.writer, None, rec, entry.stem)
                if getattr(rec, "status", "new") not in ("new", "running"):  # finished: write our timeline now
                    self._write_timeline(entry.timeline)
                self._note_violation(getattr(rec, "violation", None), entry.stem)
            else:
                self._collect(None, entry.window, None, entry.stem)

    def close(self) -> None:
        """Gather artifacts of recorders/windows, write timelines (the test's `with` blocks closed them)."""
        try:
            self.refresh()
            windows = any(isinstance(e, OpenWindow) for e in self._open)
            for entry in self._open:
                if not isinstance(entry, OpenRecorder):
                    continue
                self._note_timings(entry.recorder, entry.stem)
                if self.settings.profile is not None and not windows:  # say why no trace came out
                    a, b = self.settings.profile
                    self._state.notes.append(
                        f"profile window {a}:{b} ({self.settings.profile_source}) not applied to recorder "
                        f"{self._label(entry.stem)!r}: in hand-written loops log a jaxlog.profile_window() too "
                        "(jl.CompositeLogger(recorder, window))"
                    )
        finally:
            self._open.clear()
            for pending in list(self._timelines):
                self._write_timeline(pending.timeline)
            if self in self._state.fixtures:
                self._state.fixtures.remove(self)


def process_suffix() -> str:
    """``.p<i>`` in process *i* of a run over several processes (``jax.distributed``), else nothing:
    a trajectory is one file the processes write parts of, a timeline or profile is each one's own."""
    import jax

    return f".p{jax.process_index()}" if jax.process_count() > 1 else ""


def file_stem(name: str) -> str:
    """The file stem of run ``name``: the name itself, or (over 100 characters, where the file names
    ``<stem>-profile/...``/``<stem>.pftrace`` would near the 255-byte limit) its start and a hash."""
    if len(name) <= 100:
        return name
    import hashlib

    return f"{name[:80]}-{hashlib.sha1(name.encode()).hexdigest()[:10]}"


def _stopped_before(window: Any, result: Any) -> str | None:
    """A run stopped (a violation, ``until=``) before its profile window's first step: the device may
    have run window steps past the stop (chunks are dispatched ahead), but the run's result ends
    before them, so their trace is removed and a note says why there is none; None otherwise."""
    done = getattr(result, "steps_done", None)
    if window is None or not isinstance(done, int) or window.start <= done or not window.reached:
        return None  # reached, or known unreached (the window's own note says so and it kept nothing)
    if window.session_dir is not None:
        shutil.rmtree(window.session_dir, ignore_errors=True)  # what is left of it is not listed (_collect)
    with contextlib.suppress(OSError):
        window.dir.rmdir()  # the window's folder, when nothing else is in it
    reason = getattr(result, "stop_reason", None) or getattr(result, "status", None)
    return (f"profile window {window.start}:{window.stop} not reached: the run stopped at step {done}"
            f"{f' ({reason})' if reason else ''}; no trace kept")


def _reemit(caught: list) -> None:
    """Warnings caught around a ``jl.run`` call in ``JaxlogFixture.run``: jaxlog's own at the line of the test
    that called ``jaxlog.run`` (stack: _reemit, run, caller), others where they were first raised. A
    violation's warning is written again from the violation, which now names the files as the session
    shows them."""
    for w in caught:
        if issubclass(w.category, JaxlogRuntimeWarning):
            violation = getattr(w.message, "violation", None)
            if violation is not None:
                message = JaxlogRuntimeWarning(str(violation))
                message.violation = violation  # type: ignore[attr-defined]
                warnings.warn(message, stacklevel=3)
                continue
            warnings.warn(w.message, stacklevel=3)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)

# ---------------------------------------------------------------------------------------------
# The ``jaxlog_factory`` fixture's object, for hypothesis ``@given`` tests: a function-scoped
# fixture would be shared by every example (hypothesis rejects it), so each example opens its own
# ``jaxlog`` with ``with jaxlog_factory() as jaxlog:`` and gets its own directory.

class JaxlogFactory:
    """``with jaxlog_factory() as jaxlog:`` per hypothesis example. Each example gets
    ``<test dir>/example-<n>``; a passing example's directory is removed (unless keep=all), a failing
    one is kept, replacing the previous failing one (hypothesis replays the minimal failing example last)."""

    def __init__(self, session: JaxlogSession):
        self._session = session

    @contextmanager
    def __call__(self) -> Iterator[JaxlogFixture]:
        item = self._session.current_item
        if item is None:
            raise JaxlogError("jaxlog_factory() must be used inside a running test")
        state = self._session.state_for(item)
        if state.pending_example is not None:  # a new example: the previous one passed
            state.drop_example(state.pending_example)
            state.pending_example = None
        n = state.examples
        state.examples += 1
        d = state.dir / f"example-{n}"
        fx = JaxlogFixture(self._session, state, d)
        failed = False
        try:
            yield fx
        except BaseException:
            failed = True
            raise
        finally:
            try:
                fx.close()
            except BaseException:
                failed = True
                raise
            finally:
                _settle(state, d, failed)


def _settle(state: TestState, d: Path, failed: bool) -> None:
    """After an example: keep it (failed, keep=failed|all), remember it as pending (passed inside
    `with`, the test may still fail after it), or remove it."""
    keep = state.settings.keep
    if keep == "all":
        return
    if failed and keep == "failed":
        prev = state.kept_example
        if prev is not None and prev != d:
            state.drop_example(prev)
        state.kept_example = d
        return
    if keep == "failed":  # passed inside `with`; removed when the next example starts or the test passes
        state.pending_example = d
        return
    state.drop_example(d)
