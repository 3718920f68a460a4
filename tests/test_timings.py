"""Timings and CompileTracker: real JAX compilations, counted with names and argument shapes."""

from __future__ import annotations

import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pytest_jaxlog as jl
from pytest_jaxlog import CompileTracker, Timings
from pytest_jaxlog.profiling.timings import CompileEvent, describe_avals


def _make_step():
    # A fresh function per test: jit caches are per function, so its first call compiles here.
    @jax.jit
    def step(x, c):
        return x * c + 1.0, c * 1.0

    return step


def test_stable_kernel_compiles_exactly_once():
    step = _make_step()
    x, c = jnp.ones((64, 3)), jnp.float32(0.5)
    with CompileTracker(step) as tracker:
        for _ in range(50):
            x, c = step(x, c)
        jax.block_until_ready(x)
    assert tracker.count == 1
    (ev,) = tracker.events
    assert ev.function == "step"
    assert ev.args == ("f32[64,3]", "f32[]")
    assert ev.seconds is not None and ev.seconds > 0
    timings = tracker.timings(wall_s=1.0, steps=50)
    timings.assert_compiles(1)
    assert timings.compile_s == pytest.approx(ev.seconds)


def test_weak_type_flip_recompiles_and_the_message_says_why():
    step = _make_step()
    x = jnp.ones((64, 3))
    c = 0.5
    with CompileTracker(step) as tracker:
        for k in range(8):
            # a hand-written loop that re-wraps its scalar: python float (weak) on even steps
            c = float(c) if k % 2 == 0 else jnp.float32(c)
            x, c = step(x, c)
    assert tracker.count == 2  # one per weak/strong variant; the jit cache then holds both
    timings = tracker.timings(wall_s=1.0, steps=8)
    with pytest.raises(AssertionError) as info:
        timings.assert_compiles(1)
    msg = str(info.value)
    assert msg.startswith("[jaxlog] expected 1 compilation, saw 2")
    assert "step(f32[64,3], weak_type f32[])" in msg
    assert "step(f32[64,3], f32[])" in msg
    timings.assert_compiles(2)
    timings.assert_compiles(3, at_most=True)


def test_shape_change_recompiles_every_step():
    @jax.jit
    def grow(x):
        return jnp.concatenate([x, x[:1] * 2.0])

    x = jnp.ones((4, 3))
    with CompileTracker(grow) as tracker:
        for _ in range(5):
            x = grow(x)
    assert tracker.count == 5
    assert [ev.args for ev in tracker.events] == [(f"f32[{n},3]",) for n in range(4, 9)]
    with pytest.raises(AssertionError, match=r"saw 5: grow\(f32\[4,3\]\)"):
        tracker.timings(1.0, 5).assert_compiles(1, at_most=True)


def test_filter_and_all_events_and_nesting():
    step = _make_step()

    @jax.jit
    def other(x):
        return x - 1

    x = jnp.ones((2, 2))
    with CompileTracker() as everything:
        with CompileTracker(step) as only_step, CompileTracker("other") as only_other:
            step(x, jnp.float32(1.0))
            other(x)
        other(jnp.ones((3,)))  # after the inner trackers closed
    assert only_step.count == 1 and only_step.events[0].function == "step"
    assert only_other.count == 1 and only_other.events[0].function == "other"
    assert {ev.function for ev in everything.events} >= {"step", "other"}
    assert sum(ev.function == "other" for ev in everything.events) == 2
    assert len(only_step.all_events) >= 2  # unfiltered view keeps the rest


def test_a_tracker_not_reading_arguments_leaves_the_compile_log_alone_and_still_counts():
    logger = logging.getLogger("jax._src.interpreters.pxla")
    before = (logger.level, list(logger.handlers), logger.propagate)
    step = _make_step()
    with CompileTracker(step, read_args=False) as light:
        assert (logger.level, list(logger.handlers), logger.propagate) == before
        step(jnp.ones((5, 3)), jnp.float32(0.5))
        with CompileTracker(step) as reading:  # one that reads them, open at the same time
            assert logger.level == logging.DEBUG or logger.getEffectiveLevel() <= logging.DEBUG
            step(jnp.ones((6, 3)), jnp.float32(0.5))
        assert (logger.level, list(logger.handlers), logger.propagate) == before
    assert [ev.args for ev in light.events] == [None, ("f32[6,3]", "f32[]")]
    assert [ev.args for ev in reading.events] == [("f32[6,3]", "f32[]")]
    assert all(ev.seconds > 0 for ev in light.events)


