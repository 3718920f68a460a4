"""jl.log / jl.spool / jl.tap: each semantic against the same values threaded out by hand, bit for bit.

The references below return the logged values explicitly (scan ``ys``, while-loop buffers, cond
outputs), compiled with ``jax.jit`` like ``jl.spool`` compiles, and the comparisons are exact.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pytest_jaxlog as jl
from pytest_jaxlog.logs import collect, has_logs

eq = np.testing.assert_array_equal
X = jnp.linspace(-1.0, 1.0, 8, dtype=jnp.float32)


def energy(x):
    return jnp.sum(0.5 * x**2 - jnp.cos(x))


def force(x):
    return -x - jnp.sin(x)


def line_of(fn, text):
    """``test_log.py:<line>`` of the first line of ``fn``'s source containing ``text``."""
    import inspect

    lines, start = inspect.getsourcelines(fn)
    for i, line in enumerate(lines):
        if text in line:
            return f"test_log.py:{start + i}"
    raise AssertionError(text)


# --------------------------------------------------------------------------------------------
# top level, dict form, indices
# --------------------------------------------------------------------------------------------


def test_top_level_value_and_return():
    def f(x):
        e = jl.log("e", energy(x))
        return x + 0.1 * force(x), e

    out, logs = jl.spool(f)(X)
    ref = jax.jit(lambda x: (x + 0.1 * force(x), energy(x)))(X)
    eq(out[0], ref[0])
    eq(out[1], ref[1])
    assert set(logs) == {"e"}
    eq(logs["e"], ref[1])


def test_dict_form_pytree_values_and_indices():
    def f(x, k):
        jl.log({"fmax": jnp.max(jnp.abs(force(x))), "pair": {"a": x[0], "b": x[:2]}}, step=k)
        return x

    _, logs = jl.spool(f)(X, 7)
    assert set(logs) == {"fmax", "pair"}
    eq(logs["fmax"]["value"], jnp.max(jnp.abs(force(X))))
    eq(logs["fmax"]["step"], 7)
    eq(logs["pair"]["value"]["a"], X[0])
    eq(logs["pair"]["value"]["b"], X[:2])
    eq(logs["pair"]["step"], 7)


def test_same_name_twice_is_stacked_in_program_order():
    def verlet(x):  # force evaluated twice per step, logging inside
        def fmax(y):
            f = force(y)
            jl.log("fmax", jnp.max(jnp.abs(f)))
            return f

        v = 0.05 * fmax(x)
        x = x + 0.1 * v
        return x + 0.05 * fmax(x)

    _, logs = jl.spool(verlet)(X)
    x1 = X + 0.1 * (0.05 * force(X))
    ref = jnp.stack([jnp.max(jnp.abs(force(X))), jnp.max(jnp.abs(force(x1)))])
    eq(logs["fmax"], jax.jit(lambda: ref)())


def test_no_logs_returns_empty_and_same_output():
    out, logs = jl.spool(lambda x: x * 2)(X)
    assert logs == {}
    eq(out, X * 2)
    assert not has_logs(lambda x: x * 2, X)
    assert has_logs(lambda x: jl.log("a", x), X)


def test_keys_are_logged_as_key_data():
    _, logs = jl.spool(lambda k: jl.log("k", k))(jax.random.key(3))
    eq(logs["k"], jax.random.key_data(jax.random.key(3)))


# --------------------------------------------------------------------------------------------
# scan / fori_loop
# --------------------------------------------------------------------------------------------


def _md(x, n):
    def step(x, i):
        f = force(x)
        jl.log("fmax", jnp.max(jnp.abs(f)), step=i)
        return x + 0.01 * f, None

    return lax.scan(step, x, jnp.arange(n))[0]


def _md_ref(x, n):
    def step(x, i):
        f = force(x)
        return x + 0.01 * f, (jnp.max(jnp.abs(f)), i)

    return lax.scan(step, x, jnp.arange(n))


def test_scan_stacks_along_inner_axis():
    out, logs = jl.spool(functools.partial(_md, n=5))(X)
    ref_x, (ref_f, ref_i) = jax.jit(functools.partial(_md_ref, n=5))(X)
    eq(out, ref_x)
    assert logs["fmax"]["value"].shape == (5,)
    eq(logs["fmax"]["value"], ref_f)
    eq(logs["fmax"]["step"], ref_i)


def test_reverse_scan_keeps_xs_order():
    def f(xs):
        def body(c, x):
            c = c * 0.5 + x
            jl.log("c", c)
            return c, None

        return lax.scan(body, 0.0, xs, reverse=True)[0]

    def ref(xs):
        def body(c, x):
            c = c * 0.5 + x
            return c, c

        return lax.scan(body, 0.0, xs, reverse=True)

    out, logs = jl.spool(f)(X)
    r = jax.jit(ref)(X)
    eq(out, r[0])
    eq(logs["c"], r[1])


