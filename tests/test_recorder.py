"""jl.Recorder: the Logger protocol for hand-written loops, same frames/sinks/invariants as jl.run."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog import MemorySink

N = 4


def osc(s):
    v = s["v"] - 0.05 * jnp.sin(s["x"])
    return {"x": s["x"] + 0.1 * v, "v": v}


def energy(s):
    return jnp.sum(0.5 * s["v"] ** 2 - jnp.cos(s["x"]))


def positions(s):
    return s["x"]


STATE = {"x": jnp.linspace(-1.0, 1.0, N, dtype=jnp.float32), "v": jnp.zeros(N, jnp.float32)}
STEP = jax.jit(osc)
RECORD = {"e": energy, "x": jl.Record(positions, every=3)}


def _loop(rec, steps, start=0, state=STATE, every=1):
    s = state
    for k in range(start, start + steps + 1):
        if k > start:
            s = STEP(s)
        if (k - start) % every == 0:
            rec.log(s, k)
    return s


class Sink(MemorySink):
    def __init__(self, fail_at=None, exc=None):
        super().__init__()
        self.writes, self.fail_at, self.exc = 0, fail_at, exc

    def write(self, frames):
        self.writes += 1
        if self.writes == self.fail_at:
            raise self.exc
        super().write(frames)


def test_recorder_matches_run_and_flushes_in_batches():
    sink = Sink()
    with jl.Recorder(RECORD, sinks=[sink], flush_every=4, dt=0.1) as rec:
        _loop(rec, 10)
    assert sink.writes == 3  # 11 calls: flushes after 4 and 8, and at exit
    assert sink.status == "complete" and sink.steps_done == 10
    assert sink.meta["run"]["driver"] == "recorder"
    t = rec.trajectory
    r = jl.run(osc, STATE, 10, record=RECORD, progress=False, dt=0.1)
    for p in ("e", "x"):
        np.testing.assert_array_equal(t.steps(p), r.trajectory.steps(p))
        np.testing.assert_allclose(t[p], r.trajectory[p], rtol=1e-6)
    np.testing.assert_array_equal(t.steps("x"), [0, 3, 6, 9])
    assert rec.schema.dt == 0.1 and rec.timings.steps == 10


def test_sparse_and_resumed_labels():
    with jl.Recorder(RECORD) as rec:
        _loop(rec, 20, start=100, every=5)  # labels 100, 105, ..., 120
    t = rec.trajectory
    np.testing.assert_array_equal(t.steps("e"), [100, 105, 110, 115, 120])
    np.testing.assert_array_equal(t.steps("x"), [105, 120])  # every(3) applies to the labels given


@pytest.mark.parametrize("second", [3, 2])
def test_labels_must_increase(second):
    with pytest.raises(jl.JaxlogError, match=rf"step {second} .*previous step 3"):
        with jl.Recorder(RECORD) as rec:
            rec.log(STATE, 3)
            rec.log(STATE, second)
    assert rec.trajectory.status == "failed"
    np.testing.assert_array_equal(rec.trajectory.steps("x"), [3])  # buffered frames are kept


def test_log_outside_with_is_an_error():
    rec = jl.Recorder(RECORD)
    with pytest.raises(jl.JaxlogError, match="outside"):
        rec.log(STATE, 0)
    with rec:
        rec.log(STATE, 0)
    with pytest.raises(jl.JaxlogError, match="outside"):
        rec.log(STATE, 1)
    with pytest.raises(jl.JaxlogError, match="one run"):
        rec.__enter__()


def test_bad_view_and_shape_change_name_the_record():
    with pytest.raises(jl.JaxlogError, match="'name'"):
        with jl.Recorder({"name": lambda s: "text"}) as rec:
            rec.log(STATE, 0)
    with pytest.raises(jl.JaxlogError, match=r"'x' at step 1"):
        with jl.Recorder({"x": positions}) as rec:
            rec.log(STATE, 0)
            rec.log({"x": jnp.zeros(N + 1), "v": jnp.zeros(N + 1)}, 1)


def test_keyboard_interrupt_and_sink_failure_close_the_sinks():
    sink = Sink()
    with pytest.raises(KeyboardInterrupt):
        with jl.Recorder(RECORD, sinks=[sink], flush_every=3) as rec:
            for k in range(7):
                rec.log(STATE, k)
            raise KeyboardInterrupt
    assert sink.status == "stopped" and sink.steps_done == 6
    np.testing.assert_array_equal(sink.frames().steps["e"], np.arange(7))

    mem, bad = MemorySink(), Sink(fail_at=2, exc=OSError("disk full"))
    with pytest.raises(OSError, match="disk full"):
        with jl.Recorder(RECORD, sinks=[mem, bad], flush_every=2) as rec:
            _loop(rec, 10)
    assert mem.status == "failed" and rec.status == "failed"


def _counter_state(k):
    return {"c": jnp.asarray(float(k))}


def test_violation_raise_from_log():
    sink = Sink()
    with pytest.raises(jl.InvariantViolation) as info:
        with jl.Recorder({"c": lambda s: s["c"]}, sinks=[sink], invariants=[jl.bounded("c", hi=4.5)],
                         flush_every=3) as rec:
            for k in range(20):
                rec.log(_counter_state(k), k)
    assert info.value.step == 5 and rec.violation is info.value
    assert sink.status == "violated" and sink.steps_done == 5 and sink.violation["step"] == 5
    np.testing.assert_array_equal(sink.frames().steps["c"], np.arange(6))




def test_violation_at_exit_raises():
    with pytest.raises(jl.InvariantViolation):
        with jl.Recorder({"c": lambda s: s["c"]}, invariants=[jl.bounded("c", hi=1.5)]) as rec:
            for k in range(4):
                rec.log(_counter_state(k), k)


def test_real_invariants_and_composite_logger():
    ring = jl.RingBuffer(2)
    rec = jl.Recorder(RECORD, invariants=[jl.finite("e", "x"), jl.conserved("e", rtol=0.5)], flush_every=5)
    with jl.CompositeLogger(rec, ring) as log:
        s = _loop(log, 12)
    assert rec.trajectory.status == "complete" and ring.steps == [11, 12]
    np.testing.assert_array_equal(ring.states[-1]["x"], np.asarray(s["x"]))


def test_no_log_calls_still_closes_sinks():
    sink = Sink()
    with jl.Recorder(RECORD, sinks=[sink]):
        pass
    assert sink.status == "complete" and sink.steps_done == 0


def test_recorder_to_hdf5(tmp_path):
    pytest.importorskip("pytest_jaxlog.store.hdf5.writer")
    path = tmp_path / "rec.h5"
    with jl.Recorder(RECORD, sinks=[jl.HDF5Writer(path)], flush_every=4) as rec:
        _loop(rec, 9)
    assert rec.artifacts["trajectory"] == path
    t = jl.load(path)
    assert t.status == "complete"
    np.testing.assert_array_equal(t.steps("x"), [0, 3, 6, 9])


def test_compiles_count_every_recompile_of_the_user_kernel():
    """A step whose state changes shape every call recompiles every call: the Recorder shows N
    compiles (its own programs are not counted), and they are on the timeline's compile track."""
    from pytest_jaxlog import Timeline

    @jax.jit
    def grow(s):
        return {"x": jnp.concatenate([s["x"], s["x"][:1] * 0.5])}

    tl = Timeline()
    s = {"x": jnp.ones(2, jnp.float32)}
    with jl.Recorder({"total": lambda s: jnp.sum(s["x"])}, flush_every=4, timeline=tl) as rec:
        for k in range(6):
            rec.log(s, k)
            s = grow(s)
    assert rec.timings.compiles == 6
    assert [ev.args for ev in rec.timings.compile_events] == [(f"f32[{n}]",) for n in range(2, 8)]
    with pytest.raises(AssertionError, match=r"expected 1 compilation, saw 6: grow\(f32\[2\]\)"):
        rec.timings.assert_compiles(1)
    assert [sl.name for sl in tl.slices("compile")] == ["grow"] * 6


