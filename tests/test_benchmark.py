"""``jl.benchmark``: the statistics on given timings (exact, no clock), and one real benchmark whose
outcome noise cannot change (a kernel doing 5x the work is found slower at 1.10x; identical kernels
are not found slower than 3x)."""

from __future__ import annotations

import pytest

import pytest_jaxlog as jl
from examples.kernels.lj import make_lj, repeated
from plugin_helpers import no_jaxlog_env  # noqa: F401  (no_jaxlog_env: an autouse fixture)
from pytest_jaxlog.profiling.stats import median, median_interval, min_repeats

pytest_plugins = ["pytester"]

# imported before the inner run: pytester drops modules first imported during a run
import h5py  # noqa: E402,F401
import pytest_jaxlog.drive.benchmark  # noqa: E402,F401
import pytest_jaxlog.store.hdf5  # noqa: E402,F401
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
    b.assert_not_slower(than=1.0)  # the interval's low end is 1.0: not above
    with pytest.raises(jl.TimingAssertionError) as e:
        b.assert_not_slower(than=0.95)
    assert isinstance(e.value, jl.JaxlogError)
    assert str(e.value) == ("[jaxlog] kernel slower than 0.95x its reference: the ratio's 96.1% interval "
                            "[1.000, 2.500] lies above 0.95; ratio 1.300 (median of 9 repeats); kernel 33.3 steps/s (median of 27 runs of 100 steps), "
                            "reference 100.0 steps/s")


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


def _steps_per_call(n):
    step, state, _ = make_lj(4)
    return repeated(step, n), state


def test_five_times_the_work_is_slower_and_the_same_work_is_not():
    """LJ-64, 200 calls a run (milliseconds: the device work, not jl.run's host work, is what is
    timed); 9 repeats of 3 runs, so the interval is the 2nd to 8th of 9 ratios of fastest runs."""
    slow, state = _steps_per_call(5)
    fast, _ = _steps_per_call(1)
    same, _ = _steps_per_call(1)
    found = jl.benchmark(slow, state, 200, reference=(fast, state), repeats=9, number=3)
    assert len(found.samples) == 9 and all(len(rep) == 3 for rep in found.samples)
    slower = r"kernel slower than 1.1x its reference: the ratio's 9\d.\d% interval \[\d"
    with pytest.raises(jl.TimingAssertionError, match=slower):
        found.assert_not_slower(than=1.10)
    assert found.steps_per_s < found.reference_steps_per_s, found
    alike = jl.benchmark(same, state, 200, reference=(fast, state), repeats=9, number=3)
    alike.assert_not_slower(than=3.0)
    assert alike.interval.lo < 3.0, alike

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
                                 "[[]*]; kernel * steps/s (median of 6 runs of 10 steps), reference * steps/s"])