def test_fori_loop_static_trip_count():
    def f(x):
        def body(i, x):
            jl.log("e", energy(x), i=i)
            return x + 0.01 * force(x)

        return lax.fori_loop(0, 4, body, x)

    def ref(x):
        def body(x, i):
            return x + 0.01 * force(x), energy(x)

        return lax.scan(body, x, jnp.arange(4))

    out, logs = jl.spool(f)(X)
    r = jax.jit(ref)(X)
    eq(out, r[0])
    eq(logs["e"]["value"], r[1])
    eq(logs["e"]["i"], np.arange(4))


def test_nested_scan_lox_example():
    def f(x):
        def outer(x, _):
            def inner(x, _):
                jl.log("e", energy(x))
                return x + 0.01 * force(x), None

            x = lax.scan(inner, x, None, length=3)[0]
            jl.log("x", x)
            return x, None

        return lax.scan(outer, x, None, length=4)[0]

    def ref(x):
        def outer(x, _):
            def inner(x, _):
                return x + 0.01 * force(x), energy(x)

            x, es = lax.scan(inner, x, None, length=3)
            return x, (es, x)

        return lax.scan(outer, x, None, length=4)

    out, logs = jl.spool(f)(X)
    r = jax.jit(ref)(X)
    eq(out, r[0])
    assert logs["e"].shape == (4, 3)
    eq(logs["e"], r[1][0])
    eq(logs["x"], r[1][1])


# --------------------------------------------------------------------------------------------
# while_loop
# --------------------------------------------------------------------------------------------


def _relax(x, tol, capacity=None):
    def cond(c):
        return (c[1] > tol) & (c[2] < 50)

    def body(c):
        x, _, i = c
        g = force(x)
        gn = jnp.sqrt(jnp.sum(g * g))
        jl.log("gnorm", gn, capacity=capacity, it=i)
        return x + 0.3 * g, gn, i + 1

    return lax.while_loop(cond, body, (x, jnp.float32(jnp.inf), 0))


def _relax_ref(x, tol, k):
    def cond(c):
        return (c[0][1] > tol) & (c[0][2] < 50)

    def body(c):
        (x, _, i), buf, its = c
        g = force(x)
        gn = jnp.sqrt(jnp.sum(g * g))
        slot = jnp.minimum(i, k)
        return ((x + 0.3 * g, gn, i + 1), buf.at[slot].set(gn), its.at[slot].set(i))

    st, buf, its = lax.while_loop(cond, body, ((x, jnp.float32(jnp.inf), 0), jnp.zeros(k + 1), jnp.zeros(k + 1, int)))
    return st, buf[:k], its[:k], st[2]


@pytest.mark.parametrize("k", [32, 4])
def test_while_loop_capacity_count_and_overflow(k):
    out, logs = jl.spool(functools.partial(_relax, capacity=k))(X, 1e-3)
    st, buf, its, n = jax.jit(functools.partial(_relax_ref, k=k))(X, 1e-3)
    for a, b in zip(out, st):
        eq(a, b)
    rec = logs["gnorm"]
    assert rec["value"].shape == (k,)
    eq(rec["value"], buf)
    eq(rec["it"], its)
    eq(rec["count"], n)
    assert int(n) > 4  # the k=4 case really overflows
    assert bool(rec["overflow"]) == (int(n) > k)


def test_while_loop_default_capacity_from_spool():
    _, logs = jl.spool(_relax, capacity=32)(X, 1e-3)
    _, buf, _, n = jax.jit(functools.partial(_relax_ref, k=32))(X, 1e-3)
    eq(logs["gnorm"]["value"], buf)
    eq(logs["gnorm"]["count"], n)


def test_while_in_scan_and_nested_while_counts():
    def f(x):
        def step(x, _):
            return _relax(x, 1e-2, capacity=8)[0], None

        return lax.scan(step, x, None, length=3)[0]

    _, logs = jl.spool(f)(X)
    rec = logs["gnorm"]
    assert rec["value"].shape == (3, 8) and rec["count"].shape == (3,) and rec["overflow"].shape == (3,)
    x = X
    for s in range(3):
        st, buf, _, n = jax.jit(functools.partial(_relax_ref, k=8))(x, 1e-2)
        eq(rec["value"][s], buf)
        eq(rec["count"][s], n)
        x = st[0]

    def nested(x):
        def cond(c):
            return c[1] < 2

        def body(c):
            return _relax(c[0], 1e-2, capacity=8)[0], c[1] + 1

        return lax.while_loop(cond, body, (x, 0))

    _, logs = jl.spool(nested)(X)  # the log's capacity holds for each enclosing while loop
    rec = logs["gnorm"]
    assert rec["value"].shape == (8, 8)
    outer, inner = rec["count"]
    eq(outer, 2)
    assert inner.shape == (8,)
    x = X
    for s in range(2):
        st, buf, _, n = jax.jit(functools.partial(_relax_ref, k=8))(x, 1e-2)
        eq(rec["value"][s], buf)
        eq(inner[s], n)
        x = st[0]
    eq(inner[2:], 0)
    assert rec["overflow"].shape == () and not rec["overflow"]


