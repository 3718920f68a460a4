"""A view returning a plain scalar in a batched run: a value shared by all systems (a temperature
read from a shared state leaf) is recorded for every system; a scalar computed from the
systems' own leaves (a total over them) is not one system's value and stays refused."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl

KEY = jax.random.key(3)
N = 5


def langevin(key, x, temperature):
    """One overdamped Langevin step of one particle in a harmonic well at ``temperature``."""
    return x - 0.1 * x + jnp.sqrt(0.2 * temperature) * jax.random.normal(key, x.shape, x.dtype)


def step(keys, s):
    """``N`` chains at one shared, annealed temperature (a scalar leaf of the state)."""
    return {"x": jax.vmap(langevin, in_axes=(0, 0, None))(keys, s["x"], s["T"]), "T": s["T"] * 0.9}


STATE = {"x": jnp.linspace(-1.0, 1.0, N, dtype=jnp.float32), "T": jnp.float32(2.0)}


def plain(steps):
    """The same chains in a Python loop: positions and temperatures per step."""
    x, temperature = STATE["x"], STATE["T"]
    xs, ts = [np.asarray(x)], [np.asarray(temperature)]
    one = jax.jit(langevin)
    for k in range(steps):
        key_k = jax.random.fold_in(KEY, k)
        keys = jax.vmap(lambda i: jax.random.fold_in(key_k, i))(jnp.arange(N, dtype=jnp.uint32))
        x = jnp.stack([one(keys[i], x[i], temperature) for i in range(N)])
        temperature = temperature * 0.9
        xs.append(np.asarray(x))
        ts.append(np.asarray(temperature))
    return np.stack(xs), np.stack(ts)


@pytest.mark.parametrize("chunk", [1, 4, None])
def test_a_shared_scalar_is_recorded_for_every_system(chunk, tmp_path):
    path = tmp_path / "t.h5"
    record = {"T": lambda s: s["T"], "obs": jl.Record(lambda s: {"x": s["x"], "kT": s["T"] * 2.0, "one": 1}, every=3)}
    run = jl.run(step, STATE, 12, key=KEY, batched=True, record=record, chunk=chunk, progress=False,
                 sinks=[jl.HDF5Writer(path)])
    xs, ts = plain(12)
    for traj in (run.trajectory, jl.load(path)):
        assert traj["T"].shape == (13, N)
        np.testing.assert_array_equal(traj["T"], np.repeat(ts[:, None], N, axis=1))
        np.testing.assert_array_equal(traj.steps("obs/kT"), [0, 3, 6, 9, 12])
        np.testing.assert_array_equal(traj["obs/kT"], np.repeat(ts[::3, None] * np.float32(2.0), N, axis=1))
        np.testing.assert_array_equal(traj["obs/one"], np.ones((5, N), traj["obs/one"].dtype))
        # positions to rounding: XLA fuses the batched step's a - b*a + c*d differently from one chain's
        np.testing.assert_allclose(traj["obs/x"], xs[::3], rtol=1e-5, atol=1e-6)


def test_a_scalar_of_the_systems_own_leaves_is_refused_with_the_reason():
    with pytest.raises(jl.JaxlogError, match=r"record 'mean_x': batched runs record one row per system.*got shape "
                                             r"\(\).*computed from per-system leaves"):
        jl.run(step, STATE, 3, key=KEY, batched=True, record={"mean_x": lambda s: jnp.mean(s["x"] * s["T"])},
               progress=False)
