"""Random-walk Metropolis on a correlated 2-D Gaussian, several independent chains at once."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

PRECISION = jnp.linalg.inv(jnp.asarray([[1.0, 0.8], [0.8, 1.0]], jnp.float32))


class Chain(NamedTuple):
    x: jax.Array  # (2,) per chain
    logp: jax.Array
    accepted: jax.Array  # whether the last proposal was accepted


def logp(x: jax.Array) -> jax.Array:
    return -0.5 * x @ PRECISION @ x


def make_chains(chains: int = 8, scale: float = 1.0):
    """(step, state): ``step(keys, state)`` advances every chain with its own key (``jl.run``
    with ``batched=True`` and ``key=`` hands one key per chain)."""

    def chain_step(key, c: Chain) -> Chain:
        k_prop, k_acc = jax.random.split(key)
        proposal = c.x + scale * jax.random.normal(k_prop, (2,))
        lp = logp(proposal)
        accept = jnp.log(jax.random.uniform(k_acc)) < lp - c.logp
        return Chain(jnp.where(accept, proposal, c.x), jnp.where(accept, lp, c.logp), accept)

    x0 = jnp.linspace(-2.0, 2.0, chains * 2, dtype=jnp.float32).reshape(chains, 2)
    state = Chain(x0, jax.vmap(logp)(x0), jnp.zeros(chains, bool))
    return jax.vmap(chain_step), state