@pytest.mark.parametrize("cached", [False, True])
def test_a_runs_compilations_are_its_own_threads_counted_by_the_states_types(cached):
    """``jl.run``'s tracker reads no arguments: its thread's compilations get the state's leaf
    types, and each counts, those of one state signature too (a program compiled twice is two
    compilations); another thread's are not the run's."""
    import threading

    from pytest_jaxlog.drive.host.result import run_timings

    me = threading.current_thread().name
    tracker = CompileTracker("chunk_impl", read_args=False)
    tracker.all_events += [
        CompileEvent("jit(chunk_impl)", None, 0.5, me, cached=cached),  # the program
        CompileEvent("jit(chunk_impl)", ("f32[3]", "s32[]", "f32[9]"), 0.25, me, cached=True),  # args read
        CompileEvent("jit(chunk_impl)", None, 2.0, "another run's thread"),
        CompileEvent("jit(helper)", None, 1.0, me),  # not tracked
    ]
    t = run_timings(tracker, 1.0, 10, state_leaves=[jnp.ones(3), jnp.int32(0)])
    assert [ev.args for ev in t.compile_events] == [("f32[3]", "s32[]"), ("f32[3]", "s32[]", "f32[9]")]
    assert (t.compiles, t.compile_s, t.from_cache) == (2, 0.75, int(cached) + 1)


def test_tracker_restores_logging_and_is_quiet(caplog):
    logger = logging.getLogger("jax._src.interpreters.pxla")
    before = (logger.level, list(logger.handlers))
    with caplog.at_level(logging.WARNING):
        with CompileTracker() as tracker:
            jax.jit(lambda v: v * 3)(jnp.ones(3))
    assert tracker.count >= 1
    assert (logger.level, list(logger.handlers)) == before
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "Compiling" in r.getMessage()]
    assert jax.config.jax_log_compiles is False
    # closed: later compilations are not seen
    n = len(tracker.all_events)
    jax.jit(lambda v: v * 4)(jnp.ones(3))
    assert len(tracker.all_events) == n


def test_describe_avals():
    avals = [jax.core.ShapedArray((64, 3), jnp.float32), jax.core.ShapedArray((), jnp.int32, weak_type=True),
             jax.core.ShapedArray((2,), jnp.bfloat16), "opaque"]
    assert describe_avals(avals) == ("f32[64,3]", "weak_type s32[]", "bf16[2]", "opaque")


def test_assert_faster_than_and_overhead():
    fast = Timings(wall_s=1.0, steps=1000)
    slow = Timings(wall_s=2.0, steps=1000)
    fast.assert_faster_than(slow)
    fast.assert_faster_than(slow, ratio=2.0)
    with pytest.raises(AssertionError, match=r"at least 2.1x the throughput"):
        fast.assert_faster_than(slow, ratio=2.1)
    slow.assert_faster_than(fast, ratio=0.5)
    with pytest.raises(AssertionError, match=r"\[jaxlog\]"):
        slow.assert_faster_than(fast)
    slow.assert_faster_than(400.0)  # steps/s
    slow.assert_overhead(fast, at_most=2.0)
    with pytest.raises(AssertionError, match=r"at most 1.1x the reference time per step"):
        slow.assert_overhead(fast, at_most=1.1)
    with pytest.raises(jl.JaxlogError, match=r"assert_faster_than\(ratio=...\) must be a finite number > 0, got 0"):
        fast.assert_faster_than(slow, ratio=0)


