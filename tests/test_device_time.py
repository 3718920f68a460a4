"""Device time: the accelerator's busy seconds read from a real JAX trace (one taken on an NVIDIA
H200, committed), overlapping streams counted once, and a clear refusal where there is no device
(this CPU backend), never wall time passed off as device time."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import pytest_jaxlog as jl
from examples.kernels.lj import make_lj
from pytest_jaxlog.errors import JaxlogError
from pytest_jaxlog.profiling.window import device_seconds

H200 = Path(__file__).parent.parent / "fixtures" / "traces" / "h200-lj512-window.perfetto_trace.json.gz"


def _union_by_sweep(spans):
    """The union's length by a sweep over start/end events (a second way to count it)."""
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], -e[1]))
    depth, total, opened = 0, 0.0, None
    for t, d in events:
        if depth == 0 and d == 1:
            opened = t
        depth += d
        if depth == 0:
            total += t - opened
    return total


def test_an_h200_traces_device_time():
    """The trace of a 10-step window of LJ-512 on an H200: its GPU streams' slices, counted once."""
    trace = jl.load_trace(H200)
    spans = [(s.start_s, s.end_s) for s in trace.all_slices if s.track.startswith("/device:GPU:0/") and s.dur_s > 0]
    assert len(spans) > 200  # kernels and copies of three streams
    busy = trace.device_busy_s()
    assert busy == pytest.approx(_union_by_sweep(spans), rel=1e-12)
    assert 0 < busy <= sum(b - a for a, b in spans)
    # the figures the docs quote (timings.md, performance-gpu.md): the device worked 0.30 ms of
    # the window's 6.5 ms of host time, and each of the 10 steps' loops asked the host for its
    # condition: a compare kernel and a device-to-host copy per iteration, 40 of each
    host = sum(s.dur_s for s in trace.slices("jaxlog_step"))
    assert len(trace.slices("jaxlog_step")) == 10
    assert round(busy * 1e3, 2) == 0.30 and round(host * 1e3, 1) == 6.5
    stream = [s.name for s in trace.all_slices if s.track.startswith("/device:GPU:0/Stream #14")]
    assert stream.count("wrapped_compare_1") == 40 and stream.count("MemcpyD2H") == 40


def test_overlapping_streams_count_once_and_devices_add(tmp_path):
    def x(pid, tid, ts, dur):
        return {"ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "name": "k"}

    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
              {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/device:GPU:1"}},
              {"ph": "M", "name": "process_name", "pid": 3, "args": {"name": "/host:CPU"}},
              x(1, 1, 0, 10), x(1, 2, 5, 10), x(1, 1, 30, 5),  # GPU 0: [0, 15] and [30, 35] = 20 us
              x(2, 1, 0, 7),  # GPU 1: 7 us
              x(3, 1, 0, 1000)]  # the host: not device time
    path = tmp_path / "t.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    assert jl.load_trace(path).device_busy_s() == pytest.approx(27e-6)


def test_no_device_no_device_time(tmp_path):
    """On the CPU backend the trace has no device track: an error that says so, for the call and
    for jl.benchmark(timer='device'); timer='auto' is wall time there and says which."""
    assert jax.default_backend() == "cpu"
    with pytest.raises(JaxlogError, match=r"no device track.*'cpu'.*wall-clock"):
        device_seconds(lambda: jnp.ones(8) * 2)
    step, state, _ = make_lj(n_side=2)
    with pytest.raises(JaxlogError, match="no device track"):
        jl.benchmark(step, state, 20, repeats=1, number=1, timer="device", progress=False)
    b = jl.benchmark(step, state, 20, repeats=1, number=1, timer="auto", progress=False)
    assert b.timer == "wall" and "device time" not in b.describe()
    with pytest.raises(JaxlogError, match="timer= must be"):
        jl.benchmark(step, state, 20, timer="gpu")
    with pytest.raises(JaxlogError, match="leave profile= out"):
        jl.benchmark(step, state, 20, timer="device", profile=jl.ProfileWindow(2, 3, tmp_path))


def test_device_time_is_said_in_the_figures():
    b = jl.Benchmark.of(100, [(1e-3, 2e-3)], None, timer="device")
    assert "device time from the profiler's trace" in b.describe()
    assert "device time" not in jl.Benchmark.of(100, [(1e-3, 2e-3)]).describe()
