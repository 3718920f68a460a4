"""1-D heat equation, explicit FTCS on a ring: total heat conserved and the maximum principle, for
one run and as a hypothesis property over stable diffusion numbers (one artifact dir per example)."""

import numpy as np
from hypothesis import given, settings, strategies as st

import pytest_jaxlog as jl
from kernels.heat import make_heat


def heat_invariants(u0):
    return [
        jl.finite("u"),
        jl.conserved("obs/total", rtol=1e-4),
        jl.monotonic("obs/max", increasing=False),  # the maximum principle
        jl.monotonic("obs/min", increasing=True),
        jl.bounded("u", float(u0.min()), float(u0.max())),
    ]


def test_heat_conservation_and_maximum_principle(jaxlog):
    step, state, observables = make_heat(n=128, r=0.4)
    run = jaxlog.run(step, state, 3000, record={"obs": observables, "u": jl.Record(lambda s: s.u, every=100)},
                     invariants=heat_invariants(np.asarray(state.u)))
    u = run.trajectory["u"]
    assert u.shape == (31, 128)
    # diffusion flattens the profile towards its mean
    assert np.ptp(u[-1]) < 0.25 * np.ptp(u[0])
    np.testing.assert_allclose(u[-1].mean(), u[0].mean(), rtol=1e-4)


def test_heat_golden(jaxlog):
    step, state, observables = make_heat(n=64, r=0.25)
    run = jaxlog.run(step, state, 200, record={"obs": observables, "u": jl.Record(lambda s: s.u, every=50)})
    jaxlog.check_golden(run, rtol=1e-5, atol=1e-7)


@settings(max_examples=6, deadline=None, derandomize=True)
@given(r=st.sampled_from([0.05, 0.2, 0.35, 0.5]), seed=st.integers(0, 2**16))
def test_stable_for_any_r_up_to_one_half(jaxlog_factory, r, seed):
    step, state, observables = make_heat(n=128, r=r, seed=seed)
    with jaxlog_factory() as jaxlog:
        jaxlog.run(step, state, 400, record={"obs": observables, "u": jl.Record(lambda s: s.u, every=100)},
                   invariants=heat_invariants(np.asarray(state.u)))
