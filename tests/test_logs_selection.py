"""``jl.run(logs=...)`` chooses the step's logs as ``aux=`` chooses aux leaves: a dict of
schedules (None: the default, every step; False: left out), a name or a list of names; and a
nested log name gets advice that fits logs. Values compared with the step run in a Python loop."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl

S0 = jnp.linspace(0.0, 1.0, 4)
N = 9


def step(x):
    x = 0.9 * x + 0.1
    jl.log("fmax", jnp.max(x))
    jl.log("pair", {"lo": jnp.min(x), "hi": jnp.max(x)})
    return x


def plain():
    """Each step's logs, from a loop over the step's own arithmetic (steps 1..N)."""
    x, out = S0, {"fmax": [], "lo": [], "hi": []}
    for _ in range(N):
        x = 0.9 * x + 0.1
        out["fmax"].append(np.max(np.asarray(x)))
        out["lo"].append(np.min(np.asarray(x)))
        out["hi"].append(np.max(np.asarray(x)))
    return {k: np.array(v) for k, v in out.items()}


def _logs(logs):
    return jl.run(step, S0, N, logs=logs, progress=False).trajectory


def test_a_list_or_a_name_is_a_dict_of_default_schedules():
    want = plain()
    for logs in (["fmax"], "fmax", {"fmax": None}, None, ("fmax", "pair")):
        traj = _logs(logs)
        assert set(traj.records) == {"log/fmax", "log/pair/hi", "log/pair/lo"}, logs
        np.testing.assert_array_equal(traj.steps("log/fmax"), np.arange(1, N + 1))
        np.testing.assert_allclose(traj["log/fmax"], want["fmax"], rtol=1e-6)
        np.testing.assert_allclose(traj["log/pair/lo"], want["lo"], rtol=1e-6)


def test_false_leaves_a_log_out_and_the_others_as_they_were():
    want = plain()
    traj = _logs({"pair": False, "fmax": 3})
    assert traj.records == ("log/fmax",)
    np.testing.assert_array_equal(traj.steps("log/fmax"), [3, 6, 9])
    np.testing.assert_allclose(traj["log/fmax"], want["fmax"][[2, 5, 8]], rtol=1e-6)
    traj = _logs({"pair": False, "fmax": False})
    assert traj.records == ()
    run = jl.run(step, S0, N, logs={"fmax": False}, record={"x": lambda s: s}, progress=False)
    assert run.trajectory.records == ("x", "log/pair/hi", "log/pair/lo")
    with pytest.raises(jl.JaxlogError, match=r"logs= names \['nope'\], but the step never logs them"):
        _logs(["nope"])
    with pytest.raises(jl.JaxlogError, match=r"logs= must be a dict of log name -> schedule \(False leaves a log "
                                             r"out\) or a list of log names, got int"):
        _logs(3)


def test_a_nested_log_name_gets_advice_for_logs():
    with pytest.raises(jl.JaxlogError, match=r"log name 'pair/lo' is invalid: a log's name is one part; to nest, "
                                             r"log a dict under the first part: jl.log\('pair', \{'lo': value\}\) is "
                                             r"recorded as 'log/pair/lo' \(and chosen in logs= as 'pair'\)") as info:
        jl.spool(lambda x: jl.log("pair/lo", x))(S0)
    assert "view" not in str(info.value)
    with pytest.raises(jl.JaxlogError, match=r"logs=: log name 'pair/lo' is invalid.*chosen in logs= as 'pair'"):
        _logs({"pair/lo": 2})
    with pytest.raises(jl.JaxlogError, match=r"log name ' x' is invalid: use a non-empty string without '/'"):
        jl.spool(lambda x: jl.log(" x", x))(S0)
