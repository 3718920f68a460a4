"""``jl.benchmark``: the statistics and verdicts on given timings (exact, no clock), the adaptive
repeats on scripted timings, real benchmarks whose verdict noise cannot change (a kernel doing twice
the work is slower at 1.5x, the same work is not, a reference made to alternate between two speeds
cannot tell), the CPU-time timer, and the check that a reference is independent of the kernel."""

from __future__ import annotations

import itertools
import math
import time

import jax
import jax.numpy as jnp
import pytest

import pytest_jaxlog as jl
import pytest_jaxlog.drive.benchmark as benchmark_module
from examples.kernels.lj import make_lj, repeated
from plugin_helpers import no_jaxlog_env  # noqa: F401  (no_jaxlog_env: an autouse fixture)
from pytest_jaxlog.profiling.speed import operations, shared_program
from pytest_jaxlog.profiling.speed import Interval, median, median_interval, min_repeats
from pytest_jaxlog.profiling.speed import detectable, verdict

pytest_plugins = ["pytester"]

# imported before the inner run: pytester drops modules first imported during a run
import h5py  # noqa: E402,F401
import pytest_jaxlog.drive.benchmark  # noqa: E402,F401
import pytest_jaxlog.store.hdf5.writer  # noqa: E402,F401
import pytest_jaxlog.profiling.timeline  # noqa: E402,F401

# per repeat (seconds per run): the kernel, the reference; ratios of the fastest 2, 2, 1, 3, 1.2, 1.1, 2.5, 0.9, 1.3
KERNEL = [(4, 5, 4.5), (4, 4, 9), (1, 1, 1), (3, 3, 4), (1.2, 2, 1.5), (2.2, 3, 5), (5, 5, 6), (0.9, 0.9, 1),
          (1.3, 1.4, 1.3)]
REFERENCE = [(2, 3, 2), (2, 2, 2), (1, 1, 1), (1, 1, 1), (1, 1, 1), (2, 2, 2), (2, 2, 2), (1, 1, 1), (1, 1, 1)]


def test_statistics_of_given_timings():
    b = jl.Benchmark.of(100, KERNEL, REFERENCE)
    assert b.ratios == pytest.approx((2.0, 2.0, 1.0, 3.0, 1.2, 1.1, 2.5, 0.9, 1.3))
    assert b.ratio == pytest.approx(1.3)  # sorted: 0.9 1.0 1.1 1.2 [1.3] 2.0 2.0 2.5 3.0
    # 9 repeats: [x_(2), x_(8)] covers the median with 1 - 2 P(Binomial(9, 1/2) <= 1) = 1 - 20/512
    assert (b.interval.lo, b.interval.hi) == pytest.approx((1.0, 2.5))
    assert b.interval.coverage == pytest.approx(1 - 20 / 512)
    all_kernel = sorted(t for rep in KERNEL for t in rep)  # steps/s: the median of all 27 runs
    assert all_kernel[13] == 3 and b.steps_per_s == pytest.approx(100 / 3)
    assert b.reference_steps_per_s == pytest.approx(100.0)
    # the interval [1.0, 2.5] holds 1.10: cannot tell; it could have shown 1.10 * 1.3 / 1.0 = 1.43 and more
    assert (b.than, b.verdict) == (1.10, "cannot tell") and b.detectable == pytest.approx(1.43)
    assert b.decision(0.95).verdict == "slower" and b.decision(2.5).verdict == "not slower"
    assert b.decision(1.0).verdict == "cannot tell"  # the low end is 1.0: not above
    b.assert_not_slower(than=1.0)  # cannot tell passes unless asked otherwise
    with pytest.raises(jl.TimingAssertionError) as e:
        b.assert_not_slower(than=0.95)
    assert isinstance(e.value, jl.JaxlogError)
    assert str(e.value) == ("[jaxlog] kernel slower than 0.95x its reference: the ratio's 96.1% interval "
                            "[1.000, 2.500] lies above 0.95; ratio 1.300 (median of 9 repeats); kernel 33.3 steps/s (median of 27 runs of 100 steps), "
                            "reference 100.0 steps/s")
    with pytest.raises(jl.TimingAssertionError) as e:
        b.assert_not_slower(inconclusive="fail")
    assert str(e.value) == (
        "[jaxlog] cannot tell whether the kernel is slower than 1.1x its reference at this noise: the ratio's 96.1% "
        "interval [1.000, 2.500] holds 1.1; ratio 1.300 (median of 9 repeats); the measurement could only have "
        "detected x1.430 or more; kernel 33.3 steps/s (median of 27 runs of 100 steps), reference 100.0 steps/s. More "
        "repeats (repeats=, max_repeats=, budget_s=), longer runs, a quieter machine or timer='cpu' narrow the "
        "interval; \"cannot tell\" fails here because of inconclusive='fail': assert_not_slower(inconclusive='pass')")
    b.assert_not_slower(than=2.5, inconclusive="fail")  # not slower: passes either way
    with pytest.raises(jl.JaxlogError, match="must be 'pass' or 'fail'"):
        b.assert_not_slower(inconclusive="maybe")


