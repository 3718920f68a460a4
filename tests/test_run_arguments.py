"""Bad arguments to jl.run are one JaxlogError naming the argument, before any step runs and
before any file exists, never JAX's error from inside the first trace."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl


def _noisy(key, s):
    return s + jax.random.normal(key, s.shape)


@pytest.mark.parametrize("key", ["notakey", 1.5, np.zeros(3, np.float32), np.zeros((2, 3), np.uint32)])
def test_a_key_that_is_not_a_key_is_one_error_naming_key(tmp_path, key):
    path = tmp_path / "t.h5"
    with pytest.raises(jl.JaxlogError, match=r"key= must be a PRNG key"):
        jl.run(_noisy, jnp.zeros(2), 3, key=key, sinks=[jl.HDF5Writer(path)], progress=False)
    assert not path.exists()


@pytest.mark.parametrize("keys", [lambda: jax.random.split(jax.random.key(0), 3),
                                  lambda: jax.random.split(jax.random.PRNGKey(0), 3)])
@pytest.mark.parametrize("batched", [True, False])
def test_an_array_of_keys_is_refused_saying_the_run_makes_one_key_per_system(tmp_path, keys, batched):
    path = tmp_path / "t.h5"
    state = jnp.zeros((3, 2))
    step = jax.vmap(_noisy) if batched else _noisy
    how = "this batched run makes one key per system itself" if batched else "pass batched=True"
    with pytest.raises(jl.JaxlogError, match=rf"^\[jaxlog\] key= must be one PRNG key, got an array of 3 keys "
                                             rf"\(shape \[3\]\).*{how}.*pass one key, jax.random.key\(seed\)$"):
        jl.run(step, state, 3, key=keys(), batched=batched, sinks=[jl.HDF5Writer(path)], progress=False)
    assert not path.exists()


@pytest.mark.parametrize("dt", ["x", float("nan"), float("inf")])
def test_a_dt_that_is_not_a_finite_number_is_one_error_naming_dt(tmp_path, dt):
    path = tmp_path / "t.h5"
    with pytest.raises(jl.JaxlogError, match="dt"):
        jl.run(lambda s: s + 1, jnp.zeros(2), 3, dt=dt, sinks=[jl.HDF5Writer(path)], progress=False)
    assert not path.exists()


@pytest.mark.parametrize("make", [lambda: jax.random.PRNGKey(3), lambda: jax.random.key(3)])
def test_raw_and_typed_keys_give_the_plain_loops_values(make):
    key = make()
    run = jl.run(_noisy, jnp.zeros(2), 4, key=key, record={"x": lambda s: s}, progress=False)
    s, plain = jnp.zeros(2), [np.zeros(2, np.float32)]
    for k in range(4):
        s = _noisy(jax.random.fold_in(key, k), s)
        plain.append(np.asarray(s))
    np.testing.assert_array_equal(run.trajectory["x"], np.stack(plain))


def test_a_run_inside_a_jax_transformation_is_one_error_naming_it():
    def step(x):
        return x * 0.5 + 1.0

    with pytest.raises(jl.JaxlogError, match=r"state leaf \(the state itself\) is a tracer: jl.run was called inside"):
        jax.make_jaxpr(lambda x: jl.run(step, x, 10, record={"m": jnp.mean}, progress=False).state)(jnp.ones(3))
    run = jl.run(step, jnp.ones(3), 10, record={"m": jnp.mean}, progress=False)  # and the next run is unharmed
    assert run.steps_done == 10 and run.trajectory.steps("m").tolist() == list(range(11))
