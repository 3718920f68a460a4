"""End to end: jl.run with a fault placed at a random step/system/chunk reports it exactly, keeps
the evidence in the HDF5 file (status, violation, post-mortem states), and LJ NVE with a timestep
that is too large trips ``conserved`` exactly where the recorded energy drift crosses the tolerance.
"""

from __future__ import annotations

import json
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pytest_jaxlog as jl

S = 4  # systems
STEPS = 24
KINDS = {"nan": 0, "drift": 1, "bound": 2}


class Faulty(NamedTuple):
    """A batched toy kernel whose fault (kind, step, systems) lives in the state: no recompiles per case."""

    x: jax.Array  # (S,) the recorded observable: 1.0 until the fault
    t: jax.Array  # (S,) int32 step counter
    bad_step: jax.Array  # (S,) int32
    bad: jax.Array  # (S,) bool: which systems break
    kind: jax.Array  # (S,) int32: 0 NaN, 1 drift (x = 1.5), 2 bound break (x = 10)


def faulty_step(s: Faulty) -> Faulty:
    t = s.t + 1
    hit = s.bad & (t >= s.bad_step)
    broken = jnp.where(s.kind == 0, jnp.nan, jnp.where(s.kind == 1, 1.5, 10.0)).astype(s.x.dtype)
    return Faulty(jnp.where(hit, broken, s.x), t, s.bad_step, s.bad, s.kind)


def faulty_state(kind: str, bad_step: int, systems) -> Faulty:
    bad = np.zeros(S, bool)
    bad[list(systems)] = True
    return Faulty(
        jnp.ones(S, jnp.float32),
        jnp.zeros(S, jnp.int32),
        jnp.full(S, bad_step, jnp.int32),
        jnp.asarray(bad),
        jnp.full(S, KINDS[kind], jnp.int32),
    )


INVARIANT = {
    "nan": lambda: jl.finite("x"),
    "drift": lambda: jl.conserved("x", rtol=1e-3),
    "bound": lambda: jl.bounded("x", lo=0.0, hi=2.0),
}


def view_x(s: Faulty):
    return s.x


