"""Both drivers, one behaviour: ``jl.run`` and a ``jl.Recorder`` loop feed the same frames →
invariants → sinks → timeline path, so every case here runs through both."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl

N = 4


def osc(s):
    v = s["v"] - 0.05 * jnp.sin(s["x"])
    return {"x": s["x"] + 0.1 * v, "v": v, "t": s["t"] + 1}


STATE = {"x": jnp.linspace(-1.0, 1.0, N, dtype=jnp.float32), "v": jnp.zeros(N, jnp.float32), "t": jnp.int32(0)}
BATCHED = {"x": jnp.stack([STATE["x"], 2 * STATE["x"], -STATE["x"]]), "v": jnp.zeros((3, N), jnp.float32),
           "t": jnp.zeros(3, jnp.int32)}
_step = jax.jit(osc)
_bstep = jax.jit(jax.vmap(osc))

RECORD = {"e": lambda s: jnp.sum(0.5 * s["v"] ** 2 - jnp.cos(s["x"]), axis=-1),
          "t": lambda s: s["t"],
          "moving": lambda s: jnp.any(s["v"] != 0, axis=-1),  # a bool record
          "x": jl.Record(lambda s: s["x"], every=3)}


@dataclass
class Result:
    trajectory: Any
    status: str
    violation: Any
    steps_done: int


def _by_run(step, state, steps, batched=False, **kw) -> Result:
    r = jl.run(step, state, steps, chunk=4, progress=False, batched=batched, **kw)
    return Result(r.trajectory, r.status, r.violation, r.steps_done)


def _by_recorder(step, state, steps, batched=False, **kw) -> Result:
    one = _bstep if batched else _step
    rec = jl.Recorder(kw.pop("record"), flush_every=4, batched=batched, **kw)
    with rec:
        s = state
        for k in range(steps + 1):
            if k:
                s = one(s)
            rec.log(s, k)
    return Result(rec.trajectory, rec.status, rec.violation, rec.steps_done)


@pytest.fixture(params=["run", "recorder"])
def drive(request):
    """``drive(step, state, steps, **kw)``: the same run through ``jl.run`` or a Recorder loop."""
    return _by_run if request.param == "run" else _by_recorder


def _reference(steps: int) -> list:
    s, out = STATE, [STATE]
    for _ in range(steps):
        s = _step(s)
        out.append(s)
    return out


def test_both_drivers_record_the_same_values(drive):
    traj = drive(osc, STATE, 10, record=RECORD).trajectory
    ref = _reference(10)
    assert set(traj.records) == {"e", "t", "moving", "x"}
    np.testing.assert_array_equal(traj.steps("x"), [0, 3, 6, 9])
    np.testing.assert_array_equal(traj["x"], np.stack([np.asarray(ref[k]["x"]) for k in (0, 3, 6, 9)]))
    np.testing.assert_array_equal(traj["t"], np.arange(11))
    np.testing.assert_array_equal(traj["moving"], [False] + [True] * 10)


def test_a_single_invariant_needs_no_list(drive):
    res = drive(osc, STATE, 6, record=RECORD, invariants=jl.finite("e"))
    assert res.status == "complete" and res.steps_done == 6
    with pytest.raises(jl.InvariantViolation, match=r"bounded\(t, hi=2\) violated at step 3"):
        drive(osc, STATE, 6, record=RECORD, invariants=jl.bounded("t", hi=2))
    with pytest.raises(jl.JaxlogError, match="invariants= takes"):
        drive(osc, STATE, 6, record=RECORD, invariants=3)


@pytest.mark.parametrize("mode", ["warn", "record"])
def test_warn_or_record_goes_on_and_warns_once_per_invariant_at_the_callers_line(drive, mode):
    invs = [jl.bounded("t", hi=12), jl.bounded("t", hi=6), jl.finite("e")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = drive(osc, STATE, 20, record=RECORD, invariants=invs, on_violation=mode)
    assert res.status == "violated" and res.steps_done == 20 and res.trajectory.status == "violated"
    assert (res.violation.invariant, res.violation.step) == ("bounded(t, hi=6)", 7)
    np.testing.assert_array_equal(res.trajectory["t"], np.arange(21))
    warned = [w for w in caught if issubclass(w.category, jl.JaxlogRuntimeWarning)]
    if mode == "warn":
        assert [(w.message.violation.invariant, w.message.violation.step) for w in warned] == [
            ("bounded(t, hi=6)", 7), ("bounded(t, hi=12)", 13)]
        assert all(w.filename == __file__ for w in warned), [w.filename for w in warned]
    else:
        assert not warned


def test_timeline_counters_cover_scalar_and_bool_records_and_stop_at_the_violation(drive, tmp_path, monkeypatch):
    """A counter per scalar record (bool ones too), with exactly the frames the file holds: after
    a violation nothing past the violating step reaches the .pftrace; a marker names the step."""
    from pytest_jaxlog.drive.device import chunks

    monkeypatch.setattr(chunks, "FEED_INTERVAL_S", 0.0)  # jl.run pulls every chunk, as when each takes long
    tl = jl.Timeline()
    with pytest.raises(jl.InvariantViolation) as info:
        drive(osc, STATE, 20, record=RECORD, invariants=[jl.bounded("t", hi=9)], timeline=tl)
    assert info.value.step == 10
    back = jl.load_trace(tl.write(tmp_path / "t.pftrace"))
    assert set(back.counters) == {"e", "t", "moving"}  # x is not a scalar
    ts, t_values = back.counters["t"]
    np.testing.assert_array_equal(t_values, np.arange(11))
    assert np.all(np.diff(ts) > 0)
    np.testing.assert_array_equal(back.counters["moving"][1], [0.0] + [1.0] * 10)
    assert [(m.name, m.args["step"]) for m in back.instants()] == [("bounded(t, hi=9)", 10)]
    assert len(tl.slices("host")) >= 2


def test_batched_runs_get_a_counter_per_system(drive, tmp_path):
    tl = jl.Timeline()
    res = drive(osc, BATCHED, 8, batched=True, record={"e": RECORD["e"]}, timeline=tl)
    back = jl.load_trace(tl.write(tmp_path / "b.pftrace"))
    assert set(back.counters) == {f"e[system {s}]" for s in range(3)}
    for s in range(3):
        np.testing.assert_array_equal(back.counters[f"e[system {s}]"][1], np.asarray(res.trajectory["e"][:, s], np.float64))


def test_an_aggregate_window_the_run_ends_before_is_judged_at_the_end(drive):
    inv = jl.aggregate("t", "mean", hi=3.0, steps=jl.window(2, 500))
    with pytest.raises(jl.InvariantViolation) as info:
        drive(osc, STATE, 9, record=RECORD, invariants=[inv])
    assert info.value.step == 9 and "cut short" in str(info.value)
    res = drive(osc, STATE, 9, record=RECORD, invariants=[inv], on_violation="record")
    assert res.status == "violated" and res.trajectory.status == "violated" and res.violation.step == 9
