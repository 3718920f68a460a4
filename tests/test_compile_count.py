"""Every compilation a run causes is counted, and a state's placement or types never make it
compile twice: each case is checked against JAX's own count of backend compilations (its
monitoring events), taken apart from the driver's tracker."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import monitoring

import pytest_jaxlog as jl

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"  # JAX's event, one per backend compilation
_seen: list[tuple[str, float]] = []


def _listen(name, seconds, **kw):
    if name == BACKEND_COMPILE:
        _seen.append((str(kw.get("fun_name", "")), float(seconds)))


monitoring.register_event_duration_secs_listener(_listen)


@contextlib.contextmanager
def jax_compiles():
    """The chunk program's backend compilations JAX reports while the block runs: [seconds, ...]."""
    start = len(_seen)
    out: list[float] = []
    yield out
    out.extend(s for name, s in _seen[start:] if "chunk_impl" in name)


def fresh_step(scale: float):
    """A step no earlier test compiled (its constant differs), so the first run compiles."""
    def step(s):
        return {**s, "t": s["t"] + 0.01, "x": s["x"] * scale}
    return step


DEVICE = jax.devices()[0]
STATES = {
    "a committed 0-d leaf, the rest uncommitted": lambda: {"t": jax.device_put(jnp.float32(0.0), DEVICE),
                                                            "x": jnp.ones(3)},
    "every leaf committed": lambda: {"t": jax.device_put(jnp.float32(0.0), DEVICE),
                                     "x": jax.device_put(jnp.ones(3), DEVICE)},
    "nothing committed": lambda: {"t": jnp.float32(0.0), "x": jnp.ones(3)},
    "a weakly typed leaf": lambda: {"t": jnp.asarray(0.0), "x": jnp.ones(3)},
    "a Python float": lambda: {"t": 0.0, "x": jnp.ones(3)},
    "a numpy scalar": lambda: {"t": np.float32(0.0), "x": np.ones(3, np.float32)},
    "a committed leaf and a numpy one": lambda: {"t": np.float32(0.0), "x": jax.device_put(jnp.ones(3), DEVICE)},
}


@pytest.mark.parametrize("case", sorted(STATES))
def test_a_state_compiles_its_program_once_whatever_its_placement_and_types(case):
    scale = 0.5 + 0.01 * sorted(STATES).index(case)
    with jax_compiles() as seen:
        run = jl.run(fresh_step(scale), STATES[case](), 300, record={"m": lambda s: s["x"].mean()}, chunk=100,
                     progress=False)
    assert len(seen) == 1, case
    assert run.timings.compiles == len(run.timings.compile_events) == 1
    run.timings.assert_compiles(1)
    np.testing.assert_allclose(np.asarray(run.state["x"]), np.full(3, scale ** 300, np.float32), rtol=1e-5)


def test_a_committed_key_or_constant_compiles_once_too():
    """A key or an array in the step's closure committed to the device commits the chunk's outputs:
    the state is committed from the first chunk on, so the second does not compile again."""
    key = jax.device_put(jax.random.key(0), DEVICE)
    with jax_compiles() as seen:
        run = jl.run(lambda k, s: {"x": s["x"] * 0.91 + 1e-3 * jax.random.normal(k, (3,))}, {"x": jnp.ones(3)}, 300,
                     key=key, record={"m": lambda s: s["x"].mean()}, chunk=100, progress=False)
    assert len(seen) == 1 and run.timings.compiles == 1
    shift = jax.device_put(jnp.arange(3.0), DEVICE)
    with jax_compiles() as seen:
        run = jl.run(lambda s: {"x": s["x"] * 0.92 + shift}, {"x": jnp.ones(3)}, 300,
                     record={"m": lambda s: s["x"].mean()}, chunk=100, progress=False)
    assert len(seen) == 1 and run.timings.compiles == 1


def _clear_once():
    cleared: list[int] = []

    def fn(step, rows):
        if not cleared:  # after the first frames: the next chunk finds no program in JAX's caches
            cleared.append(step)
            jax.clear_caches()
    return jl.CallbackSink(fn, rows=True)


def test_the_same_program_compiled_twice_counts_twice_and_says_why():
    with jax_compiles() as seen:
        run = jl.run(fresh_step(0.3), STATES["nothing committed"](), 3000, record={"m": lambda s: s["x"].mean()},
                     chunk=100, sinks=[_clear_once()], progress=False)
    t = run.timings
    assert len(seen) == 2  # JAX compiled it twice
    assert t.compiles == len(t.compile_events) == 2 and t.programs == 1
    assert t.compile_events[0].reason is None
    assert "the same arguments as the first dispatch; JAX's caches no longer held the program" in t.compile_events[1].reason
    with pytest.raises(jl.TimingAssertionError) as info:
        t.assert_compiles(1)
    msg = str(info.value)
    assert msg.startswith("[jaxlog] expected 1 program, saw 2 (the run needed 1 program and compiled 2 times")
    assert "compiled again: chunk " in msg
    # neither compile is stepping time: the loop's time less both dispatches that compiled
    assert t.stepping_s is not None and t.stepping_s <= t.wall_s - sum(seen)


def test_a_differing_argument_is_named():
    from pytest_jaxlog.drive.device.program import Signature

    a = Signature.of(({"t": jnp.float32(0.0), "x": jnp.ones(3)}, None))
    b = Signature.of(({"t": jax.device_put(jnp.float32(0.0), DEVICE), "x": jnp.ones(3)}, None))
    why = b.differs(a, at="chunk 1")
    assert why.startswith("chunk 1: state['t']: placement None -> ") and "x" not in why


def test_no_compile_is_inside_a_profile_window(tmp_path):
    """A window that opens at the first step: the program is compiled before the profiler starts,
    so the window's per-step seconds hold no compilation."""
    with jax_compiles() as seen:
        run = jl.run(fresh_step(0.7), STATES["nothing committed"](), 20, record={"m": lambda s: s["x"].mean()},
                     profile=jl.ProfileWindow(0, 4, tmp_path / "w"), progress=False)
    assert len(seen) == 1 and run.timings.compiles == 1
    window = run.timings.window
    assert window is not None and len(window) == 5
    assert float(window.max()) < seen[0]  # a step of this kernel takes far less than compiling it did