# --------------------------------------------------------------------------------------------
# cond / switch
# --------------------------------------------------------------------------------------------


def _branchy(x, i):
    return lax.switch(i, [
        lambda x: jl.log("a", energy(x)) * 0 + x,
        lambda x: x * 2,
        lambda x: jl.log("a", 2 * energy(x)) * 0 + x + 1,
    ], x)


@pytest.mark.parametrize("i", [0, 1, 2])
def test_switch_taken_branch_and_validity(i):
    out, logs = jl.spool(_branchy)(X, i)
    ref = jax.jit(lambda x, i: lax.switch(i, [
        lambda x: (energy(x) * 0 + x, energy(x), True),
        lambda x: (x * 2, jnp.float32(0), False),
        lambda x: (2 * energy(x) * 0 + x + 1, 2 * energy(x), True),
    ], x))(X, i)
    eq(out, ref[0])
    eq(logs["a"]["value"], ref[1])
    eq(logs["a"]["valid"], ref[2])


def test_cond_logging_in_both_branches_has_no_mask():
    def f(x, p):
        return lax.cond(p, lambda x: jl.log("m", jnp.max(x)) + 0 * x, lambda x: jl.log("m", jnp.min(x)) + 0 * x, x)

    for p in (True, False):
        _, logs = jl.spool(f)(X, p)
        eq(logs["m"], jnp.max(X) if p else jnp.min(X))


def test_cond_inside_scan_masks_per_iteration():
    def f(x):
        def body(x, i):
            x = lax.cond(i % 2 == 0, lambda x: x + 0 * jl.log("e", energy(x)), lambda x: x, x)
            return x + 0.01 * force(x), None

        return lax.scan(body, x, jnp.arange(4))[0]

    def ref(x):
        def body(x, i):
            e = jnp.where(i % 2 == 0, energy(x), 0.0)
            return x + 0.01 * force(x), (e, i % 2 == 0)

        return lax.scan(body, x, jnp.arange(4))

    _, logs = jl.spool(f)(X)
    r = jax.jit(ref)(X)
    eq(logs["e"]["valid"], r[1][1])
    eq(logs["e"]["value"], r[1][0])


def test_branches_with_different_shapes_are_an_error():
    def f(x, p):
        return lax.cond(p, lambda x: jl.log("a", x), lambda x: x + 0 * jl.log("a", x[:2]).sum(), x)

    with pytest.raises(jl.JaxlogError, match=r"log 'a' is logged with different shapes.*test_log.py:\d+"):
        jl.spool(f)(X, True)


# --------------------------------------------------------------------------------------------
# vmap
# --------------------------------------------------------------------------------------------

XS = jnp.stack([X, 0.5 * X, -X])


def test_vmap_one_row_per_system():
    _, logs = jl.spool(jax.vmap(lambda x: jl.log("e", energy(x))))(XS)
    eq(logs["e"], jax.jit(jax.vmap(energy))(XS))


def test_vmap_of_scan_puts_systems_first():
    out, logs = jl.spool(jax.vmap(functools.partial(_md, n=5)))(XS)
    ref_x, (ref_f, ref_i) = jax.jit(jax.vmap(functools.partial(_md_ref, n=5)))(XS)
    eq(out, ref_x)
    assert logs["fmax"]["value"].shape == (3, 5)
    eq(logs["fmax"]["value"], ref_f)
    eq(logs["fmax"]["step"], ref_i)


def test_scan_of_vmap_puts_systems_first():
    def f(xs):
        def body(xs, _):
            jax.vmap(lambda x: jl.log("e", energy(x)))(xs)
            return xs + 0.01 * force(xs), None

        return lax.scan(body, xs, None, length=4)[0]

    def ref(xs):
        def body(xs, _):
            return xs + 0.01 * force(xs), jax.vmap(energy)(xs)

        return lax.scan(body, xs, None, length=4)

    _, logs = jl.spool(f)(XS)
    r = jax.jit(ref)(XS)
    assert logs["e"].shape == (3, 4)
    eq(logs["e"], r[1].T)


