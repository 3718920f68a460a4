"""A state of one array, a tuple or a list of arrays comes back from a checkpoint without ``like=``
(``traj.state`` and ``jl.resume``), as the same containers, and the resumed run equals the
uninterrupted one; a state of the kernel's own types still needs ``like=``, saying so."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.store.dtypes import template


def _ctrl_c_after(step):
    """A sink that is handed the frames and then Ctrl-C once they reach ``step``."""
    def write(frames):
        if (frames.last_step or 0) >= step:
            raise KeyboardInterrupt
    return jl.CallbackSink(write)


def tuple_step(s):
    x, (v, extras) = s
    v = v - 0.1 * x
    return x + 0.1 * v, (v, [extras[0] + 1, extras[1] * 0.5])


def array_step(x):
    return x * 0.9 + 0.05


class Pair(NamedTuple):
    a: jax.Array
    b: jax.Array


def pair_step(s):
    return Pair(s.a + s.b, s.b * 0.5)


CASES = {
    "tuple": (tuple_step, (jnp.ones(3), (jnp.zeros(3), [jnp.int32(0), jnp.float32(1.0)]))),
    "array": (array_step, jnp.linspace(0.0, 1.0, 4)),
}


def _run(path, step, s0, steps, stop_at=None):
    return jl.run(step, s0, steps, record={"leaf0": lambda s: jax.tree_util.tree_leaves(s)[0]},
                  sinks=[jl.HDF5Writer(path), *([] if stop_at is None else [_ctrl_c_after(stop_at)])],
                  checkpoint=jl.every(10), chunk=4, progress=False)


@pytest.mark.parametrize("case", sorted(CASES))
def test_plain_states_come_back_without_like(tmp_path, case):
    step, s0 = CASES[case]
    whole = _run(tmp_path / "whole.h5", step, s0, 40)
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path / "cut.h5", step, s0, 40, stop_at=25)
    traj = jl.load(tmp_path / "cut.h5")
    back = traj.state(20)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(s0)  # the same containers
    ref = jl.load(tmp_path / "whole.h5").state(20)
    for got, want in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_array_equal(got, want)
    resumed = jl.resume(tmp_path / "cut.h5", step, 40, record={"leaf0": lambda s: jax.tree_util.tree_leaves(s)[0]},
                        checkpoint=jl.every(10), chunk=4, progress=False)
    assert jax.tree_util.tree_structure(resumed.state) == jax.tree_util.tree_structure(whole.state)
    for got, want in zip(jax.tree_util.tree_leaves(resumed.state), jax.tree_util.tree_leaves(whole.state)):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(jl.load(tmp_path / "cut.h5")["leaf0"], whole.trajectory["leaf0"])


def test_a_state_of_the_kernels_own_types_still_needs_like(tmp_path):
    s0 = Pair(jnp.ones(2), jnp.ones(2))
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path / "cut.h5", pair_step, s0, 40, stop_at=25)
    assert jl.load(tmp_path / "cut.h5").state(20)["a"].shape == (2,)  # paths as dicts, as before
    with pytest.raises(jl.JaxlogError, match=r"the state is not a dict of arrays.*pass like="):
        jl.resume(tmp_path / "cut.h5", pair_step, 40, record={"leaf0": lambda s: s.a}, checkpoint=jl.every(10))


def test_structure_text_is_parsed_never_evaluated():
    assert template("PyTreeDef(__import__('os').system('true'))") is None
    assert template("PyTreeDef(CustomNode(namedtuple[Pair], [*, *]))") is None
    assert template("PyTreeDef((*, [*, None]))") is not None
    assert template("not a tree") is None
