"""A text chosen inside the step (a solver's convergence message): refused as a log, with the way
documented in docs/log.md, an int code logged and its texts kept in ``meta=``, read back from the
file equal to the messages a plain Python loop picks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl

MESSAGES = ["running", "converged: gradient below tol", "stopped: iteration limit"]
TOL, MAX_IT = 1e-3, 12


def loss(x, target):
    return jnp.sum((x - target) ** 2)


def solve(x, target):
    """Gradient descent until the gradient is below TOL or MAX_IT iterations: which one, as a code."""
    def body(c):
        x, _, i = c
        g = jax.grad(loss)(x, target)
        return x - 0.1 * g, jnp.linalg.norm(g), i + 1

    x, gnorm, i = jax.lax.while_loop(lambda c: (c[1] > TOL) & (c[2] < MAX_IT), body, (x, jnp.inf, 0))
    jl.log("status", jnp.where(gnorm <= TOL, 1, jnp.where(i >= MAX_IT, 2, 0)))
    return x


def step(s):  # each step solves from a target further away: early ones converge, later ones stop
    return {"x": solve(jnp.zeros(2), s["target"]), "target": s["target"] * 4.0}


def plain_messages(steps):
    out, target = [], np.full(2, 1e-4, np.float32)
    for _ in range(steps):
        x, gnorm, i = np.zeros(2, np.float32), np.inf, 0
        while gnorm > TOL and i < MAX_IT:
            g = 2 * (x - target)
            x, gnorm, i = x - np.float32(0.1) * g, float(np.linalg.norm(g)), i + 1
        out.append(MESSAGES[1] if gnorm <= TOL else MESSAGES[2])
        target = target * np.float32(4.0)
    return out


def test_a_message_as_an_int_code_and_its_texts_in_meta(tmp_path):
    state = {"x": jnp.zeros(2), "target": jnp.full(2, 1e-4, jnp.float32)}
    jl.run(step, state, 6, meta={"status": MESSAGES}, sinks=[jl.HDF5Writer(tmp_path / "t.h5")], progress=False)
    traj = jl.load(tmp_path / "t.h5")
    got = [traj.meta["status"][int(code)] for code in traj["log/status"]]
    assert got == plain_messages(6)
    assert set(got) == set(MESSAGES[1:])  # both messages occur: the test can tell them apart


def test_a_string_log_is_refused_pointing_to_the_code_and_meta():
    with pytest.raises(jl.JaxlogError, match=r"log 'msg' at test_log_messages.py:\d+: value leaf 'converged' is not "
                                             r"an array.*logged as an int code, its texts kept in meta="):
        jl.spool(lambda x: jl.log("msg", "converged") and x)(jnp.zeros(2))