def test_vmap_unbatched_value_is_broadcast():
    _, logs = jl.spool(jax.vmap(lambda x: jl.log("c", jnp.float32(2.0)) + x))(XS)
    eq(logs["c"], np.full(3, 2.0, np.float32))


# --------------------------------------------------------------------------------------------
# grad / jvp / custom_vjp / checkpoint / nested jit
# --------------------------------------------------------------------------------------------


def _loss(x, logging=True):
    def body(x, _):
        e = energy(x)
        if logging:
            jl.log("e", e)
        return x + 0.01 * force(x), e

    x, es = lax.scan(body, x, None, length=3)
    return jnp.sum(es) + energy(x)


def test_grad_logs_primal_once_and_derivative_unchanged():
    g, logs = jl.spool(jax.grad(_loss))(X)
    eq(g, jax.jit(jax.grad(functools.partial(_loss, logging=False)))(X))
    eq(logs["e"], jax.jit(lambda x: lax.scan(lambda x, _: (x + 0.01 * force(x), energy(x)), x, None, length=3)[1])(X))


def test_jvp_and_value_and_grad():
    t = jnp.ones_like(X)
    (p, d), logs = jl.spool(lambda x: jax.jvp(_loss, (x,), (t,)))(X)
    rp, rd = jax.jit(lambda x: jax.jvp(functools.partial(_loss, logging=False), (x,), (t,)))(X)
    eq(p, rp)
    eq(d, rd)
    eq(logs["e"], jax.jit(lambda x: lax.scan(lambda x, _: (x + 0.01 * force(x), energy(x)), x, None, length=3)[1])(X))


def test_checkpoint_logs_once_under_grad():
    def loss(x, logging=True):
        def body(x, _):
            if logging:
                jl.log("e", energy(x))
            return x + 0.01 * force(x), None

        return energy(lax.scan(jax.checkpoint(body), x, None, length=3)[0])

    g, logs = jl.spool(jax.grad(loss))(X)
    eq(g, jax.jit(jax.grad(functools.partial(loss, logging=False)))(X))
    ref = jax.jit(lambda x: lax.scan(lambda x, _: (x + 0.01 * force(x), energy(x)), x, None, length=3)[1])(X)
    eq(logs["e"], ref)  # forward values once: not again from the backward recomputation

    # a checkpointed function at top level, differentiated: logged once
    g2, logs2 = jl.spool(jax.grad(lambda x: jax.checkpoint(lambda y: jl.log("y", energy(y)))(x)))(X)
    eq(logs2["y"], energy(X))


def test_checkpoint_without_grad():
    out, logs = jl.spool(jax.checkpoint(lambda x: jl.log("e", energy(x)) * 2))(X)
    eq(logs["e"], jax.jit(energy)(X))
    eq(out, jax.jit(jax.checkpoint(lambda x: energy(x) * 2))(X))


def test_custom_vjp_forward_logs_and_gradient_unchanged():
    def make(logging):
        @jax.custom_vjp
        def clip_grad(x):
            return energy(x)

        def fwd(x):
            if logging:
                jl.log("fwd", energy(x))
            return energy(x), x

        def bwd(x, g):
            return (jnp.clip(g * -force(x), -0.1, 0.1),)

        clip_grad.defvjp(fwd, bwd)
        return clip_grad

    g, logs = jl.spool(jax.grad(make(True)))(X)
    eq(g, jax.jit(jax.grad(make(False)))(X))
    eq(logs["fwd"], jax.jit(energy)(X))


def test_custom_jvp_primal_is_logged():
    @jax.custom_jvp
    def f(x):
        return jl.log("inner", jnp.sin(x))

    f.defjvp(lambda p, t: (f(p[0]), jnp.cos(p[0]) * t[0]))
    out, logs = jl.spool(f)(X)
    eq(logs["inner"], jax.jit(jnp.sin)(X))


def test_nested_jit():
    inner = jax.jit(lambda x: jl.log("f", force(x)) * 1.0)
    out, logs = jl.spool(lambda x: inner(inner(x)))(X)
    r1 = jax.jit(force)(X)
    eq(logs["f"], jnp.stack([r1, jax.jit(force)(r1)]))


# --------------------------------------------------------------------------------------------
# free when nobody collects
# --------------------------------------------------------------------------------------------


