"""Finished systems stay finished: in a batched run with per-system ``until=``, a system's rows
after its stop are what the file says they are (views: its frozen state; the step's aux and logs:
marked invalid), ``when=`` keeps none of them, and a batch whose system axis cannot be known
(graphs of different sizes concatenated) is refused. Compared with each chain run on its own in
a plain Python loop that stops it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl

N_STEPS = 40
KEY = jax.random.key(7)


def metropolis(key, x, acc):
    """One Metropolis step of one chain on the density exp(-|x|): its new position and
    acceptance count, and what the step computed on the way (the proposal, its log ratio)."""
    k1, k2 = jax.random.split(key)
    prop = x + 0.5 * jax.random.normal(k1, x.shape, x.dtype)
    logratio = jnp.abs(x) - jnp.abs(prop)
    accepted = jnp.log(jax.random.uniform(k2, x.shape, x.dtype)) < logratio
    return {"x": jnp.where(accepted, prop, x), "acc": acc + accepted.astype(jnp.int32),
            "prop": prop, "logratio": logratio, "accepted": accepted}


def chain_step(key, s):
    out = metropolis(key, s["x"], s["acc"])
    jl.log("proposal", out["prop"])
    jl.log("acc_seen", out["acc"])
    return {"x": out["x"], "acc": out["acc"], "target": s["target"]}, {"logratio": out["logratio"],
                                                                        "accepted": out["accepted"]}


def batched_step(keys, s):
    return jax.vmap(chain_step)(keys, s)


# chain 0 stops early, 1 and 2 later, 3 never within N_STEPS
STATE = {"x": jnp.asarray([0.3, -1.0, 2.0, 0.0], jnp.float32), "acc": jnp.zeros(4, jnp.int32),
         "target": jnp.asarray([3, 9, 15, 1000], jnp.int32)}


def until(s):
    return s["acc"] >= s["target"]


def plain_chains():
    """Each chain run on its own, in a Python loop that stops it at its own first step where
    its acceptance count reaches its target: its rows up to that step, by step."""
    one = jax.jit(metropolis)
    out = []
    for i in range(STATE["x"].shape[0]):
        x, acc, target = STATE["x"][i], STATE["acc"][i], int(STATE["target"][i])
        rows = {"x": [x], "acc": [acc], "proposal": [None], "logratio": [None], "accepted": [None]}
        k = 0
        while k < N_STEPS and int(acc) < target:
            key = jax.random.fold_in(jax.random.fold_in(KEY, k), i)
            r = one(key, x, acc)
            x, acc = r["x"], r["acc"]
            for name, v in (("x", x), ("acc", acc), ("proposal", r["prop"]), ("logratio", r["logratio"]),
                            ("accepted", r["accepted"])):
                rows[name].append(v)
            k += 1
        out.append({"stop": k, **{n: [None if v is None else np.asarray(v) for v in vs] for n, vs in rows.items()}})
    return out


@pytest.fixture(scope="module")
def plain():
    return plain_chains()


def _run(chunk, path=None, **kwargs):
    record = {"x": lambda s: s["x"], "acc": lambda s: s["acc"], "xs": jl.Record(lambda s: s["x"], every=3)}
    return jl.run(batched_step, STATE, N_STEPS, key=KEY, batched=True, has_aux=True, until=until, record=record,
                  logs={"acc_seen": jl.every(2)}, chunk=chunk, progress=False,
                  sinks=[jl.HDF5Writer(path)] if path is not None else (), **kwargs)


def test_rows_before_a_stop_are_the_plain_chains_and_after_it_as_documented(plain, tmp_path):
    run = _run(7, tmp_path / "chains.h5")
    stops = [p["stop"] for p in plain]
    assert stops[0] < stops[1] < stops[2] < N_STEPS and stops[3] == N_STEPS  # the scenario holds
    np.testing.assert_array_equal(run.systems_done, stops)
    assert run.stop_reason == "steps" and run.steps_done == N_STEPS
    for traj in (run.trajectory, jl.load(tmp_path / "chains.h5")):
        assert traj.finished_systems == {"views": "frozen", "aux": "invalid", "step logs": "invalid",
                                         "invalid": {"float": "nan", "complex": "nan", "signed int": "min",
                                                     "unsigned int": "max", "bool": False},
                                         "live": "steps <= systems_done"}
        np.testing.assert_array_equal(traj.systems_done, stops)
        for name, plain_name in (("x", "x"), ("acc", "acc"), ("xs", "x"), ("aux/logratio", "logratio"),
                                 ("aux/accepted", "accepted"), ("log/proposal", "proposal"),
                                 ("log/acc_seen", "acc")):
            values, steps = traj[name], traj.steps(name)
            live = traj.live(name)
            assert live.shape == (len(steps), 4)
            for i, p in enumerate(plain):
                np.testing.assert_array_equal(live[:, i], steps <= p["stop"])
                for row, k in enumerate(steps):
                    got = values[row, i]
                    if k <= p["stop"]:  # the chain's own data, bit for bit
                        np.testing.assert_array_equal(got, p[plain_name][k], err_msg=f"{name} system {i} step {k}")
                    elif not name.startswith(("aux/", "log/")):  # views: the frozen state, at its stop
                        np.testing.assert_array_equal(got, p[plain_name][p["stop"]], err_msg=f"{name} {i} {k}")
                    elif values.dtype == np.bool_:
                        assert not got, f"{name} system {i} step {k}"
                    elif np.issubdtype(values.dtype, np.integer):
                        assert got == np.iinfo(values.dtype).min, f"{name} system {i} step {k}"
                    else:
                        assert np.isnan(got), f"{name} system {i} step {k}: {got}"
    np.testing.assert_array_equal(np.asarray(run.state["x"]), [p["x"][-1] for p in plain])


def test_any_chunk_size_gives_identical_results():
    base = _run(None)
    for chunk in (1, 5, 16):
        other = _run(chunk)
        np.testing.assert_array_equal(other.systems_done, base.systems_done)
        for name in base.trajectory.records:
            np.testing.assert_array_equal(other.trajectory.steps(name), base.trajectory.steps(name))
            np.testing.assert_array_equal(other.trajectory[name], base.trajectory[name], err_msg=f"{name} {chunk}")


def test_when_keeps_no_row_of_a_finished_system(plain):
    """A predicate that holds on a finished system's frozen state forever (its count reached its
    target) keeps that system's stop step and none after: per system, only where it still runs."""
    stops = [p["stop"] for p in plain]
    record = {"done": jl.Record(lambda s: s["acc"], when=lambda s: s["acc"] >= s["target"]),
              "far": jl.Record(lambda s: s["x"], every=2, when=lambda s: jnp.abs(s["x"]) > 0.5)}
    # without aux the program nests its loops (views only); a sparse aux record makes it test per step
    for chunk, aux in ((1, []), (6, []), (None, []), (4, {"accepted": jl.every(3)}), (None, {"accepted": jl.every(3)})):
        run = jl.run(batched_step, STATE, N_STEPS, key=KEY, batched=True, has_aux=True, until=until, record=record,
                     chunk=chunk, progress=False, aux=aux, logs={})
        np.testing.assert_array_equal(run.trajectory.steps("done"), sorted(s for s in stops if s < N_STEPS))
        far = [k for k in range(0, N_STEPS + 1, 2)
               if any(k <= p["stop"] and abs(p["x"][k]) > 0.5 for p in plain)]
        np.testing.assert_array_equal(run.trajectory.steps("far"), far)