def first_recorded_at_or_after(step: int, stride: int) -> int:
    return -(-step // stride) * stride


def run_capture(*args, **kwargs):
    """(run, None) or (None, violation): jl.run with on_violation="raise"."""
    try:
        return jl.run(*args, **kwargs), None
    except jl.InvariantViolation as e:
        return None, e


fault = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(sorted(KINDS)),
        "bad_step": st.integers(1, STEPS),
        "systems": st.lists(st.integers(0, S - 1), min_size=1, max_size=S, unique=True),
        "chunk": st.sampled_from([1, 5, 8]),
        "stride": st.sampled_from([1, 3]),
    }
)
HYP = settings(max_examples=20, deadline=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@HYP
@given(f=fault)
def test_raise_reports_exact_step_and_system_and_leaves_the_evidence(tmp_path_factory, f):
    path = tmp_path_factory.mktemp("v") / "traj.h5"
    exp = first_recorded_at_or_after(f["bad_step"], f["stride"])
    system = min(f["systems"])
    run, v = run_capture(
        faulty_step,
        faulty_state(f["kind"], f["bad_step"], f["systems"]),
        STEPS,
        record={"x": jl.Record(view_x, every=f["stride"])},
        invariants=[INVARIANT[f["kind"]]()],
        sinks=[jl.HDF5Writer(path)],
        batched=True,
        chunk=f["chunk"],
    )
    traj = jl.load(path)
    if exp > STEPS:  # the fault falls after the last recorded step: nothing to see
        assert v is None and run.violation is None
        assert traj.status == "complete" and traj.violation is None
        return
    assert v is not None, f"no violation raised for {f}"
    assert (v.step, v.system, v.record) == (exp, system, "x")
    assert f"violated at step {exp} (system {system})" in str(v)
    assert v.artifacts.get("trajectory") is not None and str(path) in str(v)
    # the file: status, the violation as JSON, every frame up to and including the violating step
    assert traj.status == "violated"
    json.dumps(traj.violation, allow_nan=False)
    assert traj.violation == v.to_json()  # artifact paths and the full message included
    assert traj.violation["artifacts"] == {"trajectory": str(path)} and str(path) in traj.violation["message"]
    back = jl.InvariantViolation.from_json(traj.violation)
    assert (back.invariant, back.step, back.system, back.record) == (v.invariant, exp, system, "x")
    np.testing.assert_array_equal(traj.steps("x"), np.arange(0, exp + 1, f["stride"]))
    assert not np.all(np.isfinite(traj["x"][-1])) or f["kind"] != "nan"
    # post-mortem: the full state for the last 3 steps up to the violating one
    pm = traj.postmortem
    assert sorted(pm) == list(range(max(0, exp - 2), exp + 1))
    for k in pm:
        assert int(np.asarray(pm[k]["state/t"])[0]) == k
    np.testing.assert_array_equal(np.asarray(pm[exp]["state/x"]), traj["x"][-1])


@HYP
@given(f=fault, mode=st.sampled_from(["warn", "record"]))
def test_warn_and_record_store_the_violation_and_go_on(tmp_path_factory, f, mode):
    path = tmp_path_factory.mktemp("w") / "traj.h5"
    exp = first_recorded_at_or_after(f["bad_step"], f["stride"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = jl.run(
            faulty_step,
            faulty_state(f["kind"], f["bad_step"], f["systems"]),
            STEPS,
            record={"x": jl.Record(view_x, every=f["stride"])},
            invariants=[INVARIANT[f["kind"]]()],
            sinks=[jl.HDF5Writer(path)],
            batched=True,
            chunk=f["chunk"],
            on_violation=mode,
        )
    ours = [w for w in caught if issubclass(w.category, jl.JaxlogRuntimeWarning)]
    traj = jl.load(path)
    if exp > STEPS:
        assert run.steps_done == STEPS
        assert run.violation is None and not ours and traj.violation is None
        return
    v = run.violation
    assert isinstance(v, jl.InvariantViolation)
    assert (v.step, v.system) == (exp, min(f["systems"]))
    # warn/record do not stop: every step runs and every frame is written; the first violation is kept
    assert run.steps_done == STEPS and run.status == "violated"
    assert int(np.asarray(run.state.t)[0]) == STEPS
    np.testing.assert_array_equal(traj.steps("x"), np.arange(0, STEPS + 1, f["stride"]))
    if mode == "warn":  # once for the invariant, at its first violation (not once per batch)
        assert len(ours) == 1 and f"violated at step {exp}" in str(ours[0].message)
        assert ours[0].message.violation is v
    else:
        assert not ours
    assert traj.status == "violated" and traj.steps_done == STEPS
    assert traj.violation["step"] == exp and traj.violation["system"] == min(f["systems"])
    assert traj.violation["artifacts"] == {"trajectory": str(path)} and str(path) in traj.violation["message"]
    # the post-mortem of the first violation is saved as in raise mode
    pm = traj.postmortem
    assert sorted(pm) == list(range(max(0, exp - 2), exp + 1))
    for k in pm:
        assert int(np.asarray(pm[k]["state/t"])[0]) == k


def test_unrecorded_record_fails_before_the_run(tmp_path):
    calls = []

    def step(s):
        calls.append(1)
        return faulty_step(s)

    with pytest.raises(jl.JaxlogError, match=r"record 'energy' is not recorded; recorded: x"):
        jl.run(step, faulty_state("nan", 3, [0]), 5, record={"x": view_x}, invariants=[jl.conserved("energy")],
               batched=True)
    with pytest.raises(jl.JaxlogError, match=r"cannot apply to record 'z'"):
        jl.run(faulty_step, faulty_state("nan", 3, [0]), 5, record={"z": lambda s: s.x.astype(jnp.complex64)},
               invariants=[jl.bounded("z", hi=1)], batched=True)


def test_finite_of_all_records_unbatched_reports_the_element(tmp_path):
    def step(s):
        pos, n = s
        pos = pos + 0.1
        pos = jnp.where((n + 1 == 7) & (jnp.arange(pos.size).reshape(pos.shape) == 4), jnp.inf, pos)
        return pos, n + 1

    state = (jnp.zeros((3, 2), jnp.float32), jnp.int32(0))
    run, v = run_capture(step, state, 12, record={"pos": lambda s: s[0], "n": lambda s: s[1]},
                         invariants=[jl.finite()], chunk=4)
    assert v is not None and (v.step, v.system, v.record, v.index) == (7, None, "pos", (2, 0))
    assert "violated at step 7 in pos[2, 0]: value inf, expected finite" in str(v)


def test_postmortem_has_full_depth_right_after_a_chunk_start(tmp_path):
    """The last 3 states up to the violating step, even when it is 0-2 steps past a chunk start."""
    depth = {}
    for bad in range(2, 13):
        path = tmp_path / f"pm{bad}.h5"
        run, v = run_capture(faulty_step, faulty_state("nan", bad, [2]), 12, record={"x": view_x},
                             invariants=[jl.finite()], sinks=[jl.HDF5Writer(path)], batched=True, chunk=5)
        assert (v.step, v.system) == (bad, 2)
        depth[bad] = sorted(jl.load(path).postmortem)
    assert depth == {bad: [bad - 2, bad - 1, bad] for bad in range(2, 13)}


# --------------------------------------------------------------------------- LJ NVE, timestep too large


def _first_crossing(total: np.ndarray, rtol: float) -> int | None:
    e = np.asarray(total, np.float64)
    bad = ~(np.abs(e - e[0]) <= rtol * abs(e[0]))
    return int(np.argmax(bad)) if bad.any() else None


@pytest.fixture(scope="module")
def lj_equilibrated():
    """A melted LJ-64 state (dt=0.005): a too-large timestep then drifts instead of jumping at once."""
    from kernels.lj import make_lj

    small, state, energies = make_lj(dt=0.005)
    return jl.run(small, state, 500, chunk=250).state, energies


@pytest.mark.parametrize("dt, rtol", [(0.025, 1e-2), (0.03, 3e-2)])
def test_lj_large_timestep_trips_conserved_where_the_recorded_drift_crosses(tmp_path, lj_equilibrated, dt, rtol):
    from kernels.lj import make_lj

    state, energies = lj_equilibrated
    step, _, _ = make_lj(dt=dt)
    # independent reference: a run that only records the energies
    ref = jl.run(step, state, 300, record={"energy": energies}, chunk=64)
    total = np.asarray(ref.trajectory["energy/total"])
    np.testing.assert_array_equal(ref.trajectory.steps("energy/total"), np.arange(301))
    expected = _first_crossing(total, rtol)
    assert expected is not None and expected > 5, f"dt={dt} should drift past rtol={rtol} within 300 steps"
    path = tmp_path / "lj.h5"
    run, v = run_capture(step, state, 300, record={"energy": energies}, chunk=50,
                         invariants=[jl.finite(), jl.conserved("energy/total", rtol=rtol)],
                         sinks=[jl.HDF5Writer(path)])
    assert v is not None and v.step == expected and v.system is None
    assert v.invariant == f"conserved(energy/total, rtol={rtol!r})"
    assert v.expected == pytest.approx(float(total[0])) and v.value == pytest.approx(float(total[expected]))
    assert v.tolerance == pytest.approx(rtol * abs(float(total[0])))
    assert "relative drift" in str(v)
    # checked against the recorded energies in the file itself (frames up to the violating step)
    traj = jl.load(path)
    assert traj.status == "violated" and traj.violation["step"] == expected
    rec = np.asarray(traj["energy/total"], np.float64)
    assert traj.steps("energy/total")[-1] == expected
    assert np.all(np.abs(rec[:-1] - rec[0]) <= rtol * abs(rec[0]))
    assert not np.abs(rec[-1] - rec[0]) <= rtol * abs(rec[0])
    pm = traj.postmortem
    assert max(pm) == expected
    assert set(pm[expected]) >= {"state/positions", "state/velocities", "state/forces"}
    replayed = type(state)(*(jnp.asarray(pm[expected][f"state/{k}"]) for k in state._fields))
    np.testing.assert_allclose(float(energies(replayed)["total"]), total[expected], rtol=1e-5)


# --------------------------------------------------------------------------- jl.Recorder (hand-written loop)

faulty_step_jit = jax.jit(faulty_step)


@HYP
@given(f=fault, flush_every=st.sampled_from([1, 4, 7]))
def test_recorder_reports_exact_step_and_system(tmp_path_factory, f, flush_every):
    path = tmp_path_factory.mktemp("r") / "traj.h5"
    exp = first_recorded_at_or_after(f["bad_step"], f["stride"])
    state = faulty_state(f["kind"], f["bad_step"], f["systems"])
    rec = jl.Recorder({"x": jl.Record(view_x, every=f["stride"])}, sinks=[jl.HDF5Writer(path)],
                      invariants=[INVARIANT[f["kind"]]()], batched=True, flush_every=flush_every)
    caught = None
    try:
        with rec:
            for k in range(STEPS + 1):
                rec.log(state, k)
                state = faulty_step_jit(state)
    except jl.InvariantViolation as e:
        caught = e
    traj = jl.load(path)
    if exp > STEPS:
        assert caught is None and traj.status == "complete"
        return
    assert caught is not None and (caught.step, caught.system) == (exp, min(f["systems"]))
    assert rec.violation is caught
    assert traj.status == "violated" and traj.violation["step"] == exp
    assert traj.violation["artifacts"] == {"trajectory": str(path)} and str(path) in traj.violation["message"]
    np.testing.assert_array_equal(traj.steps("x"), np.arange(0, exp + 1, f["stride"]))
