"""One compiled chunk program per distinct program, not per function object: runs whose step,
views and predicates compute the same share one executable whatever Python objects they were
built from, and runs that differ in anything that changes results never do (each compared with
the same computation done plainly). A resume continues only the program that wrote the file."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl
from test_checkpoint import _StopAt  # Ctrl-C once the run has written a given step

N = 6
S0 = {"x": jnp.linspace(-1.0, 1.0, N, dtype=jnp.float32), "v": jnp.zeros(N, jnp.float32)}


def make_step(dt=0.05, box=None, fn=jnp.sin):
    """A factory as examples/ use them: every call a new closure, capturing a Python scalar and an
    array (``box``)."""
    box = jnp.full(N, 1.0, jnp.float32) if box is None else box

    def step(s):
        return {"x": s["x"] + dt * s["v"], "v": s["v"] - dt * fn(s["x"]) * box}
    return step


def make_views():
    return {"e": lambda s: jnp.sum(s["v"] ** 2) + jnp.sum(1.0 - jnp.cos(s["x"])),
            "x": jl.Record(lambda s: s["x"], every=10)}


def plain(step, state, steps):
    """The step applied in a Python loop: every state, stacked per leaf."""
    f = jax.jit(step)
    out = [state]
    for _ in range(steps):
        state = f(state)
        out.append(state)
    return {k: np.stack([np.asarray(s[k]) for s in out]) for k in state}


def close(actual, plain_loop):
    """Equal to the plain loop up to how XLA fuses a loop (the last bit or so); kernels compared
    here differ far more."""
    np.testing.assert_allclose(np.asarray(actual), np.asarray(plain_loop), rtol=2e-6, atol=1e-7)


def go(step, steps=40, **kw):
    kw.setdefault("record", make_views())
    kw.setdefault("progress", False)
    return jl.run(step, S0, steps, **kw)


def test_runs_from_a_factory_compile_once_and_match_a_plain_loop():
    ref = plain(make_step(dt=0.0371), S0, 40)
    runs = [go(make_step(dt=0.0371), chunk=[None, 1, 7, 40, 3][i % 5]) for i in range(10)]
    assert sum(r.timings.compiles for r in runs) == 1, [r.timings.compiles for r in runs]
    for r in runs:  # bit-identical to one another whatever the chunk size, and the plain loop's values
        np.testing.assert_array_equal(r.trajectory["x"], runs[0].trajectory["x"])
        np.testing.assert_array_equal(r.trajectory["e"], runs[0].trajectory["e"])
        np.testing.assert_array_equal(r.state["v"], runs[0].state["v"])
        close(r.trajectory["x"], ref["x"][::10])
        close(r.state["v"], ref["v"][-1])
    e = np.sum(ref["v"] ** 2, axis=1) + np.sum(1.0 - np.cos(ref["x"]), axis=1)
    np.testing.assert_allclose(runs[0].trajectory["e"], e, rtol=1e-6)


def test_captured_arrays_are_arguments_only_their_values_differ():
    """A captured box of other values reuses the program (hoisted into its arguments), with the
    run's own values: each run agrees with the plain loop of its own kernel."""
    go(make_step(dt=0.0372))
    for box in (jnp.full(N, 2.0, jnp.float32), np.full(N, -0.5, np.float32)):  # a numpy array too
        r = go(make_step(dt=0.0372, box=box))
        assert r.timings.compiles == 0
        ref = plain(make_step(dt=0.0372, box=box), S0, 40)
        close(r.trajectory["x"], ref["x"][::10])
        close(r.state["v"], ref["v"][-1])


BOX = jnp.full(N, 1.1, jnp.float32)