def test_timing_failures_are_timing_assertion_errors():
    from pytest_jaxlog import JaxlogAssertionError

    t = jl.Timings(wall_s=1.0, steps=10, compiles=2)
    failures = [lambda: t.assert_compiles(1), lambda: t.assert_compiles(1, at_most=True),
                lambda: t.assert_faster_than(jl.Timings(wall_s=1.0, steps=100)),
                lambda: t.assert_overhead(jl.Timings(wall_s=1.0, steps=100), at_most=1.5)]
    for fail in failures:
        with pytest.raises(jl.TimingAssertionError) as info:
            fail()
        err = info.value
        assert isinstance(err, jl.JaxlogError) and isinstance(err, AssertionError) and isinstance(err, JaxlogAssertionError)
        assert str(err).startswith("[jaxlog] expected ")
    t.assert_compiles(2)
    t.assert_compiles(3, at_most=True)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda t: t.assert_compiles(1.5), r"assert_compiles\(n\) must be an integer >= 0, got 1.5"),
        (lambda t: t.assert_compiles(-1), r"must be an integer >= 0, got -1"),
        (lambda t: t.assert_compiles(True), r"must be an integer >= 0, got True"),
        (lambda t: t.assert_faster_than(t, ratio="2"), r"ratio=...\) must be a finite number > 0, got '2'"),
        (lambda t: t.assert_faster_than("fast"), r"assert_faster_than\(other\): a reference in steps/s must be"),
        (lambda t: t.assert_faster_than(-3.0), r"got -3.0"),
        (lambda t: t.assert_overhead(t, at_most=float("inf")), r"at_most=...\) must be a finite number > 0, got inf"),
        (lambda t: t.assert_overhead(None, at_most=1.1), r"assert_overhead\(limit\): a reference in seconds per step"),
        (lambda t: CompileTracker(3), r"CompileTracker needs functions or names, got 3"),
    ],
)
def test_user_mistakes_are_jaxlog_errors(call, match):
    with pytest.raises(jl.JaxlogError, match=match) as info:
        call(jl.Timings(wall_s=1.0, steps=10))
    assert not isinstance(info.value, AssertionError)


def test_tracker_opened_twice_is_a_jaxlog_error():
    tracker = CompileTracker()
    with tracker:
        with pytest.raises(jl.JaxlogError, match="CompileTracker is already open"):
            tracker.__enter__()


def test_a_failing_compile_hook_is_reported_when_the_tracker_closes():
    """A fault in our log-record bookkeeping must not break the user's compile, nor vanish: the
    tracker warns that its counts may be short."""

    class Broken(CompileTracker):
        def _on_lowering(self, name, args, thread):
            raise RuntimeError("bookkeeping broke")

    step = _make_step()
    x, w = jnp.ones(3), jnp.float32(2.0)  # made before: their eager programs are not the records counted below
    with CompileTracker(step) as healthy:
        with pytest.warns(jl.JaxlogRuntimeWarning, match=r"compile tracking failed to read 1 JAX compile log "
                                                         r"record\(s\) \(RuntimeError: bookkeeping broke\)"):
            with Broken(step) as tracker:
                out, _ = step(x, w)
    assert float(out[0]) == 3.0  # the compile itself went through
    assert tracker.errors == ["RuntimeError: bookkeeping broke"]
    assert healthy.count == 1 and healthy.errors == []  # another open tracker still saw it


@settings(max_examples=60, deadline=None)
@given(w1=st.floats(1e-3, 1e3), w2=st.floats(1e-3, 1e3), n1=st.integers(1, 10**6), n2=st.integers(1, 10**6),
       ratio=st.floats(0.1, 10))
def test_faster_than_matches_its_definition(w1, w2, n1, n2, ratio):
    a, b = Timings(wall_s=w1, steps=n1), Timings(wall_s=w2, steps=n2)
    expected = a.steps_per_s >= ratio * b.steps_per_s
    try:
        a.assert_faster_than(b, ratio)
        passed = True
    except AssertionError:
        passed = False
    assert passed == expected
    # overhead is the same budget, expressed per step
    try:
        a.assert_overhead(b, at_most=1 / ratio)
        ok = True
    except AssertionError:
        ok = False
    if not math.isclose(a.steps_per_s, ratio * b.steps_per_s, rel_tol=1e-9):
        assert ok == expected


def test_timings_json_roundtrip_and_properties():
    t = Timings(wall_s=2.0, steps=10, compiles=1, compile_s=0.5,
                compile_events=(CompileEvent("jit(step)", ("f32[3]",), 0.5),), window=np.array([0.1, 0.2]))
    assert t.run_s == 1.5 and t.steps_per_s == 10 / 1.5 and t.s_per_step == 0.15  # compilation left out
    back = Timings.from_json(t.to_json())
    assert back.compile_events == t.compile_events
    np.testing.assert_array_equal(back.window, t.window)
    assert str(t.compile_events[0]) == "step(f32[3]) [500.0 ms]"
    assert math.isnan(Timings(wall_s=0.0, steps=0).steps_per_s)  # too short to time: no rate