def _kernel(logging):
    def kernel(x):
        def inner(x, i):
            f = force(x)
            if logging:
                jl.log("fmax", jnp.max(jnp.abs(f)), step=i)
            x = lax.cond(i % 2 == 0, lambda x: x + 0.01 * f, lambda x: x - 0.01 * f, x)

            def w(c):
                if logging:
                    jl.log("res", c[0], capacity=4)
                return c[0] * 0.5, c[1] + 1

            r, _ = lax.while_loop(lambda c: c[1] < 3, w, (jnp.sum(x), 0))
            return x + r * 1e-3, None

        x = lax.scan(inner, x, jnp.arange(3))[0]
        if logging:
            jl.log({"e": energy(x), "g": jax.grad(energy)(x)})
            jax.vmap(lambda y: jl.log("row", y * 2))(x[None])
        return x

    return kernel


def _strip(text):
    """An HLO module without source locations (metadata and the stack-frame tables)."""
    text = re.sub(r", metadata=\{[^}]*\}", "", text)
    return "\n".join(line for line in text.splitlines()
                     if not re.match(r"^(FileNames|FunctionNames|FileLocations|StackFrames)$|^\d+ ", line))


def test_uncollected_logs_compile_to_the_same_program():
    with_logs, without = jax.jit(_kernel(True)), jax.jit(_kernel(False))
    lw, lo = with_logs.lower(X), without.lower(X)
    assert lw.as_text() == lo.as_text()
    assert _strip(lw.compile().as_text()) == _strip(lo.compile().as_text())
    eq(with_logs(X), without(X))


def test_still_free_after_being_collected():
    k = jax.jit(_kernel(True))
    _, logs = jl.spool(lambda x: k(x))(X)
    assert set(logs) == {"fmax", "res", "e", "g", "row"}
    assert logs["res"]["value"].shape == (3, 4)
    assert k.lower(X).as_text() == jax.jit(_kernel(False)).lower(X).as_text()


def test_eager_calls_do_nothing():
    assert jl.log("a", X) is X
    d = {"a": X}
    assert jl.log(d) is d


# --------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------


def test_error_non_array_value_names_log_and_line():
    def f(x):
        jl.log("label", "hello")
        return x

    with pytest.raises(jl.JaxlogError, match=rf"^\[jaxlog\] log 'label' at {line_of(f, 'label')}: .*not an array"):
        jl.spool(f)(X)
    with pytest.raises(jl.JaxlogError, match=r"log 'obj' .*not an array"):
        jl.spool(lambda x: jl.log("obj", object()))(X)
    with pytest.raises(jl.JaxlogError, match="holds no arrays"):
        jl.log("empty", {})


def test_error_two_shapes_in_one_call():
    def f(x):
        jl.log("v", x)
        jl.log("v", x[:3])
        return x

    with pytest.raises(jl.JaxlogError) as e:
        jl.spool(f)(X)
    msg = str(e.value)
    assert "log 'v' is logged with two different shapes or dtypes" in msg
    assert line_of(f, 'jl.log("v", x)') in msg and line_of(f, "x[:3]") in msg

    def g(x):
        jl.log("v", x)
        jl.log("v", x.astype(jnp.int32))
        return x

    with pytest.raises(jl.JaxlogError, match="int32"):
        jl.spool(g)(X)


def test_error_while_without_capacity():
    with pytest.raises(jl.JaxlogError, match=r"log 'gnorm' at test_log.py:\d+ is inside a lax.while_loop.*capacity=K"):
        jl.spool(_relax)(X, 1e-3)


def test_error_log_in_while_cond():
    def f(x):
        return lax.while_loop(lambda c: jl.log("c", c, capacity=3) < 3, lambda c: c + 1, x)

    with pytest.raises(jl.JaxlogError, match="log 'c' at test_log.py:\\d+ is inside a lax.while_loop's cond_fun"):
        jl.spool(f)(0)


def test_error_escaped_tracer():
    leaked = []

    def f(x):
        def body(c, _):
            leaked.append(c)
            return c + 1, None

        x = lax.scan(body, x, None, length=2)[0]
        jl.log("leak", leaked[0])
        return x

    where = line_of(f, 'jl.log("leak"')
    with pytest.raises(jl.JaxlogError, match=rf"log 'leak' at {where}: .*escaped the transformation"):
        jl.spool(f)(X)


def test_error_inside_unsupported_transformation():
    def f(b):
        def matvec(x):
            jl.log("mv", x)
            return 2.0 * x

        return lax.custom_linear_solve(matvec, b, lambda mv, b: b / 2.0)

    with pytest.raises(jl.JaxlogError, match=r"log 'mv' at test_log.py:\d+ is inside a custom_linear_solve"):
        jl.spool(f)(X)


