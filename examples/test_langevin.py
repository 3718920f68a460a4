"""Langevin NVT (BAOAB): the thermostat reaches the target temperature, the trap gives <x²> = T/k,
and a keyed run does not depend on the chunk size (so runs can be split and resumed)."""

import jax
import numpy as np
import pytest

import pytest_jaxlog as jl
from kernels.langevin import make_langevin

T, K = 1.0, 1.0


@pytest.fixture(scope="module")
def kernel():
    return make_langevin(n=256, temperature=T, k=K, gamma=1.0, dt=0.05)


def test_thermostat_reaches_temperature(jaxlog, kernel):
    step, state, observables = kernel
    run = jaxlog.run(step, state, 2000, key=jax.random.key(42), record={"obs": observables}, dt=0.05,
                     invariants=[jl.finite("obs"), jl.bounded("obs/temperature", 0.0, 2.0)])
    temp = run.trajectory["obs/temperature"]
    msd = run.trajectory["obs/msd"]
    assert temp[0] == 0.0  # starts at rest
    # equilibrium after ~5/gamma; 768 degrees of freedom x 1000 frames: averages well within 3%
    np.testing.assert_allclose(temp[1000:].mean(), T, rtol=0.03)
    np.testing.assert_allclose(msd[1000:].mean(), T / K, rtol=0.05)


def test_keyed_run_independent_of_chunk(jaxlog, kernel):
    step, state, observables = kernel
    key = jax.random.key(7)
    a = jaxlog.run(step, state, 300, key=key, record={"obs": observables}, chunk=300, name="one-chunk")
    b = jaxlog.run(step, state, 300, key=key, record={"obs": observables}, chunk=37, name="many-chunks")
    jl.assert_trajectory_close(a, b, rtol=0, atol=0)
    np.testing.assert_array_equal(np.asarray(a.state.positions), np.asarray(b.state.positions))
