"""A run recording large arrays stays within the memory bound ``drive.memory`` states.

Each case runs in a fresh process (peak resident memory, ``VmHWM``, is per process and never
goes down), and its growth is measured against a process running the same kernel on the same
state recording only a scalar: what recording the array costs. Memory, unlike time, is
deterministic enough for a test: what varies is the allocator's slack (glibc keeps freed blocks
below its mmap threshold for reuse, JAX's CPU client frees a buffer when its last view dies) and
the Python and XLA bookkeeping, a few tens of MiB; hence 25% slack on the bound, far below what
one more record held per step would add (the bound is ~3x a set of buffers; the runs before the
bound held up to ~15x a record). The runs' files are compared with a run in small chunks: views
of the buffers instead of copies must not change a value.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.drive.memory import bound, set_bytes

MB = 2**20
STEPS = 12
SLACK = 1.25

_CASE = textwrap.dedent("""
    import json, os, sys
    import jax, jax.numpy as jnp
    import pytest_jaxlog as jl

    def hwm():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))

    sink, mb, steps, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    x0 = jnp.zeros((mb * 2**20 // 4,), jnp.float32)
    step = lambda x: x * jnp.float32(0.5) + jnp.float32(1.0)
    if sink == "baseline":
        record, sinks = {"s": lambda x: x[0]}, [jl.CallbackSink(lambda frames: None)]
    else:
        record = {"x": lambda x: x}
        sinks = [jl.HDF5Writer(path)] if sink == "hdf5" else [jl.CallbackSink(lambda frames: None)]
    run = jl.run(step, x0, steps, record=record, sinks=sinks)
    jax.block_until_ready(run.state)
    print(json.dumps({"peak": hwm()}))
""")


def _peak(sink: str, mb: int, path: str) -> int:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", _CASE, sink, str(mb), str(STEPS), path], env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["peak"]


def _small_chunks(mb: int) -> jl.MemorySink:
    """The same run in chunks of 2 steps, copied out of buffers reused: the values to expect."""
    import jax.numpy as jnp

    mem = jl.MemorySink()
    x0 = jnp.zeros((mb * MB // 4,), jnp.float32)
    jl.run(lambda x: x * jnp.float32(0.5) + jnp.float32(1.0), x0, STEPS, record={"x": lambda x: x},
           sinks=[mem], chunk=2, progress=False)
    return mem


@pytest.mark.parametrize("mb", [16, pytest.param(64, marks=pytest.mark.campaign)])  # 64 MB a step: ~3 GB resident
@pytest.mark.parametrize("sink", ["hdf5", "drop"])
def test_peak_memory_within_the_bound(tmp_path, sink, mb):
    base = _peak("baseline", mb, str(tmp_path / "base.h5"))
    path = str(tmp_path / "t.h5")
    growth = _peak(sink, mb, path) - base
    limit = bound(mb * MB, sink=sink).host
    assert growth <= SLACK * limit, (f"{sink}, {mb} MB a step: peak RSS grew by {growth / MB:.0f} MiB, "
                                     f"bound {limit / MB:.0f} MiB (+25%)")
    if sink == "hdf5":
        got = jl.load(path)
        assert list(got.steps("x")) == list(range(STEPS + 1))
        values = np.asarray(got["x"])
        assert np.array_equal(values, np.asarray(jl.Trajectory.from_sink(_small_chunks(mb))["x"]))
        expected = np.zeros(mb * MB // 4, np.float32)
        for k in range(STEPS + 1):  # the same arithmetic, step by step, in float32
            assert np.array_equal(values[k], expected), k
            expected = expected * np.float32(0.5) + np.float32(1.0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])  # bfloat16: no DLPack view, copied
def test_views_of_large_sets_equal_copies_of_small_ones(dtype):
    """A set over ``VIEW_BYTES`` reaches the sinks as views of its buffers, each set fresh: the
    frames equal those of a run whose sets are copied and reused, and no frame changes later."""
    import jax.numpy as jnp

    from pytest_jaxlog.drive.chunks import VIEW_BYTES

    dt = jnp.dtype(dtype)
    n = VIEW_BYTES // dt.itemsize // 2 + 1  # each set (3 rows and more) is past VIEW_BYTES
    x0 = jnp.arange(n, dtype=dt) / n
    step = lambda x: jnp.sin(x) * jnp.asarray(1.5, dt) + jnp.asarray(0.25, dt)  # noqa: E731
    big, small = jl.MemorySink(), jl.MemorySink()
    jl.run(step, x0, 9, record={"x": lambda x: x, "e": lambda x: jnp.sum(x)}, sinks=[big], progress=False)
    jl.run(step, x0, 9, record={"x": lambda x: x, "e": lambda x: jnp.sum(x)}, sinks=[small], chunk=1,
           chunk_budget_bytes=1, progress=False)
    got, want = jl.Trajectory.from_sink(big), jl.Trajectory.from_sink(small)
    assert np.array_equal(got.steps("x"), np.arange(10))
    assert np.array_equal(np.asarray(got["x"]), np.asarray(want["x"]))
    assert np.array_equal(np.asarray(got["e"]), np.asarray(want["e"]))
    if dtype != "float32":
        return
    x = np.asarray(x0)
    for k in range(10):  # the step applied plainly in numpy (libm and XLA sines differ in the last bits)
        np.testing.assert_allclose(np.asarray(got["x"])[k], x, rtol=1e-4, atol=1e-3, err_msg=str(k))
        x = np.sin(x) * np.float32(1.5) + np.float32(0.25)


def test_bound_follows_the_budget():
    """One set holds the chunk's rows and the initial frame's row; a record past half the budget
    still gets 2 steps a chunk (3 rows)."""
    assert set_bytes(64 * MB) == 3 * 64 * MB
    assert set_bytes(16 * MB) == 5 * 16 * MB
    assert set_bytes(16 * MB, budget=256 * MB) == 17 * 16 * MB
    assert set_bytes(16 * MB, every=4) == (4 + 2) * 16 * MB  # 16 steps a chunk: 4 slots, the initial frame, a spare
    b = bound(64 * MB, sink="hdf5", platform="gpu")
    assert b.device == 2 * 3 * 64 * MB and b.host == 3 * 64 * MB + 3 * 128 * MB + 2 * 64 * MB
    assert bound(64 * MB, sink="memory").host is None
