"""Independent harmonic oscillators: microsecond-sized steps, the worst case for per-step overhead."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class OscState(NamedTuple):
    x: jax.Array
    v: jax.Array


def make_oscillators(n: int = 1024, systems: int | None = None, dt: float = 0.01, seed: int = 0, dtype=jnp.float32):
    """Returns (step, state, energy). With ``systems=S`` every leaf has a leading system axis
    (shape ``(S, n)``) and ``energy`` returns one value per system."""
    rng = np.random.default_rng(seed)
    shape = (n,) if systems is None else (systems, n)
    k = jnp.asarray(rng.uniform(0.5, 2.0, size=shape), dtype)
    state = OscState(jnp.asarray(rng.normal(size=shape), dtype), jnp.asarray(rng.normal(size=shape), dtype))
    dt = jnp.asarray(dt, dtype)

    def step(s: OscState) -> OscState:
        v = s.v - 0.5 * dt * k * s.x
        x = s.x + dt * v
        return OscState(x, v - 0.5 * dt * k * x)

    def energy(s: OscState):
        return jnp.sum(0.5 * s.v**2 + 0.5 * k * s.x**2, axis=-1)

    return step, state, energy