@pytest.mark.parametrize("other", [
    pytest.param(lambda: make_step(dt=0.0374, box=BOX), id="another captured Python scalar"),
    pytest.param(lambda: make_step(dt=0.0373, box=BOX, fn=jnp.cos), id="another jnp function"),
    pytest.param(lambda: make_step(dt=0.0373, box=jnp.full((1,), 1.2, jnp.float32)), id="another captured array shape"),
    pytest.param(lambda: make_step(dt=0.0373, box=jnp.full(N, 1.1, jnp.float16)), id="another captured array dtype"),
    pytest.param(lambda: (lambda s: jax.tree.map(lambda x: x + jnp.float32(1e-5), make_step(dt=0.0373, box=BOX)(s))),
                 id="another constant baked into the program"),
])
def test_near_identical_kernels_never_share_a_program(other):
    """Each differs from the base kernel in one thing that changes its results: it compiles a
    program of its own and agrees with the plain loop of its own step."""
    base = go(make_step(dt=0.0373, box=BOX))
    kernel = other()
    r = go(kernel)
    assert r.timings.compiles == 1
    ref = plain(kernel, S0, 40)
    close(r.trajectory["x"], ref["x"][::10])
    close(r.state["v"], ref["v"][-1])
    assert np.max(np.abs(np.asarray(r.state["v"]) - np.asarray(base.state["v"]))) > 1e-5


def test_custom_derivative_rules_are_part_of_the_program():
    """Two steps whose energies have the same primal but different custom_jvp rules: the force
    (its gradient) differs, and so must the programs."""
    def make(slope):
        @jax.custom_jvp
        def u(x):
            return jnp.sum(jnp.sin(x))

        @u.defjvp
        def u_jvp(p, t):
            return u(p[0]), jnp.sum(slope * t[0])

        return lambda s: {"x": s["x"] - 0.1 * jax.grad(u)(s["x"]), "v": s["v"]}

    a, b = go(make(1.0)), go(make(3.0))
    assert b.timings.compiles == 1
    np.testing.assert_allclose(np.asarray(a.state["x"]), np.asarray(S0["x"]) - 40 * 0.1, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(b.state["x"]), np.asarray(S0["x"]) - 40 * 0.3, rtol=1e-5)


def test_inline_lambdas_partials_and_nested_jit_share_or_not_as_they_compute():
    def kernel(k, s):
        return {"x": s["x"] * k, "v": s["v"]}

    k1, k2 = jnp.full(N, 0.99, jnp.float32), jnp.full(N, 0.98, jnp.float32)
    a = go(functools.partial(kernel, k1))
    b = go(functools.partial(kernel, k2))  # the partial's array argument: hoisted
    assert b.timings.compiles == 0
    c = go(functools.partial(kernel, jnp.float32(0.95)))  # a scalar stays a constant of the program
    d = go(functools.partial(kernel, jnp.float32(0.94)))
    assert c.timings.compiles == d.timings.compiles == 1
    np.testing.assert_allclose(np.asarray(d.state["x"]), np.asarray(S0["x"]) * 0.94 ** 40, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(b.state["x"]), np.asarray(S0["x"]) * 0.98 ** 40, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(a.state["x"]), np.asarray(S0["x"]) * 0.99 ** 40, rtol=1e-5)
    # a jitted closure keeps its captured array inside: its value is part of the program
    j1 = go(jax.jit(lambda s: {"x": s["x"] * jnp.full(N, 0.97), "v": s["v"]}))
    j2 = go(jax.jit(lambda s: {"x": s["x"] * jnp.full(N, 0.96), "v": s["v"]}))
    assert j2.timings.compiles == 1
    np.testing.assert_allclose(np.asarray(j1.state["x"]), np.asarray(S0["x"]) * 0.97 ** 40, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(j2.state["x"]), np.asarray(S0["x"]) * 0.96 ** 40, rtol=1e-5)