def test_compiles_show_a_weak_type_flip():
    @jax.jit
    def decay(c):
        return c * jnp.float32(0.5)  # weak in, strong out: the second call compiles again

    c = jnp.asarray(1.0)
    assert c.weak_type
    with jl.Recorder({"c": lambda c: c}) as rec:
        for k in range(5):
            rec.log(c, k)
            c = decay(c)
    assert rec.timings.compiles == 2
    assert [ev.args for ev in rec.timings.compile_events] == [("weak_type f32[]",), ("f32[]",)]
    with jl.Recorder({"c": lambda c: c}) as again:  # all compiled: nothing new
        for k in range(3):
            again.log(c, k)
            c = decay(c)
    again.timings.assert_compiles(0)


def test_invariants_of_a_recorder_never_given_a_state_are_not_checked():
    with jl.Recorder({"e": energy}, invariants=jl.bounded("e", hi=0.0)) as rec:  # no log(): closes cleanly
        pass
    assert rec.status == "complete" and rec.trajectory.status == "complete"


def test_view_that_raises_or_returns_python_scalars():
    def picky(s):
        if s["x"].shape[0] > N:
            raise ValueError("too many atoms")
        return s["x"]

    sink = MemorySink()
    with pytest.raises(jl.JaxlogError, match=r"record 'p' at step 2: the view raised ValueError: too many atoms") as info:
        with jl.Recorder({"p": picky}, sinks=[sink]) as rec:
            rec.log(STATE, 0)
            rec.log(STATE, 1)
            rec.log({"x": jnp.zeros(N + 1), "v": jnp.zeros(N + 1)}, 2)
    assert isinstance(info.value.__cause__, ValueError)
    assert sink.status == "failed" and list(sink.frames().steps["p"]) == [0, 1]

    with jl.Recorder({"c": lambda s: {"one": 1, "half": 0.5, "e": energy(s)}}) as rec:
        _loop(rec, 3)
    t = rec.trajectory
    np.testing.assert_array_equal(t["c/one"], [1, 1, 1, 1])
    np.testing.assert_array_equal(t["c/half"], np.full(4, 0.5, np.float32))


