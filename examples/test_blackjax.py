"""blackjax's NUTS on a correlated 2-D Gaussian, eight chains at once through ``jaxlog.run``: the
draws' mean and second moments against the known ones within their Monte Carlo standard errors
(from each moment's own effective sample size), the chains' agreement (split R-hat), and the
effective sample size per gradient evaluation kept as a golden (``jaxlog.check_ess``): a change
that keeps the values right but makes the sampler mix worse per unit of work fails there. An HMC
with a step size far too small, judged against the NUTS rate, shows what such a failure looks like.
"""

import numpy as np
import pytest

import pytest_jaxlog as jl

blackjax = pytest.importorskip("blackjax", reason="blackjax is in the test extra; the suite runs without it")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

MEAN = np.array([1.0, -0.5])
COV = np.array([[1.0, 0.8], [0.8, 1.0]])
PRECISION = jnp.asarray(np.linalg.inv(COV), jnp.float32)
CHAINS, STEPS, BURN_IN = 8, 1000, 100
X0 = jnp.asarray(np.random.default_rng(0).uniform(-3.0, 3.0, (CHAINS, 2)), jnp.float32)  # dispersed: R-hat can see


def logdensity(x):
    d = x - jnp.asarray(MEAN, jnp.float32)
    return -0.5 * d @ PRECISION @ d


def sampler(kernel):
    """(step, state) for ``jaxlog.run(..., batched=True, key=..., has_aux=True)``: every chain one
    kernel step with its own key; the aux ``grads`` is the step's gradient evaluations."""

    def chain_step(key, s):
        s, info = kernel.step(key, s)
        return s, {"grads": info.num_integration_steps, "divergent": info.is_divergent}

    return jax.vmap(chain_step), jax.vmap(kernel.init)(X0)


def draws_and_grads(jaxlog, kernel, seed=0):
    step, state = sampler(kernel)
    run = jaxlog.run(step, state, STEPS, key=jax.random.key(seed), batched=True, has_aux=True,
                     record={"x": lambda s: s.position}, invariants=[jl.finite("x")])
    traj = run.trajectory
    assert not traj["aux/divergent"].any()
    # draws after burn-in, (draws, chains, 2); the gradients that made them (aux is recorded from step 1)
    return traj["x"][BURN_IN + 1:], int(traj["aux/grads"][BURN_IN:].sum())


def test_nuts_moments_mixing_and_ess_per_gradient(jaxlog):
    nuts = blackjax.nuts(logdensity, step_size=0.5, inverse_mass_matrix=jnp.ones(2))
    x, grads = draws_and_grads(jaxlog, nuts)
    assert x.shape == (STEPS - BURN_IN, CHAINS, 2)

    quality = jl.ess(x, "x", chain_axis=1)
    quality.assert_at_least(500, rhat_below=1.01)  # per coordinate, over the eight chains
    # the mean, and the second moments E[x_i x_j], each within 4 Monte Carlo standard errors of the
    # known value, the error from that quantity's own ESS (NUTS mixes the mean better than squares)
    d = x - x.reshape(-1, 2).mean(axis=0)
    moments = {"mean": (x, MEAN),
               "second": (np.stack([d[..., 0] ** 2, d[..., 1] ** 2, d[..., 0] * d[..., 1]], axis=-1),
                          np.array([COV[0, 0], COV[1, 1], COV[0, 1]]))}
    for what, (values, known) in moments.items():
        n_eff = jl.ess(values, chain_axis=1).pooled
        flat = values.reshape(-1, values.shape[-1])
        mcse = flat.std(axis=0, ddof=1) / np.sqrt(n_eff)
        assert np.all(np.abs(flat.mean(axis=0) - known) < 4 * mcse), (what, flat.mean(axis=0), known, mcse)
    np.testing.assert_allclose(np.cov(x.reshape(-1, 2).T), COV, atol=0.15)  # the same, read plainly

    # quality per unit of work: the ESS per gradient evaluation of each coordinate against the golden
    rate = quality.per(grads, unit="grad")
    assert np.all(rate.value > 0.02)  # NUTS here: an effective draw for every few dozen gradient evaluations
    jaxlog.check_ess(rate)


def test_a_step_size_far_too_small_is_below_the_nuts_rate(jaxlog):
    """HMC with a step size 50 times too small and few leapfrog steps: still correct, a random walk
    per gradient. Its rate judged against NUTS's (the comparison check_ess makes with a golden)."""
    nuts = blackjax.nuts(logdensity, step_size=0.5, inverse_mass_matrix=jnp.ones(2))
    hmc = blackjax.hmc(logdensity, step_size=0.01, inverse_mass_matrix=jnp.ones(2), num_integration_steps=5)
    (good, good_grads), (slow, slow_grads) = (draws_and_grads(jaxlog, k) for k in (nuts, hmc))
    assert slow_grads == 5 * CHAINS * (STEPS - BURN_IN)  # HMC: a fixed count per step
    golden = jl.ess(good, "x", chain_axis=1).per(good_grads)
    worse = jl.ess(slow, "x", chain_axis=1).per(slow_grads)
    for i in range(2):
        found = jl.EssRate("x", "grad", worse.value[i], worse.se[i]).judge(golden.value[i], golden.se[i])
        assert found.verdict == "below", found.describe("grad")