def test_verdicts_and_detectable_against_a_plain_computation():
    """The verdict is where the interval lies against the threshold; ``detectable`` is the ratio
    that, with the same spread, would just come out slower: scaling every kernel time by s scales
    the ratios and their interval by s, so it is slower exactly when s times the ratio passes
    ``detectable`` (checked on both sides of it)."""
    assert verdict(Interval(1.2, 1.5, 0.95), 1.1) == "slower"
    assert verdict(Interval(0.9, 1.1, 0.95), 1.1) == "not slower"  # at the threshold: not above it
    assert verdict(Interval(1.05, 1.2, 0.95), 1.1) == "cannot tell"
    assert verdict(Interval(1.1, 1.2, 0.95), 1.1) == "cannot tell"  # the low end on it: not wholly above
    assert detectable(1.0, Interval(0.8, 1.25, 0.95), 1.1) == pytest.approx(1.375)
    b = jl.Benchmark.of(100, KERNEL, REFERENCE, than=1.05)
    d = b.detectable
    for side, expected in ((1 + 1e-9, "slower"), (1 - 1e-9, "cannot tell")):
        s = d * side / b.ratio
        scaled = jl.Benchmark.of(100, [tuple(t * s for t in rep) for rep in KERNEL], REFERENCE, than=1.05)
        assert scaled.ratio == pytest.approx(d * side) and scaled.verdict == expected
    with pytest.raises(jl.JaxlogError, match=r"than=...\) must be a number > 0"):
        jl.benchmark(lambda x: x, 1.0, 1, than=0)


def test_order_statistic_intervals_and_their_limits():
    assert median([3, 1, 2]) == 2 and median([4, 1, 2, 3]) == 2.5
    assert min_repeats(0.95) == 6
    iv = median_interval(range(1, 21))  # n = 20: [x_(6), x_(15)], coverage 1 - 2 P(B <= 5)
    assert (iv.lo, iv.hi) == (6, 15) and iv.coverage == pytest.approx(1 - 2 * 21700 / 2**20)
    with pytest.raises(jl.JaxlogError, match="needs at least 6 values, got 5"):
        median_interval(range(5))
    with pytest.raises(jl.JaxlogError, match="needs a reference"):
        jl.Benchmark.of(10, [(1,)]).assert_not_slower()
    with pytest.raises(jl.JaxlogError, match="2 repeats of the kernel but 1 of the reference"):
        jl.Benchmark.of(10, [(1,), (1,)], [(1,)])
    with pytest.raises(jl.JaxlogError, match="repeats must be an integer >= 1"):
        jl.benchmark(lambda x: x, 1.0, 1, repeats=0)
    with pytest.raises(jl.JaxlogError, match="needs at least 6 values, got 3"):
        jl.benchmark(lambda x: x, 1.0, 1, reference=lambda: 0, repeats=3)


