"""jl.run: chunk-size independence, keys, aux, batching, stops (violation, KeyboardInterrupt, errors)."""

from __future__ import annotations

import io
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pytest_jaxlog as jl
from pytest_jaxlog.drive.run import auto_chunk
from pytest_jaxlog import MemorySink

# ---------------------------------------------------------------- small kernels (compiled once per shape)

N = 5


def osc(s):
    v = s["v"] - 0.05 * jnp.sin(s["x"])
    return {"x": s["x"] + 0.1 * v, "v": v}


def noisy(key, s):
    v = s["v"] - 0.05 * jnp.sin(s["x"]) + 0.01 * jax.random.normal(key, s["v"].shape)
    return {"x": s["x"] + 0.1 * v, "v": v}


def with_aux(s):
    new = osc(s)
    return new, {"ke": 0.5 * jnp.sum(new["v"] ** 2), "vmax": jnp.max(new["v"])}


def energy(s):
    return jnp.sum(0.5 * s["v"] ** 2 - jnp.cos(s["x"]))


def positions(s):
    return s["x"]


def both(s):
    return {"x": s["x"], "v": s["v"]}


STATE = {"x": jnp.linspace(-1.0, 1.0, N, dtype=jnp.float32), "v": jnp.zeros(N, jnp.float32)}
KEY = jax.random.key(42)
SCHEDULES = [jl.every(1), jl.every(3), jl.every(5, start=2), jl.at(0, 4, 17, 33), jl.window(5, 20, every=2)]
RECORDS = [{"e": energy, "x": jl.Record(positions, every=s)} for s in SCHEDULES]


def _leaves_equal(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _traj_equal(t1, t2):
    assert t1.records == t2.records
    for p in t1.records:
        np.testing.assert_array_equal(t1.steps(p), t2.steps(p))
        np.testing.assert_array_equal(t1[p], t2[p])


_single = jax.jit(osc)
_single_noisy = jax.jit(noisy)


def _reference(steps, key=None, start=0, state=STATE):
    """Plain loop: state after each step, the work of step k fed fold_in(key, k)."""
    s, out = state, [state]
    for k in range(start, start + steps):
        s = _single_noisy(jax.random.fold_in(key, k), s) if key is not None else _single(s)
        out.append(s)
    return out


# ---------------------------------------------------------------- chunk-size independence


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunk=st.sampled_from([1, 2, 7, 1000]), steps=st.integers(0, 40), which=st.integers(0, len(SCHEDULES) - 1),
       keyed=st.booleans(), small=st.booleans())
