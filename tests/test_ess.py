"""Effective sample size, split R-hat and the order of convergence: against processes whose answer
is known (AR(1) chains, an explicit Runge-Kutta stepper), against the same estimator written out
plainly, and through real runs."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl


def ar1(rho, n, chains, seed=0, mean=0.0):
    rng = np.random.default_rng(seed)
    x = np.empty((n, chains))
    x[0] = rng.normal(size=chains) / math.sqrt(1 - rho**2)
    noise = rng.normal(size=(n, chains))
    for t in range(1, n):
        x[t] = rho * x[t - 1] + noise[t]
    return x + mean


def plain_ess(draws):
    """Stan's multi-chain ESS written out with loops: direct sums for the autocovariances."""
    n, m = draws.shape
    means = [sum(draws[:, j]) / n for j in range(m)]
    acov = [[sum((draws[t, j] - means[j]) * (draws[t + lag, j] - means[j]) for t in range(n - lag)) / n
             for lag in range(n)] for j in range(m)]
    w = sum(acov[j][0] * n / (n - 1) for j in range(m)) / m
    var_plus = w * (n - 1) / n
    if m > 1:
        grand = sum(means) / m
        var_plus += sum((mu - grand) ** 2 for mu in means) / (m - 1)
    rho = [1.0] + [1 - (w - sum(acov[j][lag] for j in range(m)) / m) / var_plus for lag in range(1, n)]
    total, last = 0.0, math.inf
    for k in range(n // 2):
        p = rho[2 * k] + rho[2 * k + 1]
        if p <= 0:
            break
        last = min(last, p)
        total += last
    tau = max(-1 + 2 * total, 1 / math.log10(max(n, 10)))
    return n * m / tau


def test_the_estimator_is_stans_written_out_plainly():
    draws = ar1(0.7, 120, 3, seed=4)
    got = jl.ess(draws, chain_axis=1)
    assert float(got.pooled) == pytest.approx(plain_ess(draws), rel=1e-9)
    for j in range(3):
        assert float(got.per_chain[j]) == pytest.approx(plain_ess(draws[:, j:j + 1]), rel=1e-9)


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_an_ar1_chain_is_worth_what_theory_says(rho):
    """ESS of an AR(1) chain of n draws: n (1 - rho) / (1 + rho)."""
    n, m = 20_000, 4
    got = jl.ess(ar1(rho, n, m, seed=1), chain_axis=1)
    expected = n * m * (1 - rho) / (1 + rho)
    assert float(got.pooled) == pytest.approx(expected, rel=0.15)
    assert np.all(np.abs(got.per_chain / (expected / m) - 1) < 0.25)
    assert float(got.rhat) < 1.01
    # the stated standard error covers the estimate's distance from the truth (3 sigma)
    assert abs(float(got.pooled) - expected) < 3 * float(got.pooled_se) + 0.02 * expected


def test_chains_that_disagree_have_a_high_rhat_and_fail_the_gate():
    draws = np.concatenate([ar1(0.5, 2000, 2, seed=2), ar1(0.5, 2000, 2, seed=3, mean=3.0)], axis=1)
    got = jl.ess(draws, chain_axis=1)
    assert float(got.rhat) > 1.5
    with pytest.raises(jl.JaxlogError, match=r"split R-hat .* >= 1.01: the 4 chain\(s\) do not agree"):
        got.assert_at_least(10)
    # a chain that drifts disagrees with itself (split R-hat)
    drift = np.linspace(0, 5, 4000) + np.random.default_rng(0).normal(size=4000)
    assert float(jl.ess(drift).rhat) > 1.1


def test_per_element_figures_name_the_element():
    draws = np.stack([ar1(0.2, 4000, 2, seed=5), ar1(0.99, 4000, 2, seed=6)], axis=-1)  # (n, chains, 2)
    got = jl.ess(draws, chain_axis=1)
    assert got.pooled.shape == (2,) and got.pooled[0] > 10 * got.pooled[1]
    with pytest.raises(jl.JaxlogError, match=r"element \[1\]: effective sample size"):
        got.assert_at_least(500, rhat_below=2.0)


def test_the_rate_gate_catches_a_sampler_that_mixes_worse_and_passes_another_seed():
    golden = jl.ess(ar1(0.8, 10_000, 4, seed=7), chain_axis=1).per(2.0)
    same = jl.ess(ar1(0.8, 10_000, 4, seed=8), chain_axis=1).per(2.0)
    same.assert_not_below(float(golden.value), float(golden.se))
    worse = jl.ess(ar1(0.9, 10_000, 4, seed=9), chain_axis=1).per(2.0)  # half the ESS, same cost
    with pytest.raises(jl.JaxlogError, match="below the golden"):
        worse.assert_not_below(float(golden.value), float(golden.se))
    with pytest.raises(jl.JaxlogError, match="cannot tell"):
        same.assert_not_below(float("nan"))


def test_bad_draws_are_one_error_each():
    with pytest.raises(jl.JaxlogError, match="needs at least 8"):
        jl.ess(np.zeros(5))
    bad = ar1(0.5, 100, 2)
    bad[40, 1] = np.nan
    with pytest.raises(jl.JaxlogError, match="draw 40 of chain 1 is not finite"):
        jl.ess(bad, chain_axis=1)
    with pytest.raises(jl.JaxlogError, match="chain_axis=3"):
        jl.ess(bad, chain_axis=3)


def metropolis(key_and_x):
    """Random-walk Metropolis on a standard normal, one chain per system."""
    key, x = key_and_x["key"], key_and_x["x"]
    key, k1, k2 = jax.random.split(key, 3)
    y = x + 0.8 * jax.random.normal(k1)
    accept = jnp.log(jax.random.uniform(k2)) < 0.5 * (x**2 - y**2)
    return {"key": key, "x": jnp.where(accept, y, x)}


def test_a_batched_runs_systems_are_its_chains(tmp_path):
    chains = 4
    state = {"key": jax.random.split(jax.random.key(0), chains), "x": jnp.linspace(-1.0, 1.0, chains)}
    run = jl.run(jax.vmap(metropolis), state, 3000, record={"x": lambda s: s["x"]}, batched=True,
                 sinks=[jl.HDF5Writer(tmp_path / "mcmc.h5")], progress=False)
    traj = jl.load(tmp_path / "mcmc.h5")
    got = jl.ess(traj, "x")
    assert got.chains == chains and got.draws == 3001
    plain = jl.ess(np.asarray(traj.values("x")), chain_axis=1)
    np.testing.assert_array_equal(got.per_chain, plain.per_chain)
    assert float(got.pooled) == float(plain.pooled)
    assert 100 < float(got.pooled) < chains * 3001 and float(got.rhat) < 1.05
    rate = got.per(run.timings.run_s)
    assert float(rate.value) == pytest.approx(float(got.pooled) / run.timings.run_s)
    with pytest.raises(jl.JaxlogError, match="name the record"):
        jl.ess(traj)


def test_systems_stopped_early_are_refused(tmp_path):
    state = {"key": jax.random.split(jax.random.key(1), 3), "x": jnp.array([0.0, 0.0, 50.0])}
    jl.run(jax.vmap(metropolis), state, 200, record={"x": lambda s: s["x"]}, batched=True,
           until=lambda s: s["x"] > 40.0, sinks=[jl.HDF5Writer(tmp_path / "m.h5")], progress=False)
    with pytest.raises(jl.JaxlogError, match=r"systems \[2\] stopped before the run's end"):
        jl.ess(jl.load(tmp_path / "m.h5"), "x")


# -- order of convergence ----------------------------------------------------------------------------
def rk_step(tableau):
    a, b, c = tableau

    def step(s):
        y, h = s["y"], s["h"]
        ks = []
        for i in range(len(b)):
            yi = y + h * sum((a[i][j] * ks[j] for j in range(i)), jnp.zeros_like(y))
            ks.append(-yi)  # y' = -y
        return {"y": y + h * sum(bi * k for bi, k in zip(b, ks)), "h": h}
    return step


RK4 = ([[], [0.5], [0.0, 0.5], [0.0, 0.0, 1.0]], [1 / 6, 1 / 3, 1 / 3, 1 / 6], [0, 0.5, 0.5, 1])
EULER = ([[]], [1.0], [0])
BROKEN_RK4 = ([[], [0.5], [0.0, 0.5], [0.0, 0.0, 1.0]], [1 / 6, 1 / 3, 1 / 6, 1 / 3], [0, 0.5, 0.5, 1])


def errors_at_t1(tableau, ns):
    jax.config.update("jax_enable_x64", True)
    try:
        out = []
        for n in ns:
            run = jl.run(rk_step(tableau), {"y": jnp.float64(1.0), "h": jnp.float64(1.0 / n)}, n, progress=False)
            out.append(abs(float(run.state["y"]) - math.exp(-1.0)))
        return out
    finally:
        jax.config.update("jax_enable_x64", False)


@pytest.mark.parametrize("tableau,order", [(RK4, 4), (EULER, 1)])
def test_a_stepper_converges_at_its_order(tableau, order):
    ns = [8, 16, 32, 64]
    errs = errors_at_t1(tableau, ns)
    got = jl.convergence_order([1 / n for n in ns], errs)
    assert got.order == pytest.approx(np.polyfit(np.log([1 / n for n in ns]), np.log(errs), 1)[0], rel=1e-12)
    assert got.lo <= got.order <= got.hi
    got.assert_order(order)


def test_a_stepper_that_lost_its_order_is_named_lower():
    ns = [8, 16, 32, 64]
    got = jl.convergence_order([1 / n for n in ns], errors_at_t1(BROKEN_RK4, ns))
    with pytest.raises(jl.JaxlogError, match=r"order of convergence 1\.\d+, 95% interval .*: lower than 4 ± 0.25"):
        got.assert_order(4)


def test_scattered_points_cannot_tell():
    h = [0.1, 0.05, 0.025, 0.0125]
    errs = [1e-2, 1e-4, 2e-3, 6e-7]  # about second order, badly scattered
    with pytest.raises(jl.JaxlogError, match="cannot tell whether it is 2"):
        jl.convergence_order(h, errs).assert_order(2)
    with pytest.raises(jl.JaxlogError, match="at least three"):
        jl.convergence_order(h[:2], errs[:2])
    with pytest.raises(jl.JaxlogError, match="error 1 is 0.0"):
        jl.convergence_order(h[:3], [1e-2, 0.0, 1e-4])
