"""Batched harmonic oscillators: per-system energy conservation (a violation would name the system),
a profile window on five steps with its Perfetto trace, and a hand-written loop with the recorder."""

import numpy as np
import pytest

import pytest_jaxlog as jl
from kernels.oscillators import make_oscillators

SYSTEMS = 8


def test_batched_energy_conserved(jaxlog):
    step, state, energy = make_oscillators(n=512, systems=SYSTEMS, dt=0.01)
    run = jaxlog.run(step, state, 2000, record={"energy": energy}, batched=True,
                     invariants=[jl.finite("energy"), jl.conserved("energy", rtol=1e-3)])
    e = run.trajectory["energy"]
    assert e.shape == (2001, SYSTEMS)
    assert np.abs(e / e[0] - 1).max() < 1e-3


@pytest.mark.jaxlog(profile=(100, 104))
def test_profile_window(jaxlog):
    step, state, energy = make_oscillators(n=1024, dt=0.01)
    run = jaxlog.run(step, state, 300, record={"energy": energy})
    # the window's steps, one dispatch each, read back from the JAX trace
    assert run.timings.window is not None and len(run.timings.window) == 5
    trace = jl.load_trace(jaxlog.artifacts["jax_trace"])
    assert sorted(trace.steps()) == [100, 101, 102, 103, 104]
    assert all(s > 0 for s in trace.steps().values())
    # the run's own timeline (dispatches, writer) is beside the trajectory
    assert jaxlog.artifacts["timeline"].exists()
    assert run.timings.steps == 300 and run.timings.compiles >= 1


def test_hand_written_loop_matches_run(jaxlog):
    """kUPS-style loops use the Logger protocol: the recorder writes the same trajectory as jl.run."""
    import jax

    step, state, energy = make_oscillators(n=256, dt=0.01)
    jstep = jax.jit(step)
    with jaxlog.recorder({"energy": energy}, name="loop") as rec:
        s = state
        for k in range(101):
            rec.log(s, k)
            s = jstep(s)
    run = jaxlog.run(step, state, 100, record={"energy": energy}, name="scan")
    np.testing.assert_allclose(rec.trajectory["energy"], run.trajectory["energy"], rtol=1e-5)
    assert jaxlog.load("loop").steps("energy").tolist() == list(range(101))
