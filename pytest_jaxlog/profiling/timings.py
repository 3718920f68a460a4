"""Timings of a run and the compilations behind them, with assertions that read well in a test.

Absolute times are noisy on CI, so the assertions are about counts (``assert_compiles``) and
ratios against another measurement of the same machine (``assert_faster_than``/``assert_overhead``).

Compilations are seen through two public JAX channels: the ``jax.monitoring`` event
``/jax/core/compile/backend_compile_duration`` (name and seconds, always emitted; an executable
loaded from the persistent compilation cache emits it too, just after
``/jax/compilation_cache/cache_hits`` on the same thread, so it is marked ``cached``) and the
"Compiling <name> with global shapes and types ..." log record (argument shapes/dtypes). The
record is taken at DEBUG level from its one logger while a tracker is open, so enabling the
tracker does not print warnings the way ``jax_log_compiles`` does.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from ..errors import JaxlogAssertionError, JaxlogError, JaxlogRuntimeWarning
from ..record.values import check_count, positive

__all__ = ["CompileEvent", "CompileTracker", "MIN_TIMED_STEPS", "Timings", "TimingAssertionError", "describe_avals"]

#: The fewest work steps a run needs to have a rate (``Timings.timed``). A shorter run's time is
#: mostly what every run costs once (its first dispatch, the last pull, the host's bookkeeping),
#: so steps per second from it would describe the run's overhead, not the kernel's speed.
MIN_TIMED_STEPS = 10


class TimingAssertionError(JaxlogAssertionError):
    """A timing or compilation assertion failed (``assert_compiles``, ``assert_faster_than``,
    ``assert_overhead``): a ``jl.JaxlogError`` and an ``AssertionError``."""


def _reference(other: Any, what: str, attr: str) -> float:
    """The reference of a relative assertion: ``attr`` of another ``Timings`` (or of the run or
    recorder holding them, ``.timings``), or a number."""
    if isinstance(getattr(other, "timings", None), Timings):
        other = other.timings
    if isinstance(other, Timings):
        return getattr(other, attr)
    return positive(other, what)

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
# The logger JAX's lowering uses for the "Compiling ..." record; only its name is used here.
_COMPILE_LOGGER = "jax._src.interpreters.pxla"
_COMPILE_PREFIX = "Compiling "


def _short_dtype(dtype: Any) -> str:
    name = np.dtype(dtype).name if not hasattr(dtype, "name") else dtype.name
    short = {
        "float16": "f16", "float32": "f32", "float64": "f64", "bfloat16": "bf16",
        "int8": "s8", "int16": "s16", "int32": "s32", "int64": "s64",
        "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
        "bool": "bool", "complex64": "c64", "complex128": "c128",
    }
    return short.get(name, name)


def describe_avals(avals: Iterable[Any]) -> tuple[str, ...]:
    """``ShapedArray(float32[64,3])`` -> ``"f32[64,3]"``; weak types marked ``"weak_type f32[]"``."""
    out = []
    for aval in avals:
        shape = getattr(aval, "shape", None)
        dtype = getattr(aval, "dtype", None)
        if shape is None or dtype is None:
            out.append(str(aval))
            continue
        try:
            text = f"{_short_dtype(dtype)}[{','.join(str(d) for d in shape)}]"
        except TypeError:
            text = str(aval)
        if getattr(aval, "weak_type", False):
            text = f"weak_type {text}"
        out.append(text)
    return tuple(out)


_primitive_names: frozenset[str] | None = None


def _primitives() -> frozenset[str]:
    """Names of JAX primitives: eager ``jnp`` ops compile as ``jit(<primitive name>)``."""
    global _primitive_names
    if _primitive_names is None:
        import sys

        names: set[str] = {"stage"}
        try:
            import jax.extend.core as jcore
            import jax.extend.core.primitives  # noqa: F401  (the public list)

            # The public list misses a few (e.g. ``stage_p`` behind jnp.asarray): also read the
            # primitives already defined by loaded jax modules (nothing is imported for this).
            for mod_name, mod in list(sys.modules.items()):
                if mod is None or not (mod_name == "jax" or mod_name.startswith(("jax.", "jaxlib."))):
                    continue
                for v in list(getattr(mod, "__dict__", {}).values()):
                    if isinstance(v, jcore.Primitive):
                        names.add(v.name)
        except (ImportError, AttributeError):  # pragma: no cover - API moved
            # safe to drop: without the list, eager ops count as compilations, which a failing
            # assert_compiles then names one by one (jit(add), ...): nothing is hidden
            pass
        _primitive_names = frozenset(names - {"jit", "pjit", "closed_call", "core_call"})
    return _primitive_names


@dataclass
class CompileEvent:
    """One compilation: JAX's name for it (``"jit(step)"``), argument shapes/dtypes, backend seconds.

    ``end_ns`` is ``time.perf_counter_ns()`` when the backend compile finished (None if unseen).
    ``cached``: the executable came from JAX's persistent compilation cache (traced and lowered,
    not compiled; ``seconds`` is then the time to load it). ``reason``: why a driver compiled
    again what it had compiled before in the same run, where it can tell (the argument that
    differed, or none: JAX's caches no longer held the program).
    """

    name: str
    args: tuple[str, ...] | None = None
    seconds: float | None = None
    thread: str | None = None
    end_ns: int | None = field(default=None, compare=False)
    cached: bool = False
    reason: str | None = field(default=None, compare=False)

    @property
    def eager(self) -> bool:
        """A single-primitive program from an eager op (``jit(convert_element_type)``), not a user function."""
        return self.function in _primitives()

    @property
    def function(self) -> str:
        """The bare function name: ``"jit(step)"`` -> ``"step"``."""
        name = self.name
        for prefix in ("jit(", "pjit(", "pmap(", "xla_pmap(", "shard_map("):
            if name.startswith(prefix) and name.endswith(")"):
                return name[len(prefix):-1]
        return name

    def __str__(self) -> str:
        args = "(?)" if self.args is None else f"({', '.join(self.args)})"
        secs = "" if self.seconds is None else f" [{self.seconds * 1e3:.1f} ms{', from the cache' if self.cached else ''}]"
        why = "" if self.reason is None else f" (compiled again: {self.reason})"
        return f"{self.function}{args}{secs}{why}"

    def to_json(self) -> dict:
        return {"name": self.name, "args": None if self.args is None else list(self.args),
                "seconds": self.seconds, "thread": self.thread, "cached": self.cached, "reason": self.reason}

    @classmethod
    def from_json(cls, d: dict) -> "CompileEvent":
        args = d.get("args")
        return cls(d["name"], None if args is None else tuple(args), d.get("seconds"), d.get("thread"),
                   cached=bool(d.get("cached", False)), reason=d.get("reason"))


# --- process-wide hookup: one handler and one monitoring listener, shared by open trackers -------

_hook_lock = threading.RLock()
_open_trackers: list["CompileTracker"] = []
_saved_level: int | None = None
# When only we lowered the logger to DEBUG, its records stop propagating (so pytest's log capture
# and users' handlers do not fill with "Compiling ..." lines) and we forward those at or above the
# level that was in force before.
_forward_from: int | None = None


class _Handler(logging.Handler):
    """Reads JAX's "Compiling ..." records for the open trackers. A fault here must never break
    the user's compile, nor vanish: each tracker it concerns keeps the error and warns when it
    closes (its counts may be short)."""

    def emit(self, record: logging.LogRecord) -> None:  # noqa: D401 - logging API
        with _hook_lock:
            trackers = list(_open_trackers)
        try:
            if not (isinstance(record.msg, str) and record.msg.startswith(_COMPILE_PREFIX)):
                return
            try:
                args = record.args if isinstance(record.args, tuple) else ()
                if len(args) >= 2 and isinstance(args[0], str):
                    name, avals = args[0], describe_avals(args[1])
                else:  # message format changed: keep the name if we can
                    name, avals = record.getMessage()[len(_COMPILE_PREFIX):].split(" ", 1)[0], None
            except Exception as e:  # kept by every open tracker (see the class docstring)
                for t in trackers:
                    t.errors.append(f"{type(e).__name__}: {e}")
                return
            for t in trackers:
                try:
                    t._on_lowering(name, avals, record.threadName)
                except Exception as e:  # kept by this tracker (see the class docstring)
                    t.errors.append(f"{type(e).__name__}: {e}")
        finally:
            forward_from, parent = _forward_from, logging.getLogger(_COMPILE_LOGGER).parent
            if forward_from is not None and record.levelno >= forward_from and parent is not None:
                parent.handle(record)


_handler = _Handler(level=logging.DEBUG)
_listening = False  # ``_on_duration`` is registered with jax.monitoring


def _on_event(event: str, **kwargs: Any) -> None:
    if event != CACHE_HIT_EVENT:
        return
    thread = threading.current_thread().name
    with _hook_lock:
        trackers = list(_open_trackers)
    for t in trackers:
        t._on_cache_hit(thread)


def _on_duration(event: str, duration: float, **kwargs: Any) -> None:
    if event != BACKEND_COMPILE_EVENT:
        return
    name = str(kwargs.get("fun_name", "?"))
    thread = threading.current_thread().name
    with _hook_lock:
        trackers = list(_open_trackers)
    for t in trackers:
        t._on_backend_compile(name, float(duration), thread)


def _reading(trackers: list["CompileTracker"]) -> bool:
    return any(t.read_args for t in trackers)


def _hook(tracker: "CompileTracker") -> None:
    global _saved_level, _forward_from, _listening
    import jax.monitoring

    with _hook_lock:
        if tracker.read_args and not _reading(_open_trackers):  # the first to read JAX's compile log
            logger = logging.getLogger(_COMPILE_LOGGER)
            _saved_level = logger.level
            if logger.getEffectiveLevel() > logging.DEBUG and logger.propagate:
                _forward_from = logger.getEffectiveLevel()
                logger.setLevel(logging.DEBUG)
                logger.propagate = False
            logger.addHandler(_handler)
        if not _listening:
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            jax.monitoring.register_event_listener(_on_event)
            _listening = True
        _open_trackers.append(tracker)


def _unhook(tracker: "CompileTracker") -> None:
    global _forward_from, _listening
    import jax.monitoring

    with _hook_lock:
        if tracker in _open_trackers:
            _open_trackers.remove(tracker)
        if tracker.read_args and not _reading(_open_trackers):  # the last to read it: the log as it was
            logger = logging.getLogger(_COMPILE_LOGGER)
            logger.removeHandler(_handler)
            if _forward_from is not None:
                logger.propagate = True
                _forward_from = None
            if _saved_level is not None:
                logger.setLevel(_saved_level)
        if not _open_trackers:
            # jax < 0.8.1 has no public unregister: there the listeners stay registered for the
            # process, and with no tracker open ``_on_duration`` and ``_on_event`` have nobody to tell.
            unregister = getattr(jax.monitoring, "unregister_event_duration_listener", None)
            unregister_event = getattr(jax.monitoring, "unregister_event_listener", None)
            if unregister is not None and unregister_event is not None:
                for undo, listener in ((unregister, _on_duration), (unregister_event, _on_event)):
                    try:
                        undo(listener)
                    except (AssertionError, ValueError, KeyError):
                        pass  # already gone (jax.monitoring.clear_event_listeners): nothing to undo
                _listening = False


class CompileTracker:
    """Context manager recording every JAX compilation that happens while it is open.

    ``CompileTracker()`` counts every compilation except eager single-primitive ones (``jnp``
    ops outside ``jit`` compile a tiny ``jit(<primitive>)`` once per process; ``eager=True``
    counts those too); ``CompileTracker(step)`` (functions or names) counts only those functions;
    ``exclude=`` names functions never to count (a driver's own helpers). ``.count``/``.events``
    are the counted ones, ``.all_events`` everything seen. Compilations on other threads are seen
    too: the JAX hooks are global. Trackers nest and may overlap in time; the logger level is
    restored when the last one exits.

    ``read_args=False``: the argument types are not read, and JAX's compile log is left as it
    is (lowering its level and restoring it costs ~10 µs per tracker, more in a process with
    many loggers: a driver that opens one per run knows its arguments itself). Events then have
    ``args=None``, unless a tracker that reads them is open at the same time.
    """

    def __init__(self, *functions: Callable | str, exclude: Iterable[Callable | str] = (), eager: bool = False,
                 read_args: bool = True):
        self.read_args = bool(read_args)
        self.functions = frozenset(_names(functions))
        self.exclude = frozenset(_names(exclude))
        self.eager = bool(eager)
        self.all_events: list[CompileEvent] = []
        self.errors: list[str] = []  # failures of our logging hook while open (counts may be short)
        self._hits: dict[str, int] = {}  # per thread: persistent-cache hits not yet paired with their compile
        self._lock = threading.Lock()
        self._open = False

    # hooks (called from any thread)
    def _on_lowering(self, name: str, args: tuple[str, ...] | None, thread: str) -> None:
        with self._lock:
            self.all_events.append(CompileEvent(name, args, None, thread))

    def _on_cache_hit(self, thread: str) -> None:
        with self._lock:
            self._hits[thread] = self._hits.get(thread, 0) + 1

    def _on_backend_compile(self, name: str, seconds: float, thread: str) -> None:
        end = time.perf_counter_ns()
        function = CompileEvent(name).function  # jax < 0.7 logs the lowering of "jit(f)" as "f"
        with self._lock:
            cached = self._hits.get(thread, 0) > 0  # the cache hit this thread saw just before
            if cached:
                self._hits[thread] -= 1
            for ev in self.all_events:  # pair with the oldest lowering of that function still unpaired
                if ev.function == function and ev.seconds is None and ev.thread == thread:
                    ev.name, ev.seconds, ev.end_ns, ev.cached = name, seconds, end, cached
                    return
            self.all_events.append(CompileEvent(name, None, seconds, thread, end, cached))

    def __enter__(self) -> "CompileTracker":
        if self._open:
            raise JaxlogError("CompileTracker is already open: use one tracker per `with` block")
        self._open = True
        _hook(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._open = False
        _unhook(self)
        if self.errors:
            warnings.warn(JaxlogRuntimeWarning(
                f"[jaxlog] compile tracking failed to read {len(self.errors)} JAX compile log record(s) "
                f"({self.errors[0]}): compile counts and argument types may be incomplete"), stacklevel=2)

    def _counts(self, ev: CompileEvent) -> bool:
        if ev.function in self.exclude or ev.name in self.exclude:
            return False
        if self.functions:
            return ev.function in self.functions or ev.name in self.functions
        return self.eager or not ev.eager

    def signatures(self) -> list[tuple[str, tuple[str, ...] | None]]:
        """Distinct ``(function, argument types)`` among the counted compilations, first-seen order.

        A driver that compiles one program per chunk length sees the same signature several
        times; a kernel whose weak types or shapes change shows new signatures.
        """
        return list(dict.fromkeys((ev.function, ev.args) for ev in self.events))

    def add_to_timeline(self, timeline: Any, track: str = "compile") -> None:
        """One slice per counted compilation (backend compile time) on ``track`` of a Timeline."""
        for ev in self.events:
            if ev.end_ns is not None and ev.seconds is not None:
                timeline.slice(track, ev.function, ev.end_ns - int(ev.seconds * 1e9), ev.end_ns,
                               {"name": ev.name, "args": ", ".join(ev.args or ())})

    @property
    def events(self) -> list[CompileEvent]:
        """Compilations of the tracked functions (all compilations when none were given)."""
        with self._lock:
            return [ev for ev in self.all_events if self._counts(ev)]

    @property
    def count(self) -> int:
        return len(self.events)

    @property
    def seconds(self) -> float:
        return float(sum(ev.seconds or 0.0 for ev in self.events))

    def timings(self, wall_s: float, steps: int, window: np.ndarray | None = None, *,
                distinct: bool = False, events: Iterable[CompileEvent] | None = None,
                signature: Callable[[CompileEvent], Any] | None = None) -> "Timings":
        """Build the :class:`Timings` of a run measured while this tracker was open.

        ``distinct=True``: ``compiles`` counts distinct signatures (see :meth:`signatures`), for
        drivers that compile the same step once per chunk length; ``signature`` says what makes
        two compilations one instead. ``events``: the compilations to report (default: the
        counted ones). ``from_cache`` counts the signatures whose programs all came from the cache.
        """
        events = tuple(self.events if events is None else events)
        if signature is None and distinct:
            signature = _function_and_args
        if signature is None:
            n, cached = len(events), sum(ev.cached for ev in events)
        else:
            groups: dict = {}
            for ev in events:
                groups.setdefault(signature(ev), []).append(ev)
            n, cached = len(groups), sum(all(ev.cached for ev in evs) for evs in groups.values())
        return Timings(wall_s=float(wall_s), steps=int(steps), compiles=n,
                       compile_s=float(sum(ev.seconds or 0.0 for ev in events)),
                       compile_events=events, window=window, from_cache=cached)


def _function_and_args(ev: CompileEvent) -> tuple:
    return ev.function, ev.args


def _names(functions: Iterable[Callable | str]) -> set[str]:
    names = set()
    for f in functions:
        if isinstance(f, str):
            names.add(f)
        else:
            name = getattr(f, "__name__", None) or getattr(getattr(f, "func", None), "__name__", None)
            if name is None:
                raise JaxlogError(f"CompileTracker needs functions or names, got {f!r}")
            names.add(name)
    return names


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@dataclass
class Timings:
    """How long a run took and what it compiled.

    ``wall_s`` covers the whole run (compilation included), ``steps`` the work steps done,
    ``compiles``/``compile_s``/``compile_events`` the step function's compilations during the run,
    ``window`` the per-step seconds of the profile window read back from the trace (or None).
    ``from_cache``: how many of the ``compiles`` JAX loaded from its persistent compilation cache
    (``--jaxlog-compile-cache``) instead of compiling: traced and lowered, not compiled, so a warm
    cache shows ``from_cache == compiles``. ``programs`` (``jl.run``): the distinct programs the run
    dispatched, whether compiled now or earlier in this process (``reused``), so ``compiles``
    says what this run paid and ``programs`` what it needed, whatever ran before it.
    Throughput (``steps_per_s``, ``s_per_step``) is over ``run_s``, the stepping alone, so a cold
    and a warm run of the same kernel compare their stepping, not the compiler: ``stepping_s``
    when the driver measured it (``jl.run``: its device loop, less the first dispatch when that
    traced and compiled the program; file creation and schema resolution are per-run costs, not
    stepping), else the wall time less the backend compile time.
    """

    wall_s: float
    steps: int
    compiles: int = 0
    compile_s: float = 0.0
    compile_events: tuple[CompileEvent, ...] = field(default_factory=tuple)
    window: np.ndarray | None = None
    stepping_s: float | None = None
    from_cache: int = 0
    programs: int | None = None  # distinct programs the run dispatched (jl.run), None where unknown
    # jl.run: loop slots computed and thrown away (its device loop steps in blocks of a trip count XLA
    # knows; a slot past a dispatch's end or an until= stop is masked). At most block - 1 per dispatch
    masked_steps: int = 0
    # the loop slots each profile-window step's dispatch computed, one kept: a window step's seconds
    # are that many steps' work (jl.run on a GPU: a block, 32 unless JAXLOG_BLOCK says otherwise)
    window_slots: int = 1

    @property
    def compiled_programs(self) -> int:
        """The distinct programs among the compilations (a program compiled twice is one)."""
        return len({(ev.function, ev.args) for ev in self.compile_events}) if self.compile_events else self.compiles

    @property
    def reused(self) -> int:
        """Programs the run ran without compiling or loading them: compiled earlier in this process."""
        return max((self.programs or 0) - self.compiled_programs, 0)

    @property
    def run_s(self) -> float:
        """Seconds spent stepping (see the class docstring)."""
        if self.stepping_s is not None:
            return max(self.stepping_s, 0.0)
        return max(self.wall_s - self.compile_s, 0.0)

    @property
    def timed(self) -> bool:
        """Whether the run is long enough to time: at least ``MIN_TIMED_STEPS`` work steps and a
        stepping time the clock measured. A run too short to time has no rate: ``steps_per_s`` and
        ``s_per_step`` are NaN (null in the manifest, left out of the summary and the report)."""
        return self.steps >= MIN_TIMED_STEPS and self.run_s > 0

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.run_s if self.timed else math.nan

    @property
    def s_per_step(self) -> float:
        return self.run_s / self.steps if self.timed else math.nan

    def _compile_list(self, limit: int = 8) -> str:
        if not self.compile_events:
            return ""
        shown = "; ".join(str(ev) for ev in self.compile_events[:limit])
        more = len(self.compile_events) - limit
        return ": " + shown + (f"; ... and {more} more" if more > 0 else "")

    def assert_compiles(self, n: int, *, at_most: bool = False) -> None:
        """Assert the run needed ``n`` programs, with no recompilation (``at_most=True``: no more than ``n``).

        Where the driver knows its programs (``jl.run``), ``n >= 1`` is judged against ``programs``,
        what the run needed whether compiled now, loaded from the persistent cache or compiled
        earlier in this process (a kernel built once at module level and run by several tests),
        so the assertion does not depend on which test ran first. ``n == 0`` asks that the run
        compiled nothing at all: everything it ran was compiled already (the check that a second
        run reuses the first one's program). Elsewhere (``jl.Recorder``, ``CompileTracker``)
        ``n`` is the compilations seen. The failure (``jl.TimingAssertionError``) says how many
        programs were compiled fresh, loaded from the cache and reused, and names each compilation
        with its argument shapes/dtypes: usually enough to see a weak type or a changing shape.
        """
        __tracebackhide__ = True
        n = check_count(n, "assert_compiles(n)", expected="must be an integer >= 0")
        if self.programs is None or n == 0:
            seen = self.compiles
        else:
            seen = max(self.programs, self.compiles)
        ok = seen <= n if at_most else seen == n
        if not ok:
            what = "compilation" if self.programs is None or n == 0 else "program"
            want = f"at most {_plural(n, what)}" if at_most else _plural(n, what)
            raise TimingAssertionError(f"[jaxlog] expected {want}, saw {seen}{self._provenance()}{self._compile_list()}")

    def _provenance(self) -> str:
        """`` (the run needed 2 programs: 1 compiled fresh, 1 from the persistent cache, 0 reused ...)``."""
        if self.programs is None:
            return ""
        again = f" and compiled {_plural(self.compiles, 'time')}" if self.compiles > self.programs else ""
        return (f" (the run needed {_plural(self.programs, 'program')}{again}: "
                f"{self.compiles - self.from_cache} compiled fresh, {self.from_cache} loaded from the persistent "
                f"compilation cache, {self.reused} reused from this process)")

    def assert_faster_than(self, other: "Timings | Any | float", ratio: float = 1.0) -> None:
        """Assert ``self.steps_per_s >= ratio * other.steps_per_s`` (``other``: Timings, a ``Run`` or
        ``Recorder`` holding them, or steps/s).

        ``ratio=1.0``: at least as fast; ``ratio=0.9``: may be up to 10% slower in throughput;
        ``ratio=2.0``: at least twice as fast. Fails with ``jl.TimingAssertionError``.
        """
        __tracebackhide__ = True
        ratio = positive(ratio, "assert_faster_than(ratio=...)")
        base = _reference(other, "assert_faster_than(other): a reference in steps/s", "steps_per_s")
        self._timed_both(base, "throughput")
        if not self.steps_per_s >= ratio * base:
            raise TimingAssertionError(
                f"[jaxlog] expected at least {ratio:g}x the throughput of the reference "
                f"({ratio * base:.4g} steps/s), got {self.steps_per_s:.4g} steps/s "
                f"({self.steps_per_s / base if base else math.inf:.3g}x; reference {base:.4g} steps/s)")

    def assert_overhead(self, limit: "Timings | float", at_most: float) -> None:
        """Assert seconds per step ``<= at_most * limit``'s (``limit`` may be seconds per step).

        The performance-contract form: ``run.timings.assert_overhead(bare_scan, at_most=1.10)``.
        Fails with ``jl.TimingAssertionError``.
        """
        __tracebackhide__ = True
        at_most = positive(at_most, "assert_overhead(at_most=...)")
        base = _reference(limit, "assert_overhead(limit): a reference in seconds per step", "s_per_step")
        self._timed_both(base, "time per step")
        if not self.s_per_step <= at_most * base:
            raise TimingAssertionError(
                f"[jaxlog] expected at most {at_most:g}x the reference time per step "
                f"({at_most * base * 1e6:.4g} us), got {self.s_per_step * 1e6:.4g} us "
                f"({self.s_per_step / base if base else math.inf:.3g}x)")

    def _timed_both(self, base: float, what: str) -> None:
        """A comparison with a run too short to time would compare overheads: said, not judged."""
        __tracebackhide__ = True
        need = f"a rate needs at least {MIN_TIMED_STEPS} work steps"
        if not self.timed:
            raise TimingAssertionError(f"[jaxlog] cannot compare the {what}: this run is too short to time ({need}; "
                                       f"it did {self.steps} in {self.run_s:.3g} s of stepping)")
        if math.isnan(base):
            raise TimingAssertionError(f"[jaxlog] cannot compare the {what}: the reference run is too short to "
                                       f"time ({need})")

    def to_json(self) -> dict:
        return {"wall_s": self.wall_s, "steps": self.steps,
                "steps_per_s": self.steps_per_s if self.timed else None,
                "compiles": self.compiles, "from_cache": self.from_cache, "programs": self.programs,
                "compile_s": self.compile_s,
                "compile_events": [ev.to_json() for ev in self.compile_events],
                "window": None if self.window is None else [float(x) for x in self.window],
                "window_slots": self.window_slots}

    @classmethod
    def from_json(cls, d: dict) -> "Timings":
        window = d.get("window")
        return cls(wall_s=float(d["wall_s"]), steps=int(d["steps"]), compiles=int(d.get("compiles", 0)),
                   compile_s=float(d.get("compile_s", 0.0)), from_cache=int(d.get("from_cache", 0)),
                   programs=None if d.get("programs") is None else int(d["programs"]),
                   compile_events=tuple(CompileEvent.from_json(e) for e in d.get("compile_events", ())),
                   window=None if window is None else np.asarray(window, dtype=np.float64),
                   window_slots=int(d.get("window_slots", 1)))
