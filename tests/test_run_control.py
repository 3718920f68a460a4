"""jl.run as users drive it: until= stops, when= records, aux= selections, chains with one key per
system, batched states with shared leaves, and the messages when a step is called wrongly."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl

# ---------------------------------------------------------------- until=


class Count(NamedTuple):
    t: jax.Array
    x: jax.Array


def count(s: Count) -> Count:
    return Count(s.t + 1, s.x * 1.5 + 0.25)


C0 = Count(jnp.int32(0), jnp.float32(1.0))
RECORD = {"t": lambda s: s.t, "x": jl.Record(lambda s: s.x, every=5)}


@pytest.mark.parametrize("chunk", [1, 4, 7, 40])
def test_until_stops_at_the_exact_first_step_mid_chunk(chunk, tmp_path):
    path = tmp_path / f"u{chunk}.h5"
    run = jl.run(count, C0, 40, record=RECORD, until=lambda s: s.t >= 13, chunk=chunk,
                 sinks=[jl.HDF5Writer(path)], progress=False)
    assert run.stop_reason == "until" and run.steps_done == 13 and run.status == "complete"
    assert int(run.state.t) == 13
    traj = jl.load(path)
    np.testing.assert_array_equal(traj.steps("t"), np.arange(14))
    np.testing.assert_array_equal(traj["t"], np.arange(14))
    np.testing.assert_array_equal(traj.steps("x"), [0, 5, 10])
    assert traj.stop_reason == "until" and traj.steps_done == 13 and traj.status == "complete"


def test_until_never_true_runs_all_steps_and_true_at_start_runs_none():
    run = jl.run(count, C0, 9, record=RECORD, until=lambda s: s.t > 100, chunk=4, progress=False)
    assert run.stop_reason == "steps" and run.steps_done == 9 and int(run.state.t) == 9
    assert run.trajectory.stop_reason == "steps"
    run = jl.run(count, C0, 9, record=RECORD, until=lambda s: s.t >= 0, chunk=4, progress=False)
    assert run.stop_reason == "until" and run.steps_done == 0 and int(run.state.t) == 0
    np.testing.assert_array_equal(run.trajectory.steps("t"), [0])


def test_until_runs_without_until_say_steps():
    run = jl.run(count, C0, 5, record=RECORD, progress=False)
    assert run.stop_reason == "steps" and run.trajectory.stop_reason == "steps"


def test_until_must_return_one_bool():
    with pytest.raises(jl.JaxlogError, match=r"until= must return one bool, got int32\[\]"):
        jl.run(count, C0, 5, until=lambda s: s.t, progress=False)


def test_batched_until_freezes_finished_systems_and_says_when_each_stopped():
    """Three systems reach their target at steps 3, 7 and never (within 10): each is frozen at its
    own step, the run ends at `steps` since one never finishes, and systems_done says which is which."""
    state = {"t": jnp.zeros(3, jnp.int32), "target": jnp.asarray([3, 7, 99], jnp.int32), "clock": jnp.int32(0)}

    def step(s):
        return {"t": s["t"] + 1, "target": s["target"], "clock": s["clock"] + 1}

    run = jl.run(step, state, 10, batched=True, record={"t": lambda s: s["t"]}, until=lambda s: s["t"] >= s["target"],
                 chunk=4, progress=False)
    assert run.stop_reason == "steps" and run.steps_done == 10
    np.testing.assert_array_equal(run.systems_done, [3, 7, 10])
    np.testing.assert_array_equal(run.state["t"], [3, 7, 10])
    assert int(run.state["clock"]) == 10  # a shared leaf goes on
    t = run.trajectory["t"]
    np.testing.assert_array_equal(t[:, 0], np.minimum(np.arange(11), 3))
    np.testing.assert_array_equal(t[:, 1], np.minimum(np.arange(11), 7))
    np.testing.assert_array_equal(run.trajectory.systems_done, [3, 7, 10])

    state = {**state, "target": jnp.asarray([3, 7, 5], jnp.int32)}
    run = jl.run(step, state, 50, batched=True, record={"t": lambda s: s["t"]}, until=lambda s: s["t"] >= s["target"],
                 chunk=4, progress=False)
    assert run.stop_reason == "until" and run.steps_done == 7
    np.testing.assert_array_equal(run.systems_done, [3, 7, 5])
    np.testing.assert_array_equal(run.trajectory.steps("t"), np.arange(8))


# ---------------------------------------------------------------- when=


def _walk(key, s):
    return s + jax.random.normal(key, s.shape)


def _python_reference(steps, key, every, pred):
    s, kept = jnp.zeros(2), []
    for k in range(steps + 1):
        if k:
            s = jax.jit(_walk)(jax.random.fold_in(key, k - 1), s)
        if k % every == 0 and bool(pred(s)):
            kept.append((k, np.asarray(s)))
    return kept


@pytest.mark.parametrize("pred, fraction", [(lambda s: s[0] > 1e9, "none"), (lambda s: s[0] > -1e9, "all"),
                                            (lambda s: s[0] > -5.0, "some")])
@pytest.mark.parametrize("chunk", [1, 3, 8, 30])
def test_when_keeps_exactly_the_steps_where_it_holds(pred, fraction, chunk):
    key = jax.random.key(3)
    ref = _python_reference(30, key, 2, pred)
    run = jl.run(_walk, jnp.zeros(2), 30, key=key, chunk=chunk, progress=False,
                 record={"x": jl.Record(lambda s: s, every=2, when=pred)})
    np.testing.assert_array_equal(run.trajectory.steps("x"), np.array([k for k, _ in ref], np.int64))
    np.testing.assert_array_equal(run.trajectory["x"], np.stack([v for _, v in ref]) if ref else np.zeros((0, 2)))
    assert {"none": 0, "all": 16}.get(fraction, len(ref)) == len(ref)
    assert fraction != "some" or 0 < len(ref) < 16


def test_when_in_a_recorder_loop_matches_run():
    key = jax.random.key(3)
    pred = lambda s: s[0] > -5.0  # noqa: E731
    run = jl.run(_walk, jnp.zeros(2), 30, key=key, chunk=7, progress=False,
                 record={"x": jl.Record(lambda s: s, when=pred)})
    with jl.Recorder({"x": jl.Record(lambda s: s, when=pred)}, flush_every=4) as rec:
        s = jnp.zeros(2)
        rec.log(s, 0)
        for k in range(30):
            s = jax.jit(_walk)(jax.random.fold_in(key, k), s)
            rec.log(s, k + 1)
    np.testing.assert_array_equal(rec.trajectory.steps("x"), run.trajectory.steps("x"))
    np.testing.assert_array_equal(rec.trajectory["x"], run.trajectory["x"])
    assert 0 < len(run.trajectory.steps("x")) < 31


def test_when_must_return_one_bool():
    with pytest.raises(jl.JaxlogError, match=r"record 'x': when= must return one bool"):
        jl.run(_walk, jnp.zeros(2), 3, key=jax.random.key(0), progress=False,
               record={"x": jl.Record(lambda s: s, when=lambda s: s > 0)})


# ---------------------------------------------------------------- aux=


def sampler(s):
    new = s + 1.0
    return new, {"acceptance": jnp.minimum(new[0] / 10, 1.0), "energy": jnp.sum(new),
                 "info": {"depth": jnp.int32(3), "divergent": jnp.bool_(False)}}


def test_aux_names_which_leaves_to_record_and_when():
    run = jl.run(sampler, jnp.zeros(2), 30, has_aux=True, chunk=7, progress=False,
                 aux={"acceptance": jl.every(1), "energy": jl.every(10), "info/depth": None})
    traj = run.trajectory
    assert set(traj.records) == {"aux/acceptance", "aux/energy", "aux/info/depth"}
    np.testing.assert_array_equal(traj.steps("aux/acceptance"), np.arange(1, 31))
    np.testing.assert_array_equal(traj.steps("aux/energy"), [10, 20, 30])
    np.testing.assert_array_equal(traj["aux/energy"], [20.0, 40.0, 60.0])
    np.testing.assert_array_equal(traj.steps("aux/info/depth"), np.arange(1, 31))
    everything = jl.run(sampler, jnp.zeros(2), 5, has_aux=True, progress=False).trajectory
    assert set(everything.records) == {"aux/acceptance", "aux/energy", "aux/info/depth", "aux/info/divergent"}


def test_aux_errors_name_what_is_missing():
    with pytest.raises(jl.JaxlogError, match=r"aux= names 'accept', which the step's aux output does not have "
                                             r"\(it has: acceptance, energy, info/depth, info/divergent\)"):
        jl.run(sampler, jnp.zeros(2), 3, has_aux=True, aux=["accept"], progress=False)
    with pytest.raises(jl.JaxlogError, match="has_aux=False"):
        jl.run(count, C0, 3, aux=["t"], progress=False)


# ---------------------------------------------------------------- chains: one key per system


def chain_step(key, x):
    return x + jax.random.normal(key, x.shape)


def test_batched_runs_give_each_system_its_own_key():
    key = jax.random.key(7)
    state = jnp.zeros((4, 2))
    seen = []

    def step(keys, s):
        seen.append(keys.shape)
        return jax.vmap(chain_step)(keys, s)

    a = jl.run(step, state, 12, key=key, batched=True, record={"x": lambda s: s}, chunk=5, progress=False)
    b = jl.run(step, state, 12, key=key, batched=True, record={"x": lambda s: s}, chunk=12, progress=False)
    assert (4,) in seen
    np.testing.assert_array_equal(a.trajectory["x"], b.trajectory["x"])  # reproducible, chunk-independent
    ref = np.zeros((4, 2), np.float32)
    for k in range(12):
        for sys in range(4):
            kk = jax.random.fold_in(jax.random.fold_in(key, k), sys)
            ref[sys] = np.asarray(chain_step(kk, jnp.asarray(ref[sys])))
    np.testing.assert_allclose(np.asarray(a.state), ref, rtol=1e-5, atol=1e-6)  # same keys (the loop fuses differently)
    draws = np.diff(a.trajectory["x"][:, :, 0], axis=0)  # independent chains: no two systems move alike
    assert len({tuple(np.round(draws[:, s], 5)) for s in range(4)}) == 4


# ---------------------------------------------------------------- batched states with shared leaves


def test_batched_state_may_hold_shared_leaves():
    state = {"x": jnp.ones((8, 5, 3)), "v": jnp.zeros((8, 5, 3)), "box": jnp.full(3, 4.0), "T": jnp.float32(1.5)}

    def step(s):
        return {**s, "x": jnp.mod(s["x"] + 0.1 * s["T"], s["box"]), "v": s["v"] + 1}

    run = jl.run(step, state, 4, batched=True, record={"v": lambda s: jnp.sum(s["v"], axis=(1, 2))},
                 invariants=[jl.bounded("v", hi=100)], progress=False)
    np.testing.assert_array_equal(run.trajectory["v"], np.broadcast_to(np.arange(5)[:, None] * 15.0, (5, 8)))
    np.testing.assert_array_equal(run.state["box"], [4.0, 4.0, 4.0])  # shared leaves: one copy, unchanged
    assert run.state["T"].shape == () and float(run.state["T"]) == 1.5
    np.testing.assert_allclose(run.state["x"], np.full((8, 5, 3), 1.0 + 4 * 0.15), rtol=1e-6)


def test_ambiguous_system_count_names_the_leaves_and_the_fix():
    state = {"x": jnp.ones((8, 3)), "box": jnp.ones(3)}
    with pytest.raises(jl.JaxlogError, match=r"leaves disagree on the leading axis \(3: \['box'\]; 8: \['x'\]\); "
                                             r"pass batched=<number of systems>"):
        jl.run(lambda s: s, state, 2, batched=True, progress=False)
    run = jl.run(lambda s: s, state, 2, batched=8, record={"x": lambda s: s["x"]}, progress=False)
    assert run.trajectory["x"].shape == (3, 8, 3)
    with pytest.raises(jl.JaxlogError, match=r"batched=5: no state leaf has a leading system axis of size 5"):
        jl.run(lambda s: s, state, 2, batched=5, progress=False)


# ---------------------------------------------------------------- types and messages


def test_weak_typed_state_compiles_once_over_many_chunks():
    """A state built from Python scalars is weak-typed; normalised once, every chunk runs one program."""
    def fresh(s):
        return {"x": s["x"] * 0.5 + 1.0, "t": s["t"] + 1}

    state = {"x": jnp.asarray(2.0), "t": jnp.asarray(0)}
    assert state["x"].weak_type
    run = jl.run(fresh, state, 50, chunk=7, record={"x": lambda s: s["x"]}, progress=False)
    run.timings.assert_compiles(1)
    assert run.trajectory["x"].dtype == np.float32


def test_a_step_returning_a_pair_without_has_aux_gets_a_hint():
    with pytest.raises(jl.JaxlogError, match=r"returns a pair \(state, something\): pass has_aux=True"):
        jl.run(lambda s: (s + 1, s * 2), jnp.zeros(3), 2, progress=False)


def test_swapped_step_and_state_is_named_without_printing_the_state():
    big = {"x": jnp.zeros((100, 100))}
    with pytest.raises(jl.JaxlogError) as info:
        jl.run(big, lambda s: s, 2, progress=False)
    msg = str(info.value)
    assert "step and state look swapped" in msg and len(msg) < 200


def test_numpy_on_a_traced_value_is_one_short_message():
    def step(s):
        return s + np.asarray(s)  # numpy cannot run on a tracer

    with pytest.raises(jl.JaxlogError) as info:
        jl.run(step, jnp.zeros(3), 2, progress=False)
    msg = str(info.value)
    assert msg.startswith("[jaxlog] the step function failed on the state: TracerArrayConversionError")
    assert len(msg) < 2000 and info.value.__cause__ is None and info.value.__suppress_context__


def test_throughput_leaves_out_the_first_dispatch_that_compiled():
    def fresh(s):  # nothing compiled for it yet in this process
        return s * 0.5 + 1.0

    rec = {"s": lambda s: s}
    cold = jl.run(fresh, jnp.zeros(4), 200, record=rec, chunk=50, progress=False)
    warm = jl.run(fresh, jnp.zeros(4), 200, record=rec, chunk=50, progress=False)
    assert cold.timings.compiles == 1 and warm.timings.compiles == 0
    t = cold.timings
    assert t.stepping_s is not None and t.stepping_s < t.wall_s - t.compile_s
    assert t.steps_per_s == pytest.approx(200 / t.stepping_s)
    warm.timings.assert_faster_than(cold, ratio=1e-9)  # a Run is a reference too
    warm.timings.assert_faster_than(cold.timings, ratio=1e-9)
    with pytest.raises(jl.TimingAssertionError, match="throughput"):  # and its steps_per_s is what is compared
        cold.timings.assert_faster_than(warm, ratio=1e9)


# ---------------------------------------------------------------- dispatches


class _Window(NamedTuple):
    start: int
    stop: int


def test_a_million_one_step_dispatches_are_made_as_the_run_goes_not_listed_up_front():
    """``chunk=1`` over 10**6 steps with a profile window and checkpoints: the dispatches cover
    every step once, in order, window steps one by one, a dispatch ending at each checkpoint step,
    and making them holds no list of them (a list of a million cost ~100 MB and 0.3 s up front)."""
    import tracemalloc

    from pytest_jaxlog.drive.device.chunks import segments as _segments

    steps, window = 10**6, _Window(1000, 1009)
    tracemalloc.start()
    try:
        segs = _segments(0, steps, 1, (window,), jl.every(250_000))
        first = [next(segs) for _ in range(3)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 16, f"{peak} bytes held to begin dispatching"
    k, n_win = 0, 0
    for seg in [*first, *segs]:
        assert seg.k0 == k and seg.length == 1
        n_win += seg.window is window
        assert (seg.window is window) == (window.start <= seg.k0 <= window.stop)
        k += seg.length
    assert k == steps and n_win == 10
    chunked = list(_segments(0, 1000, 300, (window,), jl.every(250)))
    assert [(s.k0, s.length) for s in chunked] == [(0, 250), (250, 50), (300, 200), (500, 100), (600, 150),
                                                  (750, 150), (900, 100)]