def test_step_labels_may_be_integer_scalars_from_the_device():
    with jl.Recorder(RECORD) as rec:
        for k, label in enumerate([jnp.int32(0), np.int64(1), jnp.asarray(2, jnp.uint8), 3]):
            rec.log(STATE, label)
    np.testing.assert_array_equal(rec.trajectory.steps("e"), [0, 1, 2, 3])
    for bad in (jnp.float32(4.0), jnp.arange(2), True, jnp.int32(-1), "4"):
        with pytest.raises(jl.JaxlogError, match="step must be an int >= 0"):
            with jl.Recorder(RECORD) as rec:
                rec.log(STATE, bad)


def test_device_buffers_are_bounded_whatever_flush_every():
    """flush_every=10**6 used to allocate 10**6 frames per record on the first log (GBs for a
    positions record logged every 1000 steps); buffers now stop at buffer_bytes and flush when full."""
    batches = []
    frame = N * 4  # positions: float32[N]
    rec = jl.Recorder({"x": positions, "e": jl.Record(energy, every=4)}, flush_every=10**6,
                      buffer_bytes=3 * frame, sinks=[MemorySink(), jl.CallbackSink(lambda fr: batches.append(
                          {p: list(fr.steps[p]) for p in fr if len(fr.steps[p])}))])
    rows = []
    with rec:
        for k in range(8):
            rec.log(STATE, k)
            rows += [buf["x"].shape[0] for buf in rec._buffers.bufs if buf is not None and "x" in buf]
    assert rows and max(rows) <= 3  # positions: 3 frames fit in buffer_bytes
    assert [b.get("x") for b in batches] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert sum((b.get("e", []) for b in batches), []) == [0, 4]
    np.testing.assert_array_equal(rec.trajectory.steps("x"), np.arange(8))
    with pytest.raises(jl.JaxlogError, match="buffer_bytes"):
        jl.Recorder({"x": positions}, buffer_bytes=0)




def test_states_that_are_not_arrays_pytrees():
    """A hand-written loop's state may be any object, or a dict holding strings and settings: the
    views see it as it is (they used to be jitted with the state as argument: a raw TypeError)."""

    class Sim:  # not a registered pytree
        def __init__(self, x, n):
            self.x, self.n = x, n

    with jl.Recorder({"x": lambda s: s.x, "n": lambda s: s.n}, flush_every=2) as rec:
        for k in range(3):
            rec.log(Sim(jnp.full(2, float(k)), k), k)
    np.testing.assert_array_equal(rec.trajectory["x"], [[0, 0], [1, 1], [2, 2]])
    np.testing.assert_array_equal(rec.trajectory["n"], [0, 1, 2])
    assert rec.timings.compiles == 0  # the recorder's own buffer writes are not the user's compiles

    with jl.Recorder({"x": lambda s: s["x"]}) as rec:  # arrays at first, then a setting joins the state
        rec.log({"x": jnp.zeros(2)}, 0)
        rec.log({"x": jnp.ones(2), "name": "run1"}, 1)
    np.testing.assert_array_equal(rec.trajectory["x"], [[0, 0], [1, 1]])

    with pytest.raises(jl.JaxlogError, match=r"record 'x' at step 1: got float32\[3\]"):
        with jl.Recorder({"x": lambda s: s["x"]}) as rec:
            rec.log({"x": jnp.zeros(2), "name": "run1"}, 0)
            rec.log({"x": jnp.zeros(3), "name": "run1"}, 1)
    assert list(rec.trajectory.steps("x")) == [0]