def test_one_view_twice_then_two_views_of_one_program_with_other_arrays():
    """The constants are bound per place in the plan: a run whose two records share one view
    object, then a run whose two views are one program with different captured arrays."""
    def view(scale):
        w = jnp.full(N, scale, jnp.float32)
        return lambda s: s["x"] * w

    step = make_step(dt=0.0375)
    v = view(1.0)
    go(step, record={"a": v, "b": v})
    r = go(step, record={"a": view(1.0), "b": view(2.0)})
    assert r.timings.compiles == 0
    ref = plain(step, S0, 40)["x"]
    close(r.trajectory["a"], ref)
    close(r.trajectory["b"], ref * 2.0)


def test_predicates_keys_aux_and_logs_from_factories():
    def make(threshold, scale):
        w = jnp.full(N, scale, jnp.float32)

        def step(key, s):
            jl.log("kick", jnp.sum(w))
            x = s["x"] + 0.01 * w * jax.random.normal(key, s["x"].shape)
            return {"x": x, "v": s["v"] + 1.0}, {"mean": jnp.mean(x)}
        return step, (lambda s: s["v"][0] >= threshold), jl.Record(lambda s: s["x"] * w, when=lambda s: s["v"][0] > 2)

    runs = []
    for threshold, scale in ((5.0, 1.0), (5.0, 1.0), (7.0, 1.0), (5.0, 2.0)):
        step, until, rec = make(threshold, scale)
        runs.append(jl.run(step, S0, 20, key=jax.random.key(3), has_aux=True, until=until, record={"w": rec},
                           progress=False))
    assert [r.timings.compiles for r in runs] == [1, 0, 1, 1]
    assert [r.steps_done for r in runs] == [5, 5, 7, 5]
    for r, scale in zip(runs, (1.0, 1.0, 1.0, 2.0)):
        np.testing.assert_array_equal(r.trajectory["log/kick"], np.full(r.steps_done, N * scale, np.float32))
        np.testing.assert_array_equal(r.trajectory.steps("w"), np.arange(3, r.steps_done + 1))
        x = np.asarray(r.state["x"])  # the last kept row is the final state's view
        np.testing.assert_array_equal(r.trajectory["w"][-1], x * scale)
        np.testing.assert_allclose(r.trajectory["aux/mean"][-1], x.mean(), rtol=1e-6)
    np.testing.assert_array_equal(runs[0].state["x"], runs[1].state["x"])
    assert runs[0].compiled_chunk() is not None and runs[3].compiled_chunk() is not None


def test_logs_with_other_names_are_other_programs():
    def make(name):
        def step(s):
            jl.log(name, s["x"][0])
            return make_step(dt=0.0376)(s)
        return step

    a, b = go(make("first"), record={}), go(make("second"), record={})
    assert b.timings.compiles == 1
    assert "log/first" in a.trajectory.records and "log/second" in b.trajectory.records
    np.testing.assert_array_equal(a.trajectory["log/first"], b.trajectory["log/second"])


def test_a_batched_keyed_factory_step_with_a_donated_state():
    n_sys = 4
    state = {"x": jnp.zeros((n_sys, 70_000), jnp.float32)}  # over 1 MiB: donated

    def make(scale):
        w = jnp.full((70_000,), scale, jnp.float32)
        return lambda keys, s: {"x": s["x"] + w * jax.vmap(lambda k: jax.random.uniform(k))(keys)[:, None]}

    runs = [jl.run(make(scale), state, 6, key=jax.random.key(5), batched=True, chunk=c,
                   record={"m": lambda s: s["x"][:, :2]}, progress=False) for scale, c in ((1.0, 2), (1.0, 6), (3.0, 4))]
    assert [r.timings.compiles for r in runs] == [1, 0, 0]
    np.testing.assert_array_equal(runs[0].trajectory["m"], runs[1].trajectory["m"])
    np.testing.assert_allclose(runs[2].trajectory["m"], 3.0 * runs[0].trajectory["m"], rtol=1e-6)
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(state))


# ---------------------------------------------------------------- resume: the same physics only


