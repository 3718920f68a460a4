"""``jl.benchmark``: warm timings of a kernel with statistics, against a reference timed in the
same process, interleaved with it, repeated until the noise allows a verdict.

One timing on a shared machine says little: the load changes from second to second. What stays
is the *ratio* to a reference run just before or after, under the same load. So each repeat
times the kernel and the reference alternately (``number`` times each, the order alternating so
neither always runs first) and takes the ratio of their fastest runs (load only ever adds time:
the fastest of a few runs is the least disturbed, and the two were disturbed alike); the
benchmark judges the median of the repeats' ratios by its distribution-free confidence interval
(``profiling.speed``) against a threshold ``than``: *slower* (the whole interval above it), *not
slower* (the whole interval at or below it) or *cannot tell* (``profiling.speed``). A verdict
that cannot tell is not a pass in disguise: it says the noise hid the answer, and ``detectable``
says which slow-down the measurement could have seen.

Why adaptive: a fixed number of repeats is too many on a quiet machine and too few under load.
After ``repeats`` repeats the benchmark looks at the interval; while it cannot tell, it times
``repeats`` more and looks again, up to ``max_repeats`` or the time budget (``profiling.speed``:
the looks are planned in advance and share the error, so looking again does not make noise come
out "slower" more often than the interval's coverage says).

Why a reference must be independent: the ratio cancels whatever slows both alike, the kernel's
own regressions too when the reference runs the kernel's program. Such a reference is warned
about when the benchmark starts (``profiling.speed``), and a comparison with a saved
run does not take times relative to it.

Timers. ``"wall"``: seconds around each run. ``"cpu"`` (CPU backend): the CPU seconds the whole
process spent in the run (``time.process_time``: every thread, XLA's compute threads included),
which time spent waiting for a core another process holds does not add to: it moves less with the
load than wall time, and it does not see the run's own waiting. ``"device"``: the seconds the
accelerator was busy in each run, read from a JAX profiler trace of the run
(``profiling.trace``): on a GPU that moves much less with the load than wall time, and it
measures the kernels, not the host around them. The CPU backend has no device tracks: there
``timer="device"`` is an error and ``"auto"`` is wall; on an accelerator ``"cpu"`` is an error
(it would leave the device's work out).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable

import jax

from ..errors import JaxlogError, JaxlogRuntimeWarning
from ..profiling.speed import (
    CANNOT_TELL,
    DECIDED,
    DEFAULT_THAN,
    FIXED,
    INCONCLUSIVE_CHOICES,
    INCONCLUSIVE_FLAG,
    MOST_REPEATS,
    SLOWER,
    Decision,
    Interval,
    check_budget,
    check_than,
    decide,
    median,
    median_interval,
    next_look,
    operations,
    plan,
    shared_program,
)
from ..profiling.timings import TimingAssertionError
from ..profiling.window import device_seconds
from .run import run as jl_run

__all__ = ["benchmark", "Benchmark"]

METHOD = "order-statistic interval on the median of the per-repeat ratios (distribution-free)"
TIMERS = ("wall", "cpu", "device", "auto")
_STOPPED = {DECIDED: "decided after {n} repeats", MOST_REPEATS: "{n} repeats, the most allowed (max_repeats)",
            "budget": "{n} repeats, when the time budget (budget_s) would have run out"}


@dataclass(frozen=True)
class Benchmark:
    """What ``jl.benchmark`` measured. ``samples``: per repeat, the kernel's seconds per run
    (``steps`` steps each); ``reference_samples`` the same for the reference. ``ratios``: per
    repeat, the kernel's fastest time over the reference's (above 1: slower); ``ratio`` their
    median and ``interval`` its confidence interval (None without a reference). ``verdict``:
    ``"slower"``, ``"not slower"`` or ``"cannot tell"`` at ``than``; ``detectable``: the smallest
    ratio this interval's width could have shown to be above ``than`` (``profiling.speed``).
    ``looks``: how many looks at the interval were planned (each interval's coverage is shared
    among them); ``stop_reason``: why the repeating stopped (decided, max_repeats, budget, or fixed:
    nothing to decide). ``reference_shares``: why the reference is not independent of the kernel
    (it runs the kernel's program), or None."""

    steps: int
    samples: tuple[tuple[float, ...], ...]
    reference_samples: tuple[tuple[float, ...], ...] | None = None
    ratios: tuple[float, ...] | None = None
    interval: Interval | None = None
    method: str = METHOD
    timer: str = "wall"  # "wall": perf_counter around each run; "cpu": the process's CPU time; "device"
    than: float = DEFAULT_THAN
    confidence: float = 0.95  # the coverage each look's interval was computed for
    looks: int = 1
    stop_reason: str = FIXED
    reference_shares: str | None = None
    inconclusive: str = "pass"  # what "cannot tell" does to assert_not_slower(): pass or fail
    inconclusive_source: str | None = None  # who set inconclusive (the plugin's option), for the message

    @classmethod
    def of(cls, steps: int, samples: Any, reference_samples: Any = None, confidence: float = 0.95,
           timer: str = "wall", **fields: Any) -> "Benchmark":
        """The statistics of given timings (seconds per run, grouped by repeat); ``fields``: the
        others (``than``, ``looks``, ``stop_reason``, ...)."""
        mine = tuple(tuple(float(t) for t in rep) for rep in samples)
        if reference_samples is None:
            return cls(steps, mine, timer=timer, confidence=confidence, **fields)
        theirs = tuple(tuple(float(t) for t in rep) for rep in reference_samples)
        if len(theirs) != len(mine):
            raise JaxlogError(f"jl.Benchmark: {len(mine)} repeats of the kernel but {len(theirs)} of the reference")
        if any(not min(b) > 0 for b in theirs):
            raise JaxlogError(f"jl.Benchmark: a run of the reference took no measurable {timer} time: time more "
                              "steps per run")
        ratios = tuple(min(a) / min(b) for a, b in zip(mine, theirs))
        return cls(steps, mine, theirs, ratios, median_interval(ratios, confidence), timer=timer,
                   confidence=confidence, **fields)

    @property
    def steps_per_s(self) -> float:
        """The kernel's steps per second, from the median of all its runs."""
        return self.steps / median([t for rep in self.samples for t in rep])

    @property
    def reference_steps_per_s(self) -> float | None:
        if self.reference_samples is None:
            return None
        return self.steps / median([t for rep in self.reference_samples for t in rep])

    @property
    def ratio(self) -> float | None:
        return None if self.ratios is None else median(self.ratios)

    def decision(self, than: float | None = None) -> Decision | None:
        """The verdict and the detectable ratio at ``than`` (None: the benchmark's own ``than``);
        None without a reference."""
        if self.interval is None or self.ratio is None:
            return None
        return decide(self.ratio, self.interval, self.than if than is None else than)

    @property
    def verdict(self) -> str | None:
        """slower | not slower | cannot tell, at ``than`` (None without a reference)."""
        found = self.decision()
        return None if found is None else found.verdict

    @property
    def detectable(self) -> float | None:
        """The smallest ratio to the reference the interval's width could have shown above ``than``."""
        found = self.decision()
        return None if found is None else found.detectable

    def assert_not_slower(self, than: float | None = None, inconclusive: str | None = None) -> "Benchmark":
        """Fail (``jl.TimingAssertionError``) when the ratio's whole confidence interval lies above
        ``than`` (default: the ``than`` the benchmark was run for): the kernel is slower than
        ``than`` times the reference beyond the noise. A verdict of "cannot tell" fails only with
        ``inconclusive="fail"`` (default: the benchmark's, which the plugin's
        ``--jaxlog-benchmark-inconclusive`` sets)."""
        __tracebackhide__ = True
        if self.interval is None:
            raise JaxlogError("assert_not_slower needs a reference: jl.benchmark(..., reference=(ref_step, ref_state))")
        than = self.than if than is None else check_than(than, "assert_not_slower(than=...)")
        if inconclusive is not None and inconclusive not in INCONCLUSIVE_CHOICES:
            raise JaxlogError(f"assert_not_slower(inconclusive=...) must be 'pass' or 'fail', got {inconclusive!r}")
        found = self.decision(than)
        assert found is not None
        if found.verdict == SLOWER:
            raise TimingAssertionError(
                f"[jaxlog] kernel slower than {than:g}x its reference: the ratio's {self._interval_text()} lies above "
                f"{than:g}; ratio {self.ratio:.3f} (median of {len(self.samples)} repeats); {self._speeds()}")
        fail = (inconclusive or self.inconclusive) == "fail"
        if found.verdict == CANNOT_TELL and fail:
            fix = (f"{INCONCLUSIVE_FLAG}=pass" if inconclusive is None and self.inconclusive_source
                   else "assert_not_slower(inconclusive='pass')")
            raise TimingAssertionError(
                f"[jaxlog] cannot tell whether the kernel is slower than {than:g}x its reference at this noise: the "
                f"ratio's {self._interval_text()} holds {than:g}; ratio {self.ratio:.3f} (median of "
                f"{len(self.samples)} repeats{self._stopped()}); the measurement could only have detected "
                f"x{found.detectable:.3f} or more; {self._speeds()}. More repeats (repeats=, max_repeats=, "
                f"budget_s=), longer runs, a quieter machine{' or timer=' + repr('cpu') if self.timer == 'wall' else ''}"
                f" narrow the interval; \"cannot tell\" fails here because of "
                f"{self.inconclusive_source or 'inconclusive=' + repr('fail')}: {fix}")
        return self

    def describe(self) -> str:
        """The figures in one line: the ratio, its interval, the verdict and both speeds (without a
        reference: the speed)."""
        found = self.decision()
        if found is None:
            return self._speeds()
        shares = f"; not independent: {self.reference_shares}" if self.reference_shares else ""
        return (f"ratio {self.ratio:.3f} (median of {len(self.samples)} repeats), {self._interval_text()}: "
                f"{found.verdict} at x{self.than:g} (could detect x{found.detectable:.3f}{self._stopped()}); "
                f"{self._speeds()}{shares}")

    def _stopped(self) -> str:
        text = _STOPPED.get(self.stop_reason)
        return "" if text is None else "; " + text.format(n=len(self.samples))

    def _interval_text(self) -> str:
        iv = self.interval
        assert iv is not None
        return f"{iv.coverage:.1%} interval [{iv.lo:.3f}, {iv.hi:.3f}]"

    def _speeds(self) -> str:
        text = f"{self.steps_per_s:,.1f} steps/s (median of {sum(map(len, self.samples))} runs of {self.steps} steps"
        text += {"device": ", device time from the profiler's trace)", "cpu": ", the process's CPU time)"}.get(
            self.timer, ")")
        if self.reference_samples is None:
            return text
        return f"kernel {text}, reference {self.reference_steps_per_s:,.1f} steps/s"

    def __str__(self) -> str:
        return f"Benchmark({self.describe()})"


def benchmark(step: Callable, state: Any, steps: int, *, reference: Any = None, repeats: int = 15, number: int = 5,
              warmup: int = 1, confidence: float = 0.95, timer: str = "wall", than: float = DEFAULT_THAN,
              max_repeats: int | None = None, budget_s: float | None = None,
              decided: Callable[[Benchmark], bool] | None = None, **run_kwargs: Any) -> Benchmark:
    """Time ``jl.run(step, state, steps, **run_kwargs)`` warm: ``warmup`` runs first (compiling),
    then repeats of ``number`` runs each. ``reference=(ref_step, ref_state)`` is run the same way
    (same ``steps`` and ``run_kwargs``), or ``reference=fn`` is called with no arguments (its
    result waited for), interleaved with the kernel's runs; it should share no code with the kernel
    (one that runs the kernel's program is warned about: it cancels the kernel's own regressions).

    With a reference the benchmark repeats until its verdict at ``than`` is "slower" or "not
    slower": ``repeats`` at a time, looking at the interval after each batch, up to
    ``max_repeats`` (default: 4 x repeats, fewer where ``repeats`` is too few for each look's
    share of ``1 - confidence``) or until the next batch would take the time spent past
    ``budget_s`` seconds (default: no limit but ``max_repeats``). ``decided(result)``, where given,
    must hold too (the plugin's baseline comparison). ``timer``: ``"wall"``, ``"cpu"`` (the
    process's CPU time: CPU backend), ``"device"`` (the devices' busy seconds from a profiler trace
    of each run: accelerators) or ``"auto"`` (device time where JAX's backend is not the CPU)."""
    _check_counts(repeats=repeats, number=number, warmup=warmup)
    than = check_than(than, "jl.benchmark(than=...)")
    budget = check_budget(budget_s)
    if decided is not None and not callable(decided):
        raise JaxlogError(f"jl.benchmark: decided= must be a callable taking the Benchmark, got {decided!r}")
    timer = _timer(timer, run_kwargs)
    looks = plan(repeats, max_repeats, confidence, adaptive=reference is not None or decided is not None)
    if reference is not None:
        median_interval([1.0] * repeats, looks.confidence)  # too few repeats for the confidence: say so before timing
    kernel = _timed_run(step, state, steps, run_kwargs, timer)
    ref = None if reference is None else _as_timed(reference, steps, run_kwargs, timer)
    shares = None if reference is None else _shares(step, state, reference, run_kwargs)
    if shares is not None:
        warnings.warn(JaxlogRuntimeWarning(
            f"[jaxlog] jl.benchmark: the reference is not independent of the kernel: {shares}. A ratio to it cancels "
            "whatever slows both alike, so a regression of that shared program does not show in it (nor in a "
            "comparison with a saved run relative to it): time against a reference that shares no code with the "
            "kernel"), stacklevel=2)
    for _ in range(warmup):
        kernel()
        if ref is not None:
            ref()
    mine: list[tuple[float, ...]] = []
    theirs: list[tuple[float, ...]] = []
    fields: dict[str, Any] = dict(timer=timer, than=than, looks=looks.count, reference_shares=shares)
    started, target = time.perf_counter(), looks.at[0]
    while True:
        while len(mine) < target:
            _repeat(kernel, ref, number, len(mine), mine=mine, theirs=theirs)
        result = Benchmark.of(steps, mine, theirs if ref is not None else None, looks.confidence, **fields)
        if ref is None and decided is None:
            return result  # nothing to decide: the given repeats
        if (result.verdict != CANNOT_TELL) and (decided is None or decided(result)):
            return replace(result, stop_reason=DECIDED)
        after = next_look(looks, len(mine), time.perf_counter() - started, budget)
        if after.at is None:
            return replace(result, stop_reason=after.stop_reason)
        target = after.at


def _repeat(kernel: Callable[[], float], ref: Callable[[], float] | None, number: int, index: int, *,
            mine: list, theirs: list) -> None:
    """One repeat: ``number`` runs of each, alternating which goes first (appended to ``mine``/``theirs``)."""
    a: list[float] = []
    b: list[float] = []
    for i in range(number):
        first_kernel = (index + i) % 2 == 0
        for which in ((kernel, ref) if first_kernel else (ref, kernel)):
            if which is not None:
                (a if which is kernel else b).append(which())
    mine.append(tuple(a))
    theirs.append(tuple(b))


def _check_counts(**counts: int) -> None:
    for name, n in counts.items():
        low = 0 if name == "warmup" else 1
        if isinstance(n, bool) or not isinstance(n, int) or n < low:
            raise JaxlogError(f"jl.benchmark: {name} must be an integer >= {low}, got {n!r}")


def _timer(timer: Any, run_kwargs: dict) -> str:
    if timer not in TIMERS:
        raise JaxlogError(f"jl.benchmark: timer= must be 'wall', 'cpu', 'device' or 'auto', got {timer!r}")
    backend = jax.default_backend()
    if timer == "auto":
        timer = "wall" if backend == "cpu" else "device"
    if timer == "device" and run_kwargs.get("profile") is not None:
        raise JaxlogError("jl.benchmark(timer='device') profiles each run itself: leave profile= out")
    if timer == "cpu" and backend != "cpu":
        raise JaxlogError(f"jl.benchmark(timer='cpu') counts the process's CPU time, which leaves out the work of "
                          f"JAX's {backend} devices: use timer='device' (or 'wall') there")
    return timer


def _timing(call: Callable[[], Any], timer: str) -> Callable[[], float]:
    """``call`` timed: wall or CPU seconds around it (its result waited for), or its devices' busy seconds."""
    if timer == "device":
        return lambda: device_seconds(call)
    clock = time.process_time if timer == "cpu" else time.perf_counter

    def once() -> float:
        t0 = clock()
        jax.block_until_ready(call())
        return clock() - t0
    return once


def _timed_run(step: Callable, state: Any, steps: int, run_kwargs: dict, timer: str = "wall") -> Callable[[], float]:
    return _timing(lambda: jl_run(step, state, steps, **run_kwargs).state, timer)


def _as_timed(reference: Any, steps: int, run_kwargs: dict, timer: str = "wall") -> Callable[[], float]:
    if isinstance(reference, tuple) and len(reference) == 2 and callable(reference[0]):
        return _timed_run(reference[0], reference[1], steps, run_kwargs, timer)
    if callable(reference):
        return _timing(reference, timer)
    raise JaxlogError(f"jl.benchmark: reference= must be (ref_step, ref_state) or a callable, got {type(reference).__name__}")


def _shares(step: Callable, state: Any, reference: Any, run_kwargs: dict) -> str | None:
    """Why the reference runs the kernel's program (``profiling.speed``), or None. A step
    is traced as ``jl.run`` traces it anyway; a callable only where it is a jitted function
    (``jax.jit``), which calling it traces too: a plain callable may run anything, ``jl.run`` included,
    which tracing would call with abstract values."""
    key = run_kwargs.get("key")

    def args(s: Any) -> tuple:
        return (s,) if key is None else (key, s)

    if isinstance(reference, tuple):
        ref_step, ref_state = reference
        return shared_program(lambda: operations(step, *args(state)), lambda: operations(ref_step, *args(ref_state)))
    if not callable(getattr(reference, "trace", None)):
        return None  # a plain callable may do anything (a jl.run of its own): tracing it is not calling it
    return shared_program(lambda: operations(step, *args(state)), lambda: operations(reference))