def test_a_sink_failing_to_close_leaves_the_recorder_failed():
    bad = jl.CallbackSink(lambda fr: None, on_close=lambda *a: 1 / 0)
    with pytest.raises(jl.WriterError, match="on_close callback"):
        with jl.Recorder(RECORD, sinks=[MemorySink(), bad]) as rec:
            _loop(rec, 2)
    assert rec.status == "failed"  # was left "running"


# --- what the step logs, in a hand-written loop ------------------------------------------------


def _logging_osc(s):
    """``osc`` with two logs: a scalar, and a while loop's values (count and overflow fields)."""
    jl.log("vmax", jnp.max(jnp.abs(s["v"])))
    n = jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jl.log("sq", c[1] * c[1], capacity=4)),
                           (jnp.int32(0), s["x"][0]))
    return osc(s) | {"x": osc(s)["x"] + 0.0 * n[1]}


def _plain_logs(s):
    """What ``_logging_osc`` logs, computed without jl.log."""
    c, rows = s["x"][0], []
    for _ in range(3):
        c = c * c
        rows.append(c)
    return float(jnp.max(jnp.abs(s["v"]))), np.stack([np.asarray(r) for r in rows] + [np.float32(0)])


def test_step_logs_handed_to_the_recorder_are_written_and_read_back(tmp_path):
    """``rec.log(state, k, logs=...)`` with what jl.spool returned: each name as ``log/<name>`` at
    the step that produced it, in the file, equal to the values computed plainly and to jl.run's."""
    path = tmp_path / "logs.h5"
    spooled = jl.spool(_logging_osc)
    s = STATE
    with warnings.catch_warnings():
        warnings.simplefilter("error", jl.JaxlogRuntimeWarning)  # everything logged is collected
        with jl.Recorder(RECORD, sinks=[jl.HDF5Writer(path)], flush_every=3) as rec:
            rec.log(s, 0, logs=jax.eval_shape(spooled, s)[1])  # the first state: shapes declared
            for k in range(1, 8):
                s, logs = spooled(s)
                rec.log(s, k, logs=logs)
    t = jl.load(path)
    assert t.status == "complete"
    assert {"log/vmax", "log/sq/value", "log/sq/count", "log/sq/overflow"} <= set(t.records)
    np.testing.assert_array_equal(t.steps("log/vmax"), np.arange(1, 8))
    x, vmax, sq = STATE, [], []
    for _ in range(7):
        v, rows = _plain_logs(x)
        vmax.append(v)
        sq.append(rows)
        x = jax.jit(osc)(x)
    np.testing.assert_array_equal(t["log/vmax"], np.asarray(vmax, np.float32))
    np.testing.assert_array_equal(t["log/sq/value"][:, :3], np.stack(sq)[:, :3])
    np.testing.assert_array_equal(t["log/sq/count"], np.full(7, 3))
    np.testing.assert_array_equal(t["log/sq/overflow"], np.zeros(7, bool))
    np.testing.assert_array_equal(t["x"], jl.load(path)["x"])
    run = jl.run(_logging_osc, STATE, 7, record=RECORD, progress=False, log_capacity=4)
    for name in ("log/vmax", "log/sq/value", "log/sq/count", "e", "x"):
        np.testing.assert_array_equal(t[name], run.trajectory[name])
        np.testing.assert_array_equal(t.steps(name), run.trajectory.steps(name))


def test_logs_from_the_first_log_on_and_as_a_dict():
    spooled = jl.spool(_logging_osc)
    s = STATE
    sink = MemorySink()
    with jl.Recorder({"e": energy}, sinks=[sink]) as rec:  # a training loop: the first log follows a step
        for k in range(3):
            s, logs = spooled(s)
            rec.log(s, k, logs=logs)
    np.testing.assert_array_equal(rec.trajectory.steps("log/vmax"), [0, 1, 2])
    with pytest.raises(jl.JaxlogError, match=r"logs= given at step 1 but not at the first log \(step 0\).*"
                                             r"jax.eval_shape\(jl.spool\(step\), state\)"):
        with jl.Recorder({"e": energy}) as rec:
            rec.log(STATE, 0)
            s1, logs = spooled(STATE)
            rec.log(s1, 1, logs=logs)
    with pytest.raises(jl.JaxlogError, match="logs must be the dict jl.spool returns"):
        with jl.Recorder({"e": energy}) as rec:
            rec.log(STATE, 0, logs=spooled(STATE))