def test_error_bad_arguments():
    with pytest.raises(jl.JaxlogError, match="log name 'a/b' is invalid"):
        jl.log("a/b", X)
    with pytest.raises(jl.JaxlogError, match="index name 'count' is reserved"):
        jl.log("a", X, count=1)
    with pytest.raises(jl.JaxlogError, match="capacity must be an int >= 1"):
        jl.log("a", X, capacity=0)
    with pytest.raises(jl.JaxlogError, match="takes no value"):
        jl.log({"a": X}, X)
    with pytest.raises(jl.JaxlogError, match="neither an array nor hashable"):
        jl.spool(lambda x, cfg: x)(X, {1, 2})
    with pytest.raises(jl.JaxlogError, match="log capacity must be"):
        collect(lambda x: x, capacity=-1)


# --------------------------------------------------------------------------------------------
# spool details, tap
# --------------------------------------------------------------------------------------------


def test_spool_static_arguments_and_kwargs():
    def f(x, mode, scale=1.0):
        jl.log(mode, x * scale)
        return x

    s = jl.spool(f)
    _, a = s(X, "up", scale=2.0)
    _, b = s(X, "down", scale=3.0)
    eq(a["up"], X * 2.0)
    eq(b["down"], X * 3.0)


def test_collect_inside_jit():
    fn = jax.jit(collect(functools.partial(_md, n=3)))
    out, logs = fn(X)
    ref_x, (ref_f, _) = jax.jit(functools.partial(_md_ref, n=3))(X)
    eq(out, ref_x)
    eq(logs["fmax"]["value"], ref_f)


def test_tap_calls_back_per_log_in_order():
    events = []
    out = jl.tap(functools.partial(_md, n=3), events.append)(X)
    ref_x, (ref_f, ref_i) = jax.jit(functools.partial(_md_ref, n=3))(X)
    eq(out, ref_x)
    assert [e.name for e in events] == ["fmax"] * 3
    eq(np.stack([e.value for e in events]), ref_f)
    eq([int(e.indices["step"]) for e in events], [0, 1, 2])
    assert events[0].where.startswith("test_log.py:")


def test_tap_in_while_and_cond():
    events = []
    jl.tap(lambda x: _relax(x, 1e-3), events.append)(X)
    _, _, _, n = jax.jit(functools.partial(_relax_ref, k=64))(X, 1e-3)
    assert len(events) == int(n)
    events.clear()
    jl.tap(_branchy, events.append)(X, 1)
    assert events == []
    jl.tap(_branchy, events.append)(X, 2)
    assert [e.name for e in events] == ["a"]
    eq(events[0].value, 2 * energy(X))


def test_constants_are_logged():
    _, logs = jl.spool(lambda x: (jl.log("c", 2.0), jl.log("i", 3, step=1), x)[-1])(X)
    eq(logs["c"], np.float32(2.0))
    eq(logs["i"]["value"], 3)
    eq(logs["i"]["step"], 1)


# --------------------------------------------------------------------------------------------
# in the drivers: jl.run and jl.Recorder record logs as "log/<name>", like aux
# --------------------------------------------------------------------------------------------


def _md_step(logging=True):
    """A Verlet-like step whose force function logs its largest component (two calls a step)."""
    def forces(x):
        f = force(x)
        if logging:
            jl.log("fmax", jnp.max(jnp.abs(f)))
        return f

    def step(s):
        v = s["v"] + 0.05 * forces(s["x"])
        x = s["x"] + 0.1 * v
        return {"x": x, "v": v + 0.05 * forces(x)}

    return step


S0 = {"x": X, "v": jnp.zeros_like(X)}


def _md_step_aux(s):
    f0 = force(s["x"])
    v = s["v"] + 0.05 * f0
    x = s["x"] + 0.1 * v
    f1 = force(x)
    return {"x": x, "v": v + 0.05 * f1}, {"fmax": jnp.stack([jnp.max(jnp.abs(f0)), jnp.max(jnp.abs(f1))])}


@pytest.mark.parametrize("chunk", [None, 3])
def test_run_log_equals_the_same_value_through_aux(chunk):
    r_log = jl.run(_md_step(), S0, 20, record={"x": lambda s: s["x"]}, chunk=chunk)
    r_aux = jl.run(_md_step_aux, S0, 20, record={"x": lambda s: s["x"]}, has_aux=True, chunk=chunk)
    r_plain = jl.run(_md_step(logging=False), S0, 20, record={"x": lambda s: s["x"]}, chunk=chunk)
    t_log, t_aux = r_log.trajectory, r_aux.trajectory
    assert "log/fmax" in t_log.records
    assert t_log["log/fmax"].shape == (20, 2)
    eq(t_log.steps("log/fmax"), np.arange(1, 21))
    eq(t_log.steps("log/fmax"), t_aux.steps("aux/fmax"))
    eq(t_log["log/fmax"], t_aux["aux/fmax"])
    for name in ("x", "v"):  # logging changes nothing else
        eq(r_log.state[name], r_plain.state[name])
        eq(r_log.state[name], r_aux.state[name])
    eq(t_log["x"], r_plain.trajectory["x"])
    assert "log/fmax" not in r_plain.schema.paths


