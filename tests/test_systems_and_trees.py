"""Reading a batched run one system at a time (``traj.system(i)``) and records back as the
kernel's own pytrees (``traj.tree(name, like=)``), from memory and from the file. Compared with
each chain run alone in a plain Python loop, and with the arrays the views returned."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl

N_STEPS = 30
KEY = jax.random.key(11)
N_CHAINS = 4


def metropolis(key, s):
    """One Metropolis step of one chain on exp(-x^2/2 / temp): its position, whether this step
    moved it, its acceptance count; the temperature is shared by all chains."""
    k1, k2 = jax.random.split(key)
    x = s["x"]
    prop = x + 0.8 * jax.random.normal(k1, (), x.dtype)
    logratio = (x**2 - prop**2) / (2 * s["temp"])
    accepted = jnp.log(jax.random.uniform(k2, (), x.dtype)) < logratio
    return {"x": jnp.where(accepted, prop, x), "moved": accepted, "acc": s["acc"] + accepted.astype(jnp.int32),
            "temp": s["temp"]}


def batched_step(keys, s):
    axes = {"x": 0, "moved": 0, "acc": 0, "temp": None}
    return jax.vmap(metropolis, in_axes=(0, axes), out_axes=axes)(keys, s)


STATE = {"x": jnp.asarray([0.0, 1.5, -2.0, 0.5], jnp.float32), "moved": jnp.zeros(N_CHAINS, bool),
         "acc": jnp.zeros(N_CHAINS, jnp.int32), "temp": jnp.float32(0.7)}
TARGETS = np.array([2, 5, 9, 10_000])


def plain_chain(i: int, stop_at: int | None = None) -> dict:
    """Chain ``i`` alone, in a Python loop, with the key the batched run gives it at each step:
    every position, and the accepted ones (a sample is kept where the step moved the chain)."""
    one = jax.jit(metropolis)
    s = {"x": STATE["x"][i], "moved": STATE["moved"][i], "acc": STATE["acc"][i], "temp": STATE["temp"]}
    xs, steps, kept, kept_steps = [np.asarray(s["x"])], [0], [], []
    for k in range(N_STEPS):
        if stop_at is not None and int(s["acc"]) >= stop_at:
            break
        s = one(jax.random.fold_in(jax.random.fold_in(KEY, k), i), s)
        xs.append(np.asarray(s["x"]))
        steps.append(k + 1)
        if bool(s["moved"]):
            kept.append(np.asarray(s["x"]))
            kept_steps.append(k + 1)
    return {"x": np.array(xs), "steps": np.array(steps), "kept": np.array(kept), "kept_steps": np.array(kept_steps)}


RECORD = {"x": lambda s: s["x"], "temp": lambda s: s["temp"],
          "accepted": jl.Record(lambda s: s["x"], when=lambda s: s["moved"])}


def _until(s):
    return s["acc"] >= jnp.asarray(TARGETS)


@pytest.mark.parametrize("until", [None, _until], ids=["all-steps", "until"])
def test_each_system_reads_back_as_its_chain_run_alone(tmp_path, until):
    run = jl.run(batched_step, STATE, N_STEPS, key=KEY, batched=True, record=RECORD, until=until, dt=0.5,
                 chunk=7, progress=False, sinks=[jl.HDF5Writer(tmp_path / "chains.h5")])
    plain = [plain_chain(i, None if until is None else int(TARGETS[i])) for i in range(N_CHAINS)]
    # the scenario: some row of "accepted" is kept for some chains but not for others
    flags = run.trajectory["when/accepted"]
    assert flags.shape == (len(run.trajectory.steps("accepted")), N_CHAINS) and not flags.all() and flags.any(1).all()
    if until is not None:
        assert [len(p["steps"]) - 1 for p in plain][:3] == list(run.trajectory.systems_done[:3])
    for traj in (run.trajectory, jl.load(tmp_path / "chains.h5")):
        for i, p in enumerate(plain):
            mine = traj.system(i)
            np.testing.assert_array_equal(mine.steps("x"), p["steps"])
            np.testing.assert_allclose(mine["x"], p["x"], rtol=1e-6, err_msg=f"system {i}")
            np.testing.assert_array_equal(mine.steps("accepted"), p["kept_steps"], err_msg=f"system {i}")
            np.testing.assert_allclose(mine["accepted"], p["kept"], rtol=1e-6, err_msg=f"system {i}")
            np.testing.assert_array_equal(mine.time("accepted"), p["kept_steps"] * 0.5)
            np.testing.assert_array_equal(mine["temp"], np.full(len(p["steps"]), np.float32(0.7)))  # shared
            np.testing.assert_allclose(mine["accepted", 1:3], p["kept"][1:3], rtol=1e-6)
            np.testing.assert_allclose(mine.at("accepted", int(p["kept_steps"][-1])), p["kept"][-1], rtol=1e-6)
            assert mine.records == traj.records and mine["x"].shape == (len(p["steps"]),)
            assert mine.steps_done == len(p["steps"]) - 1


def test_a_system_saves_as_a_trajectory_of_its_own(tmp_path):
    run = jl.run(batched_step, STATE, N_STEPS, key=KEY, batched=True, record=RECORD, progress=False)
    one = jl.load(run.trajectory.system(2).save(tmp_path / "two.h5"))
    p = plain_chain(2)
    np.testing.assert_allclose(one["accepted"], p["kept"], rtol=1e-6)
    np.testing.assert_array_equal(one.steps("accepted"), p["kept_steps"])


def test_system_of_a_run_that_is_not_batched_or_out_of_range_is_refused():
    run = jl.run(lambda s: s + 1.0, jnp.zeros(3), 2, record={"x": lambda s: s}, progress=False)
    with pytest.raises(jl.JaxlogError, match=r"not of a batched run"):
        run.trajectory.system(0)
    batched = jl.run(batched_step, STATE, 2, key=KEY, batched=True, record=RECORD, progress=False)
    with pytest.raises(jl.JaxlogError, match=r"traj.system\(4\): the run has 4 systems \(0..3\)"):
        batched.trajectory.system(4)
    np.testing.assert_array_equal(batched.trajectory.system(-1)["x"], batched.trajectory["x"][:, 3])


def test_a_record_named_when_is_refused_beside_a_per_system_when():
    with pytest.raises(jl.JaxlogError, match=r"record name 'when' is taken.*'accepted'"):
        jl.run(batched_step, STATE, 2, key=KEY, batched=True, record={**RECORD, "when": lambda s: s["x"]},
               progress=False)


# ------------------------------------------------------------------- traj.tree(name, like=)
class Sample(NamedTuple):
    pos: jax.Array
    key: jax.Array


@dataclasses.dataclass
class Params:
    w: jax.Array
    b: jax.Array


jax.tree_util.register_dataclass(Params, data_fields=["w", "b"], meta_fields=[])


@jax.tree_util.register_pytree_node_class
class Box:
    def __init__(self, lo, hi):
        self.lo, self.hi = lo, hi

    def tree_flatten(self):
        return (self.lo, self.hi), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


def tree_step(key, s):
    k1, k2 = jax.random.split(key)
    pos = s["pos"] + jax.random.normal(k1, s["pos"].shape)
    return {"pos": pos, "key": k2, "w": s["w"] * 0.5 + pos.sum(), "b": s["b"] - 1.0}


TREE_STATE = {"pos": jnp.zeros(3), "key": jax.random.key(3), "w": jnp.ones((2, 2)), "b": jnp.zeros(2)}
VIEWS = {"sample": lambda s: Sample(s["pos"], s["key"]), "params": lambda s: Params(s["w"], s["b"]),
         "box": lambda s: Box(s["pos"].min(), s["pos"].max()), "pos": lambda s: s["pos"]}


def test_records_come_back_as_the_views_own_pytrees(tmp_path):
    run = jl.run(tree_step, TREE_STATE, 6, key=KEY, record={n: jl.Record(v, every=2) for n, v in VIEWS.items()},
                 progress=False, sinks=[jl.HDF5Writer(tmp_path / "t.h5")])
    plain, s = [], TREE_STATE  # the same run in a Python loop: the views' outputs at steps 0, 2, 4, 6
    for k in range(7):
        if k % 2 == 0:
            plain.append({n: v(s) for n, v in VIEWS.items()})
        s = tree_step(jax.random.fold_in(KEY, k), s)
    like = {n: v(TREE_STATE) for n, v in VIEWS.items()}
    for traj in (run.trajectory, jl.load(tmp_path / "t.h5")):
        sample = traj.tree("sample", like=like["sample"])
        assert isinstance(sample, Sample) and jax.dtypes.issubdtype(sample.key.dtype, jax.dtypes.prng_key)
        assert sample.pos.shape == (4, 3)
        np.testing.assert_array_equal(sample.pos, traj["sample/pos"])  # the stored frames, bit for bit
        np.testing.assert_allclose(sample.pos, np.stack([p["sample"].pos for p in plain]), rtol=1e-5)
        np.testing.assert_array_equal(jax.random.key_data(sample.key),
                                      np.stack([jax.random.key_data(p["sample"].key) for p in plain]))
        params = traj.tree("params", like=like["params"])
        assert isinstance(params, Params) and params.w.shape == (4, 2, 2)
        np.testing.assert_array_equal(params.b, traj["params/b"])
        np.testing.assert_allclose(params.w, np.stack([p["params"].w for p in plain]), rtol=1e-5)
        box = traj.tree("box", like=like["box"])
        assert isinstance(box, Box)
        np.testing.assert_array_equal(box.lo, traj["box/0"])
        np.testing.assert_allclose(box.hi, np.stack([p["box"].hi for p in plain]), rtol=1e-5)
        np.testing.assert_array_equal(traj.tree("pos", like=like["pos"]), traj["pos"])


def test_tree_of_a_system_and_a_template_that_does_not_fit():
    run = jl.run(batched_step, STATE, 5, key=KEY, batched=True,
                 record={"pair": lambda s: Sample(s["x"], jax.random.split(jax.random.key(0), N_CHAINS))},
                 progress=False)
    one = run.trajectory.system(1).tree("pair", like=Sample(jnp.float32(0), jax.random.key(0)))
    assert isinstance(one, Sample) and one.pos.shape == (6,) and one.key.shape == (6,)
    np.testing.assert_array_equal(one.pos, run.trajectory["pair/pos"][:, 1])
    with pytest.raises(jl.JaxlogError, match=r"record 'pair'.*like= has no leaf for pair/key"):
        run.trajectory.tree("pair", like={"pos": jnp.zeros(N_CHAINS)})
    with pytest.raises(jl.JaxlogError, match=r"record 'pair': leaf pair/pos has frames of shape \(4,\), like= has "
                                             r"\(3,\)"):
        run.trajectory.tree("pair", like=Sample(jnp.zeros(3), jax.random.split(jax.random.key(0), N_CHAINS)))