def test_one_bool_for_all_systems_is_refused_with_until():
    record = {"done": jl.Record(lambda s: s["acc"], when=lambda s: jnp.any(s["acc"] >= s["target"]))}
    with pytest.raises(jl.JaxlogError, match=r"record 'done': in a batched run with until=, when= must return one "
                                             r"bool per system, shape \(4,\).*frozen state.*got bool\[\]"):
        jl.run(batched_step, STATE, 5, key=KEY, batched=True, has_aux=True, until=until, record=record,
               progress=False)


def test_per_system_when_without_until_keeps_a_row_where_any_system_holds():
    record = {"x": jl.Record(lambda s: s["x"], when=lambda s: s["x"] > 1.0)}
    run = jl.run(batched_step, STATE, 20, key=KEY, batched=True, has_aux=True, record=record, progress=False,
                 aux=[])
    every = jl.run(batched_step, STATE, 20, key=KEY, batched=True, has_aux=True, record={"x": lambda s: s["x"]},
                   progress=False, aux=[])
    keep = np.any(every.trajectory["x"] > 1.0, axis=1)
    np.testing.assert_array_equal(run.trajectory.steps("x"), np.flatnonzero(keep))
    np.testing.assert_array_equal(run.trajectory["x"], every.trajectory["x"][keep])
    assert run.trajectory.live("x").shape == (int(keep.sum()), 4) and run.trajectory.live("x").all()


def test_ragged_batch_refuses_per_system_until_with_the_reason():
    """Three graphs of 2, 3 and 5 atoms concatenated: the atoms' leading axis (10) is not the
    system axis, so freezing graph 0 could not hold its atoms still."""
    sizes = np.asarray([2, 3, 5])
    graph = jnp.asarray(np.repeat(np.arange(3), sizes))
    state = {"pos": jnp.zeros((10, 2)), "energy": jnp.zeros(3)}

    def step(s):
        pos = s["pos"] + 0.1
        return {"pos": pos, "energy": jax.ops.segment_sum(jnp.sum(pos ** 2, axis=1), graph, num_segments=3)}

    with pytest.raises(jl.JaxlogError, match=r"until= per system \(batched, 3 systems\): state leaf \['pos'\] has "
                                             r"leading axis 10, not the system axis.*ragged batch"):
        jl.run(step, state, 10, batched=3, until=lambda s: s["energy"] > 1.0, record={"e": lambda s: s["energy"]},
               progress=False)


def test_a_resumed_run_keeps_its_finished_systems_finished(tmp_path):
    """Checkpointed at step 12 (chain 0 already stopped at its own step) and resumed to the end:
    the file is the uninterrupted run's, invalid marks and frozen rows included."""
    whole = _run(5, tmp_path / "whole.h5")
    record = {"x": lambda s: s["x"], "acc": lambda s: s["acc"], "xs": jl.Record(lambda s: s["x"], every=3)}
    common = dict(key=KEY, batched=True, has_aux=True, until=until, record=record, logs={"acc_seen": jl.every(2)},
                  chunk=5, progress=False, checkpoint=jl.every(12))
    jl.run(batched_step, STATE, 12, sinks=[jl.HDF5Writer(tmp_path / "cut.h5")], **common)
    assert 0 < int(whole.systems_done[0]) < 12  # a system stopped before the checkpoint
    resumed = jl.resume(tmp_path / "cut.h5", batched_step, N_STEPS, from_step=12, **common)
    np.testing.assert_array_equal(resumed.systems_done, whole.systems_done)
    a, b = jl.load(tmp_path / "whole.h5"), jl.load(tmp_path / "cut.h5")
    assert b.finished_systems == a.finished_systems
    for name in a.records:
        np.testing.assert_array_equal(b.steps(name), a.steps(name))
        np.testing.assert_array_equal(b[name], a[name], err_msg=name)