def _interrupted(path, step, steps=60, stop=25):
    with pytest.raises(KeyboardInterrupt):
        jl.run(step, S0, steps, record={"x": lambda s: s["x"]}, chunk=10, checkpoint=jl.every(10),
               sinks=[jl.HDF5Writer(path)], progress=_StopAt(steps, stop))


def test_resume_refuses_another_physics_and_continues_the_same_bit_for_bit(tmp_path):
    def make(dt):
        def step(s):
            return {"x": s["x"] + dt * s["v"], "v": s["v"] - dt * s["x"]}
        return step

    full = tmp_path / "full.h5"
    jl.run(make(0.07), S0, 60, record={"x": lambda s: s["x"]}, chunk=10, sinks=[jl.HDF5Writer(full)], progress=False)
    path = tmp_path / "t.h5"
    _interrupted(path, make(0.07))
    with pytest.raises(jl.JaxlogError, match=r"the step's program differs from the one that wrote the checkpoint"):
        jl.resume(path, make(0.05), 60, record={"x": lambda s: s["x"]}, progress=False)
    with pytest.raises(jl.JaxlogError, match=r"the record x's program differs"):
        jl.resume(path, make(0.07), 60, record={"x": lambda s: s["x"] * 1.0}, progress=False)
    assert jl.load(path).status == "stopped"  # refusals leave the file as it was
    jl.resume(path, make(0.07), 60, record={"x": lambda s: s["x"]}, chunk=7, progress=False)
    a, b = jl.load(path), jl.load(full)
    np.testing.assert_array_equal(a["x"], b["x"])
    np.testing.assert_array_equal(a.steps("x"), np.arange(61))


def test_resume_refuses_another_lambda_of_the_same_module(tmp_path):
    first = lambda s: {"x": s["x"] * 0.99, "v": s["v"]}  # noqa: E731
    second = lambda s: {"x": s["x"] * 0.98, "v": s["v"]}  # noqa: E731
    path = tmp_path / "t.h5"
    _interrupted(path, first)
    with pytest.raises(jl.JaxlogError, match=r"the step's program differs .*traced computation"):
        jl.resume(path, second, 60, record={"x": lambda s: s["x"]}, progress=False)
    # the same computation with a captured array of other values: named as such
    path2 = tmp_path / "u.h5"
    w1, w2 = jnp.full(N, 0.99, jnp.float32), jnp.full(N, 0.98, jnp.float32)
    _interrupted(path2, lambda s: {"x": s["x"] * w1, "v": s["v"]})
    with pytest.raises(jl.JaxlogError, match=r"the arrays it captures hold other values"):
        jl.resume(path2, lambda s: {"x": s["x"] * w2, "v": s["v"]}, 60, record={"x": lambda s: s["x"]},
                  progress=False)


def test_one_keyed_step_batched_and_not():
    """The same step object, run with one key and with one key per system: two programs, each
    traced for the key it gets."""
    state = jnp.zeros((3, 2), jnp.float32)

    def step(key, s):  # a key of shape () or one per system: (3,)
        return s + (jax.random.key_data(key)[..., :1] % 7).astype(jnp.float32)

    one = jl.run(step, state, 4, key=jax.random.key(0), record={"s": lambda s: s}, progress=False)
    per = jl.run(step, state, 4, key=jax.random.key(0), batched=True, record={"s": lambda s: s}, progress=False)
    ref_one, ref_per = np.zeros((3, 2), np.float32), np.zeros((3, 2), np.float32)
    for k in range(4):
        kk = jax.random.fold_in(jax.random.key(0), k)
        ref_one += np.asarray(jax.random.key_data(kk))[0] % 7
        for sys in range(3):
            ref_per[sys] += np.asarray(jax.random.key_data(jax.random.fold_in(kk, sys)))[0] % 7
    np.testing.assert_array_equal(one.state, ref_one)
    np.testing.assert_array_equal(per.state, ref_per)
    assert not np.array_equal(ref_one, ref_per)
