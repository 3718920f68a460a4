"""jl.aggregate: a streamed reduction over a window of frames, judged when the window completes
(or at the end of the run), on hand-built frames and on real jl.run / jl.Recorder runs."""

from __future__ import annotations

import json
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pytest_jaxlog as jl
from pytest_jaxlog.check.invariants import finish_all
from pytest_jaxlog import Frames, LeafSpec, Schema

REDUCE = {"mean": np.mean, "sum": np.sum, "min": np.min, "max": np.max, "std": np.std}


def leaf(path, shape=(), dtype="float64", schedule=None):
    return LeafSpec(path, path.split("/")[0], tuple(shape), np.dtype(dtype), schedule or jl.every(1))


def frames(path, steps, values):
    f = Frames()
    f.add(path, np.asarray(steps), np.asarray(values))
    return f


# --------------------------------------------------------------------------- on frames


@pytest.mark.parametrize("reduce", sorted(REDUCE))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_reduction_is_numpys_over_the_window_for_any_batch_split(reduce, data):
    n = data.draw(st.integers(3, 40))
    systems = data.draw(st.integers(1, 3))
    start = data.draw(st.integers(0, n - 1))
    stop = data.draw(st.integers(start, n + 5))
    values = np.asarray(data.draw(st.lists(st.floats(-1e3, 1e3), min_size=n * systems * 2, max_size=n * systems * 2)))
    values = values.reshape(n, systems, 2)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, n - 1), max_size=5))))
    steps = np.arange(n)
    schema = Schema((leaf("x", (systems, 2)),), batched=True)
    expected = REDUCE[reduce](values[start : stop + 1], axis=0)
    flat = np.sort(expected.ravel())
    # a bound only the largest reduced value breaks, where it stands clear of the next: that
    # element, of any system and index, must be the one reported; otherwise every one violates
    # and the first is
    single = flat.size > 1 and flat[-1] - flat[-2] > 1e-6 * max(1.0, abs(flat[-1]))
    bound = {"hi": (flat[-1] + flat[-2]) / 2} if single else {"lo": 1e300}
    checker = jl.aggregate("x", reduce, steps=jl.window(start, stop), **bound).bind(schema)
    found = []
    for lo, hi in zip([0, *cuts], [*cuts, n]):
        v = checker.check(frames("x", steps[lo:hi], values[lo:hi]))
        if v is not None:
            found.append(v)
    v = finish_all([checker])
    if v is not None:
        found.append(v)
    (v,) = found  # judged exactly once
    system, index = np.unravel_index(np.argmax(expected), expected.shape) if single else (0, 0)
    assert (v.system, v.index) == (int(system), (int(index),))
    assert v.value == pytest.approx(expected[system, index], rel=1e-9, abs=1e-9)
    assert v.step == min(stop, n - 1)
    complete = stop <= n - 1
    assert (", cut short" not in str(v)) is complete


def test_judged_when_the_last_scheduled_step_of_the_window_is_seen():
    schema = Schema((leaf("a", schedule=jl.every(4)),))
    c = jl.aggregate("a", "mean", lo=0.5, steps=jl.window(10, 50)).bind(schema)  # a at 12, 16, ..., 48
    assert c.check(frames("a", np.arange(0, 45, 4), np.zeros(12))) is None  # 0..44: not complete yet
    v = c.check(frames("a", [48, 52, 56], [0.0, 9.0, 9.0]))
    assert v.step == 48 and v.value == 0.0
    assert str(v).splitlines()[0] == (
        "[jaxlog] invariant aggregate(a, mean, lo=0.5, steps=window(10, 50)) violated at step 48: value 0, "
        "expected >= 0.5 (mean over window(10, 50): 10 frames at steps 12..48; below the lower bound by 0.5)"
    )
    assert [s for s, _ in v.recent] == [32, 36, 40, 44, 48]
    assert c.check(frames("a", [60], [0.0])) is None and finish_all([c]) is None  # judged once


