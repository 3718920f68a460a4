"""Regression-test suites of a 256-oscillator kernel, written as users write them, for the ``suite``
benchmark: each is a test module of parametrized tests (one per initial state), every test a run
of ``STEPS`` steps recording the energy every step and the positions every 100, checking that
both are finite and the energy conserved (rtol 1e-2), and keeping the trajectory in a file.

- ``reference``: by hand, a module-level jitted ``lax.scan``, numpy checks, an h5py file;
- ``inline``: the ``jaxlog`` fixture, the views written inline in each test;
- ``factory``: the ``jaxlog`` fixture, the kernel and its views made by a factory in each test
  (as ``examples/`` does with ``make_lj``);
- ``module``: the ``jaxlog`` fixture, kernel and views defined once at module level.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

SUITES = ("reference", "inline", "factory", "module")

KERNEL = '''
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

N, STEPS, SEEDS, EVERY = 256, {steps}, {tests}, 100


class Osc(NamedTuple):
    x: jax.Array
    v: jax.Array


def make_kernel(seed=0):
    """(step, state, energy): velocity Verlet, a spring constant per oscillator."""
    rng = np.random.default_rng(seed)
    k = jnp.asarray(rng.uniform(0.5, 2.0, size=N), jnp.float32)
    dt = jnp.float32(0.01)

    def step(s):
        v = s.v - 0.5 * dt * k * s.x
        x = s.x + dt * v
        return Osc(x, v - 0.5 * dt * k * x)

    def energy(s):
        return jnp.sum(0.5 * s.v**2 + 0.5 * k * s.x**2)

    return step, initial(seed), energy


def initial(seed):
    rng = np.random.default_rng(1000 + seed)
    return Osc(jnp.asarray(rng.normal(size=N), jnp.float32), jnp.asarray(rng.normal(size=N), jnp.float32))


STEP, _, ENERGY = make_kernel(0)  # the module-level kernel
K = jnp.asarray(np.random.default_rng(0).uniform(0.5, 2.0, size=N), jnp.float32)
'''

TESTS = {
    "reference": '''
import h5py
import jax
import numpy as np
import pytest
from jax import lax

from osc_kernel import ENERGY, EVERY, SEEDS, STEP, STEPS, initial


@jax.jit
def simulate(state):
    def inner(s, _):
        s = STEP(s)
        return s, ENERGY(s)

    def outer(s, _):
        s, e = lax.scan(inner, s, None, length=EVERY)
        return s, (e, s.x)

    end, (e, x) = lax.scan(outer, state, None, length=STEPS // EVERY)
    return end, ENERGY(state), e.reshape(-1), state.x, x


@pytest.mark.parametrize("seed", range(SEEDS))
def test_oscillators(seed, tmp_path):
    _, e0, e, x0, x = simulate(initial(seed))
    energy = np.concatenate([np.asarray(e0)[None], np.asarray(e)])
    positions = np.concatenate([np.asarray(x0)[None], np.asarray(x)])
    assert np.isfinite(energy).all() and np.isfinite(positions).all()
    assert np.max(np.abs(energy / energy[0] - 1)) <= 1e-2
    with h5py.File(tmp_path / "trajectory.h5", "w") as f:
        f["energy"], f["positions"] = energy, positions
''',
    "inline": '''
import jax.numpy as jnp
import pytest

import pytest_jaxlog as jl
from osc_kernel import EVERY, K, SEEDS, STEP, STEPS, initial


@pytest.mark.parametrize("seed", range(SEEDS))
def test_oscillators(seed, jaxlog):
    run = jaxlog.run(STEP, initial(seed), STEPS,
                     record={"energy": lambda s: jnp.sum(0.5 * s.v**2 + 0.5 * K * s.x**2),
                             "positions": jl.Record(lambda s: s.x, every=EVERY)},
                     invariants=[jl.finite("energy", "positions"), jl.conserved("energy", rtol=1e-2)])
    assert run.steps_done == STEPS
''',
    "factory": '''
import pytest

import pytest_jaxlog as jl
from osc_kernel import EVERY, SEEDS, STEPS, make_kernel


@pytest.mark.parametrize("seed", range(SEEDS))
def test_oscillators(seed, jaxlog):
    step, state, energy = make_kernel(seed)
    run = jaxlog.run(step, state, STEPS, record={"energy": energy, "positions": jl.Record(lambda s: s.x, every=EVERY)},
                     invariants=[jl.finite("energy", "positions"), jl.conserved("energy", rtol=1e-2)])
    assert run.steps_done == STEPS
''',
    "module": '''
import pytest

import pytest_jaxlog as jl
from osc_kernel import ENERGY, EVERY, SEEDS, STEP, STEPS, initial


def positions(s):
    return s.x


RECORD = {"energy": ENERGY, "positions": jl.Record(positions, every=EVERY)}
INVARIANTS = [jl.finite("energy", "positions"), jl.conserved("energy", rtol=1e-2)]


@pytest.mark.parametrize("seed", range(SEEDS))
def test_oscillators(seed, jaxlog):
    run = jaxlog.run(STEP, initial(seed), STEPS, record=RECORD, invariants=INVARIANTS)
    assert run.steps_done == STEPS
''',
}


def write_suites(where: Path, tests: int, steps: int) -> dict[str, Path]:
    """The four suites' test modules (and their kernel module) in ``where``: ``{suite: path}``."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "osc_kernel.py").write_text(textwrap.dedent(KERNEL).format(steps=steps, tests=tests).lstrip())
    out = {}
    for name in SUITES:
        out[name] = where / f"test_suite_{name}.py"
        out[name].write_text(textwrap.dedent(TESTS[name]).lstrip())
    return out
