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

    from pytest_jaxlog.drive.device.program import INT32_MAX, device_next, device_schedule

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


@pytest.mark.parametrize("schedule, first, last", [
    (jl.every(1), 0, None), (jl.every(7, start=3), 3, None), (jl.at(99, 5, 0, 6), 0, 99), (jl.at(12), 12, 12),
    (jl.window(4, 40, every=3), 4, 40), (jl.window(10, 10), 10, 10)], ids=repr)
def test_schedules_say_their_first_and_last_step(schedule, first, last):
    """Checked against the steps themselves: the first is the first named, the last the last
    named (None: every later stretch still holds steps)."""
    assert schedule.first_step() == first == int(schedule.steps_between(0, 10**6)[0])
    assert schedule.last_step() == last
    if last is None:
        assert schedule.count_between(10**9, 10**9 + 7 * 3) > 0
    else:
        assert int(schedule.steps_between(0, 10**6)[-1]) == last


@pytest.mark.parametrize("schedule", [jl.every(1), jl.every(7, start=3), jl.window(4, 40, every=3), jl.window(10, 10),
                                      jl.at(0, 5, 6, 99)], ids=repr)
def test_a_schedules_closed_form_names_exactly_its_steps(schedule):
    """A progression or a table, whichever it is, lists the same steps as the schedule itself."""
    prog, table = schedule.progression(), schedule.table()
    assert (prog is None) != (table is None)
    want = schedule.steps_between(0, 500)
    if prog is not None:
        stop = 500 if prog.stop is None else prog.stop
        np.testing.assert_array_equal(np.arange(prog.start, stop + 1, prog.n), want)
    else:
        np.testing.assert_array_equal(table, want)


class _Powers(jl.Schedule):
    """Steps 1, 2, 4, 8, ...: a schedule the package does not define and that says nothing about itself."""

    def steps_between(self, lo, hi):
        out = [1 << e for e in range(63) if lo <= 1 << e <= hi]
        return np.asarray(out, np.int64)

    def mask(self, steps):
        steps = np.asarray(steps, np.int64)
        return (steps > 0) & (steps & (steps - 1) == 0)

    def max_in_span(self, length):
        return min(length, int(np.log2(max(length, 1))) + 2)

    def to_json(self):
        return {"kind": "powers"}


def test_a_custom_schedule_is_never_taken_as_starting_at_0_and_never_ending():
    """Without first_step/last_step, asking for them fails loudly, naming the class; where a
    window's end is needed (an aggregate), that is one JaxlogError, not a window judged wrongly."""
    import jax.numpy as jnp

    sq = _Powers()
    with pytest.raises(jl.JaxlogError, match=r"_Powers.*first step"):
        sq.first_step()
    with pytest.raises(jl.JaxlogError, match=r"_Powers.*last step"):
        sq.last_step()
    assert sq.progression() is None and sq.table() is None  # decided on the host
    from pytest_jaxlog.drive.device.program import device_next, device_schedule

    assert device_schedule(sq) is None and device_next(sq) is None
    with pytest.raises(jl.JaxlogError, match=r"^\[jaxlog\] invariant aggregate\(x.*\): record 'x': schedule .*_Powers.* does not say its last"):
        jl.run(lambda s: s + 1.0, jnp.zeros(()), 30, record={"x": jl.Record(lambda s: s, every=jl.every(1))},
               invariants=[jl.aggregate("x", "mean", lo=0, steps=sq)], progress=False)


def test_a_custom_schedule_that_says_its_steps_is_judged_and_compiled_like_the_package_ones():
    """One that implements the four answers gets a device form and a window end from them: the
    aggregate over it equals the mean of the same frames taken plainly."""
    import jax.numpy as jnp

    class Evens(jl.Schedule):
        def max_in_span(self, length):
            return min((length + 1) // 2, 11)

        def to_json(self):
            return {"kind": "evens"}

        def steps_between(self, lo, hi):
            return np.arange(lo + lo % 2, min(hi, 20) + 1, 2, dtype=np.int64)

        def mask(self, steps):
            steps = np.asarray(steps, np.int64)
            return (steps % 2 == 0) & (steps <= 20)

        def first_step(self):
            return 0

        def last_step(self):
            return 20

        def progression(self):
            from pytest_jaxlog.record.schedule import Progression

            return Progression(start=0, n=2, stop=20)

    r = jl.run(lambda s: s + 1.0, jnp.zeros(()), 30, record={"x": jl.Record(lambda s: s, every=Evens())},
               progress=False)
    np.testing.assert_array_equal(r.trajectory.steps("x"), np.arange(0, 21, 2))
    mean = float(np.mean(np.arange(0, 21, 2)))  # x = step
    with pytest.raises(jl.InvariantViolation, match="mean") as info:
        jl.run(lambda s: s + 1.0, jnp.zeros(()), 30, record={"x": lambda s: s},
               invariants=[jl.aggregate("x", "mean", hi=mean - 0.5, steps=Evens())], progress=False)
    assert info.value.step == 20 and float(info.value.value) == mean
