"""``jl.benchmark``: warm timings of a kernel with statistics, against a reference timed in the
same process, interleaved with it.

One timing on a shared machine says little: the load changes from second to second. What stays
is the *ratio* to a reference run just before or after, under the same load. So each repeat
times the kernel and the reference alternately (``number`` times each, the order alternating so
neither always runs first) and takes the ratio of their fastest runs (load only ever adds time:
the fastest of a few runs is the least disturbed, and the two were disturbed alike); the
benchmark asserts on the median of the repeats' ratios with a distribution-free confidence
interval (``profiling.stats``):
``assert_not_slower(than=1.10)`` fails only when the whole interval lies above 1.10, so noise
alone fails it with probability at most ``(1 - coverage) / 2`` when the kernel is no slower.

``timer="device"`` times each run by the seconds the accelerator was busy in it, read from a
JAX profiler trace of the run (``profiling.device_time``): on a GPU that moves much less with the
load than wall time, and it measures the kernels, not the host around them (dispatch, a loop's
host round trips), so it answers "did the kernel's own work get slower", not "did the run". The
CPU backend has no device tracks: there ``timer="device"`` is an error and ``"auto"`` is wall.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import jax

from ..errors import JaxlogError
from ..profiling.device_time import device_seconds
from ..profiling.stats import Interval, median, median_interval
from ..profiling.timings import TimingAssertionError
from .run import run as jl_run

__all__ = ["benchmark", "Benchmark"]

METHOD = "order-statistic interval on the median of the per-repeat ratios (distribution-free)"


@dataclass(frozen=True)
class Benchmark:
    """What ``jl.benchmark`` measured. ``samples``: per repeat, the kernel's seconds per run
    (``steps`` steps each); ``reference_samples`` the same for the reference. ``ratios``: per
    repeat, the kernel's fastest time over the reference's (above 1: slower); ``ratio`` their
    median and ``interval`` its confidence interval (None without a reference)."""

    steps: int
    samples: tuple[tuple[float, ...], ...]
    reference_samples: tuple[tuple[float, ...], ...] | None = None
    ratios: tuple[float, ...] | None = None
    interval: Interval | None = None
    method: str = METHOD
    timer: str = "wall"  # "wall": perf_counter around each run; "device": the devices' busy seconds

    @classmethod
    def of(cls, steps: int, samples: Any, reference_samples: Any = None, confidence: float = 0.95,
           timer: str = "wall") -> "Benchmark":
        """The statistics of given timings (seconds per run, grouped by repeat)."""
        mine = tuple(tuple(float(t) for t in rep) for rep in samples)
        if reference_samples is None:
            return cls(steps, mine, timer=timer)
        theirs = tuple(tuple(float(t) for t in rep) for rep in reference_samples)
        if len(theirs) != len(mine):
            raise JaxlogError(f"jl.Benchmark: {len(mine)} repeats of the kernel but {len(theirs)} of the reference")
        ratios = tuple(min(a) / min(b) for a, b in zip(mine, theirs))
        return cls(steps, mine, theirs, ratios, median_interval(ratios, confidence), timer=timer)

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

    def assert_not_slower(self, than: float = 1.10) -> "Benchmark":
        """Fail (``jl.TimingAssertionError``) only when the ratio's whole confidence interval lies
        above ``than``: the kernel is slower than ``than`` times the reference beyond the noise."""
        __tracebackhide__ = True
        if self.interval is None:
            raise JaxlogError("assert_not_slower needs a reference: jl.benchmark(..., reference=(ref_step, ref_state))")
        if isinstance(than, bool) or not isinstance(than, (int, float)) or not than > 0:
            raise JaxlogError(f"assert_not_slower(than=...) must be a number > 0, got {than!r}")
        if self.interval.lo > than:
            raise TimingAssertionError(
                f"[jaxlog] kernel slower than {than:g}x its reference: the ratio's {self._interval_text()} lies above "
                f"{than:g}; ratio {self.ratio:.3f} (median of {len(self.ratios)} repeats); {self._speeds()}")
        return self

    def describe(self) -> str:
        """The figures in one line: the ratio, its interval and both speeds (without a reference: the speed)."""
        if self.interval is None:
            return self._speeds()
        return f"ratio {self.ratio:.3f} (median of {len(self.ratios)} repeats), {self._interval_text()}; {self._speeds()}"

    def _interval_text(self) -> str:
        iv = self.interval
        return f"{iv.coverage:.1%} interval [{iv.lo:.3f}, {iv.hi:.3f}]"

    def _speeds(self) -> str:
        text = f"{self.steps_per_s:,.1f} steps/s (median of {sum(map(len, self.samples))} runs of {self.steps} steps"
        text += ", device time from the profiler's trace)" if self.timer == "device" else ")"
        if self.reference_samples is None:
            return text
        return f"kernel {text}, reference {self.reference_steps_per_s:,.1f} steps/s"

    def __str__(self) -> str:
        return f"Benchmark({self.describe()})"


def benchmark(step: Callable, state: Any, steps: int, *, reference: Any = None, repeats: int = 15, number: int = 5,
              warmup: int = 1, confidence: float = 0.95, timer: str = "wall", **run_kwargs: Any) -> Benchmark:
    """Time ``jl.run(step, state, steps, **run_kwargs)`` warm: ``warmup`` runs first (compiling),
    then ``repeats`` repeats of ``number`` runs each. ``reference=(ref_step, ref_state)`` is run
    the same way (same ``steps`` and ``run_kwargs``), or ``reference=fn`` is called with no
    arguments (its result waited for), interleaved with the kernel's runs. ``timer``: ``"wall"``,
    ``"device"`` (the devices' busy seconds from a profiler trace of each run: accelerators only)
    or ``"auto"`` (device time where JAX's backend is not the CPU)."""
    _check_counts(repeats=repeats, number=number, warmup=warmup)
    timer = _timer(timer, run_kwargs)
    kernel = _timed_run(step, state, steps, run_kwargs, timer)
    ref = None if reference is None else _as_timed(reference, steps, run_kwargs, timer)
    if ref is not None:
        median_interval([1.0] * repeats, confidence)  # too few repeats for the confidence: say so before timing
    for _ in range(warmup):
        kernel()
        if ref is not None:
            ref()
    mine: list[tuple[float, ...]] = []
    theirs: list[tuple[float, ...]] = []
    for r in range(repeats):
        a: list[float] = []
        b: list[float] = []
        for i in range(number):
            first_kernel = (r + i) % 2 == 0
            for which in ((kernel, ref) if first_kernel else (ref, kernel)):
                if which is not None:
                    (a if which is kernel else b).append(which())
        mine.append(tuple(a))
        theirs.append(tuple(b))
    return Benchmark.of(steps, mine, theirs if ref is not None else None, confidence, timer=timer)


def _check_counts(**counts: int) -> None:
    for name, n in counts.items():
        low = 0 if name == "warmup" else 1
        if isinstance(n, bool) or not isinstance(n, int) or n < low:
            raise JaxlogError(f"jl.benchmark: {name} must be an integer >= {low}, got {n!r}")


def _timer(timer: Any, run_kwargs: dict) -> str:
    if timer not in ("wall", "device", "auto"):
        raise JaxlogError(f"jl.benchmark: timer= must be 'wall', 'device' or 'auto', got {timer!r}")
    if timer == "auto":
        timer = "wall" if jax.default_backend() == "cpu" else "device"
    if timer == "device" and run_kwargs.get("profile") is not None:
        raise JaxlogError("jl.benchmark(timer='device') profiles each run itself: leave profile= out")
    return timer


def _timing(call: Callable[[], Any], timer: str) -> Callable[[], float]:
    """``call`` timed: wall seconds around it (its result waited for), or its devices' busy seconds."""
    if timer == "device":
        return lambda: device_seconds(call)

    def once() -> float:
        t0 = time.perf_counter()
        jax.block_until_ready(call())
        return time.perf_counter() - t0
    return once


def _timed_run(step: Callable, state: Any, steps: int, run_kwargs: dict, timer: str = "wall") -> Callable[[], float]:
    return _timing(lambda: jl_run(step, state, steps, **run_kwargs).state, timer)


def _as_timed(reference: Any, steps: int, run_kwargs: dict, timer: str = "wall") -> Callable[[], float]:
    if isinstance(reference, tuple) and len(reference) == 2 and callable(reference[0]):
        return _timed_run(reference[0], reference[1], steps, run_kwargs, timer)
    if callable(reference):
        return _timing(reference, timer)
    raise JaxlogError(f"jl.benchmark: reference= must be (ref_step, ref_state) or a callable, got {type(reference).__name__}")