def test_logs_nothing_collects_are_reported_once(tmp_path):
    """A step jitted as it is: its jl.log values are lost. One warning says so, naming the log and
    the fix; the file holds what was recorded, and no log record."""
    def step(s):  # a new function: traced inside the `with` block
        jl.log("vmax", jnp.max(jnp.abs(s["v"])))
        return osc(s)

    def other(s):
        jl.log("other", s["x"])
        return s

    jitted, jitted_other = jax.jit(step), jax.jit(other)
    path = tmp_path / "lost.h5"
    with pytest.warns(jl.JaxlogRuntimeWarning) as caught:
        with jl.Recorder(RECORD, sinks=[jl.HDF5Writer(path)]) as rec:
            s = STATE
            for k in range(5):
                if k:
                    s = jitted_other(jitted(s))
                rec.log(s, k)
    mine = [w for w in caught if issubclass(w.category, jl.JaxlogRuntimeWarning)]
    assert len(mine) == 1
    text = str(mine[0].message)
    assert "jl.log was called 2 time(s) while nothing collected it" in text  # both traced once, before log(s, 1)
    assert "log 'other' at test_recorder.py:" in text
    assert "rec.log(state, k, logs=logs)" in text
    assert mine[0].filename == __file__
    t = jl.load(path)
    assert not any(r.startswith("log/") for r in t.records)
    np.testing.assert_array_equal(t["e"], jl.run(osc, STATE, 4, record=RECORD, progress=False).trajectory["e"])


def test_no_warning_when_logs_were_traced_before_or_are_collected():
    """Logs traced before the recorder started, in its views, or through jl.spool: no warning."""
    def step(s):
        jl.log("vmax", jnp.max(jnp.abs(s["v"])))
        return osc(s)

    jitted = jax.jit(step)
    jitted(jitted(STATE))  # traced (and its logs lost) before the recorder, for the loop's own arguments
    # too (its outputs may differ from STATE in what jit keys on): not this recorder's to report

    def ke(s):
        return jl.log("ke", 0.5 * jnp.sum(s["v"] ** 2))

    with warnings.catch_warnings():
        warnings.simplefilter("error", jl.JaxlogRuntimeWarning)
        with jl.Recorder({"ke": ke}) as rec:
            s = STATE
            for k in range(3):
                s = jitted(s)
                s2, logs = jl.spool(step)(s)
                rec.log(s2, k, logs=logs)
    assert {"ke", "log/ke", "log/vmax"} <= set(rec.trajectory.records)


def test_step_logs_of_a_batch_of_systems():
    """A vmapped step's logs have the system axis first: a batched Recorder records them as jl.run
    with batched=True does."""
    def step(s):
        jl.log("vmax", jnp.max(jnp.abs(s["v"])))
        return osc(s)

    batch = {"x": jnp.stack([STATE["x"], 2 * STATE["x"]]), "v": jnp.stack([STATE["v"], STATE["v"] + 0.1])}
    spooled = jl.spool(jax.vmap(step))
    s = batch
    with jl.Recorder({"e": jax.vmap(energy)}, batched=True) as rec:
        rec.log(s, 0, logs=jax.eval_shape(spooled, s)[1])
        for k in range(1, 5):
            s, logs = spooled(s)
            rec.log(s, k, logs=logs)
    run = jl.run(jax.vmap(step), batch, 4, record={"e": jax.vmap(energy)}, batched=True, progress=False)
    t = rec.trajectory
    assert t["log/vmax"].shape == (4, 2)
    for name in ("log/vmax", "e"):
        np.testing.assert_array_equal(t[name], run.trajectory[name])
        np.testing.assert_array_equal(t.steps(name), run.trajectory.steps(name))
    x, plain = {"x": batch["x"][1], "v": batch["v"][1]}, []  # system 1 alone, in a Python loop
    for _ in range(4):
        plain.append(np.max(np.abs(np.asarray(x["v"]))))
        x = jax.jit(osc)(x)
    np.testing.assert_array_equal(t["log/vmax"][:, 1], np.asarray(plain, np.float32))
