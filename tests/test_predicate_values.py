"""Predicates that see what the step computed: ``until=lambda s, v: v["aux/gnorm"] < tol`` and
``when=lambda s, v: v["aux/is_accepted"]``, evaluated on the device. Each run is compared with a
Python loop of the same step: the stop step, the kept samples and their steps must be the
loop's, whatever the chunk size, single or batched."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.drive.prepare.schema import Values, takes_values

# -- an optimiser: plain gradient descent, the gradient norm as aux --------------------------------

TARGET = jnp.asarray([3.0, -1.0, 0.5, 2.0], jnp.float32)
TOL = 1e-4


def loss(x):
    return jnp.sum((x - TARGET) ** 2) + 0.1 * jnp.sum((x - TARGET) ** 4)


def descend(x):
    g = jax.grad(loss)(x)
    return x - 0.05 * g, {"gnorm": jnp.linalg.norm(g)}


X0 = jnp.zeros(4, jnp.float32)


def plain_descent(x, max_steps=2000):
    """The step in a Python loop: every state, every gradient norm, and the first step whose
    gradient norm is below ``TOL`` (the state it produced)."""
    f = jax.jit(descend)
    xs, norms = [np.asarray(x)], []
    for k in range(max_steps):
        x, aux = f(x)
        xs.append(np.asarray(x))
        norms.append(float(aux["gnorm"]))
        if aux["gnorm"] < TOL:
            return {"stop": k + 1, "x": np.array(xs), "gnorm": np.array(norms)}
    raise AssertionError("the plain loop never converged")


@pytest.mark.parametrize("chunk", [None, 1, 7])
def test_until_on_the_gradient_norm_stops_where_a_python_loop_does(chunk):
    ref = plain_descent(X0)
    run = jl.run(descend, X0, 2000, has_aux=True, until=lambda s, v: v["aux/gnorm"] < TOL, chunk=chunk,
                 record={"x": lambda s: s}, progress=False)
    assert ref["stop"] > 20  # a real descent, not a first-step stop
    assert run.stop_reason == "until" and run.steps_done == ref["stop"]
    assert run.trajectory.steps("aux/gnorm")[-1] == ref["stop"]
    np.testing.assert_allclose(run.trajectory["aux/gnorm"], ref["gnorm"], rtol=1e-5)
    assert run.trajectory["aux/gnorm"][-1] < TOL <= run.trajectory["aux/gnorm"][-2]
    np.testing.assert_allclose(run.trajectory["x"], ref["x"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run.state, ref["x"][-1], rtol=1e-5, atol=1e-6)


def test_chunk_sizes_give_bit_identical_stops_and_records():
    runs = [jl.run(descend, X0, 2000, has_aux=True, until=lambda s, v: v["aux/gnorm"] < TOL, chunk=c,
                   record={"x": lambda s: s}, progress=False) for c in (None, 1, 7, 3)]
    for r in runs[1:]:
        assert r.steps_done == runs[0].steps_done
        np.testing.assert_array_equal(r.trajectory["x"], runs[0].trajectory["x"])
        np.testing.assert_array_equal(r.trajectory["aux/gnorm"], runs[0].trajectory["aux/gnorm"])
        np.testing.assert_array_equal(r.state, runs[0].state)


def test_a_logged_value_by_its_record_path():
    """``jl.log("residual", ...)`` inside the step is ``v["log/residual"]``, recorded or not."""
    def step(x):
        g = jax.grad(loss)(x)
        jl.log("residual", jnp.max(jnp.abs(g)))
        return x - 0.05 * g

    f = jax.jit(jl.spool(step))
    x, stop = X0, None
    for k in range(2000):
        x, logs = f(x)
        if logs["residual"] < TOL:
            stop = k + 1
            break
    for logs in (None, {"residual": False}):  # recorded every step, or left out: the predicate sees it either way
        run = jl.run(step, X0, 2000, until=lambda s, v: v["log/residual"] < TOL, logs=logs, chunk=7, progress=False)
        assert run.steps_done == stop and run.stop_reason == "until"
        np.testing.assert_allclose(run.state, x, rtol=1e-5, atol=1e-6)
        assert ("log/residual" in run.trajectory.records) == (logs is None)


def test_a_values_predicate_is_first_asked_about_step_one():
    """No step computed the initial state: ``until=`` that takes values is not checked on it
    (a state predicate is), and ``when=`` that takes values does not keep its frame."""
    always = jl.run(descend, X0, 10, has_aux=True, until=lambda s, v: v["aux/gnorm"] >= 0, progress=False)
    assert always.steps_done == 1 and always.stop_reason == "until"
    on_state = jl.run(descend, X0, 10, has_aux=True, until=lambda s: jnp.all(s == s), progress=False)
    assert on_state.steps_done == 0
    kept = jl.run(descend, X0, 5, has_aux=True, progress=False,
                  record={"x": jl.Record(lambda s: s, when=lambda s, v: v["aux/gnorm"] >= 0)})
    np.testing.assert_array_equal(kept.trajectory.steps("x"), np.arange(1, 6))


# -- an accept/reject Metropolis step: when= keeps only accepted samples --------------------------

KEY = jax.random.key(11)


def log_density(x):
    return -0.5 * jnp.sum(x ** 2) - 0.25 * jnp.sum(x ** 4)


def metropolis(key, x):
    k1, k2 = jax.random.split(key)
    prop = x + 0.9 * jax.random.normal(k1, x.shape)
    accept = jnp.log(jax.random.uniform(k2)) < log_density(prop) - log_density(x)
    return jnp.where(accept, prop, x), {"is_accepted": accept}


def plain_chain(x, steps, key=KEY):
    """The chain in a Python loop with the key ``jl.run`` gives step ``k``: the accepted samples
    and the steps that produced them."""
    f = jax.jit(metropolis)
    kept, kept_steps = [], []
    for k in range(steps):
        x, aux = f(jax.random.fold_in(key, k), x)
        if bool(aux["is_accepted"]):
            kept.append(np.asarray(x))
            kept_steps.append(k + 1)
    return np.array(kept), np.array(kept_steps), np.asarray(x)


ACCEPTED = {"sample": jl.Record(lambda s: s, when=lambda s, v: v["aux/is_accepted"])}


@pytest.mark.parametrize("chunk", [None, 1, 7])
def test_when_keeps_exactly_the_accepted_samples_of_a_python_loop(chunk):
    x0 = jnp.asarray([0.3, -0.2], jnp.float32)
    kept, kept_steps, last = plain_chain(x0, 200)
    run = jl.run(metropolis, x0, 200, key=KEY, has_aux=True, aux=[], record=ACCEPTED, chunk=chunk, progress=False)
    assert 20 < len(kept_steps) < 190  # some proposals rejected, many accepted
    np.testing.assert_array_equal(run.trajectory.steps("sample"), kept_steps)
    np.testing.assert_allclose(run.trajectory["sample"], kept, rtol=1e-6)
    np.testing.assert_allclose(run.state, last, rtol=1e-6)
    assert run.trajectory.records == ("sample",)
    assert set(run.cost.views) == {"sample"} and run.cost.flops > 0


@pytest.mark.parametrize("chunk", [None, 1, 7])
def test_a_sparse_schedule_with_a_values_when_keeps_accepted_scheduled_steps(chunk):
    """Only every 5th step is a candidate, and of those only the accepted ones are kept (the
    program's loop that steps between scheduled steps, then records there)."""
    x0 = jnp.asarray([0.3, -0.2], jnp.float32)
    kept, kept_steps, _ = plain_chain(x0, 200)
    on_schedule = kept_steps % 5 == 0
    run = jl.run(metropolis, x0, 200, key=KEY, has_aux=True, aux=[], chunk=chunk, progress=False,
                 record={"sample": jl.Record(lambda s: s, every=5, when=lambda s, v: v["aux/is_accepted"])})
    assert 5 < on_schedule.sum() < 40
    np.testing.assert_array_equal(run.trajectory.steps("sample"), kept_steps[on_schedule])
    np.testing.assert_allclose(run.trajectory["sample"], kept[on_schedule], rtol=1e-6)


def test_batched_chains_keep_their_own_accepted_samples(tmp_path):
    """One bool per system: each chain's accepted samples read back as that chain's own sequence."""
    n = 3
    x0 = jnp.asarray([[0.3, -0.2], [1.0, 1.0], [-0.5, 0.0]], jnp.float32)
    step = jax.vmap(metropolis)
    runs = [jl.run(step, x0, 120, key=KEY, batched=True, has_aux=True, record=ACCEPTED, chunk=c, progress=False,
                   sinks=[jl.HDF5Writer(tmp_path / f"chains{c}.h5")]) for c in (None, 1, 7)]
    for i in range(n):
        f = jax.jit(metropolis)
        x, kept, kept_steps = x0[i], [], []
        for k in range(120):
            x, aux = f(jax.random.fold_in(jax.random.fold_in(KEY, k), i), x)
            if bool(aux["is_accepted"]):
                kept.append(np.asarray(x))
                kept_steps.append(k + 1)
        for run in runs:
            mine = run.trajectory.system(i)
            np.testing.assert_array_equal(mine.steps("sample"), kept_steps, err_msg=f"chain {i}")
            np.testing.assert_allclose(mine["sample"], np.array(kept), rtol=1e-6, err_msg=f"chain {i}")
            np.testing.assert_array_equal(mine["aux/is_accepted"], np.isin(np.arange(1, 121), kept_steps))
    for run in runs[1:]:  # bit-identical whatever the chunk size
        np.testing.assert_array_equal(run.trajectory["sample"], runs[0].trajectory["sample"])
        np.testing.assert_array_equal(run.trajectory.steps("sample"), runs[0].trajectory.steps("sample"))
        np.testing.assert_array_equal(run.trajectory["when/sample"], runs[0].trajectory["when/sample"])
    assert set(runs[0].cost.views) == {"sample"}  # the view's cost; the flags come from the step's values
    flags = runs[0].trajectory["when/sample"]
    assert flags.shape[1] == n and not flags.all() and flags.any(axis=1).all()
    loaded = jl.load(tmp_path / "chains1.h5")
    np.testing.assert_array_equal(loaded["when/sample"], flags)
    np.testing.assert_array_equal(loaded["sample"], runs[0].trajectory["sample"])


def test_batched_until_on_per_system_gradient_norms():
    """Each system stops at the step its own gradient norm fell below the tolerance."""
    starts = jnp.stack([X0, X0 + 2.0, TARGET + 0.01])
    step = jax.vmap(descend)
    stops = [plain_descent(starts[i])["stop"] for i in range(3)]
    assert len(set(stops)) == 3
    for chunk in (None, 1, 7):
        run = jl.run(step, starts, 2000, batched=True, has_aux=True, chunk=chunk, progress=False,
                     until=lambda s, v: v["aux/gnorm"] < TOL)
        assert list(run.systems_done) == stops and run.steps_done == max(stops)
        if chunk is None:
            first = run
        np.testing.assert_array_equal(run.state, first.state)  # bit-identical whatever the chunk size
        for i in range(3):
            np.testing.assert_allclose(run.state[i], plain_descent(starts[i])["x"][-1], rtol=1e-5, atol=1e-6)


# -- mistakes, and what a predicate is -------------------------------------------------------------

def test_a_missing_key_names_it_the_predicate_and_the_keys_there_are():
    def until_typo(s, v):
        return v["gnorm"] < TOL

    with pytest.raises(jl.JaxlogError, match=r"until= .*until_typo: the step computed no value 'gnorm' "
                                             r"\(values are keyed by record path: 'aux/gnorm' or 'log/gnorm'\); "
                                             r"it has: 'aux/gnorm'"):
        jl.run(descend, X0, 10, has_aux=True, until=until_typo, progress=False)
    with pytest.raises(jl.JaxlogError, match=r"record 'sample': when= .*<lambda>: the step computed no value "
                                             r"'aux/accepted'; it has: 'aux/is_accepted'"):
        jl.run(metropolis, X0, 10, key=KEY, has_aux=True, progress=False,
               record={"sample": jl.Record(lambda s: s, when=lambda s, v: v["aux/accepted"])})
    with pytest.raises(jl.JaxlogError, match=r"it has: none: the step returns no aux"):
        jl.run(lambda s: s + 1.0, X0, 10, until=lambda s, v: v["aux/gnorm"] < 1, progress=False)


def test_a_values_when_of_the_wrong_type_is_named_before_the_run(tmp_path):
    with pytest.raises(jl.JaxlogError, match=r"record 'sample': when= must return one bool.*float32"):
        jl.run(descend, X0, 10, has_aux=True, progress=False, sinks=[jl.HDF5Writer(tmp_path / "t.h5")],
               record={"sample": jl.Record(lambda s: s, when=lambda s, v: v["aux/gnorm"])})
    assert not (tmp_path / "t.h5").exists()


def test_arity_is_read_from_the_signature():
    assert takes_values(lambda s, v: True, "until=")
    assert not takes_values(lambda s: True, "until=")
    assert not takes_values(lambda s, tol=1e-3: True, "until=")  # a default-capturing lambda stays a state predicate
    assert not takes_values(lambda *a: True, "until=")

    class Pred:
        def __call__(self, s, v):
            return True
    assert takes_values(Pred(), "until=")
    with pytest.raises(jl.JaxlogError, match=r"until= .*requires 3 arguments \(s, v, w\)"):
        jl.run(descend, X0, 3, has_aux=True, until=lambda s, v, w: True, progress=False)


def test_values_is_a_read_only_mapping():
    v = Values({"aux/a": 1, "log/b": 2}, "until=")
    assert dict(v) == {"aux/a": 1, "log/b": 2} and len(v) == 2 and "aux/a" in v and "a" not in v
    assert v.get("a", 7) == 7 and sorted(v) == ["aux/a", "log/b"]
    with pytest.raises(TypeError):
        v["aux/a"] = 3  # type: ignore[index]
    leaves, tree = jax.tree_util.tree_flatten(v)
    assert leaves == [1, 2] and dict(jax.tree_util.tree_unflatten(tree, [3, 4])) == {"aux/a": 3, "log/b": 4}


def test_a_recorder_refuses_a_when_that_takes_values():
    with pytest.raises(jl.JaxlogError, match=r"record 'x': when= takes \(state, values\), but a Recorder sees only"):
        jl.Recorder({"x": jl.Record(lambda s: s, when=lambda s, v: v["aux/ok"])})


# -- program identity --------------------------------------------------------------------------------

def make_until(tol):
    return lambda s, v: v["aux/gnorm"] < tol


def test_equal_values_predicates_share_a_program_others_never_do():
    runs = [jl.run(descend, X0, 2000, has_aux=True, until=make_until(t), chunk=7, progress=False)
            for t in (1e-3, 1e-3, 1e-4, 1e-3)]
    # a tolerance is a constant of the predicate's program: the same one again compiles nothing
    assert [r.timings.compiles for r in runs] == [1, 0, 1, 0]
    assert runs[0].steps_done == runs[1].steps_done == runs[3].steps_done < runs[2].steps_done
    # a state predicate and a values predicate are two programs, with their own stops
    by_state = jl.run(descend, X0, 2000, has_aux=True, until=lambda s: loss(s) < 1e-3, chunk=7, progress=False)
    by_values = jl.run(descend, X0, 2000, has_aux=True, until=lambda s, v: loss(s) < 1e-3, chunk=7, progress=False)
    assert by_state.timings.compiles == 1 and by_values.timings.compiles == 1
    assert by_state.steps_done == by_values.steps_done  # the same test of the state, asked after each step
    ref = plain_descent(X0)
    assert runs[2].steps_done == ref["stop"]


def test_resume_continues_a_values_until_and_refuses_another(tmp_path):
    """A run stopped by Ctrl-C resumes to the stop a run without the interruption reaches; a
    resume whose predicate tests another value is refused (its program differs)."""
    from test_checkpoint import _StopAt

    ref = plain_descent(X0)
    path = tmp_path / "t.h5"
    common = {"has_aux": True, "checkpoint": jl.every(5), "chunk": 4}
    with pytest.raises(KeyboardInterrupt):
        jl.run(descend, X0, 2000, until=make_until(TOL), sinks=[jl.HDF5Writer(path)], progress=_StopAt(2000, 13),
               **common)
    with pytest.raises(jl.JaxlogError, match=r"the until's program differs from the one that wrote the checkpoint"):
        jl.resume(path, descend, 2000, until=make_until(10 * TOL), progress=False, **common)
    run = jl.resume(path, descend, 2000, until=make_until(TOL), progress=False, **common)
    assert run.steps_done == ref["stop"] and run.stop_reason == "until"
    traj = jl.load(path)
    np.testing.assert_array_equal(traj.steps("aux/gnorm"), np.arange(1, ref["stop"] + 1))
    np.testing.assert_allclose(traj["aux/gnorm"], ref["gnorm"], rtol=1e-5)
