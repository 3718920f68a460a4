"""Langevin dynamics (NVT) of particles in a harmonic trap, BAOAB splitting.

BAOAB samples the configurational distribution of a harmonic trap exactly for any stable ``dt``,
so the equilibrium is known in closed form: <x²> = T/k per coordinate and kinetic temperature T.
The step takes a PRNG key (``jl.run(..., key=...)`` feeds ``fold_in(key, k)`` to step ``k``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class LangevinState(NamedTuple):
    positions: jax.Array  # (N, dim)
    velocities: jax.Array  # (N, dim)


def make_langevin(n: int = 256, dim: int = 3, temperature: float = 1.0, gamma: float = 1.0, k: float = 1.0,
                  dt: float = 0.05, seed: int = 0, dtype=jnp.float32):
    """Returns ``(step, state, observables)``; ``step(key, state)``; unit masses.

    ``observables(state)`` -> ``{"temperature", "potential", "msd"}`` (kinetic temperature, potential
    energy per particle, mean squared distance from the trap centre per coordinate).
    Starts cold (all particles at rest, displaced by ``N(0, 0.1)``) so the thermostat has work to do.
    """
    rng = np.random.default_rng(seed)
    x0 = jnp.asarray(0.1 * rng.normal(size=(n, dim)), dtype)
    state = LangevinState(x0, jnp.zeros((n, dim), dtype))
    c1 = float(np.exp(-gamma * dt))
    c2 = float(np.sqrt((1.0 - c1 * c1) * temperature))
    h = 0.5 * dt

    def force(x):
        return -k * x

    def step(key: jax.Array, s: LangevinState) -> LangevinState:
        v = s.velocities + h * force(s.positions)  # B
        x = s.positions + h * v  # A
        noise = jax.random.normal(key, v.shape, v.dtype)
        v = c1 * v + c2 * noise  # O
        x = x + h * v  # A
        v = v + h * force(x)  # B
        return LangevinState(x, v)

    def observables(s: LangevinState):
        return {
            "temperature": jnp.mean(s.velocities**2),
            "potential": 0.5 * k * jnp.sum(s.positions**2) / n,
            "msd": jnp.mean(s.positions**2),
        }

    return step, state, observables
