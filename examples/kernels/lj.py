"""Lennard-Jones fluid, NVE, velocity Verlet, all pairs with minimum image in a periodic box."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class LJState(NamedTuple):
    positions: jax.Array  # (N, 3)
    velocities: jax.Array  # (N, 3)
    forces: jax.Array  # (N, 3), kept so each step evaluates forces once


def _pair_terms(positions, box, rc):
    d = positions[:, None, :] - positions[None, :, :]
    d = d - box * jnp.round(d / box)
    r2 = jnp.sum(d * d, axis=-1)
    n = positions.shape[0]
    eye = jnp.eye(n, dtype=bool)
    mask = (~eye) & (r2 < rc * rc)
    r2s = jnp.where(mask, r2, 1.0)
    inv6 = 1.0 / r2s**3
    inv_rc6 = 1.0 / rc**6
    shift = 4.0 * (inv_rc6 * inv_rc6 - inv_rc6)
    pair_u = jnp.where(mask, 4.0 * (inv6 * inv6 - inv6) - shift, 0.0)
    fmag = jnp.where(mask, 24.0 * (2.0 * inv6 * inv6 - inv6) / r2s, 0.0)
    forces = jnp.sum(fmag[:, :, None] * d, axis=1)
    return 0.5 * jnp.sum(pair_u), forces


def box_length(n_atoms: int, density: float = 0.8) -> float:
    return float((n_atoms / density) ** (1.0 / 3.0))


def make_lj(n_side: int = 4, density: float = 0.8, temperature: float = 1.0, dt: float = 0.005, seed: int = 0,
            dtype=jnp.float32):
    """Returns (step, state, energies) for an ``n_side**3``-atom LJ fluid.

    ``energies(state)`` returns ``{"total", "kinetic", "potential"}``.
    """
    n = n_side**3
    box = box_length(n, density)
    rc = min(2.5, box / 2)
    grid = (np.stack(np.meshgrid(*[np.arange(n_side)] * 3, indexing="ij"), -1).reshape(-1, 3) + 0.5) * box / n_side
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(n, 3))
    v -= v.mean(0)
    v *= np.sqrt(3 * (n - 1) * temperature / np.sum(v * v))
    positions = jnp.asarray(grid, dtype)
    _, forces = _pair_terms(positions, box, rc)
    state = LJState(positions, jnp.asarray(v, dtype), forces.astype(dtype))
    dt = jnp.asarray(dt, dtype)

    def step(s: LJState) -> LJState:
        v_half = s.velocities + 0.5 * dt * s.forces
        x = s.positions + dt * v_half
        x = x - box * jnp.floor(x / box)
        _, f = _pair_terms(x, box, rc)
        return LJState(x, v_half + 0.5 * dt * f, f)

    def energies(s: LJState):
        u, _ = _pair_terms(s.positions, box, rc)
        k = 0.5 * jnp.sum(s.velocities**2)
        return {"total": u + k, "kinetic": k, "potential": u}

    return step, state, energies


def repeated(step, times: int):
    """``step`` applied ``times`` times per call: the same kernel with a known multiple of the
    work (what a performance check must tell apart from the original)."""
    def many(state):
        for _ in range(times):
            state = step(state)
        return state
    return many