def test_unbounded_or_cut_short_windows_are_judged_at_the_end():
    schema = Schema((leaf("a"),))
    c = jl.aggregate("a", "max", hi=1.0, steps=jl.every(1, start=3)).bind(schema)
    assert c.check(frames("a", np.arange(10), np.r_[np.full(3, 9.0), np.zeros(7)])) is None
    v = c.finish()
    assert v is None  # frames before the window do not count
    c = jl.aggregate("a", "max", hi=1.0, steps=jl.every(1, start=3)).bind(schema)
    c.check(frames("a", np.arange(10), np.r_[np.zeros(5), [2.0], np.zeros(4)]))
    v = c.finish()
    assert v.step == 9 and v.value == 2.0
    assert "max over every(1, start=3), cut short: the run ended at step 9: 7 frames at steps 3..9" in str(v)

    c = jl.aggregate("a", "mean", hi=0.5, steps=jl.window(0, 100)).bind(schema)
    assert c.check(frames("a", np.arange(20), np.ones(20))) is None
    v = c.finish()
    assert "mean over window(0, 100), cut short: the run ended at step 19: 20 frames at steps 0..19" in str(v)
    assert c.finish() is None

    c = jl.aggregate("a", "sum", hi=10, steps=jl.window(50, 60)).bind(schema)
    c.check(frames("a", np.arange(20), np.ones(20)))
    assert c.finish() is None  # no frame reached the window: nothing to judge

    whole = jl.aggregate("a", "sum", hi=10).bind(Schema((leaf("a", schedule=jl.at(0, 5, 9)),)))
    v = whole.check(frames("a", [0, 5, 9], [4.0, 4.0, 4.0]))  # a record on a bounded schedule completes
    assert v.step == 9 and v.value == 12.0 and "sum over the whole run: 3 frames at steps 0..9" in str(v)


def test_bool_records_aggregate_as_fractions_and_groups_name_the_leaf():
    schema = Schema((leaf("mc/accepted", (2,), "bool"), leaf("mc/rate", (2,))), batched=True)
    c = jl.aggregate("mc", "mean", lo=0.4, hi=0.9, steps=jl.window(0, 3)).bind(schema)
    acc = np.array([[True, True], [False, True], [True, True], [False, True]])
    f = Frames()
    f.add("mc/accepted", np.arange(4), acc)
    f.add("mc/rate", np.arange(4), np.full((4, 2), 0.5))
    v = c.check(f)
    assert (v.record, v.group, v.system, v.value) == ("mc/accepted", "mc", 1, 1.0)
    assert "violated at step 3 (system 1) in mc/accepted (leaf of record group mc): value 1, expected in [0.4, 0.9]" in str(v)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: jl.aggregate("x", "median", lo=0), r"takes one of 'mean', 'sum', 'min', 'max', 'std'.*got 'median'"),
        (lambda: jl.aggregate("x", np.median, lo=0), r"got <function median"),
        (lambda: jl.aggregate("x", "mean"), r"aggregate\(x\) needs lo=, hi= or both"),
        (lambda: jl.aggregate("x", lo=2, hi=1), "greater than"),
        (lambda: jl.aggregate("x", lo=0, steps=100), r"steps= takes a schedule .*got 100"),
        (lambda: jl.aggregate("x", lo=0, atol=-1), r"atol must be finite and >= 0"),
        (lambda: jl.aggregate("", lo=0), "record name"),
        (lambda: jl.aggregate("x", lo=0, steps=jl.window(5, 7)).bind(Schema((leaf("x", schedule=jl.every(4)),))),
         r"record 'x' \(every\(4\)\) is never recorded in window\(5, 7\): nothing to aggregate"),
        (lambda: jl.aggregate("k", lo=0).bind(Schema((leaf("k", dtype="complex64"),))), "cannot apply to record 'k'"),
        (lambda: jl.aggregate("y", lo=0).bind(Schema((leaf("x"),))), r"record 'y' is not recorded; recorded: x"),
    ],
)
def test_bad_arguments_are_jaxlog_errors(make, match):
    with pytest.raises(jl.JaxlogError, match=match):
        make()


def test_name_and_atol():
    inv = jl.aggregate("acc", np.mean, lo=0.2, hi=0.9, steps=jl.window(100, 500), atol=1e-6)
    assert inv.name == "aggregate(acc, mean, lo=0.2, hi=0.9, steps=window(100, 500), atol=1e-06)"
    assert jl.aggregate("acc", "std", hi=1).name == "aggregate(acc, std, hi=1)"
    c = jl.aggregate("p", "max", hi=1, atol=1e-6).bind(Schema((leaf("p", dtype="float32", schedule=jl.at(0, 1)),)))
    assert c.check(frames("p", [0, 1], np.array([0.5, 1 + 1.2e-7], np.float32))) is None


# --------------------------------------------------------------------------- real runs

S = 4  # chains
PERIOD = np.arange(2, 2 + S)  # chain k rejects every (k+2)-th proposal: acceptance 1/2, 2/3, 3/4, 4/5


