"""Derivatives through ``jl.spool`` with ``jl.log`` inside functions that carry their own rules.

Each kernel below is built twice, with and without its ``jl.log`` calls, and each transformation
the docs list is applied to the spooled kernel and to the plain one: results must agree to the
bit. The kernels' rules (``100 * t``, ``7 * ct``) differ from their bodies' derivatives, so a rule
dropped anywhere shows as a different number, not as rounding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pytest_jaxlog as jl

eq = np.testing.assert_array_equal
X = jnp.linspace(-1.0, 1.0, 6, dtype=jnp.float32)
T = jnp.linspace(0.5, 1.5, 6, dtype=jnp.float32)  # a tangent
XS = jnp.stack([X, 2 * X, -X])  # three systems for vmap


def custom_kernel(kind: str, logging: bool):
    """``sin`` with a log of ``2 cos x`` inside, and a rule that is not its derivative:
    ``100 * t`` (``kind="jvp"``) or ``7 * ct`` (``kind="vjp"``)."""
    def body(x):
        if logging:
            jl.log("inner", jnp.cos(x) * 2)
        return jnp.sin(x)

    if kind == "jvp":
        f = jax.custom_jvp(body)
        f.defjvp(lambda p, t: (f(p[0]), 100.0 * t[0]))
    else:
        f = jax.custom_vjp(body)
        f.defvjp(lambda x: (f(x), x), lambda x, ct: (7.0 * ct,))
    return f


def custom_jvp_kernel(logging: bool):
    return custom_kernel("jvp", logging)


def custom_vjp_kernel(logging: bool):
    return custom_kernel("vjp", logging)


def scanned_kernel(logging: bool):
    """A custom_jvp function called inside a scan, and a log outside it."""
    g = custom_jvp_kernel(logging)

    def f(x):
        y, _ = lax.scan(lambda c, _: (g(c) + 0.1 * c, None), x, None, length=3)
        if logging:
            jl.log("outer", jnp.sum(y))
        return y

    return f


def inner_logs(x):
    return jnp.cos(x) * 2


def scanned_logs(x):
    def body(c, _):
        return jnp.sin(c) + 0.1 * c, jnp.cos(c) * 2

    y, inner = lax.scan(body, x, None, length=3)
    return {"inner": inner, "outer": jnp.sum(y)}


KERNELS = {  # name: (kernel factory, its logs computed plainly)
    "custom_jvp": (custom_jvp_kernel, lambda x: {"inner": inner_logs(x)}),
    "custom_vjp": (custom_vjp_kernel, lambda x: {"inner": inner_logs(x)}),
    "scan_of_custom_jvp": (scanned_kernel, scanned_logs),
    # the spool meets the custom call inside another rebuilt primitive
    "checkpoint_of_custom_vjp": (lambda logging: jax.checkpoint(custom_vjp_kernel(logging)),
                                 lambda x: {"inner": inner_logs(x)}),
    "jit_of_custom_jvp": (lambda logging: jax.jit(custom_jvp_kernel(logging)), lambda x: {"inner": inner_logs(x)}),
    "vmap_of_custom_jvp": (lambda logging: jax.vmap(custom_jvp_kernel(logging)), lambda x: {"inner": inner_logs(x)}),
}


def spooled(make):
    """The logging kernel through ``jl.spool``, returning (out, logs)."""
    return jl.spool(make(True))


def _sum(F):
    return lambda x: jnp.sum(F(x))


# transformation name: (function of a kernel F -> what to compute, needs forward mode)
TRANSFORMS = {
    "grad": (lambda F: jax.grad(_sum(F)), False),
    "vjp": (lambda F: lambda x: jax.vjp(F, x)[1](T)[0], False),
    "jvp": (lambda F: lambda x: jax.jvp(F, (x,), (T,)), True),
    "checkpoint": (lambda F: jax.grad(_sum(jax.checkpoint(F))), False),
    "nested_jit": (lambda F: jax.jit(jax.grad(_sum(jax.jit(F)))), False),
    "vmap_of_grad": (lambda F: jax.vmap(jax.grad(_sum(F))), False),
    "grad_of_vmap": (lambda F: jax.grad(_sum(jax.vmap(F))), False),
    "jvp_of_grad": (lambda F: lambda x: jax.jvp(jax.grad(_sum(F)), (x,), (T,)), True),
}


def _arg(transform: str):
    return XS if "vmap" in transform else X


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("transform", list(TRANSFORMS))
def test_derivatives_of_a_spooled_kernel_are_the_plain_kernels(kernel, transform):
    make, _ = KERNELS[kernel]
    how, forward = TRANSFORMS[transform]
    if forward and "custom_vjp" in kernel:
        pytest.skip("custom_vjp functions have no forward mode (JAX refuses it without logs too)")
    x = _arg(transform)
    got = jax.jit(how(lambda x: spooled(make)(x)[0]))(x)
    want = jax.jit(how(make(False)))(x)
    jax.tree_util.tree_map(eq, got, want)


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("transform", list(TRANSFORMS))
def test_spooling_a_transformed_kernel_keeps_its_values(kernel, transform):
    """The transformation inside the spool: what it computes is unchanged, and the logs are the
    forward values."""
    make, logs_of = KERNELS[kernel]
    how, forward = TRANSFORMS[transform]
    if forward and "custom_vjp" in kernel:
        pytest.skip("custom_vjp functions have no forward mode")
    x = _arg(transform)
    got, logs = jl.spool(how(make(True)))(x)
    jax.tree_util.tree_map(eq, got, jax.jit(how(make(False)))(x))
    assert set(logs) == set(logs_of(X))


def test_the_rules_are_the_ones_used():
    """The numbers the issue reported: the rules say 100 and 7, the bodies' derivative is cos."""
    x = jnp.float32(0.3)
    g_jvp = jax.grad(lambda x: jl.spool(custom_jvp_kernel(True))(x)[0])(x)
    g_vjp = jax.grad(lambda x: jl.spool(custom_vjp_kernel(True))(x)[0])(x)
    eq(g_jvp, np.float32(100.0))
    eq(g_vjp, np.float32(7.0))


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_logged_values_under_grad_are_the_plain_values(kernel):
    make, logs_of = KERNELS[kernel]

    def loss(x):
        out, logs = spooled(make)(x)
        return jnp.sum(out), logs

    g, logs = jax.jit(jax.grad(loss, has_aux=True))(X)
    eq(g, jax.jit(jax.grad(_sum(make(False))))(X))
    want = jax.jit(logs_of)(X)
    assert set(logs) == set(want)
    for name in want:
        eq(logs[name], want[name])


