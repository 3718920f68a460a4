"""Lennard-Jones fluid, NVE with velocity Verlet: energy conservation, a golden trajectory, no
recompilation, and the classic bug — a timestep too large — caught by the conservation invariant."""

import numpy as np
import pytest

import pytest_jaxlog as jl
from kernels.lj import box_length, make_lj

RECORD_EVERY = 25


def lj_records(energies):
    return {
        "energy": energies,  # every step: energy/total, energy/kinetic, energy/potential
        "positions": jl.Record(lambda s: s.positions, every=RECORD_EVERY),
    }


def test_nve_conserves_energy(jaxlog):
    step, state, energies = make_lj(n_side=4, dt=0.005)
    run = jaxlog.run(step, state, 1000, record=lj_records(energies), dt=0.005,
                     invariants=[jl.finite("energy"), jl.conserved("energy/total", rtol=2e-3)])

    traj = run.trajectory
    assert traj.status == "complete" and run.steps_done == 1000
    assert traj.steps("energy/total").tolist() == list(range(1001))
    np.testing.assert_allclose(traj.time("energy/total")[-1], 5.0, rtol=1e-6)
    e = traj["energy"]  # a prefix reads every sub-record
    np.testing.assert_allclose(e["kinetic"] + e["potential"], e["total"], rtol=1e-5, atol=1e-4)
    # a liquid: potential energy negative throughout, kinetic energy exchanged with it
    assert (e["potential"] < 0).all() and e["kinetic"].std() > 0
    # positions every 25 steps, wrapped into the periodic box
    pos = traj["positions"]
    assert traj.steps("positions").tolist() == list(range(0, 1001, RECORD_EVERY))
    assert pos.shape == (41, 64, 3) and pos.min() >= 0 and pos.max() <= box_length(64)
    # the last frame is the returned state
    np.testing.assert_array_equal(pos[-1], np.asarray(run.state.positions))


def test_lj_golden(jaxlog):
    """Checked against fixtures/golden/ (regenerate with --jaxlog-regen after an intended change).
    Short, because a chaotic system amplifies rounding differences between machines."""
    step, state, energies = make_lj(n_side=4, dt=0.005)
    run = jaxlog.run(step, state, 100, record={"energy": energies,
                                               "positions": jl.Record(lambda s: s.positions, every=20)})
    jaxlog.check_golden(run, rtol=1e-4, atol=1e-5)


def test_no_recompilation(jaxlog):
    """A second run of the same kernel with the same shapes must reuse the compiled chunk."""
    step, state, energies = make_lj(n_side=3, dt=0.005)
    first = jaxlog.run(step, state, 200, record={"energy": energies}, chunk=50)
    assert first.timings.compiles >= 1
    second = jaxlog.run(step, first.state, 200, record={"energy": energies}, chunk=50)
    second.timings.assert_compiles(0)


@pytest.mark.xfail(raises=jl.InvariantViolation, strict=True,
                   reason="dt=0.03 is too large for velocity Verlet in this LJ liquid: energy blows up")
def test_broken_timestep_is_caught(jaxlog):
    """The artifacts of this expected failure are kept: open .jaxlog/examples.test_lj.test_broken_timestep_is_caught/
    to see the trajectory up to the violating step and the post-mortem states."""
    step, state, energies = make_lj(n_side=4, dt=0.03)
    jaxlog.run(step, state, 500, record=lj_records(energies),
               invariants=[jl.finite("energy"), jl.conserved("energy/total", rtol=2e-3)])
