"""The statistical golden: runs of a stochastic kernel compared by the means and variances of their
observables within ESS-based standard errors; samples from the same process pass (checked over
many pairs), a shift of a fifth of a standard deviation or a 20% wider spread fails, and the
statistic is the one computed plainly."""

import math

import jax
import numpy as np
import pytest
from scipy.signal import lfilter

import pytest_jaxlog as jl
from pytest_jaxlog.check.statistics import compare_ensembles


def chains(seed, rho=0.9, n=8000, m=4, shift=0.0, scale=1.0):
    """AR(1) chains (draws, chains), as a batched run's trajectory."""
    noise = np.random.default_rng(seed).normal(size=(n, m))
    x = lfilter([1.0], [1.0, -rho], noise, axis=0)
    return jl.from_arrays({"x": (shift + scale * x).astype(np.float32)}, batched=True).trajectory


def test_samples_of_one_process_agree_and_false_alarms_are_rare():
    fails = 0
    for seed in range(40):
        try:
            jl.assert_statistically_close(chains(2 * seed), chains(2 * seed + 1), ["x"], burn_in=100)
        except jl.JaxlogError:
            fails += 1
    assert fails <= 1  # two moments at 4 standard errors: a false alarm about once in 8,000 pairs


def test_a_shifted_or_wider_distribution_fails_naming_the_moment():
    sd = 1 / math.sqrt(1 - 0.9**2)
    with pytest.raises(jl.JaxlogError, match=r"ensembles differ: x mean: obtained .* \(z = \+\d+\.\d\d\)"):
        jl.assert_statistically_close(chains(1, shift=0.2 * sd), chains(2), ["x"], burn_in=100)
    with pytest.raises(AssertionError, match=r"ensembles differ: x var"):
        jl.assert_statistically_close(chains(3, scale=1.2), chains(4), ["x"], burn_in=100, moments=["var"])


def test_the_statistic_is_the_one_computed_plainly():
    a, b = chains(5, rho=0.0), chains(6, rho=0.0)  # independent draws: the ESS is about the draw count
    (mean, var) = compare_ensembles(a, b, ["x"], burn_in=0)
    xa = np.asarray(a["x"], np.float64).ravel()
    xb = np.asarray(b["x"], np.float64).ravel()
    assert mean.obtained == pytest.approx(xa.mean()) and var.expected == pytest.approx(xb.var(ddof=1))
    na, nb = float(jl.ess(a, "x").pooled), float(jl.ess(b, "x").pooled)
    assert 0.9 * xa.size < na < 1.1 * xa.size
    z = (xa.mean() - xb.mean()) / math.sqrt(xa.var(ddof=1) / na + xb.var(ddof=1) / nb)
    assert mean.z == pytest.approx(z, rel=1e-9)


def test_two_runs_of_a_sampler_under_other_keys(tmp_path):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from kernels.metropolis import make_chains

    step, state = make_chains(8, scale=1.0)
    runs = [jl.run(step, state, 3000, key=jax.random.key(k), batched=True,
                   record={"x": jl.Record(lambda c: c.x, every=5)}, progress=False) for k in (0, 1)]
    checks = jl.assert_statistically_close(runs[0], runs[1], ["x"], burn_in=500)
    assert len(checks) == 4  # 2 coordinates x (mean, var)
    assert not np.array_equal(runs[0].trajectory["x"], runs[1].trajectory["x"])  # not bit for bit


def test_bad_input_is_one_error():
    a = chains(7)
    with pytest.raises(jl.JaxlogError, match="record 'y' is not in the obtained run"):
        jl.assert_statistically_close(a, a, ["y"])
    with pytest.raises(jl.JaxlogError, match="records= takes a list"):
        jl.assert_statistically_close(a, a, "x")
    with pytest.raises(jl.JaxlogError, match="moments= takes a list"):
        jl.assert_statistically_close(a, a, ["x"], moments=["skew"])
