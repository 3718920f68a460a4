"""An optimiser that stops when it converges: Adam on Rosenbrock with ``until=``. The run ends at
the first step whose gradient norm is below the tolerance, records nothing past it, and says so."""

import numpy as np

import pytest_jaxlog as jl
from kernels.rosenbrock import make_adam

TOL = 1e-3


def test_adam_stops_at_convergence(jaxlog):
    step, state, loss, grad_norm = make_adam()
    run = jaxlog.run(step, state, 20_000, record={"loss": loss, "grad_norm": grad_norm},
                     until=lambda s: grad_norm(s) < TOL, invariants=[jl.finite("loss", "grad_norm")])
    assert run.stop_reason == "until" and run.status == "complete"
    traj = run.trajectory
    g = traj["grad_norm"]
    # the exact first step below the tolerance, and nothing recorded after it
    assert traj.steps("grad_norm")[-1] == run.steps_done < 20_000
    assert g[-1] < TOL and np.all(g[:-1] >= TOL)
    np.testing.assert_allclose(np.asarray(run.state.params), [1.0, 1.0], atol=2e-2)
    assert traj.stop_reason == "until"
