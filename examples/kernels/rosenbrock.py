"""Adam on the Rosenbrock function, in plain JAX: an optimiser loop that runs until it converges."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Adam(NamedTuple):
    params: jax.Array  # (2,)
    m: jax.Array
    v: jax.Array
    t: jax.Array  # the iteration, for bias correction


def rosenbrock(p: jax.Array) -> jax.Array:
    return (1.0 - p[0]) ** 2 + 100.0 * (p[1] - p[0] ** 2) ** 2


def make_adam(lr: float = 0.02, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, start=(-1.2, 1.0)):
    """(step, state, loss, grad_norm): one Adam update per step."""
    grad = jax.grad(rosenbrock)

    def step(s: Adam) -> Adam:
        g = grad(s.params)
        t = s.t + 1
        m = b1 * s.m + (1 - b1) * g
        v = b2 * s.v + (1 - b2) * g * g
        mhat, vhat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        return Adam(s.params - lr * mhat / (jnp.sqrt(vhat) + eps), m, v, t)

    state = Adam(jnp.asarray(start, jnp.float32), jnp.zeros(2, jnp.float32), jnp.zeros(2, jnp.float32),
                 jnp.float32(0.0))
    return step, state, (lambda s: rosenbrock(s.params)), (lambda s: jnp.linalg.norm(grad(s.params)))