def test_run_finds_logs_in_a_jitted_part_traced_before_its_run():
    """A run learns from an ordinary trace whether the step logs (its Python calls ``jl.log``,
    or its program holds the log): a jitted force function traced and run before, whose Python
    does not run again in the run's trace, still has its logs recorded; so does a record view."""
    @jax.jit
    def logged_force(x):
        f = force(x)
        jl.log("fmax", jnp.max(jnp.abs(f)))
        return f

    @jax.jit
    def logged_energy(x):
        e = energy(x)
        jl.log("e_view", e)
        return e

    logged_force(S0["x"]).block_until_ready()  # traced here, without collecting
    logged_energy(S0["x"]).block_until_ready()

    def step(s):
        v = s["v"] + 0.05 * logged_force(s["x"])
        x = s["x"] + 0.1 * v
        return {"x": x, "v": v + 0.05 * logged_force(x)}

    r = jl.run(step, S0, 6, record={"e": lambda s: logged_energy(s["x"])})
    t, ref = r.trajectory, jl.run(_md_step(), S0, 6).trajectory
    eq(t.steps("log/fmax"), np.arange(1, 7))
    eq(t["log/fmax"], ref["log/fmax"])
    eq(t.steps("log/e_view"), np.arange(0, 7))
    eq(t["log/e_view"], t["e"])


def test_run_log_schedules_subsample_on_the_device(tmp_path):
    path = tmp_path / "t.h5"
    r = jl.run(_md_step(), S0, 30, logs={"fmax": jl.every(10)}, sinks=[jl.HDF5Writer(path)], chunk=7)
    full = jl.run(_md_step(), S0, 30).trajectory
    t = jl.load(path)
    eq(t.steps("log/fmax"), [10, 20, 30])
    eq(t["log/fmax"], full["log/fmax"][[9, 19, 29]])
    assert r.schema["log/fmax"].schedule == jl.every(10)
    t2 = jl.run(_md_step(), S0, 12, logs={"fmax": jl.window(3, 5)}).trajectory
    eq(t2.steps("log/fmax"), [3, 4, 5])
    eq(t2["log/fmax"], full["log/fmax"][2:5])


def test_run_log_scan_and_while_inside_the_step():
    def step(s):
        def inner(x, _):
            jl.log("e", energy(x))
            return x + 0.01 * force(x), None

        x = lax.scan(inner, s["x"], None, length=4)[0]
        x = _relax(x, 1e-2)[0]
        return {"x": x, "v": s["v"]}

    r = jl.run(step, S0, 5, log_capacity=16, chunk=2)
    t = r.trajectory
    assert t["log/e"].shape == (5, 4)
    assert t["log/gnorm/value"].shape == (5, 16)
    assert set(t.records) >= {"log/gnorm/count", "log/gnorm/overflow", "log/gnorm/it"}
    _, logs = jl.spool(step, capacity=16)(S0)
    eq(t["log/e"][0], logs["e"])
    eq(t["log/gnorm/value"][0], logs["gnorm"]["value"])
    eq(t["log/gnorm/count"][0], logs["gnorm"]["count"])
    assert not t["log/gnorm/overflow"].any()
    with pytest.raises(jl.JaxlogError, match="log 'gnorm' at test_log.py:\\d+ is inside a lax.while_loop"):
        jl.run(step, S0, 5)


def test_run_invariant_on_a_log_names_step_and_system():
    def step(s):  # per system: system 1 logs NaN from step 4 on
        k = s["k"] + 1
        bad = (k >= 4) & (jnp.arange(3) == 1)
        jax.vmap(lambda x, b: jl.log("fmax", jnp.where(b, jnp.nan, jnp.max(jnp.abs(force(x))))))(s["x"], bad)
        return {"x": s["x"] + 0.01 * force(s["x"]), "k": k}

    state = {"x": XS, "k": jnp.zeros(3, jnp.int32)}
    with pytest.raises(jl.InvariantViolation) as e:
        jl.run(step, state, 10, batched=True, invariants=[jl.finite("log/fmax")])
    v = e.value
    assert (v.step, v.system, v.record) == (4, 1, "log/fmax")