class Chain(NamedTuple):
    t: jax.Array  # (S,) int32 step counter
    accepted: jax.Array  # (S,) bool


def chain_step(s: Chain) -> Chain:
    t = s.t + 1
    return Chain(t, (t % jnp.asarray(PERIOD)) != 0)


def accepted(s: Chain):
    return s.accepted


def rate(s: Chain):
    return s.accepted.astype(jnp.float32)


START = Chain(jnp.zeros(S, jnp.int32), jnp.ones(S, bool))


def acceptance_mean(steps: range) -> np.ndarray:
    """The exact per-chain mean of ``accepted`` over these steps (step 0: accepted)."""
    t = np.asarray(list(steps))[:, None]
    acc = (t % PERIOD) != 0
    acc[t[:, 0] == 0] = True
    return acc.mean(axis=0)


@pytest.mark.parametrize("chunk", [None, 7])
def test_batched_run_reports_the_chain_and_window(chunk):
    window = jl.window(10, 60)
    inv = jl.aggregate("accepted", "mean", lo=0.6, steps=window)
    with pytest.raises(jl.InvariantViolation) as info:
        jl.run(chain_step, START, 100, record={"accepted": accepted}, invariants=[inv], batched=True, chunk=chunk)
    v = info.value
    expected = acceptance_mean(range(10, 61))
    assert expected[0] < 0.6 <= expected[1:].min()
    assert (v.step, v.system, v.record) == (60, 0, "accepted")
    assert v.value == pytest.approx(expected[0])
    assert str(v).startswith(
        f"[jaxlog] invariant aggregate(accepted, mean, lo=0.6, steps=window(10, 60)) violated at step 60 (system 0): "
        f"value {expected[0]:.6g}, expected >= 0.6 (mean over window(10, 60): 51 frames at steps 10..60; "
        f"below the lower bound by {0.6 - expected[0]:.6g})"
    )
    assert isinstance(v, jl.JaxlogError) and isinstance(v, AssertionError)


def test_run_passes_when_every_chain_is_in_bounds_and_records_the_violation_otherwise(tmp_path):
    burn_in = jl.window(20, 90)
    ok = jl.run(chain_step, START, 120, record={"rate": rate, "accepted": accepted}, batched=True,
                invariants=[jl.aggregate("rate", "mean", lo=0.45, hi=0.85, steps=burn_in),
                            jl.aggregate("accepted", "mean", lo=0.45, hi=0.85, steps=burn_in)])
    assert ok.violation is None and ok.steps_done == 120

    path = tmp_path / "chains.h5"
    run = jl.run(chain_step, START, 120, record={"rate": rate}, batched=True, on_violation="record",
                 sinks=[jl.HDF5Writer(path)],
                 invariants=[jl.aggregate("rate", "mean", hi=0.7, steps=jl.window(20, 90, every=2))])
    v = run.violation
    expected = acceptance_mean(range(20, 91, 2))
    assert list(np.flatnonzero(expected > 0.7)) == [3]  # on even steps only, chain 3 accepts 80%
    assert (v.step, v.system) == (90, 3) and v.value == pytest.approx(expected[3], rel=1e-6)
    assert run.steps_done == 120  # "record" keeps going
    stored = jl.load(path).violation
    assert stored["step"] == 90 and stored["system"] == 3 and "window(20, 90, every=2)" in stored["message"]
    assert json.loads(json.dumps(stored)) == stored


def test_recorder_judges_the_window_like_run():
    inv = jl.aggregate("accepted", "mean", lo=0.6, steps=jl.window(10, 60))
    s = START
    step = jax.jit(chain_step)
    with pytest.raises(jl.InvariantViolation) as info:
        with jl.Recorder({"accepted": accepted}, invariants=[inv], batched=True, flush_every=16) as rec:
            for k in range(101):
                if k:
                    s = step(s)
                rec.log(s, k)
    assert (info.value.step, info.value.system) == (60, 0)
    assert info.value.value == pytest.approx(acceptance_mean(range(10, 61))[0])


def test_a_run_that_ends_before_the_window_judges_the_frames_seen():
    inv = jl.aggregate("accepted", "mean", lo=0.6, steps=jl.window(10, 500))
    with pytest.raises(jl.InvariantViolation) as info:
        jl.run(chain_step, START, 60, record={"accepted": accepted}, invariants=[inv], batched=True)
    assert (info.value.step, info.value.system) == (60, 0)
    assert "cut short: the run ended at step 60" in str(info.value)
