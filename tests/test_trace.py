"""load_trace on Chrome JSON (JAX's format, real and hand-made) and on garbage."""

from __future__ import annotations

import gzip
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytest_jaxlog import JaxlogError
from pytest_jaxlog import load_trace
from pytest_jaxlog.profiling.trace import find_jax_trace

# What JAX 0.10.2 writes for StepTraceAnnotation("jaxlog_step", step_num=k) (see test_profile.py
# for the same read from a real trace): a complete event whose step_num arg is a string.
EVENTS = [
    {"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "/host:CPU"}},
    {"ph": "M", "pid": 7, "tid": 1, "name": "thread_name", "args": {"name": "python"}},
    {"ph": "X", "pid": 7, "tid": 1, "ts": 10.0, "dur": 5.0, "name": "jaxlog_step", "args": {"step_num": "3"}},
    {"ph": "X", "pid": 7, "tid": 1, "ts": 11.0, "dur": 2.0, "name": "PjitFunction(step)"},
    {"ph": "X", "pid": 7, "tid": 1, "ts": 20.0, "dur": 4.0, "name": "jaxlog_step", "args": {"step_num": "4"}},
    {"ph": "B", "pid": 7, "tid": 2, "ts": 30.0, "name": "jaxlog_step", "args": {"step_num": 5}},
    {"ph": "E", "pid": 7, "tid": 2, "ts": 33.0},
    {"ph": "i", "pid": 7, "tid": 1, "ts": 40.0, "name": "mark", "s": "t"},
    {"ph": "C", "pid": 7, "ts": 41.0, "name": "mem", "args": {"value": 12}},
    {"ph": "X", "pid": 7, "tid": 1, "ts": 50.0, "dur": 1.0, "name": "jaxlog_step", "args": {"step_num": "x"}},
    {},
]


@pytest.mark.parametrize("compress", [True, False])
def test_chrome_json(tmp_path, compress):
    raw = json.dumps({"displayTimeUnit": "ns", "traceEvents": EVENTS}).encode()
    path = tmp_path / ("t.trace.json.gz" if compress else "t.json")
    path.write_bytes(gzip.compress(raw) if compress else raw)
    trace = load_trace(path)
    assert trace.format == "chrome-json"
    assert trace.steps() == {3: pytest.approx(5e-6), 4: pytest.approx(4e-6), 5: pytest.approx(3e-6)}
    np.testing.assert_allclose(trace.step_seconds(range(3, 6)), [5e-6, 4e-6, 3e-6])
    with pytest.raises(JaxlogError, match=r"steps \[6\]"):
        trace.step_seconds(range(3, 7))
    (pjit,) = trace.slices("PjitFunction(step)")
    assert pjit.track == "/host:CPU/python" and pjit.start_s == pytest.approx(11e-6)
    assert [s.name for s in trace.instants()] == ["mark"]
    np.testing.assert_array_equal(trace.counters["mem"][1], [12.0])


def test_log_dir_with_several_sessions_reads_the_newest_one_whole(tmp_path):
    """A log dir reused by several profiler sessions: load_trace(dir) used to take whichever path
    sorted last, and find_jax_trace could mix files of different sessions."""
    import os

    def session(name, step, mtime, files=("perfetto_trace.json.gz", "host.trace.json.gz", "host.xplane.pb")):
        d = tmp_path / name / "plugins" / "profile" / "2026_01_01_00_00_00"
        d.mkdir(parents=True)
        ev = [{"ph": "X", "pid": 1, "tid": 1, "ts": 0.0, "dur": 1.0, "name": "jaxlog_step", "args": {"step_num": step}}]
        for f in files:
            (d / f).write_bytes(gzip.compress(json.dumps(ev).encode()) if f.endswith(".gz") else b"x")
            os.utime(d / f, (mtime, mtime))
        return d

    new = session("a-new", 7, 2_000_000_000, files=("host.trace.json.gz",))
    session("z-old", 3, 1_000_000_000)  # sorts last, written first, and has every kind of file
    found = find_jax_trace(tmp_path)
    assert found == {"jax_trace": new / "host.trace.json.gz", "jax_trace_json": new / "host.trace.json.gz"}
    assert list(load_trace(tmp_path).steps()) == [7]


def test_bare_event_list_and_duplicates(tmp_path):
    events = [{"ph": "X", "pid": 1, "tid": t, "ts": 0, "dur": d, "name": "s", "args": {"step_num": 0}}
              for t, d in ((1, 3.0), (2, 7.0))]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(events))
    assert load_trace(path).steps("s") == {0: pytest.approx(7e-6)}  # longest wins


def test_errors(tmp_path):
    with pytest.raises(JaxlogError, match="does not exist"):
        load_trace(tmp_path / "nope.json.gz")
    bad = tmp_path / "bad.pftrace"
    bad.write_bytes(b"\xff\xfe not a proto \x00\x01")
    with pytest.raises(JaxlogError, match="neither Chrome JSON nor a Perfetto"):
        load_trace(bad)
    badjson = tmp_path / "bad.json"
    badjson.write_text("{ nope")
    with pytest.raises(JaxlogError, match="not valid JSON"):
        load_trace(badjson)
    (tmp_path / "empty").mkdir()
    with pytest.raises(JaxlogError, match="no JAX trace"):
        load_trace(tmp_path / "empty")


def test_query_needs_a_local_binary(tmp_path, monkeypatch):
    monkeypatch.delenv("JAXLOG_TRACE_PROCESSOR", raising=False)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(EVENTS[:3]))
    trace = load_trace(path)
    with pytest.raises(JaxlogError, match="trace_processor_shell"):
        trace.query("select 1", trace_processor_shell=tmp_path / "missing")


def test_real_jax_trace_dir(tmp_path):
    """Plain jax.profiler.trace (no ProfileWindow): the directory loads and the annotation reads back."""
    f = jax.jit(lambda x: x * 2.0)
    x = f(jnp.ones(8))
    with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True):
        for k in (10, 11):
            with jax.profiler.StepTraceAnnotation("jaxlog_step", step_num=k):
                x = f(x)
        x.block_until_ready()
    found = find_jax_trace(tmp_path)
    assert found["jax_trace"].name == "perfetto_trace.json.gz"
    assert found["jax_trace_json"].name.endswith(".trace.json.gz")
    for trace in (load_trace(tmp_path), load_trace(found["jax_trace_json"])):
        assert sorted(trace.steps()) == [10, 11]
        raw = [s.args for s in trace.slices("jaxlog_step")]
        assert raw == [{"step_num": "10"}, {"step_num": "11"}]  # JAX stringifies the arg
