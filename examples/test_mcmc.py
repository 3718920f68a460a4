"""Metropolis chains: several at once, each with its own key, the acceptance rate checked per chain
after burn-in with an aggregate invariant, their effective sample size and split R-hat (``jl.ess``);
a proposal too small, caught by the ESS; and a chain whose accepted samples alone are kept with
``when=`` (decided on the device: only kept rows reach the file)."""

import jax
import numpy as np
import pytest

import pytest_jaxlog as jl
from kernels.metropolis import make_chains

CHAINS, STEPS, BURN_IN = 8, 3000, 500


def test_chains_accept_at_a_healthy_rate(jaxlog):
    step, state = make_chains(CHAINS, scale=1.0)
    run = jaxlog.run(
        step, state, STEPS, key=jax.random.key(0), batched=True,
        record={"accepted": lambda c: c.accepted,
                "x": jl.Record(lambda c: c.x, every=10)},
        invariants=[jl.finite("x"),
                    jl.aggregate("accepted", "mean", lo=0.2, hi=0.8, steps=jl.window(BURN_IN, STEPS))])
    traj = run.trajectory
    acc = traj["accepted"][BURN_IN:]
    assert acc.shape == (STEPS - BURN_IN + 1, CHAINS) and 0.2 < acc.mean() < 0.8
    # independent chains: their acceptance sequences differ
    assert len({traj["accepted"][:, c].tobytes() for c in range(CHAINS)}) == CHAINS
    # the samples follow the target's correlation
    x = traj["x"][BURN_IN // 10:].reshape(-1, 2)
    assert 0.6 < np.corrcoef(x.T)[0, 1] < 0.95
    # the chains agree and are worth a few hundred independent draws per coordinate after burn-in
    jl.ess(traj["x"][BURN_IN // 10:], chain_axis=1).assert_at_least(400)


def test_a_proposal_too_small_mixes_too_slowly(jaxlog):
    """Its acceptance rate is high and its samples are right in the mean, but its chains are worth
    a few dozen draws: the effective sample size catches what a check of values would pass."""
    step, state = make_chains(CHAINS, scale=0.1)
    run = jaxlog.run(step, state, STEPS, key=jax.random.key(0), batched=True,
                     record={"x": jl.Record(lambda c: c.x, every=10)})
    quality = jl.ess(run.trajectory["x"][BURN_IN // 10:], chain_axis=1)
    with pytest.raises(jl.JaxlogError, match=r"split R-hat|effective sample size"):
        quality.assert_at_least(400)
    assert np.all(quality.pooled < 100)


def test_only_accepted_samples_are_kept(jaxlog):
    step, state = make_chains(1, scale=1.0)
    one = jax.tree_util.tree_map(lambda a: a[0], state)

    def chain_step(key, c):  # one chain: the batched step on a batch of one
        return jax.tree_util.tree_map(lambda a: a[0], step(key[None], jax.tree_util.tree_map(lambda a: a[None], c)))

    run = jaxlog.run(chain_step, one, STEPS, key=jax.random.key(2),
                     record={"accepted": lambda c: c.accepted,
                             "sample": jl.Record(lambda c: c.x, when=lambda c: c.accepted)})
    traj = run.trajectory
    kept = traj.steps("sample")
    np.testing.assert_array_equal(kept, np.flatnonzero(traj["accepted"]))  # exactly the accepting steps
    assert 0.2 * STEPS < len(kept) < 0.8 * STEPS
    assert not np.any(np.all(np.diff(traj["sample"], axis=0) == 0, axis=1))  # each kept sample is a move


def test_a_too_large_proposal_fails_the_acceptance_window(jaxlog):
    step, state = make_chains(CHAINS, scale=25.0)
    run = jaxlog.run(step, state, 1500, key=jax.random.key(1), batched=True,
                     record={"accepted": lambda c: c.accepted},
                     invariants=[jl.aggregate("accepted", "mean", lo=0.2, steps=jl.window(BURN_IN, 1500))],
                     on_violation="record")
    v = run.violation
    assert run.status == "violated" and v.step == 1500 and v.system is not None
    assert "window(500, 1500)" in str(v)
