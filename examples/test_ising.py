"""2-D Ising, checkerboard Metropolis: ordered below T_c, disordered above, observables in their
physical bounds, and an exact golden trajectory (integer spins)."""

import jax
import numpy as np
import pytest

import pytest_jaxlog as jl
from kernels.ising import CRITICAL_BETA, make_ising

BOUNDS = [jl.bounded("obs/magnetization", -1.0, 1.0), jl.bounded("obs/energy", -2.0, 2.0)]


@pytest.mark.parametrize("beta, ordered", [(0.6, True), (0.25, False)], ids=["cold", "hot"])
def test_phase(jaxlog, beta, ordered):
    assert (beta > CRITICAL_BETA) == ordered
    step, state, observables = make_ising(size=32, beta=beta, start="up")
    run = jaxlog.run(step, state, 400, key=jax.random.key(0), record={"obs": observables}, invariants=BOUNDS)
    m = np.abs(run.trajectory["obs/magnetization"][200:]).mean()
    e = run.trajectory["obs/energy"][200:].mean()
    if ordered:
        assert m > 0.9 and e < -1.7  # exact (Onsager/Yang) at beta=0.6: |m| = 0.975, e = -1.90
    else:
        assert m < 0.2 and e > -0.8  # high-temperature series at beta=0.25: e = -0.52


def test_ising_golden(jaxlog):
    step, state, observables = make_ising(size=16, beta=0.5, start="random", seed=3)
    run = jaxlog.run(step, state, 50, key=jax.random.key(1),
                     record={"obs": observables, "spins": jl.Record(lambda s: s.spins, every=10)})
    jaxlog.check_golden(run, rtol=0, atol=0)
