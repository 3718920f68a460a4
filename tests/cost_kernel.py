"""The test module the cost-golden tests write with pytester: one kernel whose work a test varies
(``KERNEL.format(work=PLAIN)``; ``TWICE`` does twice the transcendentals, ``CHEAPER`` fewer), its
cost checked against ``GOLDEN``."""

KERNEL = """
import jax.numpy as jnp
import pytest_jaxlog as jl

def step(x):
    return {work}

def test_cost(jaxlog):
    run = jaxlog.run(step, jnp.linspace(0.0, 1.0, 64), 10, record={{"mean": lambda x: x.mean()}})
    assert jaxlog.check_cost(run) in ("ok", "created", "regenerated")
"""
PLAIN = "x * 0.9 + jnp.sin(x)"
TWICE = "x * 0.9 + jnp.sin(x) + jnp.sin(x + 1.0)"
CHEAPER = "x * 0.9"
GOLDEN = "fixtures/golden/test_k.test_cost.cost.json"
