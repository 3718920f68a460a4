"""The run the resume tests share: a Langevin chain (BAOAB, ``examples/kernels/langevin.py``)
whose step draws from ``key=``, checkpointed every 10 steps, with invariants that carry state."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import pytest_jaxlog as jl
from examples.kernels.langevin import make_langevin

TOTAL = 60
CHECKPOINT = 10
CHUNK = 5
DT = 0.05
STEP, STATE, OBSERVABLES = make_langevin(n=16, dim=3, dt=DT, seed=3)
KEY = jax.random.key(7)


def positions(s):
    return s.positions


RECORD = {"obs": OBSERVABLES, "x": jl.Record(positions, every=5)}


def invariants() -> list:
    return [jl.finite("obs"), jl.bounded("obs/temperature", lo=0.0), jl.bounded("obs/msd", hi=10.0),
            jl.aggregate("obs/temperature", "mean", lo=0.0, hi=10.0, steps=jl.window(20, 50))]


def run_kwargs() -> dict:
    """Everything ``jl.run`` is given besides the step, state and length."""
    return dict(record=RECORD, key=KEY, dt=DT, checkpoint=jl.every(CHECKPOINT), chunk=CHUNK,
                invariants=invariants(), progress=False)


class FailAt(jl.CallbackSink):
    """A sink that fails once the run hands it step ``at``: the file ends ``failed``, resumable."""

    def __init__(self, at: int):
        def fail(frames):
            if frames.last_step is not None and frames.last_step >= at:
                raise RuntimeError(f"failing at step {frames.last_step}")

        super().__init__(fail)


def failed_file(path, at: int = 35) -> None:
    """A run of ``TOTAL`` steps that failed past step ``at`` (its checkpoints up to there kept)."""
    try:
        jl.run(STEP, STATE, TOTAL, sinks=[jl.HDF5Writer(path), FailAt(at)], **run_kwargs())
    except jl.JaxlogError:
        pass
    else:
        raise AssertionError("the run was to fail")


def kicked(s):
    """An oscillator kicked by noise drawn from the PRNG key it carries in its state (a dict:
    it comes back from a checkpoint without ``like=``)."""
    k1, k2 = jax.random.split(s["key"])
    v = s["v"] - 0.05 * s["x"] + 0.02 * jax.random.normal(k1, s["v"].shape)
    return {"x": s["x"] + 0.05 * v, "v": v, "key": k2}


def energy(s):
    return 0.5 * jnp.sum(s["x"] ** 2 + s["v"] ** 2)


KICKED0 = {"x": jnp.linspace(-1.0, 1.0, 8), "v": jnp.zeros(8), "key": jax.random.key(3)}
