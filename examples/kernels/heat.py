"""1-D heat equation u_t = α u_xx on a periodic ring, explicit FTCS.

With periodic boundaries the scheme conserves the total heat Σu exactly (up to rounding), and for
r = α·dt/dx² ≤ 1/2 every new value is a convex combination of old ones, so the discrete maximum
principle holds: max u never grows, min u never falls. For r > 1/2 the scheme is unstable
(the checkerboard mode grows by |1 - 4r| per step) — the classic broken-timestep bug.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class HeatState(NamedTuple):
    u: jax.Array  # (n,)


def make_heat(n: int = 256, r: float = 0.4, seed: int = 0, dtype=jnp.float32):
    """Returns ``(step, state, observables)`` for ``n`` cells and diffusion number ``r = α dt/dx²``.

    The initial profile is a hot block plus small noise; ``observables(state)`` ->
    ``{"total", "max", "min"}``."""
    rng = np.random.default_rng(seed)
    x = np.arange(n) / n
    u0 = np.where((x > 0.25) & (x < 0.5), 1.0, 0.0) + 0.01 * rng.random(n)
    r = jnp.asarray(r, dtype)

    def step(s: HeatState) -> HeatState:
        u = s.u
        return HeatState(u + r * (jnp.roll(u, 1) - 2.0 * u + jnp.roll(u, -1)))

    def observables(s: HeatState):
        return {"total": jnp.sum(s.u), "max": jnp.max(s.u), "min": jnp.min(s.u)}

    return step, HeatState(jnp.asarray(u0, dtype)), observables