def test_logged_values_under_vmap_and_their_tangents():
    """vmap: one row per system; jvp: a log's tangent is its body's derivative (the rule covers
    only the function's outputs), here d(2 cos x) = -2 sin x."""
    make = custom_jvp_kernel
    out, logs = jax.jit(jax.vmap(spooled(make)))(XS)
    eq(out, jax.jit(jax.vmap(make(False)))(XS))
    eq(logs["inner"], jax.jit(jax.vmap(inner_logs))(XS))
    (out, logs), (d_out, d_logs) = jax.jit(lambda x: jax.jvp(spooled(make), (x,), (T,)))(X)
    eq(d_out, 100.0 * T)
    eq(d_logs["inner"], jax.jit(lambda x: jax.jvp(inner_logs, (x,), (T,))[1])(X))


def test_second_order_through_the_rule():
    """The rule is linear in the tangent (100 t): the second derivative is 0, the body's is -sin."""
    f = lambda x: jl.spool(custom_jvp_kernel(True))(x)[0]  # noqa: E731
    h = jax.jit(jax.hessian(lambda x: jnp.sum(f(x))))(X)
    eq(h, jax.jit(jax.hessian(lambda x: jnp.sum(custom_jvp_kernel(False)(x))))(X))
    eq(h, np.zeros((6, 6), np.float32))


def test_a_body_jax_cannot_differentiate_names_the_log():
    """A custom_jvp around a host callback: its outputs' derivative comes from the rule, but the
    logged value's cannot, and JAX cannot differentiate the body: a JaxlogError says so."""
    @jax.custom_jvp
    def f(x):
        y = jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        jl.log("y", y)
        return y

    f.defjvp(lambda p, t: (f(p[0]), 3.0 * t[0]))
    out, logs = jl.spool(f)(X)
    eq(logs["y"], np.sin(np.asarray(X)))
    with pytest.raises(jl.JaxlogError, match=r"log 'y' at test_log_derivatives.py:\d+ is inside a custom_jvp.*"
                                             r"cannot be differentiated.*log them outside"):
        jax.grad(lambda x: jnp.sum(jl.spool(f)(x)[0]))(X)


def test_run_with_custom_derivatives_and_logs_in_the_step():
    """jl.run: a step calling a custom_jvp function that logs, and a gradient step through it,
    recorded as a Python loop of the plain step computes them."""
    f_log, f_plain = custom_jvp_kernel(True), custom_jvp_kernel(False)

    def make_step(f):
        def step(x):
            return x - 0.01 * jax.grad(lambda y: jnp.sum(f(y) ** 2))(x) + 0.001 * f(x)
        return step

    r = jl.run(make_step(f_log), X, 5, record={"x": lambda x: x}, progress=False)
    plain = jax.jit(make_step(f_plain))
    x, xs, inner = X, [X], []
    for _ in range(5):
        inner.append(jax.jit(inner_logs)(x))
        x = plain(x)
        xs.append(x)
    eq(r.state, x)
    eq(r.trajectory["x"], np.stack(xs))
    # logged twice per step: by the rule's primal call under grad, then by the plain call
    got = r.trajectory["log/inner"]
    assert got.shape == (5, 2, 6)
    eq(got[:, 0], np.stack(inner))
    eq(got[:, 1], np.stack(inner))
    eq(r.trajectory.steps("log/inner"), np.arange(1, 6))


def test_tap_sees_a_custom_functions_logs_once():
    events = []
    out = jl.tap(custom_jvp_kernel(True), events.append)(X)
    jax.effects_barrier()
    eq(out, jax.jit(custom_jvp_kernel(False))(X))
    assert [e.name for e in events] == ["inner"]
    eq(events[0].value, jax.jit(inner_logs)(X))
    g = jax.grad(lambda x: jnp.sum(jl.tap(custom_jvp_kernel(True), lambda e: None)(x)))(X)
    eq(g, np.full(6, 100.0, np.float32))
