"""``jl.from_arrays``: a trajectory computed elsewhere (a ``lax.scan``'s stacked output, a solver's
saved times) checked by the invariants as a run's frames and stored as a run's file, read back
equal to the arrays; and ``jaxlog.from_arrays`` in a test, with goldens."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl
from plugin_helpers import no_jaxlog_env  # noqa: F401  (no_jaxlog_env: an autouse fixture)

pytest_plugins = ["pytester"]

import h5py  # noqa: E402,F401  (imported before the pytester runs: see test_golden_plugin)
import pytest_jaxlog.drive.arrays, pytest_jaxlog.store.hdf5.writer  # noqa: E401,E402,F401

DT = 0.05


class Phase(NamedTuple):
    x: jax.Array
    v: jax.Array


def leapfrog(s: Phase, _):
    """One velocity-Verlet step of unit oscillators; outputs what a scan would stack."""
    v = s.v - 0.5 * DT * s.x
    x = s.x + DT * v
    v = v - 0.5 * DT * x
    new = Phase(x, v)
    return new, {"energy": 0.5 * jnp.sum(x * x + v * v), "phase": new}


def scanned(n: int = 40, x0=None):
    s0 = Phase(jnp.linspace(-1.0, 1.0, 5) if x0 is None else x0, jnp.zeros(5))
    _, out = jax.lax.scan(leapfrog, s0, None, length=n)
    return out


def test_a_scan_output_is_checked_stored_and_read_back_equal(tmp_path):
    out = scanned()
    run = jl.from_arrays(out, steps=np.arange(1, 41), time=np.arange(1, 41) * DT,
                         invariants=[jl.finite("phase"), jl.conserved("energy", rtol=1e-3)],
                         sinks=[jl.HDF5Writer(tmp_path / "scan.h5")])
    assert isinstance(run, jl.ArraysRun) and run.status == "complete" and run.stop_reason == "steps"
    assert run.steps_done == 40 and run.violation is None and run.artifacts["trajectory"] == tmp_path / "scan.h5"
    for traj in (run.trajectory, jl.load(tmp_path / "scan.h5")):
        assert traj.status == "complete" and traj.steps_done == 40
        np.testing.assert_array_equal(traj["energy"], np.asarray(out["energy"]))
        np.testing.assert_array_equal(traj["phase/x"], np.asarray(out["phase"].x))
        np.testing.assert_array_equal(traj.steps("energy"), np.arange(1, 41))
        np.testing.assert_allclose(traj.time("energy"), np.arange(1, 41) * DT)
        phase = traj.tree("phase", like=Phase(jnp.zeros(5), jnp.zeros(5)))
        assert isinstance(phase, Phase)
        np.testing.assert_array_equal(phase.v, np.asarray(out["phase"].v))
    # the same run through jl.run, recording the same arrays: the same file content
    ran = jl.run(lambda s: leapfrog(s, None)[0], Phase(jnp.linspace(-1.0, 1.0, 5), jnp.zeros(5)), 40, dt=DT,
                 record={"energy": jl.Record(lambda s: 0.5 * jnp.sum(s.x * s.x + s.v * s.v), every=jl.every(1, 1))},
                 progress=False)
    np.testing.assert_allclose(ran.trajectory["energy"], run.trajectory["energy"], rtol=1e-6)


def test_a_violation_is_named_at_its_step_and_the_file_ends_there(tmp_path):
    out = scanned()
    energy = np.asarray(out["energy"]).copy()
    energy[23:] *= 1.5  # the frame at step 10 * 23 breaks conservation
    with pytest.raises(jl.InvariantViolation) as info:
        jl.from_arrays({"energy": energy, "x": out["phase"].x}, steps=np.arange(0, 400, 10),
                       invariants=[jl.conserved("energy", rtol=1e-3)], sinks=[jl.HDF5Writer(tmp_path / "bad.h5")])
    v = info.value
    assert v.step == 230 and v.record == "energy" and "step 230" in str(v)
    traj = jl.load(tmp_path / "bad.h5")
    assert traj.status == "violated" and traj.violation["step"] == 230 and traj.stop_reason == "violation"
    np.testing.assert_array_equal(traj.steps("energy"), np.arange(0, 240, 10))
    np.testing.assert_array_equal(traj["energy"], energy[:24])
    assert v.jaxlog_run.steps_done == 230 and v.jaxlog_run.trajectory.steps_done == 230


def test_batched_arrays_name_the_system_and_read_back_per_system():
    x = np.asarray(jax.vmap(lambda x0: scanned(10, x0)["phase"].x)(jnp.stack([jnp.full(5, 0.5), jnp.full(5, 1.0)])))
    x = np.moveaxis(x, 0, 1).copy()  # frames first, then systems
    x[6, 1, 2] = np.nan
    with pytest.raises(jl.InvariantViolation, match=r"system 1") as info:
        jl.from_arrays({"x": x}, batched=True, invariants=[jl.finite("x")])
    assert info.value.step == 6 and info.value.system == 1
    run = jl.from_arrays({"x": x}, batched=True, invariants=[jl.finite("x")], on_violation="record")
    assert run.status == "violated" and run.violation.system == 1
    np.testing.assert_array_equal(run.trajectory.system(0)["x"], x[:, 0])


def test_times_of_a_solver_and_what_is_refused():
    ts = np.linspace(0.0, 2.0, 21).astype(np.float32)  # SaveAt(ts=jnp.linspace(0, 2, 21))
    run = jl.from_arrays({"y": np.cos(ts)}, time=ts)
    np.testing.assert_array_equal(run.trajectory.steps("y"), np.arange(21))
    np.testing.assert_array_equal(run.trajectory.time("y"), ts.astype(np.float64))  # as given
    assert run.trajectory["y"].dtype == np.float32
    assert jl.from_arrays({"y": np.cos(ts.astype(np.float64))}).trajectory["y"].dtype == np.float64  # as given
    with pytest.raises(jl.JaxlogError, match=r"time= must be evenly spaced.*frame 2.*record the times as a record"):
        jl.from_arrays({"y": np.zeros(4)}, time=[0.0, 0.1, 0.25, 0.3])
    with pytest.raises(jl.JaxlogError, match=r"steps= has 3 frames but y has 4"):
        jl.from_arrays({"y": np.zeros(4)}, steps=[0, 1, 2])
    with pytest.raises(jl.JaxlogError, match=r"frame 2 has step 1"):
        jl.from_arrays({"y": np.zeros(3)}, steps=[0, 2, 1])
    with pytest.raises(jl.JaxlogError, match=r"record 'y/a': a scalar has no frame axis"):
        jl.from_arrays({"y": {"a": np.float32(1.0)}})
    with pytest.raises(jl.JaxlogError, match=r"record 'w'.*leading system axis of size 3, got shape \(2,\)"):
        jl.from_arrays({"y": np.zeros((4, 3)), "z": np.zeros((4, 3, 2)), "w": np.zeros((4, 2))}, batched=3)


@pytest.mark.parametrize("n", [201, 1001])
def test_given_times_are_stored_as_given_not_as_step_times_dt(tmp_path, n):
    """float32 times of a solver (their spacing off in the last bits): read back as given, from
    the file, from memory and in a CSV, where step × dt had made 20.0 into 20.0000048."""
    ts = np.linspace(0.0, 20.0, n).astype(np.float32)
    sinks = [jl.HDF5Writer(tmp_path / "t.h5"), jl.CSVWriter(tmp_path / "t.csv")]
    run = jl.from_arrays({"y": np.cos(ts)}, time=ts, sinks=sinks)
    memory = jl.from_arrays({"y": np.cos(ts)}, time=ts).trajectory
    for traj in (run.trajectory, jl.load(tmp_path / "t.h5"), memory):
        np.testing.assert_array_equal(traj.steps("y"), np.arange(n))
        np.testing.assert_array_equal(traj.time("y"), ts.astype(np.float64))
        np.testing.assert_array_equal(traj.time("y", slice(-3, None)), ts[-3:].astype(np.float64))
        assert traj.time("y")[-1] == 20.0
        assert traj.dt == pytest.approx(20.0 / (n - 1), rel=1e-6)
    rows = (tmp_path / "t.csv").read_text().splitlines()
    assert rows[0] == "step,time,y"
    assert [float(r.split(",")[1]) for r in rows[1:]] == ts.astype(np.float64).tolist()


def test_the_fixture_writes_the_tests_file_and_goldens_work(pytester):
    pytester.makepyfile(test_k="""
import jax, jax.numpy as jnp, numpy as np
import pytest_jaxlog as jl

def test_scan(jaxlog):
    _, e = jax.lax.scan(lambda c, _: (c * 0.9, c), jnp.float32(1.0), None, length=12)
    run = jaxlog.from_arrays({"e": e}, invariants=[jl.monotonic("e", increasing=False)])
    assert run.artifacts["trajectory"].name == "trajectory.h5"
    np.testing.assert_array_equal(jaxlog.load()["e"], np.asarray(e))
    jaxlog.check_golden(run)

def test_bad(jaxlog):
    jaxlog.from_arrays({"e": np.array([1.0, 0.5, 0.7])}, invariants=[jl.monotonic("e", increasing=False)])
""")
    result = pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-create-goldens")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*monotonic*step 2*"])
    assert (pytester.path / "fixtures" / "golden").is_dir()
    pytester.runpytest("-p", "no:cacheprovider", "-k", "scan").assert_outcomes(passed=1)
