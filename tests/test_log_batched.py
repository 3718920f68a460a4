"""A value logged inside a vmapped step that does not vary over the batch (a constant, a shared
state leaf) is broadcast to one row per system, in ``jl.spool(jax.vmap(f))`` and in a batched
``jl.run`` alike, beside a per-system log; each checked against a Python loop over the systems."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl

N_SYS, STEPS = 3, 6
XS = jnp.stack([jnp.linspace(-1.0, 1.0, 8, dtype=jnp.float32) * s for s in (1.0, 0.5, -2.0)])
STATE = {"x": XS, "dt": jnp.float32(0.05)}


def energy(x):
    return jnp.sum(0.5 * x**2 - jnp.cos(x))


def system_step(x, dt):
    """One system's step, logging a constant, the shared ``dt`` and its own energy."""
    jl.log("kT_target", jnp.float32(1.0))
    jl.log("dt", dt)
    jl.log("e", energy(x))
    return x - dt * (x + jnp.sin(x))


def step(s):
    return {"x": jax.vmap(system_step, in_axes=(0, None))(s["x"], s["dt"]), "dt": s["dt"]}


def plain(steps):
    """``{log name: (steps, systems)}``: each system stepped alone, its logged values kept."""
    one = jax.jit(system_step)
    logs: dict[str, list] = {"kT_target": [], "dt": [], "e": []}
    rows = []
    for i in range(N_SYS):
        x, e = XS[i], []
        for _ in range(steps):
            e.append(np.asarray(energy(x)))
            x = one(x, STATE["dt"])
        rows.append(e)
    logs["e"] = np.asarray(rows).T
    logs["kT_target"] = np.full((steps, N_SYS), 1.0, np.float32)
    logs["dt"] = np.full((steps, N_SYS), np.asarray(STATE["dt"]), np.float32)
    return logs


def test_spool_of_vmap_broadcasts_what_does_not_vary_over_the_systems():
    _, logs = jl.spool(jax.vmap(system_step, in_axes=(0, None)))(XS, STATE["dt"])
    ref = plain(1)
    assert {k: v.shape for k, v in logs.items()} == {"kT_target": (N_SYS,), "dt": (N_SYS,), "e": (N_SYS,)}
    for name in ("kT_target", "dt"):
        np.testing.assert_array_equal(logs[name], ref[name][0])
        assert logs[name].dtype == np.float32
    np.testing.assert_allclose(logs["e"], ref["e"][0], rtol=1e-6)


@pytest.mark.parametrize("chunk", [1, None])
def test_batched_run_records_them_per_system_as_spool_returns_them(chunk, tmp_path):
    path = tmp_path / "t.h5"
    run = jl.run(step, STATE, STEPS, batched=True, chunk=chunk, progress=False, sinks=[jl.HDF5Writer(path)])
    ref = plain(STEPS)
    _, spooled = jl.spool(step)(STATE)
    for traj in (run.trajectory, jl.load(path)):
        for name in ("kT_target", "dt", "e"):
            assert traj[f"log/{name}"].shape == (STEPS, N_SYS), name
            np.testing.assert_array_equal(traj.steps(f"log/{name}"), np.arange(1, STEPS + 1))
            assert traj[f"log/{name}"].shape[1:] == spooled[name].shape
        np.testing.assert_array_equal(traj["log/kT_target"], ref["kT_target"])
        np.testing.assert_array_equal(traj["log/dt"], ref["dt"])
        # XLA may fuse the batched step's arithmetic differently from one system's: to rounding
        np.testing.assert_allclose(traj["log/e"], ref["e"], rtol=1e-5)


def test_a_shared_log_outside_any_vmap_stays_refused_with_the_way_out():
    """A batched step written by hand (no vmap) that logs a scalar: nothing says it is shared."""
    def hand_batched(s):
        jl.log("dt", s["dt"])
        return {"x": s["x"] * (1 - s["dt"]), "dt": s["dt"]}

    with pytest.raises(jl.JaxlogError, match=r"record 'log/dt': batched runs record one row per system.*"
                                             r"got shape \(\).*inside the jax.vmap"):
        jl.run(hand_batched, STATE, 2, batched=True, progress=False)
