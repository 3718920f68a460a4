"""Catching performance regressions in the LJ kernel: its compiled cost against a stored cost golden
(XLA's own figures: exact, whatever the machine's load), and its speed against a reference timed
in the same session, with a confidence interval (never against a fixed number of steps/s).

The speed check's reference is a bare scan of the same step: it catches what jl.run adds around
the kernel, not a regression of the step itself, which slows the reference alike and cancels in
the ratio (the cost golden catches the step doing more work)."""

import jax
import pytest_jaxlog as jl
from kernels.lj import make_lj

STEPS = 500


def test_lj_cost(jaxlog):
    step, state, energies = make_lj(n_side=4, dt=0.005)
    run = jaxlog.run(step, state, 100, record={"energy": energies,
                                               "positions": jl.Record(lambda s: s.positions, every=25)})
    cost = run.cost  # one step compiled alone, and each view at a step where it is recorded
    assert cost.flops > 0 and set(cost.views) == {"energy", "positions"}
    # computing the forces twice per step would double cost.flops and fail here, on any machine
    jaxlog.check_cost(run)


def test_lj_is_not_slower_than_a_bare_scan(jaxlog):
    step, state, _ = make_lj(n_side=4, dt=0.005)
    bare = jax.jit(lambda s: jax.lax.scan(lambda c, _: (step(c), None), s, None, length=STEPS)[0])
    found = jaxlog.benchmark(step, state, STEPS, reference=lambda: bare(state), repeats=7, number=3)
    found.assert_not_slower(than=1.5)  # fails only when the whole 95% interval of the ratio is above 1.5
