"""The kernel the sink tests share: pendulums (one per element; a batch of systems on a leading
axis), small enough that a run is milliseconds, with an energy per system."""

import jax.numpy as jnp


def step(state):
    x, v = state["x"], state["v"]
    v = v - 0.01 * jnp.sin(x)
    return {"x": x + 0.01 * v, "v": v}


def energy(state):
    return jnp.sum(0.5 * state["v"] ** 2 - jnp.cos(state["x"]), axis=-1)


STATE = {"x": jnp.linspace(0.1, 1.0, 4), "v": jnp.zeros(4)}
BATCHED = {"x": jnp.linspace(0.1, 1.0, 12).reshape(3, 4), "v": jnp.zeros((3, 4))}
