"""ProfileWindow with the real JAX profiler on the CPU: the trace holds exactly the window's steps.

JAX 0.10.2 allows many start/stop_trace sessions per process (one at a time), so most tests run
in-process; one runs in a fresh subprocess to cover a process whose first session is the window.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import pytest_jaxlog as jl

from pytest_jaxlog import JaxlogError, JaxlogRuntimeWarning
from pytest_jaxlog import Timeline
from pytest_jaxlog import ProfileWindow
from pytest_jaxlog.profiling.window import active_window, check_windows
from pytest_jaxlog import load_trace


@jax.jit
def _step(x):
    return x * 0.999 + jnp.sin(x) * 1e-3


@pytest.fixture
def state():
    x = _step(jnp.ones((64, 3)))
    yield x.block_until_ready()
    assert active_window() is None, "a test left a profiler session running"


def _trace_steps(window):
    return sorted(load_trace(window.artifacts["jax_trace"]).steps())


def test_iterate_captures_exactly_the_window(tmp_path, state):
    win = ProfileWindow(3, 7, tmp_path)
    for k in win.iterate(12):
        state = _step(state)
    assert win.done and not win.active
    assert _trace_steps(win) == [3, 4, 5, 6, 7]
    assert sorted(load_trace(win.artifacts["jax_trace_json"]).steps()) == [3, 4, 5, 6, 7]
    assert win.artifacts["jax_trace"].name == "perfetto_trace.json.gz"
    assert win.artifacts["xplane"].exists()
    assert win.artifacts["profile_dir"] == win.session_dir
    assert win.session_dir.parent == tmp_path
    assert win.session_dir.name.startswith(f"window-3-7-{os.getpid()}-")
    secs = win.step_seconds()
    assert secs.shape == (5,) and (secs > 0).all()


def test_logger_protocol_start_zero(tmp_path, state):
    win = ProfileWindow(0, 2, tmp_path)
    with win:
        assert win.active  # start == 0 arms at __enter__
        for k in range(6):
            with win.step(k):
                state = _step(state)
            win.log(state, k)
            if k == 2:
                assert win.done
    assert _trace_steps(win) == [0, 1, 2]


def test_logger_protocol_arms_one_call_early(tmp_path, state):
    win = ProfileWindow(4, 6, tmp_path, name="kups")
    seen = []
    with win:
        for k in range(10):
            seen.append(win.active)
            with win.step(k):
                state = _step(state)
            win.log(state, k)
    # active while doing steps 4, 5, 6: begun by log(state, 3), ended by log(state, 6)
    assert seen == [False] * 4 + [True] * 3 + [False] * 3
    assert _trace_steps(win) == [4, 5, 6]
    assert win.session_dir.name.startswith("kups-4-6-")


def test_logger_protocol_with_state_after_labels_beside_a_recorder(tmp_path, state):
    """The labels jl.run and jl.Recorder use (log(s, k + 1) after work step k) in one
    CompositeLogger: the window still holds exactly work steps start..stop."""
    win = ProfileWindow(2, 4, tmp_path)
    rec = jl.Recorder({"m": lambda x: x.mean()})
    with jl.CompositeLogger(win, rec) as lg:
        lg.log(state, 0)
        for k in range(7):
            with win.step(k):
                state = _step(state)
            lg.log(state, k + 1)
    assert win.done and _trace_steps(win) == [2, 3, 4]
    assert list(rec.trajectory.steps("m")) == list(range(8))
    # kUPS labels with log() inside the annotation still stop right after work step `stop`
    win = ProfileWindow(1, 2, tmp_path)
    with win:
        for k in range(5):
            with win.step(k):
                state = _step(state)
                win.log(state, k)
            if k == 2:
                assert win.done
    assert _trace_steps(win) == [1, 2]


def test_log_inside_iterate_defers_the_stop(tmp_path, state):
    """A log(state, stop) inside the last annotation must not cut step `stop` out of the trace."""
    win = ProfileWindow(1, 2, tmp_path)
    for k in win.iterate(4):
        state = _step(state)
        win.log(state, k)
    assert _trace_steps(win) == [1, 2]


def test_two_windows_in_the_same_second_do_not_overwrite(tmp_path, state):
    a, b = ProfileWindow(0, 1, tmp_path), ProfileWindow(0, 1, tmp_path)
    for k in a.iterate(2):
        state = _step(state)
    for k in b.iterate(range(0, 2)):
        state = _step(state)
    assert a.session_dir != b.session_dir
    assert a.artifacts["jax_trace"] != b.artifacts["jax_trace"]
    assert a.artifacts["jax_trace"].exists() and b.artifacts["jax_trace"].exists()
    assert _trace_steps(a) == _trace_steps(b) == [0, 1]


def test_second_concurrent_session_is_refused(tmp_path, state):
    first = ProfileWindow(0, 3, tmp_path, name="first")
    first.begin()
    try:
        with pytest.raises(JaxlogError) as info:
            ProfileWindow(5, 6, tmp_path, name="second").begin()
        assert "'second'" in str(info.value) and "'first'" in str(info.value)
        assert active_window() is first
    finally:
        first.end(block_on=state)
    # a profiler started outside pytest-jaxlog is detected through JAX's RuntimeError
    jax.profiler.start_trace(str(tmp_path / "outside"))
    try:
        with pytest.raises(JaxlogError, match="another profiler session is already running"):
            ProfileWindow(0, 1, tmp_path, name="third").begin()
    finally:
        jax.profiler.stop_trace()
    assert not list(tmp_path.glob("third-*"))  # no empty session dir left behind
    assert active_window() is None
    for k in (w := ProfileWindow(0, 0, tmp_path)).iterate(1):  # and the next window works
        state = _step(state)
    assert _trace_steps(w) == [0]


def test_overlapping_windows_and_bad_input(tmp_path):
    a, b, c = ProfileWindow(0, 4, tmp_path), ProfileWindow(4, 8, tmp_path), ProfileWindow(9, 9, tmp_path)
    with pytest.raises(JaxlogError, match="overlap"):
        check_windows([c, b, a])
    assert check_windows([c, a]) == (a, c)
    assert check_windows(None) == () and check_windows(a) == (a,)
    with pytest.raises(JaxlogError, match="given twice"):
        check_windows([a, a])
    with pytest.raises(JaxlogError, match=r"work steps 0..8"):
        check_windows([c], steps=9)
    check_windows([c], steps=10)
    with pytest.raises(JaxlogError, match=r"starts at work step 0 but the run resumes at step 2 \(work steps 2..9\)"):
        check_windows([a], steps=10, first=2)  # a resumed run would capture steps 2..4 only
    check_windows([c], steps=10, first=9)
    with pytest.raises(JaxlogError, match="before start"):
        ProfileWindow(5, 4, tmp_path)
    with pytest.raises(JaxlogError, match=">= 0"):
        ProfileWindow(-1, 4, tmp_path)
    with pytest.raises(JaxlogError, match="ProfileWindow start must be an integer step"):
        ProfileWindow(True, 4, tmp_path)
    with pytest.raises(JaxlogError, match="directory name"):
        ProfileWindow(0, 1, tmp_path, name="a/b")
    with pytest.raises(JaxlogError, match="not started"):
        with a.step(2):
            pass
    with a.step(7):  # outside the window: a no-op, no session needed
        pass


def test_used_window_cannot_restart_and_exception_stops_the_session(tmp_path, state):
    win = ProfileWindow(0, 5, tmp_path)
    with pytest.raises(RuntimeError, match="boom"):
        with win:
            for k in range(3):
                with win.step(k):
                    state = _step(state)
                win.log(state, k)
            raise RuntimeError("boom")
    assert win.done and active_window() is None
    assert _trace_steps(win) == [0, 1, 2]  # what ran before the error is kept
    with pytest.raises(JaxlogError, match="already done"):
        win.begin()
    with pytest.raises(JaxlogError, match="already used"):
        check_windows([win])


def test_late_arming_warns(tmp_path, state):
    win = ProfileWindow(2, 5, tmp_path)
    with win:
        with pytest.warns(JaxlogRuntimeWarning, match=r"steps 2..3 are not in the trace"):
            win.log(state, 3)  # logged only every few steps: missed log(state, 1)
        with win.step(4):
            state = _step(state)
        win.log(state, 4)
        with win.step(5):
            state = _step(state)
        win.log(state, 5)
    assert _trace_steps(win) == [4, 5]


def test_python_tracer_off_by_default_and_timeline_copy(tmp_path, state):
    def marker_function_for_the_tracer(x):
        return _step(x)

    default = ProfileWindow(0, 1, tmp_path)
    for k in default.iterate(2):
        state = marker_function_for_the_tracer(state)
    traced = ProfileWindow(0, 1, tmp_path, python_tracer_level=1)
    for k in traced.iterate(2):
        state = marker_function_for_the_tracer(state)
    names = lambda w: [n for n in load_trace(w.artifacts["jax_trace"]).names() if "marker_function" in n]  # noqa: E731
    assert names(default) == []
    assert names(traced) != []

    tl = Timeline()
    default.add_to_timeline(tl)
    back = load_trace(tl.write(tmp_path / "run.pftrace"))
    assert sorted(back.steps()) == [0, 1]
    assert {s.track for s in back.slices("jaxlog_step")} == {"window steps"}


def test_fresh_process_window(tmp_path):
    """A process whose only profiler session is the window (also how xdist workers see it)."""
    code = textwrap.dedent(f"""
        import jax, jax.numpy as jnp
        from pytest_jaxlog import ProfileWindow
        from pytest_jaxlog import load_trace
        step = jax.jit(lambda x: x * 0.5 + 1.0)
        x = jnp.ones((16,))
        win = ProfileWindow(0, 3, {str(tmp_path)!r})
        with win:
            for k in range(5):
                with win.step(k):
                    x = step(x)
                win.log(x, k)
        print(sorted(load_trace(win.artifacts["jax_trace"]).steps()))
    """)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                         cwd=Path(__file__).parent.parent)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == "[0, 1, 2, 3]"