def _plain_interval(xs, confidence):
    """The order-statistic interval for the median from scratch: the largest k whose
    [x_(k), x_(n-k+1)] covers with 1 - 2 P(Binomial(n, 1/2) <= k-1) >= confidence."""
    s, n = sorted(xs), len(xs)
    cover = [1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n for k in range(1, n // 2 + 1)]
    k = max(k for k in range(1, n // 2 + 1) if cover[k - 1] >= confidence)
    return s[k - 1], s[n - k], cover[k - 1]


def _scripted(monkeypatch, kernel, reference):
    """jl.benchmark's clock replaced by given seconds per run, cycled: the kernel's runs take the
    next of ``kernel``, the reference's the next of ``reference``, whatever they compute."""
    streams = iter([itertools.cycle(kernel), itertools.cycle(reference)])

    def timing(call, timer):
        values = next(streams)
        return lambda: next(values)
    monkeypatch.setattr(benchmark_module, "_timing", timing)


def test_it_repeats_until_the_interval_decides(monkeypatch):
    """Ratios alternating 2 and 0.5 never decide at 1.10: 15 repeats, then 30, 45, 60 (4 looks,
    each interval at 1 - 0.05 / 4 coverage, the plain order statistics), and it says so; with a
    time budget already spent it stops after the first look."""
    _scripted(monkeypatch, [2.0], [1.0, 4.0])
    wide = jl.benchmark(lambda x: x, 1.0, 10, reference=lambda: 0, number=1)
    assert (len(wide.samples), wide.looks, wide.stop_reason, wide.verdict) == (60, 4, "max_repeats", "cannot tell")
    lo, hi, cover = _plain_interval(wide.ratios, 0.9875)
    assert (wide.interval.lo, wide.interval.hi, wide.interval.coverage) == pytest.approx((lo, hi, cover))
    assert (lo, hi) == (0.5, 2.0) and wide.detectable == pytest.approx(1.1 * 1.25 / 0.5)
    assert "cannot tell at x1.1 (could detect x2.750; 60 repeats, the most allowed (max_repeats))" in wide.describe()
    _scripted(monkeypatch, [2.0], [1.0, 4.0])
    spent = jl.benchmark(lambda x: x, 1.0, 10, reference=lambda: 0, number=1, budget_s=0)
    assert (len(spent.samples), spent.stop_reason) == (15, "budget")
    _scripted(monkeypatch, [2.0] * 15 + [2.2] * 15, [1.0, 4.0] * 7 + [1.0] * 16)
    later = jl.benchmark(lambda x: x, 1.0, 10, reference=lambda: 0, number=1)
    assert (len(later.samples), later.stop_reason, later.verdict) == (30, "decided", "slower")
    lo, hi, cover = _plain_interval(later.ratios, 0.9875)
    assert later.interval.lo == pytest.approx(lo) and lo > 1.1
    _scripted(monkeypatch, [1.0, 1.02, 0.98], [1.0, 1.01])
    same = jl.benchmark(lambda x: x, 1.0, 10, reference=lambda: 0, number=1, max_repeats=30)
    assert (len(same.samples), same.looks, same.stop_reason, same.verdict) == (15, 2, "decided", "not slower")
    assert same.interval.coverage >= 0.975


def test_the_looks_are_planned_from_the_repeats(monkeypatch):
    _scripted(monkeypatch, [2.0], [1.0, 4.0])
    few = jl.benchmark(lambda x: x, 1.0, 10, reference=lambda: 0, repeats=6, number=1)
    assert (len(few.samples), few.looks, few.interval.coverage) == (6, 1, 1 - 2 / 64)  # 6 cannot share 5%
    _scripted(monkeypatch, [2.0], [1.0])
    alone = jl.benchmark(lambda x: x, 1.0, 10, repeats=4, number=1)  # no reference: nothing to decide
    assert (len(alone.samples), alone.stop_reason, alone.verdict, alone.detectable) == (4, "fixed", None, None)
    with pytest.raises(jl.JaxlogError, match=r"up to 3 looks \(repeats=6 at a time up to max_repeats=18\) need each "
                       r"interval at 98.33% coverage, which takes at least 7 repeats"):
        jl.benchmark(lambda x: x, 1.0, 1, reference=lambda: 0, repeats=6, max_repeats=18)
    with pytest.raises(jl.JaxlogError, match="max_repeats must be an integer >= repeats"):
        jl.benchmark(lambda x: x, 1.0, 1, reference=lambda: 0, max_repeats=3)
    with pytest.raises(jl.JaxlogError, match="budget_s must be seconds >= 0"):
        jl.benchmark(lambda x: x, 1.0, 1, reference=lambda: 0, budget_s=-1)


def _steps_per_call(n):
    step, state, _ = make_lj(4)
    return repeated(step, n), state


@pytest.mark.parametrize("timer", ["wall", "cpu"])
def test_twice_the_work_is_slower_and_the_same_work_is_not(timer):
    """LJ-64, 100 calls a run (milliseconds: the device work, not jl.run's host work, is what is
    timed); 9 repeats of 3 runs at a time. The references are the kernel's own step (said in a
    warning: they cannot show a regression of the step)."""
    double, state = _steps_per_call(2)
    once, _ = _steps_per_call(1)
    same, _ = _steps_per_call(1)
    with pytest.warns(jl.JaxlogRuntimeWarning, match="the kernel's step runs the reference's whole program"):
        found = jl.benchmark(double, state, 100, reference=(once, state), repeats=9, number=3, than=1.5, timer=timer)
    assert all(len(rep) == 3 for rep in found.samples) and found.timer == timer
    assert found.verdict == "slower", found
    assert found.ratios == pytest.approx([min(a) / min(b) for a, b in zip(found.samples, found.reference_samples)])
    with pytest.raises(jl.TimingAssertionError, match=r"kernel slower than 1.5x its reference: the ratio's 9\d.\d% "
                       r"interval \[\d"):
        found.assert_not_slower()
    assert found.steps_per_s < found.reference_steps_per_s, found
    with pytest.warns(jl.JaxlogRuntimeWarning, match="the reference runs the same program as the kernel's step"):
        alike = jl.benchmark(same, state, 100, reference=(once, state), repeats=9, number=3, than=1.5, timer=timer)
    assert alike.verdict == "not slower", alike
    assert alike.reference_shares == "the reference runs the same program as the kernel's step"
    alike.assert_not_slower(inconclusive="fail")


@pytest.mark.filterwarnings("ignore::pytest_jaxlog.JaxlogRuntimeWarning")
def test_a_reference_alternating_between_two_speeds_cannot_tell():
    """The reference runs the kernel's work on odd calls and 4 times it on even ones: the per-repeat
    ratios fall in two clusters (about 1 and 1/4), 8 of each after 16 repeats, so every interval
    holds 0.5, and after the two looks the benchmark says it cannot tell."""
    step, state, _ = make_lj(4)
    slow = repeated(step, 4)
    calls = itertools.count()

    def alternating():
        return jl.run(slow if next(calls) % 2 else step, state, 50).state

    found = jl.benchmark(step, state, 50, reference=alternating, repeats=8, number=1, max_repeats=16, than=0.5)
    assert (found.verdict, len(found.samples), found.stop_reason) == ("cannot tell", 16, "max_repeats"), found
    assert min(found.ratios) < 0.5 < max(found.ratios) and found.detectable > 0.5
    found.assert_not_slower()
    with pytest.raises(jl.TimingAssertionError, match=r"^\[jaxlog\] cannot tell whether the kernel is slower than "
                       r"0.5x its reference at this noise: the ratio's 9\d.\d% interval .* holds 0.5;"):
        found.assert_not_slower(inconclusive="fail")


def test_the_cpu_timer_counts_cpu_time_not_waiting(monkeypatch):
    """A call that sleeps takes its wall time and next to no CPU time; where JAX runs on another
    backend, CPU time would leave the device's work out and is refused."""
    nap = lambda: time.sleep(0.05)  # noqa: E731
    wall = benchmark_module._timing(nap, "wall")()
    cpu = benchmark_module._timing(nap, "cpu")()
    assert wall >= 0.05 and cpu < wall / 5
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    with pytest.raises(jl.JaxlogError, match=r"timer='cpu'\) counts the process's CPU time, which leaves out the "
                       r"work of JAX's gpu devices: use timer='device'"):
        jl.benchmark(lambda x: x, 1.0, 1, timer="cpu")
    with pytest.raises(jl.JaxlogError, match="timer= must be 'wall', 'cpu', 'device' or 'auto'"):
        jl.benchmark(lambda x: x, 1.0, 1, timer="perf")


def test_a_reference_that_runs_the_kernels_program_is_told_apart():
    step, state, _ = make_lj(3)
    other_dt, other_state, _ = make_lj(3, dt=0.001)
    W = jnp.eye(32) * 0.5
    X = jnp.ones((32, 32))

    def ops(fn, *args):
        return lambda: operations(fn, *args)

    kernel = ops(step, state)
    assert shared_program(kernel, ops(jax.jit(step), state)) == "the reference runs the same program as the kernel's step"
    assert shared_program(kernel, ops(other_dt, other_state)) == "the reference runs the same program as the kernel's step"
    assert shared_program(ops(repeated(step, 3), state), ops(repeated(step, 2), state)).startswith(
        "the kernel's step runs the reference's whole program inside it")
    scan = ops(lambda: jax.lax.scan(lambda c, _: (step(c), None), state, None, length=10))
    assert shared_program(kernel, scan).startswith("the reference runs the kernel's whole step inside it")
    assert shared_program(ops(lambda x: jnp.tanh(W @ x), X), ops(lambda x: jnp.exp(-x * x).T, X)) is None
    assert shared_program(ops(lambda x: x * 0.5, X), ops(lambda x: x * 0.5, X)).startswith("the reference runs the same")
    assert shared_program(ops(lambda x: x * 0.5, X), ops(lambda: jnp.tanh(X * 0.5) + 1)) is None  # one op: no program
    assert shared_program(kernel, ops(lambda: float(jnp.sum(X)))) is None  # not a JAX function: not judged
    # in jl.benchmark: a jitted callable reference is traced (as calling it would), a plain one is not
    scan_fn = jax.jit(lambda: jax.lax.scan(lambda c, _: (step(c), None), state, None, length=10)[0])
    with pytest.warns(jl.JaxlogRuntimeWarning, match="the reference runs the kernel's whole step inside it"):
        found = jl.benchmark(step, state, 10, reference=scan_fn, repeats=6, number=1)
    assert found.reference_shares.startswith("the reference runs the kernel's whole step inside it")
    assert "; not independent: the reference runs the kernel's whole step" in found.describe()
    assert jl.benchmark(step, state, 10, reference=lambda: scan_fn(), repeats=6, number=1).reference_shares is None


INNER = """
import jax.numpy as jnp

def test_speed(jaxlog):
    found = jaxlog.benchmark(lambda x: x * 0.5, jnp.ones(8), 10, reference=lambda: jnp.ones(8) * 0.5,
                             repeats=6, number=1)
    assert len(found.samples) == 6 and found.interval.coverage == 1 - 2 / 64
"""


def test_the_fixture_reports_the_figures(pytester):
    pytester.makepyfile(test_b=INNER)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_b.py::test_speed: benchmark: ratio *(median of 6 repeats), 96.9% interval "
                                 "[[]*]: * at x1.1 (could detect x*); kernel * steps/s (median of 6 runs of 10 steps), "
                                 "reference * steps/s"])
