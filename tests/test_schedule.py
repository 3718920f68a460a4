import numpy as np
import pytest
from hypothesis import given, strategies as st

import pytest_jaxlog as jl
from pytest_jaxlog import Record
from pytest_jaxlog.record.records import normalize_records


@given(n=st.integers(1, 20), start=st.integers(0, 30), lo=st.integers(0, 100), span=st.integers(0, 100))
def test_every_steps_between_matches_mask(n, start, lo, span):
    s = jl.every(n, start=start)
    hi = lo + span
    expected = np.arange(lo, hi + 1)[s.mask(np.arange(lo, hi + 1))]
    np.testing.assert_array_equal(s.steps_between(lo, hi), expected)
    # The most scheduled steps in any `span + 1` window bounds every actual window.
    assert len(expected) <= s.max_in_span(span + 1)


@given(steps=st.lists(st.integers(0, 200), min_size=1, max_size=20), length=st.integers(1, 50))
def test_at_max_in_span_is_tight(steps, length):
    s = jl.at(*steps)
    best = max(len(s.steps_between(lo, lo + length - 1)) for lo in range(0, 201))
    assert s.max_in_span(length) == best


def test_window_is_inclusive_and_strided():
    s = jl.window(3, 11, every=4)
    assert list(s.steps_between(0, 100)) == [3, 7, 11]
    assert 11 in s and 12 not in s and 2 not in s


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: jl.every(0), "n >= 1"),
        (lambda: jl.every(-2), "n >= 1"),
        (lambda: jl.every(2, start=-1), ">= 0"),
        (lambda: jl.at(), "at least one"),
        (lambda: jl.at(3, -1), ">= 0"),
        (lambda: jl.window(5, 2), "stop must be >= start"),
        (lambda: jl.every(1.5), "n >= 1"),
    ],
)
def test_bad_schedules_are_clear_errors(make, match):
    with pytest.raises(jl.JaxlogError, match=match) as info:
        make()
    assert str(info.value).startswith("[jaxlog]")


def test_schedules_round_trip_json():
    from pytest_jaxlog.record.schedule import schedule_from_json

    for s in (jl.every(3, start=2), jl.at(5, 1, 9), jl.window(2, 20, every=3)):
        assert schedule_from_json(s.to_json()) == s


@pytest.mark.parametrize("name", ["", "a/b", "/x", 3, " lead"])
def test_bad_record_names(name):
    with pytest.raises(jl.JaxlogError, match="invalid"):
        normalize_records({name: lambda s: s})


def test_record_shorthand_and_schedules():
    specs = normalize_records({"e": lambda s: s, "x": Record(lambda s: s, every=10), "y": Record(lambda s: s, every=jl.at(1))})
    assert [s.name for s in specs] == ["e", "x", "y"]
    assert specs[0].schedule == jl.every(1)
    assert specs[1].schedule == jl.every(10)
    assert specs[2].schedule == jl.at(1)
    with pytest.raises(jl.JaxlogError, match="reserved"):
        normalize_records({"aux": lambda s: s}, reserved=("aux",))
    with pytest.raises(jl.JaxlogError, match="callable"):
        normalize_records({"e": 3})


@pytest.mark.parametrize("schedule", [jl.every(1), jl.every(7, start=3), jl.at(0, 5, 6, 99), jl.window(4, 40, every=3),
                                      jl.window(10, 10)])
def test_contains_and_count_between_agree_with_the_array_answers(schedule):
    """The drivers and the HDF5 writer ask schedules these questions directly (per log call, per
    file): the fast answers must equal the array-building ones everywhere."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        lo, hi = sorted(int(x) for x in rng.integers(0, 120, 2))
        assert schedule.count_between(lo, hi) == len(schedule.steps_between(lo, hi)), (lo, hi)
    assert schedule.count_between(50, 3) == 0
    steps = np.arange(0, 120)
    assert [schedule.contains(int(k)) for k in steps] == schedule.mask(steps).tolist()
    assert [int(k) in schedule for k in steps] == schedule.mask(steps).tolist()
    assert jl.every(1).count_between(0, 2**31) == 2**31 + 1


@pytest.mark.parametrize("schedule", [jl.every(1), jl.every(3), jl.every(5, start=2), jl.window(5, 20, every=2),
                                      jl.window(0, 10), jl.at(0, 4, 17, 33), jl.every(7, start=2**31 - 30),
                                      jl.window(2**31 - 40, 2**31 - 5, every=4), jl.every(1, start=2**31 - 3)],
                         ids=repr)
def test_device_schedules_agree_with_the_host(schedule):
    """The chunk program's schedule tests and next-step searches (int32 arithmetic on the device)
    give the host's answers, at small steps and near the int32 step counter's end."""
    import jax

    from pytest_jaxlog.drive.program import INT32_MAX, device_next, device_schedule

    ks = np.concatenate([np.arange(0, 120), np.arange(INT32_MAX - 60, INT32_MAX)]).astype(np.int32)
    contains = np.asarray(jax.jit(jax.vmap(device_schedule(schedule)))(ks))
    nexts = np.asarray(jax.jit(jax.vmap(device_next(schedule)))(ks))
    want_contains = np.array([schedule.contains(int(k)) for k in ks])
    np.testing.assert_array_equal(contains, want_contains)
    for k, got in zip(ks.tolist(), nexts.tolist()):
        assert got == _first_after(schedule, k, INT32_MAX), (k, got)


def _first_after(schedule, k: int, top: int) -> int:
    """The first scheduled step in ``k+1 .. top`` (``top`` if none), by bisection on counts."""
    lo, hi = k + 1, top
    if lo > hi or schedule.count_between(lo, hi) == 0:
        return top
    while lo < hi:
        mid = (lo + hi) // 2
        if schedule.count_between(k + 1, mid):
            hi = mid
        else:
            lo = mid + 1
    return lo
