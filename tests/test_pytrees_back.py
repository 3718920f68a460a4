"""States come back as the kernel wrote them: ``traj.state(step, like=template)`` rebuilds
namedtuples, dataclasses and registered pytree nodes (types from the template, never from the
file), typed PRNG keys, bf16 and complex leaves; step-based selection with ``at``/``between``."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl


class Particles(NamedTuple):
    x: jax.Array
    v: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Thermo:  # flax.struct / chex style: a frozen-field dataclass registered as a pytree
    temperature: jax.Array
    half: jax.Array


class Box:
    """A hand-registered pytree node with keys."""

    def __init__(self, lengths, phase):
        self.lengths, self.phase = lengths, phase


jax.tree_util.register_pytree_with_keys(
    Box,
    lambda b: (((jax.tree_util.GetAttrKey("lengths"), b.lengths), (jax.tree_util.GetAttrKey("phase"), b.phase)), None),
    lambda _, children: Box(*children),
)


def make_state():
    return {"p": Particles(jnp.linspace(0.0, 1.0, 4, dtype=jnp.float32), jnp.zeros(4, jnp.float32)),
            "thermo": Thermo(jnp.float32(1.0), jnp.ones(2, jnp.bfloat16)),
            "box": Box(jnp.ones(3), jnp.zeros(2, jnp.complex64)),
            "key": jax.random.key(5)}


def step(s):
    p = Particles(s["p"].x + 0.5, s["p"].v - 0.25)
    th = Thermo(s["thermo"].temperature * 1.5, s["thermo"].half + jnp.bfloat16(1))
    box = Box(s["box"].lengths * 2, s["box"].phase + 1j)
    return {"p": p, "thermo": th, "box": box, "key": jax.random.split(s["key"])[0]}


@pytest.mark.parametrize("where", ["memory", "file"])
def test_postmortem_states_come_back_as_the_kernels_types(tmp_path, where):
    s0 = make_state()
    sinks = [jl.HDF5Writer(tmp_path / "t.h5")] if where == "file" else []
    with pytest.raises(jl.InvariantViolation) as info:
        jl.run(step, s0, 10, record={"x": lambda s: s["p"].x}, invariants=[jl.bounded("x", hi=1.6)], sinks=sinks,
               progress=False)
    traj = info.value.jaxlog_run.trajectory if where == "memory" else jl.load(tmp_path / "t.h5")
    assert sorted(traj.postmortem) == [0, 1, 2]
    ref = s0
    for k in range(3):
        back = traj.state(k, like=s0)
        assert isinstance(back["p"], Particles) and isinstance(back["thermo"], Thermo) and isinstance(back["box"], Box)
        assert jax.dtypes.issubdtype(back["key"].dtype, jax.dtypes.prng_key)
        assert back["thermo"].half.dtype == jnp.bfloat16 and back["box"].phase.dtype == np.complex64
        for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(ref)):
            if jax.dtypes.issubdtype(getattr(b, "dtype", np.float32), jax.dtypes.prng_key):
                a, b = jax.random.key_data(a), jax.random.key_data(b)
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        ref = jax.jit(step)(ref)
    plain = traj.state(2)
    assert set(plain) == {"p", "thermo", "box", "key"} and set(plain["p"]) == {"x", "v"}


def test_a_template_that_does_not_fit_is_named():
    s0 = make_state()
    with pytest.raises(jl.InvariantViolation) as info:
        jl.run(step, s0, 5, record={"x": lambda s: s["p"].x}, invariants=[jl.bounded("x", hi=0.5)], progress=False)
    traj = info.value.jaxlog_run.trajectory
    with pytest.raises(jl.JaxlogError, match=r"the file has no state/extra"):
        traj.state(0, like={**s0, "extra": jnp.zeros(1)})
    with pytest.raises(jl.JaxlogError, match=r"like= has no leaf for state/key"):
        traj.state(0, like={k: v for k, v in s0.items() if k != "key"})
    with pytest.raises(jl.JaxlogError, match=r"no state stored at step 7 \(states stored at steps: \[0\]\)"):
        traj.state(7, like=s0)


def test_step_based_selection():
    run = jl.run(lambda s: s + 1, jnp.zeros(2), 40, progress=False,
                 record={"once": jl.Record(lambda s: s, every=jl.at(25)), "x": jl.Record(lambda s: s[0], every=5)})
    traj = run.trajectory
    once = traj.at("once", 25)
    assert once.shape == (2,)  # a record taken once reads back with its own shape
    np.testing.assert_array_equal(once, [25.0, 25.0])
    np.testing.assert_array_equal(traj.between("x", 10, 22), [10.0, 15.0, 20.0])
    np.testing.assert_array_equal(traj["x", 2:4], [10.0, 15.0])  # an index selects frames, not steps
    with pytest.raises(jl.JaxlogError, match=r"record 'x' was not recorded at step 7 \(recorded: 9 steps from 0 to 40\)"):
        traj.at("x", 7)