def test_chunk_size_independence(chunk, steps, which, keyed, small):
    rec = RECORDS[which]
    fn, key = (noisy, KEY) if keyed else (osc, None)
    # small: buffers for a few steps, so chunks fill many sets in turn and reuse them (stale rows)
    budget = {"chunk_budget_bytes": 3 * 4 * (1 + N)} if small else {}
    a = jl.run(fn, STATE, steps, record=rec, key=key, chunk=chunk, progress=False, **budget)
    b = jl.run(fn, STATE, steps, record=rec, key=key, chunk=1000, progress=False)
    _leaves_equal(a.state, b.state)
    _traj_equal(a.trajectory, b.trajectory)
    assert a.steps_done == b.steps_done == steps
    sched = SCHEDULES[which]
    np.testing.assert_array_equal(a.trajectory.steps("x"), sched.steps_between(0, steps))
    np.testing.assert_array_equal(a.trajectory.steps("e"), np.arange(steps + 1))
    # values are those of a plain per-step loop
    ref = _reference(steps, key)
    _leaves_equal(a.state, ref[-1])
    want = np.stack([np.asarray(ref[k]["x"]) for k in sched.steps_between(0, steps)]) if len(
        sched.steps_between(0, steps)) else np.zeros((0, N), np.float32)
    np.testing.assert_allclose(a.trajectory["x"], want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("which", range(len(SCHEDULES)))
def test_only_sparse_records_step_ahead_between_scheduled_steps(which):
    """With no every-step record the program runs the steps between two scheduled ones in an inner
    loop: the same frames, states and until= stop for any chunk size, and the states of a plain loop."""
    sched = SCHEDULES[which]
    rec = {"x": jl.Record(positions, every=sched), "n": jl.Record(energy, every=jl.at(3, 30))}
    ref = _reference(40)
    runs = [jl.run(osc, STATE, 40, record=rec, chunk=c, progress=False) for c in (None, 1, 7)]
    for r in runs:
        _traj_equal(r.trajectory, runs[0].trajectory)
        _leaves_equal(r.state, ref[40])
        np.testing.assert_array_equal(r.trajectory.steps("x"), sched.steps_between(0, 40))
        np.testing.assert_array_equal(r.trajectory.steps("n"), [3, 30])
    # until= inside the inner loop: the exact first step where it holds
    stop = next(k for k in range(41) if float(ref[k]["x"][0]) > -0.9)
    for c in (None, 1, 7):
        r = jl.run(osc, STATE, 40, record=rec, chunk=c, until=lambda s: s["x"][0] > -0.9, progress=False)
        assert r.stop_reason == "until" and r.steps_done == stop
        _leaves_equal(r.state, ref[stop])
        np.testing.assert_array_equal(r.trajectory.steps("x"), sched.steps_between(0, stop))


@pytest.mark.parametrize("which", range(len(SCHEDULES)))
def test_only_sparse_views_on_one_schedule_record_the_values_of_a_plain_loop(which):
    """Sparse views sharing one schedule are evaluated at every state the inner loop reaches and
    written where scheduled: exactly the scheduled frames, with a plain loop's values, for any
    chunk size, when until= stops the run between two scheduled states, and beside a when= record
    (evaluated only where scheduled) and a sparse aux record (taken by the scheduled step itself)."""
    sched = SCHEDULES[which]
    ref = _reference(40)
    stop = next(k for k in range(41) if float(ref[k]["x"][0]) > -0.9)
    positive = lambda s: s["v"][0] > 0  # noqa: E731
    for kw, end in (({}, 40), ({"until": lambda s: s["x"][0] > -0.9}, stop)):
        for extra in ({}, {"w": jl.Record(positions, every=sched, when=positive)}):
            rec = {"x": jl.Record(positions, every=sched), "e": jl.Record(energy, every=sched), **extra}
            runs = [jl.run(osc, STATE, 40, record=rec, chunk=c, progress=False, **kw) for c in (None, 1, 3, 7)]
            want = sched.steps_between(0, end)
            for r in runs:
                assert r.steps_done == end
                _leaves_equal(r.state, ref[end])
                _traj_equal(r.trajectory, runs[0].trajectory)
                np.testing.assert_array_equal(r.trajectory.steps("x"), want)
                np.testing.assert_array_equal(r.trajectory.steps("e"), want)
                xs = np.stack([np.asarray(ref[k]["x"]) for k in want]) if len(want) else np.zeros((0, N), np.float32)
                np.testing.assert_allclose(r.trajectory["x"], xs, rtol=1e-6, atol=1e-6)
                np.testing.assert_allclose(r.trajectory["e"], [float(energy(ref[k])) for k in want], rtol=1e-5)
                if extra:
                    kept = [k for k in want if float(ref[k]["v"][0]) > 0]
                    np.testing.assert_array_equal(r.trajectory.steps("w"), kept)
    # a sparse aux record only: the scheduled step records what it returns
    for c in (None, 1, 7):
        r = jl.run(with_aux, STATE, 40, record={}, has_aux=True, aux={"ke": sched}, chunk=c, progress=False)
        want = [k for k in sched.steps_between(1, 40)]
        np.testing.assert_array_equal(r.trajectory.steps("aux/ke"), want)
        np.testing.assert_allclose(r.trajectory["aux/ke"], [float(0.5 * jnp.sum(ref[k]["v"] ** 2)) for k in want],
                                   rtol=1e-5)


def test_scalar_records_share_a_row_buffer_and_keep_a_plain_loops_values_and_steps():
    """Every-step scalar records of one dtype are the columns of one row buffer: views recorded
    from step 0 beside one from step 1 and aux values (from step 1), bool and int32 columns in
    buffers of their own dtype, a vector record in its own buffer; each keeps a plain loop's
    values and steps, for any chunk size."""
    def step(s):
        new, aux = with_aux(s)
        return new, {**aux, "n_pos": jnp.sum(new["x"] > 0)}

    record = {"e": energy, "x0": lambda s: s["x"][0], "up": lambda s: s["v"][0] > 0, "x": positions,
              "late": jl.Record(lambda s: s["v"][1], every=jl.every(1, start=1))}
    ref = _reference(30)
    runs = [jl.run(step, STATE, 30, record=record, has_aux=True, chunk=c, progress=False) for c in (None, 1, 4, 7)]
    for r in runs:
        t = r.trajectory
        _traj_equal(t, runs[0].trajectory)
        for path in ("e", "x0", "up", "x"):
            np.testing.assert_array_equal(t.steps(path), np.arange(31))
        for path in ("late", "aux/ke", "aux/vmax", "aux/n_pos"):
            np.testing.assert_array_equal(t.steps(path), np.arange(1, 31))
        np.testing.assert_array_equal(t["x0"], [float(ref[k]["x"][0]) for k in range(31)])
        np.testing.assert_array_equal(t["up"], [bool(ref[k]["v"][0] > 0) for k in range(31)])
        np.testing.assert_array_equal(t["late"], [float(ref[k]["v"][1]) for k in range(1, 31)])
        np.testing.assert_array_equal(t["aux/n_pos"], [int(jnp.sum(ref[k]["x"] > 0)) for k in range(1, 31)])
        np.testing.assert_array_equal(t["x"], np.stack([np.asarray(ref[k]["x"]) for k in range(31)]))
        np.testing.assert_allclose(t["e"], [float(energy(ref[k])) for k in range(31)], rtol=1e-6)
        np.testing.assert_allclose(t["aux/vmax"], [float(jnp.max(ref[k]["v"])) for k in range(1, 31)], rtol=1e-6)
        assert t["up"].dtype == np.bool_ and t["aux/n_pos"].dtype == np.int32 and t["e"].dtype == np.float32


def test_scalar_records_are_written_by_one_update_per_step_however_many():
    """XLA:CPU compiles each in-place update of a record buffer as a kernel of its own (a few
    milliseconds each): six scalar records compile no more updates than two."""
    def updates(n):
        record = {f"s{i}": (lambda s, i=i: s["x"][i % N] * (i + 1)) for i in range(n)}
        hlo = jl.run(osc, STATE, 3, record=record, progress=False).compiled_chunk().as_text()
        return hlo.count(" dynamic-update-slice(")

    assert updates(6) == updates(2) > 0


def test_a_sparse_records_steps_are_written_on_the_device_only_where_when_decides_them():
    """A sparse record is taken at every scheduled state the run reaches: the host works its
    steps out from the schedule, and the program writes only its values. With ``when=`` the
    steps depend on the state: the program writes them too (one more update)."""
    def updates(**when):
        rec = {"x": jl.Record(positions, every=3, **when)}
        r = jl.run(osc, STATE, 20, record=rec, chunk=7, progress=False)
        return r, r.compiled_chunk().as_text().count(" dynamic-update-slice(")

    plain, n_plain = updates()
    kept, n_kept = updates(when=lambda s: s["x"][0] < 10.0)  # always true: the same frames
    assert n_kept > n_plain > 0
    np.testing.assert_array_equal(plain.trajectory.steps("x"), np.arange(0, 21, 3))
    _traj_equal(plain.trajectory, kept.trajectory)


def test_a_window_schedule_records_nothing_past_its_stop():
    """window(0, 10) holds at every step up to 10: recorded at those steps only, however the run
    is cut into chunks."""
    for chunk in (None, 1, 4):
        r = jl.run(osc, STATE, 25, record={"w": jl.Record(positions, every=jl.window(0, 10))}, chunk=chunk,
                   progress=False)
        np.testing.assert_array_equal(r.trajectory.steps("w"), np.arange(11))


def test_a_schedule_the_program_does_not_know_is_evaluated_on_the_host():
    """A user's Schedule subclass has no device form: its steps come from the host, per chunk."""
    from pytest_jaxlog.record.schedule import Schedule

    class Squares(Schedule):
        def steps_between(self, lo, hi):
            k = np.arange(int(np.ceil(np.sqrt(max(lo, 0)))), int(np.floor(np.sqrt(max(hi, 0)))) + 1, dtype=np.int64)
            return k * k

        def mask(self, steps):
            steps = np.asarray(steps, np.int64)
            return np.round(np.sqrt(steps)) ** 2 == steps

        def max_in_span(self, length):
            return min(length, int(np.sqrt(length)) + 1)

        def to_json(self):
            return {"kind": "squares"}

    ref = _reference(40)
    for chunk in (None, 1, 6):
        r = jl.run(osc, STATE, 40, record={"x": jl.Record(positions, every=Squares())}, chunk=chunk, progress=False)
        np.testing.assert_array_equal(r.trajectory.steps("x"), [0, 1, 4, 9, 16, 25, 36])
        np.testing.assert_array_equal(r.trajectory["x"], np.stack([np.asarray(ref[k]["x"]) for k in
                                                                   (0, 1, 4, 9, 16, 25, 36)]))


def test_runs_of_any_length_and_chunk_share_one_program():
    """The capacity comes from the memory budget, not the run length: once a kernel and its records
    ran, runs of other lengths, chunk sizes and windows compile nothing, and the buffers kept
    from one run (stale rows in them) never show up in the next."""
    def fresh(s):  # nothing compiled for it yet in this process
        return osc(s)

    rec = {"e": energy, "x": jl.Record(positions, every=3), "h": lambda s: s["x"].astype(jnp.bfloat16),
           "k": jl.Record(positions, when=lambda s: s["x"][0] < -0.5)}
    ref = _reference(70)
    first = jl.run(fresh, STATE, 50, record=rec, progress=False)
    assert first.timings.compiles == 1
    for steps, chunk in ((7, None), (70, 1), (3, 13), (0, None), (70, 9)):
        r = jl.run(fresh, STATE, steps, record=rec, chunk=chunk, progress=False)
        assert r.timings.compiles == 0, (steps, chunk)
        t = r.trajectory
        np.testing.assert_array_equal(t.steps("e"), np.arange(steps + 1))
        np.testing.assert_array_equal(t.steps("x"), np.arange(0, steps + 1, 3))
        np.testing.assert_array_equal(t["h"], np.stack([np.asarray(ref[k]["x"]).astype(jnp.bfloat16)
                                                        for k in range(steps + 1)]))
        kept = [k for k in range(steps + 1) if float(ref[k]["x"][0]) < -0.5]
        np.testing.assert_array_equal(t.steps("k"), kept)
        _leaves_equal(r.state, ref[steps])


def test_key_folding_and_resume():
    full = jl.run(noisy, STATE, 23, record={"e": energy, "x": jl.Record(positions, every=4)}, key=KEY, chunk=5,
                  progress=False)
    first = jl.run(noisy, STATE, 10, record={"e": energy, "x": jl.Record(positions, every=4)}, key=KEY, chunk=3,
                   progress=False)
    second = jl.run(noisy, first.state, 13, record={"e": energy, "x": jl.Record(positions, every=4)}, key=KEY,
                    chunk=7, start_step=10, progress=False)
    _leaves_equal(second.state, full.state)
    assert second.steps_done == 23
    t, t1, t2 = full.trajectory, first.trajectory, second.trajectory
    np.testing.assert_array_equal(t2.steps("e"), np.arange(11, 24))  # the resumed run does not re-record step 10
    np.testing.assert_array_equal(np.concatenate([t1["e"], t2["e"]]), t["e"])
    np.testing.assert_array_equal(np.concatenate([t1.steps("x"), t2.steps("x")]), t.steps("x"))
    np.testing.assert_array_equal(np.concatenate([t1["x"], t2["x"]]), t["x"])
    # a different key gives a different trajectory
    other = jl.run(noisy, STATE, 23, key=jax.random.key(7), chunk=5, progress=False)
    assert not np.array_equal(np.asarray(other.state["v"]), np.asarray(full.state["v"]))


def test_raw_uint32_key_and_key_in_state():
    def step(key, s):
        k2, sub = jax.random.split(s["k"])
        return {"k": k2, "x": s["x"] + jax.random.uniform(sub, s["x"].shape) + jax.random.uniform(key, ())}

    state = {"k": jax.random.key(1), "x": jnp.zeros(3)}
    r = jl.run(step, state, 6, record={"k": lambda s: s["k"], "x": lambda s: s["x"]}, key=jax.random.PRNGKey(0),
               chunk=4, progress=False)
    leaf = r.schema["k"]
    assert leaf.key_impl == "threefry2x32" and leaf.dtype == np.uint32 and leaf.shape == (2,)
    np.testing.assert_array_equal(r.trajectory["k"][-1], np.asarray(jax.random.key_data(r.state["k"])))
    assert jax.dtypes.issubdtype(r.state["k"].dtype, jax.dtypes.prng_key)


def test_has_aux_recorded_from_step_1():
    r = jl.run(with_aux, STATE, 9, record={"e": energy}, has_aux=True, chunk=4, progress=False)
    t = r.trajectory
    assert set(t.records) == {"e", "aux/ke", "aux/vmax"}
    np.testing.assert_array_equal(t.steps("aux/ke"), np.arange(1, 10))
    ref = _reference(9)
    np.testing.assert_allclose(t["aux/ke"], [0.5 * np.sum(np.asarray(s["v"]) ** 2) for s in ref[1:]], rtol=1e-6)
    _leaves_equal(r.state, ref[-1])
    with pytest.raises(jl.JaxlogError, match="reserved"):
        jl.run(with_aux, STATE, 2, record={"aux": energy}, has_aux=True, progress=False)
    with pytest.raises(jl.JaxlogError, match=r"\(state, aux\)"):
        jl.run(osc, STATE, 2, has_aux=True, progress=False)


def test_batched_and_dt():
    state = {"x": jnp.ones((3, N)) * jnp.arange(3.0)[:, None], "v": jnp.zeros((3, N))}
    per_system = lambda s: jnp.sum(0.5 * s["v"] ** 2 - jnp.cos(s["x"]), axis=-1)  # noqa: E731
    r = jl.run(osc, state, 8, record={"e": per_system, "x": jl.Record(positions, every=4)}, batched=True, dt=0.5,
               chunk=3, progress=False)
    assert r.schema.batched and r.schema.n_systems == 3 and r.schema.dt == 0.5
    t = r.trajectory
    assert t["e"].shape == (9, 3) and t["x"].shape == (3, 3, N)
    np.testing.assert_allclose(t.time("x"), [0.0, 2.0, 4.0])
    with pytest.raises(jl.JaxlogError, match="'total'.*leading system axis"):
        jl.run(osc, state, 2, record={"total": energy}, batched=True, progress=False)


# ---------------------------------------------------------------- errors before any step


class CountingSink(MemorySink):
    def __init__(self, fail_at=None, exc=None):
        super().__init__()
        self.writes = 0
        self.fail_at, self.exc = fail_at, exc

    def write(self, frames):
        self.writes += 1
        if self.fail_at is not None and self.writes == self.fail_at:
            raise self.exc
        super().write(frames)


@pytest.mark.parametrize("record, match", [
    ({"s": lambda s: "text"}, "'s'"),
    ({"bad": lambda s: s["nope"]}, "'bad' failed"),
    ({"n": lambda s: {"a": s["x"], "b": object()}}, "'n"),
    ({"bad/name": positions}, "invalid"),
])
def test_bad_views_fail_before_any_step(record, match):
    sink = CountingSink()
    with pytest.raises(jl.JaxlogError, match=match):
        jl.run(osc, STATE, 3, record=record, sinks=[sink], progress=False)
    assert sink.schema is None  # never opened


def test_step_changing_shape_is_an_error():
    with pytest.raises(jl.JaxlogError, match=r"\['x'\]"):
        jl.run(lambda s: {"x": jnp.concatenate([s["x"], s["x"]]), "v": s["v"]}, STATE, 3, progress=False)


def test_bad_arguments():
    with pytest.raises(jl.JaxlogError, match="steps"):
        jl.run(osc, STATE, -1)
    with pytest.raises(jl.JaxlogError, match="chunk"):
        jl.run(osc, STATE, 3, chunk=0)
    with pytest.raises(jl.JaxlogError, match="on_violation"):
        jl.run(osc, STATE, 3, on_violation="explode")


# ---------------------------------------------------------------- invariants (fake, interface only) and stops


def osc_t(s):
    """``osc`` with a step counter ``t`` (an invariant on it breaks at a chosen step)."""
    return {**osc({"x": s["x"], "v": s["v"]}), "t": s["t"] + 1}


STATE_T = {**STATE, "t": jnp.int32(0)}
REC_T = {"e": energy, "t": lambda s: s["t"], "x": jl.Record(positions, every=5)}


def _xv(s):
    return {"x": s["x"], "v": s["v"]}


def test_violation_stops_at_the_step_with_postmortem():
    sink = MemorySink()
    with pytest.raises(jl.InvariantViolation) as info:
        jl.run(osc_t, STATE_T, 40, record=REC_T, invariants=[jl.bounded("t", hi=12)], sinks=[sink], chunk=6,
               progress=False)
    run = info.value.jaxlog_run
    assert sink.status == "violated" and sink.steps_done == 13 and sink.violation["step"] == 13
    frames = sink.frames()
    assert frames.steps["e"][-1] == 13 and frames.steps["x"][-1] == 10
    ref = _reference(13)
    assert sorted(sink.attachments["postmortem"]) == [11, 12, 13]
    for k in (11, 12, 13):
        snap = sink.attachments["postmortem"][k]
        assert set(snap) == {"state/x", "state/v", "state/t"} and int(snap["state/t"]) == k
        np.testing.assert_array_equal(snap["state/x"], np.asarray(ref[k]["x"]))
    assert run.steps_done == 13 and run.status == "violated" and int(run.state["t"]) == 13
    _leaves_equal(_xv(run.state), ref[13])


@pytest.mark.parametrize("mode", ["warn", "record"])
def test_violation_warn_or_record_goes_on_to_the_end(mode):
    """warn/record: all steps run, all frames written, status "violated", the first violation kept,
    its post-mortem saved, and one warning per broken invariant (at its first violation)."""
    sink = MemorySink()
    invs = [jl.bounded("t", hi=12), jl.bounded("t", hi=6), jl.finite("e")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = jl.run(osc_t, STATE_T, 40, record=REC_T, invariants=invs, sinks=[sink], on_violation=mode, chunk=4,
                   progress=False)
    assert r.steps_done == 40 and r.status == "violated" and int(r.state["t"]) == 40
    _leaves_equal(_xv(r.state), _reference(40)[-1])
    v = r.violation
    assert isinstance(v, jl.InvariantViolation) and (v.invariant, v.step) == ("bounded(t, hi=6)", 7)
    assert sink.status == "violated" and sink.steps_done == 40 and sink.violation["step"] == 7
    frames = sink.frames()
    np.testing.assert_array_equal(frames.steps["t"], np.arange(41))
    np.testing.assert_array_equal(frames.values["t"], np.arange(41))
    np.testing.assert_array_equal(frames.steps["x"], np.arange(0, 41, 5))
    assert sorted(sink.attachments["postmortem"]) == [5, 6, 7]
    assert [int(sink.attachments["postmortem"][k]["state/t"]) for k in (5, 6, 7)] == [5, 6, 7]
    warned = [w for w in caught if issubclass(w.category, jl.JaxlogRuntimeWarning)]
    if mode == "warn":
        assert [(w.message.violation.invariant, w.message.violation.step) for w in warned] == [
            ("bounded(t, hi=6)", 7), ("bounded(t, hi=12)", 13)]
        assert all(w.filename == __file__ for w in warned)
    else:
        assert not warned


def test_violation_at_step_zero_keeps_the_initial_state():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jl.JaxlogRuntimeWarning)
        r = jl.run(osc_t, STATE_T, 20, record=REC_T, invariants=[jl.bounded("t", lo=1)], on_violation="warn",
                   chunk=4, progress=False)
    assert r.violation.step == 0 and r.steps_done == 20 and r.trajectory.status == "violated"
    assert sorted(r.trajectory.postmortem) == [0]
    with pytest.raises(jl.InvariantViolation) as info:
        jl.run(osc_t, STATE_T, 20, record=REC_T, invariants=[jl.bounded("t", lo=1)], chunk=4, progress=False)
    assert info.value.step == 0 and info.value.jaxlog_run.steps_done == 0
    _leaves_equal(_xv(info.value.jaxlog_run.state), STATE)


def test_real_finite_invariant_names_step():
    def blowup(s):
        return {"x": s["x"] * 10.0, "v": s["v"]}

    with pytest.raises(jl.InvariantViolation) as info:
        jl.run(blowup, {"x": jnp.ones(2, jnp.float32), "v": jnp.zeros(2)}, 100, record={"x": lambda s: s["x"]},
               invariants=[jl.finite("x")], chunk=16, progress=False)
    assert info.value.step == 39  # 10**39 overflows float32
    with pytest.raises(jl.JaxlogError):  # the invariant names a record that is not recorded: before any step
        jl.run(osc, STATE, 3, record={"e": energy}, invariants=[jl.finite("nope")], progress=False)


def test_keyboard_interrupt_stops_at_chunk_boundary():
    mem = MemorySink()
    bad = CountingSink(fail_at=3, exc=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt) as info:
        jl.run(osc, STATE, 50, record={"e": energy}, sinks=[mem, bad], chunk_budget_bytes=5 * 4, donate=False,
               progress=False)  # buffers for 5 steps of "e": each set of 5 is pulled and written as one batch
    assert mem.status == bad.status == "stopped"
    # chunks 0..4 and 5..9 written everywhere before the third write raised; mem (listed first)
    # took that third batch too, so it holds, and says, steps up to 15
    assert mem.steps_done == 15
    np.testing.assert_array_equal(mem.frames().steps["e"], np.arange(16))
    run = info.value.jaxlog_run
    assert run.steps_done == 10 and run.status == "stopped"
    _leaves_equal(run.state, _reference(10)[-1])


def test_sink_exception_fails_and_is_reraised():
    mem = MemorySink()
    with pytest.raises(RuntimeError, match="disk full"):
        jl.run(osc, STATE, 30, record={"e": energy}, sinks=[mem, CountingSink(2, RuntimeError("disk full"))],
               chunk_budget_bytes=5 * 4, progress=False)
    # mem took chunk 6..10 before the next sink failed on it: it holds (and says) steps up to 10
    assert mem.status == "failed" and mem.steps_done == 10
    np.testing.assert_array_equal(mem.frames().steps["e"], np.arange(11))


def test_a_sink_ahead_of_a_failing_one_says_how_far_its_file_goes(tmp_path):
    calls = []

    def flaky(frames):
        calls.append(frames.last_step)
        if len(calls) == 3:
            raise OSError("network share gone")

    with pytest.raises(jl.WriterError, match="network share gone") as info:
        jl.run(osc, STATE, 20, chunk_budget_bytes=3 * (4 + N), record={"e": energy, "x": jl.Record(positions, every=4)},
               sinks=[jl.HDF5Writer(tmp_path / "t.h5"), jl.CallbackSink(flaky)], progress=False)  # sets of 3 steps
    traj = jl.load(tmp_path / "t.h5")
    assert traj.status == "failed" and list(traj.steps("e")) == list(range(10))
    assert traj.steps_done == 9  # was 6: the file held steps 7..9 beyond its steps_done
    assert info.value.jaxlog_run.status == "failed"


# ---------------------------------------------------------------- the rest of the options


def test_caller_state_is_not_donated_and_compiles_are_reused():
    state = {"x": jnp.linspace(0.0, 1.0, N, dtype=jnp.float32), "v": jnp.ones(N, jnp.float32)}
    r1 = jl.run(osc, state, 20, record={"e": energy}, chunk=7, progress=False)
    assert not any(leaf.is_deleted() for leaf in jax.tree_util.tree_leaves(state))
    assert r1.timings.compiles <= 3  # chunk 7, the last chunk of 6, the initial views
    r2 = jl.run(osc, state, 20, record={"e": energy}, chunk=7, progress=False)
    assert r2.timings.compiles == 0
    assert r2.timings.steps == 20 and r2.timings.wall_s > 0 and r2.timings.steps_per_s > 0
    _leaves_equal(r1.state, r2.state)


def test_auto_chunk_respects_budget():
    r = jl.run(osc, STATE, 50, record={"x": positions}, chunk_budget_bytes=N * 4 * 8, progress=False)
    assert r.chunk == 8
    assert auto_chunk(r.schema) == 10_000  # the capacity does not follow the run length
    ref = jl.run(osc, STATE, 50, record={"x": positions}, chunk=50, progress=False)
    _traj_equal(r.trajectory, ref.trajectory)


def test_zero_steps_records_initial_state():
    r = jl.run(osc, STATE, 0, record={"e": energy, "x": jl.Record(positions, every=3)}, progress=False)
    assert r.steps_done == 0
    np.testing.assert_array_equal(r.trajectory.steps("x"), [0])
    _leaves_equal(r.state, STATE)


def test_progress_advances_by_steps():
    out = io.StringIO()
    bar = jl.ProgressLogger(30, enabled=True, file=out, mininterval=0)
    jl.run(osc, STATE, 30, chunk=10, progress=bar)
    assert "30/30" in out.getvalue()


def test_hdf5_sink_trajectory_is_loaded(tmp_path):
    pytest.importorskip("pytest_jaxlog.store.hdf5.writer")
    path = tmp_path / "t.h5"
    r = jl.run(osc, STATE, 12, record={"e": energy, "x": jl.Record(positions, every=4)},
               sinks=[jl.HDF5Writer(path)], chunk=5, dt=0.1, progress=False)
    assert r.artifacts["trajectory"] == path
    t = r.trajectory
    assert t.path == path and t.status == "complete" and t.steps_done == 12
    mem = jl.run(osc, STATE, 12, record={"e": energy, "x": jl.Record(positions, every=4)}, chunk=12, dt=0.1,
                 progress=False)
    _traj_equal(t, mem.trajectory)


def test_timeline_slices_and_counters(tmp_path):
    from pytest_jaxlog import Timeline
    from pytest_jaxlog import load_trace

    tl = Timeline()
    jl.run(osc, STATE, 20, record={"e": energy, "x": positions}, chunk_budget_bytes=3 * 4 * (1 + N), timeline=tl,
           progress=False)  # sets of 3 steps, each pulled as one batch
    assert len(tl.slices("dispatch")) == 7 and len(tl.slices("host")) == 7
    assert "e" in tl.counter_names()
    # the counter reads in step order across chunks (their time intervals overlap)
    run = jl.run(osc, STATE, 20, record={"e": energy}, chunk=3, progress=False)
    ts, vals = load_trace(tl.write(tmp_path / "t.pftrace")).counters["e"]
    np.testing.assert_array_equal(vals, np.asarray(run.trajectory["e"], np.float64))
    assert np.all(np.diff(ts) > 0)


def test_profile_window_steps_are_identical(tmp_path):
    win = jl.ProfileWindow(3, 5, tmp_path)
    rec = {"e": energy, "x": jl.Record(positions, every=2)}
    r = jl.run(osc, STATE, 12, record=rec, chunk=4, profile=win, progress=False)
    plain = jl.run(osc, STATE, 12, record=rec, chunk=4, progress=False)
    _traj_equal(r.trajectory, plain.trajectory)
    _leaves_equal(r.state, plain.state)
    assert win.done and "jax_trace" in r.artifacts


BIG = 1 << 17  # two float32 leaves of this many elements: the 1 MiB from which a state is donated


@pytest.mark.parametrize("n, donated", [(BIG, True), (BIG - 1, False), (N, False)])
def test_keyboard_interrupt_returns_the_newest_state_when_it_was_donated(n, donated):
    """Sets of 5 steps; the sink stops on the second (steps 6..10) while the chunk of steps 11..15
    runs. A donated state is gone once passed on, so the run returns the newest it holds; a
    state too small to be donated is kept, and the run returns the state at the last step that
    every sink took (5: the second set did not reach the failing sink)."""
    state = {"x": jnp.linspace(-1.0, 1.0, n, dtype=jnp.float32), "v": jnp.zeros(n, jnp.float32)}
    mem = MemorySink()
    with pytest.raises(KeyboardInterrupt) as info:
        jl.run(osc, state, 50, record={"e": energy}, sinks=[mem, CountingSink(fail_at=2, exc=KeyboardInterrupt())],
               chunk_budget_bytes=5 * 4, progress=False)
    run = info.value.jaxlog_run
    assert mem.status == "stopped" and mem.steps_done == 10  # it took the batch the next sink stopped on
    assert run.steps_done == (15 if donated else 5)  # with donation, the chunk dispatched ahead is not lost
    _leaves_equal(run.state, _reference(run.steps_done, state=state)[-1])
    assert not any(leaf.is_deleted() for leaf in jax.tree_util.tree_leaves(state))


# ---------------------------------------------------------------- compile counting


def test_compiles_count_the_step_function_once_per_run(tmp_path):
    """A stable kernel compiles once (cold) although the run compiles one program per chunk length
    (a shorter last chunk, length-1 window steps) and replays the post-mortem; 0 when warm."""
    from pytest_jaxlog import Timeline
    from pytest_jaxlog import load_trace

    def fresh(s):  # defined here, a program of its own (v * 1.0): nothing compiled for it yet in this process
        out = osc_t(s)
        return {**out, "v": out["v"] * 1.0}

    def go(win=None, timeline=None):
        return jl.run(fresh, STATE_T, 23, record=REC_T, invariants=[jl.finite("e")], chunk=5, profile=win,
                      timeline=timeline, progress=False)

    tl = Timeline()
    cold = go(jl.ProfileWindow(7, 8, tmp_path), tl)
    # one program for chunks of 5, the window's one-step chunks and the short last chunk
    assert [(ev.function, ev.args) for ev in cold.timings.compile_events] == [("chunk_impl", ("s32[]", f"f32[{N}]", f"f32[{N}]"))]  # t, v, x
    cold.timings.assert_compiles(1)
    assert cold.timings.compile_s > 0
    warm = go(jl.ProfileWindow(7, 8, tmp_path))  # the same chunk lengths: all compiled already
    warm.timings.assert_compiles(0)
    assert warm.timings.compile_events == ()
    # violated: the post-mortem replay runs the same program one step at a time: nothing new compiles
    with pytest.raises(jl.InvariantViolation) as info:
        jl.run(fresh, STATE_T, 23, record=REC_T, invariants=[jl.bounded("t", hi=9)], chunk=5, progress=False)
    info.value.jaxlog_run.timings.assert_compiles(0)
    # a new state signature is a new compile
    longer = {"x": jnp.zeros(N + 1, jnp.float32), "v": jnp.zeros(N + 1, jnp.float32), "t": jnp.int32(0)}
    jl.run(fresh, longer, 4, chunk=4, progress=False).timings.assert_compiles(1)
    # the run's compilations are on the timeline's "compile" track in the .pftrace
    back = load_trace(tl.write(tmp_path / "run.pftrace"))
    compiles = back.slices(track="compile")
    assert len(compiles) == len(cold.timings.compile_events) == 1
    assert {s.name for s in compiles} == {"chunk_impl"} and all(s.dur_s > 0 for s in compiles)




def test_a_first_run_traces_each_view_once_to_resolve_it():
    """Resolution learns a view's shapes and whether it calls ``jl.log`` from one trace; the
    chunk program then reads it twice (the initial frame and the loop). A view that logs is
    traced once more, collecting, and its logs are recorded."""
    calls = {"plain": 0, "logs": 0}

    def plain(s):
        calls["plain"] += 1
        return s["x"] * 2.0

    def logs(s):
        calls["logs"] += 1
        jl.log("half", s["x"][0] * 0.5)
        return s["t"]

    run = jl.run(lambda s: {**s, "x": s["x"] + 1.0, "t": s["t"] + 1}, {"x": jnp.zeros(3), "t": jnp.int32(0)}, 4,
                 record={"p": plain, "q": logs}, progress=False)
    assert calls["plain"] == 1 + 2, calls
    assert calls["logs"] == 1 + 1 + 2, calls
    np.testing.assert_array_equal(run.trajectory["log/half"], [0.0, 0.5, 1.0, 1.5, 2.0])
    np.testing.assert_array_equal(run.trajectory["p"][:, 0], [0.0, 2.0, 4.0, 6.0, 8.0])


def test_profile_window_outside_a_resumed_run_is_an_error(tmp_path):
    # work steps of this run are 3..8: a window on steps 1..2 (or 2..4) would capture nothing (or
    # part of itself) without a word; refused before any step runs or any profiler starts
    for lo, hi in ((1, 2), (2, 4)):
        win = jl.ProfileWindow(lo, hi, tmp_path)
        with pytest.raises(jl.JaxlogError, match=rf"starts at work step {lo} but the run resumes at step 3"):
            jl.run(osc, STATE, 6, start_step=3, record={"e": energy}, profile=win)
        assert not win.active and not win.done and not list(tmp_path.iterdir())


def test_postmortem_keeps_the_impl_of_typed_keys_in_the_state(tmp_path):
    def walk(s):
        k, sub = jax.random.split(s["k"])
        return {"x": s["x"] + jax.random.uniform(sub), "k": k}

    state = {"x": jnp.float32(0.0), "k": jax.random.key(7, impl="rbg")}
    mem = MemorySink()
    with pytest.raises(jl.InvariantViolation) as info:
        jl.run(walk, state, 12, chunk=4, record={"x": lambda s: s["x"]}, invariants=jl.bounded("x", hi=2.0),
               sinks=[jl.HDF5Writer(tmp_path / "t.h5"), mem], postmortem=2)
    bad = info.value.step
    for traj in (jl.load(tmp_path / "t.h5"), mem.trajectory):
        assert traj.attachment_key_impls("postmortem") == {"state/k": "rbg"}
        assert sorted(traj.postmortem) == [bad - 1, bad]
    # the saved key wraps back into the key that reproduces the violating step
    pm = jl.load(tmp_path / "t.h5").postmortem
    before = {"x": jnp.asarray(pm[bad - 1]["state/x"]),
              "k": jax.random.wrap_key_data(jnp.asarray(pm[bad - 1]["state/k"]), impl="rbg")}
    np.testing.assert_array_equal(walk(before)["x"], pm[bad]["state/x"])


def test_a_state_leaf_that_is_not_an_array_is_named():
    with pytest.raises(jl.JaxlogError, match=r"state leaf \['name'\] is str 'run1', not an array: jl.run carries"):
        jl.run(lambda s: {"x": s["x"] + 1, "name": s["name"]}, {"x": jnp.ones(2), "name": "run1"}, 3)


def test_reductions_in_views_are_bit_identical_for_any_chunk_and_window(tmp_path):
    """A loop with a compile-time trip count of 1 (chunk=1, a short last chunk, profile-window steps)
    is simplified by XLA, which changed the last bits of small reductions in views (sum of 8 floats
    differed at steps 2, 8, 9, 13, 15 with chunk=1). Every chunk runs one program with a runtime
    trip count, so records are bit-identical for any chunk size and with a window."""
    def step(x):
        return x * 1.01

    x0 = jnp.asarray(np.random.default_rng(0).normal(size=(8,)), jnp.float32)
    rec = {"s": jnp.sum, "m": jl.Record(lambda x: jnp.max(jnp.abs(x)) * jnp.mean(x), every=3)}
    ref = jl.run(step, x0, 15, record=rec, chunk=15, progress=False)
    for chunk in (1, 2, 7):
        other = jl.run(step, x0, 15, record=rec, chunk=chunk, progress=False)
        _traj_equal(other.trajectory, ref.trajectory)
        _leaves_equal(other.state, ref.state)
    win = jl.run(step, x0, 15, record=rec, chunk=15, profile=jl.ProfileWindow(4, 6, tmp_path), progress=False)
    _traj_equal(win.trajectory, ref.trajectory)
    win.timings.assert_compiles(0)  # the window's one-step chunks ran the program already compiled


@pytest.mark.parametrize("until", [None, lambda s: s["x"][0] > 10.0])
def test_dispatches_pass_no_host_values(until):
    """The step numbers, lengths, offsets and flags a dispatch passes are kept on the device:
    a warm run's chunks (here one per step) and its post-mortem replay transfer none of them."""
    def go():
        plain = jl.run(osc_t, STATE_T, 12, record=REC_T, chunk=1, until=until, progress=False)
        with pytest.raises(jl.InvariantViolation) as info:
            jl.run(osc_t, STATE_T, 12, record=REC_T, chunk=1, until=until, invariants=[jl.bounded("t", hi=6)],
                   progress=False)
        return plain, info.value.jaxlog_run

    warm, warm_violated = go()
    with jax.transfer_guard_host_to_device("disallow"):
        plain, violated = go()
    _traj_equal(plain.trajectory, warm.trajectory)
    assert violated.steps_done == warm_violated.steps_done == 7
    _leaves_equal(violated.state, warm_violated.state)


def test_kept_values_are_the_values_given_with_their_dtype():
    from pytest_jaxlog.drive.device.chunks import KEEP, Scalars

    kept = Scalars(jax.device_put)
    zero, false = kept.one(np.int32(0)), kept.one(np.bool_(False))
    assert (zero.dtype, false.dtype) == (jnp.int32, jnp.bool_)
    assert kept.one(np.int32(0)) is zero  # transferred once
    for k in range(KEEP + 10):  # past the limit, older values are dropped and made again when asked
        assert int(kept.one(np.int32(k))) == k
    again = kept((np.int32(3), np.bool_(True), np.full(3, -1, np.int32), jnp.int32(7)))
    assert [np.asarray(x).tolist() for x in again] == [3, True, [-1, -1, -1], 7]
    assert all(isinstance(x, jax.Array) for x in again)


def test_the_compiled_chunk_is_the_program_each_run_dispatched_committed_or_not():
    """``run.compiled_chunk()`` lowers the program again from the arguments' signature: read once
    per kernel when nothing the caller gave is committed, and from the arrays when it is (their
    shardings are part of what jit compiled)."""
    from pytest_jaxlog import CompileTracker

    rec = {"e": energy}
    plain = jl.run(osc, STATE, 5, record=rec, progress=False)
    placed = jl.run(osc, jax.device_put(STATE, jax.devices()[0]), 5, record=rec, progress=False)
    again = jl.run(osc, STATE, 7, record=rec, progress=False)
    with CompileTracker() as tracker:
        texts = [r.compiled_chunk().as_text() for r in (plain, placed, again)]
    assert tracker.count == 0, tracker.events  # each is a program JAX compiled for its run
    assert texts[0] == texts[2] and "while" in texts[0]

    def shardings(r):
        return [sharding for _, _, sharding, _ in r._chunk_program[2].leaves]

    assert again._chunk_program[2] is plain._chunk_program[2]  # the same signature, read once
    assert all(s is None for s in shardings(plain))
    assert any(s is not None for s in shardings(placed))