def test_run_errors_for_logs_argument():
    with pytest.raises(jl.JaxlogError, match=r"logs= names \['nope'\], but the step never logs them.*fmax"):
        jl.run(_md_step(), S0, 3, logs={"nope": 2})
    with pytest.raises(jl.JaxlogError, match="logs='fmax'.*schedule"):
        jl.run(_md_step(), S0, 3, logs={"fmax": "often"})
    with pytest.raises(jl.JaxlogError, match="record name 'log' is reserved.*jl.log"):
        jl.run(_md_step(), S0, 3, record={"log": lambda s: s["x"]})
    with pytest.raises(jl.JaxlogError, match="log_capacity must be an int >= 1"):
        jl.run(_md_step(), S0, 3, log_capacity=0)


def test_recorder_records_what_its_views_log():
    def kinetic(s):  # a library function that logs on its own
        ke = 0.5 * jnp.sum(s["v"] ** 2)
        jl.log("vmax", jnp.max(jnp.abs(s["v"])))
        return ke

    step = jax.jit(_md_step(logging=False))
    rec = jl.Recorder({"ke": jl.Record(kinetic, every=2)})
    s = S0
    with rec:
        for k in range(7):
            if k:
                s = step(s)
            rec.log(s, k)
    t = rec.trajectory
    eq(t.steps("log/vmax"), [0, 2, 4, 6])
    eq(t.steps("ke"), [0, 2, 4, 6])
    ref = jax.jit(lambda s: jnp.max(jnp.abs(s["v"])))
    s, vals = S0, []
    for k in range(7):
        if k:
            s = step(s)
        if k % 2 == 0:
            vals.append(ref(s))
    eq(t["log/vmax"], np.stack(vals))
    # the same view in jl.run
    r = jl.run(_md_step(logging=False), S0, 6, record={"ke": jl.Record(kinetic, every=2)})
    eq(r.trajectory["log/vmax"], t["log/vmax"])


def test_run_keyed_step_with_aux_and_logs_and_a_postmortem(tmp_path):
    def step(key, s):
        noise = 0.01 * jax.random.normal(key, s["x"].shape)
        x = s["x"] + 0.01 * force(s["x"]) + noise
        jl.log("noise", jnp.max(jnp.abs(noise)))
        return {"x": x, "v": s["v"]}, {"e": energy(x)}

    def ref_step(key, s):
        noise = 0.01 * jax.random.normal(key, s["x"].shape)
        x = s["x"] + 0.01 * force(s["x"]) + noise
        return {"x": x, "v": s["v"]}, {"e": energy(x), "noise": jnp.max(jnp.abs(noise))}

    key = jax.random.key(0)
    r = jl.run(step, S0, 12, key=key, has_aux=True, chunk=5)
    ref = jl.run(ref_step, S0, 12, key=key, has_aux=True, chunk=5)
    eq(r.trajectory["log/noise"], ref.trajectory["aux/noise"])
    eq(r.trajectory["aux/e"], ref.trajectory["aux/e"])
    eq(r.state["x"], ref.state["x"])
    # a violation on a log: the post-mortem replays the run's own program up to the violating step
    bound = float(np.sort(ref.trajectory["aux/noise"])[-3])
    path = tmp_path / "t.h5"
    with pytest.raises(jl.InvariantViolation) as e:
        jl.run(step, S0, 12, key=key, has_aux=True, chunk=5, sinks=[jl.HDF5Writer(path)],
               invariants=[jl.bounded("log/noise", hi=bound)])
    first = int(np.argmax(ref.trajectory["aux/noise"] > bound)) + 1
    assert (e.value.step, e.value.record) == (first, "log/noise")
    t = jl.load(path)
    eq(t.steps("log/noise"), np.arange(1, first + 1))
    assert max(t.postmortem) == first


def test_jl_log_stays_the_function_whatever_imports_the_log_layer_first():
    """The layer ``pytest_jaxlog/logs/`` must not shadow the function ``jl.log``; importing the layer (as every
    driver does) must not turn ``jl.log`` into a module. A fresh interpreter, layer imported first."""
    import subprocess
    import sys

    code = ("import pytest_jaxlog as jl, pytest_jaxlog.drive.run, inspect\n"
            "from pytest_jaxlog.logs import collect\n"
            "assert inspect.isfunction(jl.log), jl.log\n"
            "from pytest_jaxlog import log\n"
            "assert log is jl.log and callable(collect)\n"
            "import jax.numpy as jnp\n"
            "out, logs = jl.spool(lambda x: jl.log('y', x + 1))(jnp.float32(1))\n"
            "print(float(logs['y']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "2.0"


def test_an_unknown_shard_reduction_is_one_error_naming_the_log():
    with pytest.raises(jl.JaxlogError, match=r"log 'e' at .*: shards= is one of 'gather', 'sum'.*got 'median'"):
        jl.spool(lambda x: jl.log("e", x, shards="median"))(jnp.ones(3))
