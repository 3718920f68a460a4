"""Shared by the tests that run pytest sessions inside pytest (pytester): a toy kernel their test
files start from, and the outer session's JAXLOG_* kept out of the inner sessions."""

from __future__ import annotations

import os

import pytest

KERNEL = """
import jax.numpy as jnp
import pytest
import pytest_jaxlog as jl

def rotate(s):
    x, v = s
    return (x + 0.01 * v, v - 0.01 * (x + 0.01 * v))

def explode(s):
    return (s[0] * 1.5, s[1])

def energy(s):
    x, v = s
    return 0.5 * jnp.sum(x * x + v * v)

STATE = (jnp.linspace(0.0, 1.0, 8), jnp.zeros(8))
"""


@pytest.fixture(autouse=True)
def no_jaxlog_env(monkeypatch):
    """The inner sessions see the plugin's defaults, whatever JAXLOG_* (or CI) the outer one has (CI
    sets JAXLOG_KEEP). Autouse in every module that imports it."""
    for name in [k for k in os.environ if k.startswith("JAXLOG_")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("CI", raising=False)  # CI turns golden review on: a test that wants it sets it


def fresh_programs() -> None:
    """Forget every program this process compiled (JAX's caches and the driver's): an in-process
    inner session that counts compilations then sees what a fresh process would, whatever
    equal kernels earlier inner sessions of this worker ran (jl.run reuses equal programs)."""
    import jax

    from pytest_jaxlog.drive.prepare.identity import clear_caches

    clear_caches()
    jax.clear_caches()