def test_eager_ops_exclude_signatures_and_timeline(tmp_path):
    from pytest_jaxlog import Timeline
    from pytest_jaxlog import load_trace

    @jax.jit
    def helper(x):
        return x + 1

    @jax.jit
    def kernel(x, n):
        return x * n

    x = jnp.ones((5,))
    with CompileTracker(exclude=[helper]) as default, CompileTracker(eager=True) as with_eager:
        jnp.asarray(np.arange(7, dtype=np.int16)).astype(jnp.float16)  # eager op: a primitive program
        helper(x)
        kernel(x, 2.0)
        kernel(x, jnp.float32(2.0))
    assert [ev.function for ev in default.events] == ["kernel", "kernel"]
    assert any(ev.eager for ev in with_eager.events)
    assert not any(ev.eager for ev in default.events)
    assert default.signatures() == [("kernel", ("f32[5]", "weak_type f32[]")), ("kernel", ("f32[5]", "f32[]"))]
    assert default.timings(1.0, 1, distinct=True).compiles == 2

    tl = Timeline()
    default.add_to_timeline(tl)
    back = load_trace(tl.write(tmp_path / "c.pftrace"))
    slices = back.slices("kernel", track="compile")
    assert len(slices) == 2
    assert [s.dur_s for s in slices] == pytest.approx([ev.seconds for ev in default.events], abs=1e-6)
    assert slices[0].args["args"] == "f32[5], weak_type f32[]"


def test_tracking_does_not_flood_users_log_handlers():
    """The tracker lowers JAX's lowering logger to DEBUG to read "Compiling ..." records; those must
    not reach handlers that never asked for DEBUG (pytest's log capture), while warnings still do."""
    import logging

    import jax
    import jax.numpy as jnp

    from pytest_jaxlog import CompileTracker
    from pytest_jaxlog.profiling.timings import _COMPILE_LOGGER

    seen: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(record)

    root = logging.getLogger()
    handler = Collect(level=logging.NOTSET)
    root.addHandler(handler)
    try:
        f = jax.jit(lambda x: jnp.sin(x) * 3.0)
        with CompileTracker() as tracker:
            f(jnp.ones(7))
            logging.getLogger(_COMPILE_LOGGER).warning("a real warning")
    finally:
        root.removeHandler(handler)
    assert tracker.count == 1
    messages = [r.getMessage() for r in seen if r.name == _COMPILE_LOGGER]
    assert "a real warning" in messages
    assert not any(m.startswith("Compiling") for m in messages), messages
    assert logging.getLogger(_COMPILE_LOGGER).propagate is True


def test_throughput_leaves_compilation_out():
    """A cold run (compiling) and a warm one compare their stepping, not the compiler."""
    from pytest_jaxlog import Timings

    cold = Timings(wall_s=2.0, steps=100, compiles=1, compile_s=1.5)
    warm = Timings(wall_s=0.5, steps=100)
    assert cold.run_s == 0.5 and cold.steps_per_s == warm.steps_per_s == 200.0
    assert cold.s_per_step == warm.s_per_step == 0.005
    cold.assert_faster_than(warm, 1.0)
    warm.assert_overhead(cold, at_most=1.0)


def test_a_run_too_short_to_time_has_no_rate():
    """Fewer than MIN_TIMED_STEPS work steps: the time is mostly the run's fixed costs, so there is no
    rate (NaN, null in JSON), and a comparison with such a run says so instead of judging overhead."""
    from pytest_jaxlog.profiling.timings import MIN_TIMED_STEPS

    assert MIN_TIMED_STEPS == 10
    short, enough = Timings(wall_s=0.4, steps=MIN_TIMED_STEPS - 1), Timings(wall_s=0.4, steps=MIN_TIMED_STEPS)
    assert not short.timed and math.isnan(short.steps_per_s) and math.isnan(short.s_per_step)
    assert enough.timed and enough.steps_per_s == MIN_TIMED_STEPS / 0.4 and enough.s_per_step == 0.04
    assert short.to_json()["steps_per_s"] is None and enough.to_json()["steps_per_s"] == 25.0
    with pytest.raises(jl.TimingAssertionError, match=r"^\[jaxlog\] cannot compare the throughput: this run is too "
                       r"short to time \(a rate needs at least 10 work steps; it did 9 in 0\.4 s of stepping\)$"):
        short.assert_faster_than(enough)
    with pytest.raises(jl.TimingAssertionError, match=r"cannot compare the time per step: the reference run is too "
                       r"short to time"):
        enough.assert_overhead(short, at_most=2.0)
    one = jl.run(lambda x: x * 0.5, jnp.ones(3), 1, record={"x": lambda x: x}, progress=False)
    assert one.timings.steps == 1 and not one.timings.timed and math.isnan(one.timings.steps_per_s)
