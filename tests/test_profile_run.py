"""End to end: jl.run(profile=ProfileWindow, timeline=Timeline) and ProfileWindow beside a Recorder."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernels.oscillators import make_oscillators
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

import pytest_jaxlog as jl
from pytest_jaxlog import JaxlogError
from pytest_jaxlog import Timeline
from pytest_jaxlog.profiling.window import active_window
from pytest_jaxlog import load_trace


@pytest.fixture(scope="module")
def kernel():
    """A small oscillator kernel: a real simulation step with cheap compiles."""
    step, state, energy = make_oscillators(n=64)
    return step, state, energy


def _energy(energy):
    return energy


def test_run_window_5_9_and_timeline(tmp_path, kernel):
    step, state, energies = kernel
    tl = Timeline()
    win = jl.ProfileWindow(5, 9, tmp_path / "prof")
    run = jl.run(step, state, 20, record={"energy": _energy(energies)}, sinks=[jl.MemorySink()],
                 profile=win, timeline=tl, chunk=4)
    assert run.steps_done == 20 and active_window() is None
    trace = load_trace(run.artifacts["jax_trace"])
    assert sorted(trace.steps()) == [5, 6, 7, 8, 9]
    assert run.timings.window is not None and run.timings.window.shape == (5,)
    assert (run.timings.window > 0).all()
    assert run.timings.steps == 20 and run.timings.wall_s > 0

    path = tl.write(tmp_path / "run.pftrace")
    raw = pb.Trace.FromString(path.read_bytes())
    names = {p.track_descriptor.name for p in raw.packet if p.HasField("track_descriptor")}
    assert {"dispatch", "host", "window steps", "energy"} <= names
    back = load_trace(path)
    assert sorted(back.steps()) == [5, 6, 7, 8, 9]
    # one dispatch per window step; chunks elsewhere
    one_step = [s for s in back.slices(track="dispatch") if s.args.get("length") == 1]
    assert {s.args["k0"] for s in one_step} >= {5, 6, 7, 8, 9}
    traj = run.trajectory
    ts, values = back.counters["energy"]
    assert np.all(np.diff(ts) >= 0)
    np.testing.assert_allclose(np.sort(values), np.sort(np.asarray(traj["energy"], dtype=np.float64)[-len(values):]))


def test_run_window_from_step_zero_and_two_windows(tmp_path, kernel):
    step, state, energies = kernel
    a, b = jl.ProfileWindow(0, 1, tmp_path, name="a"), jl.ProfileWindow(6, 7, tmp_path, name="b")
    run = jl.run(step, state, 10, record={"energy": _energy(energies)}, profile=[b, a], chunk=3)
    assert run.steps_done == 10
    assert sorted(load_trace(a.artifacts["jax_trace"]).steps()) == [0, 1]
    assert sorted(load_trace(b.artifacts["jax_trace"]).steps()) == [6, 7]
    assert a.session_dir != b.session_dir


def test_run_refuses_bad_windows(tmp_path, kernel):
    step, state, energies = kernel
    with pytest.raises(JaxlogError, match="overlap"):
        jl.run(step, state, 10, profile=[jl.ProfileWindow(0, 4, tmp_path), jl.ProfileWindow(4, 5, tmp_path)])
    with pytest.raises(JaxlogError, match="work steps 0..9"):
        jl.run(step, state, 10, profile=jl.ProfileWindow(8, 10, tmp_path))
    outer = jl.ProfileWindow(0, 0, tmp_path, name="outer")
    outer.begin()
    try:
        with pytest.raises(JaxlogError, match="'outer'"):
            jl.run(step, state, 4, profile=jl.ProfileWindow(1, 2, tmp_path, name="inner"), chunk=2)
    finally:
        outer.end()
    assert active_window() is None


def test_window_beside_recorder_kups_loop(tmp_path, kernel):
    step, state, energies = kernel
    jstep = jax.jit(step)
    win = jl.ProfileWindow(3, 5, tmp_path)
    rec = jl.Recorder({"energy": _energy(energies)}, sinks=[jl.MemorySink()])
    with jl.CompositeLogger(rec, win) as logger:
        for k in range(8):
            with win.step(k):
                state = jstep(state)
            logger.log(state, k)
    assert sorted(load_trace(win.artifacts["jax_trace"]).steps()) == [3, 4, 5]
    assert active_window() is None


def test_violation_inside_window_stops_the_session(tmp_path):
    def step(s):
        return s[0] * 0.5, s[1] + 1.0

    state = (jnp.ones(4), jnp.float32(0.0))
    win = jl.ProfileWindow(5, 9, tmp_path)
    try:
        with pytest.raises(jl.InvariantViolation):
            jl.run(step, state, 20, record={"t": lambda s: s[1]}, invariants=[jl.bounded("t", hi=6.5)],
                   profile=win, chunk=4)
        assert not win.active and active_window() is None
        assert 7 in load_trace(win.artifacts["jax_trace"]).steps()
    finally:
        if win.active:  # keep the rest of the suite able to profile
            win.end()


def test_window_steps_include_their_device_work(tmp_path):
    """Each window step's annotation waits for the device: the XLA ops its dispatch started run
    inside it (JAX dispatch is asynchronous, on the CPU too), so per-step times are device times."""

    def heavy(s):
        m = s["m"]
        for _ in range(6):
            m = jnp.tanh(m @ m * 1e-3)
        return {"m": m}

    win = jl.ProfileWindow(2, 5, tmp_path)
    run = jl.run(heavy, {"m": jnp.ones((300, 300), jnp.float32)}, 8, profile=win, chunk=2, progress=False)
    trace = load_trace(run.artifacts["jax_trace"])
    steps = trace.slices("jaxlog_step")
    assert sorted(int(s.args["step_num"]) for s in steps) == [2, 3, 4, 5]
    ops = [s for s in trace.slices() if "fusion" in s.name and not s.name.startswith("end")
           and "python" not in s.track and "Compiler" not in s.track and "codegen" not in s.track]
    for s in steps:
        inside = [o for o in ops if s.start_s <= o.start_s < s.end_s]
        assert inside, f"no device op inside window step {s.args['step_num']}"
        assert max(o.end_s for o in inside) <= s.end_s, f"step {s.args['step_num']} ended before its device work"
    assert run.timings.window.shape == (4,) and (run.timings.window > 0).all()


def _stops_at(n):
    return lambda s: s[0] >= n


def test_a_window_past_an_until_stop_reports_no_step_and_says_it_was_not_reached(tmp_path, kernel):
    """The run stops at step 10 (until=) with a window 50..50: the chunk dispatched ahead ran the
    window's step as a dispatch that did no work. Nothing of it is reported: no trace, no
    per-step seconds, no window slice on the timeline, and the window says it was not reached."""
    step, state, energies = kernel
    counter = (jnp.zeros((), jnp.int32), state)

    def counted(s):
        return s[0] + 1, step(s[1])

    win, tl = jl.ProfileWindow(50, 50, tmp_path / "prof"), Timeline()
    run = jl.run(counted, counter, 100, record={"k": lambda s: s[0]}, until=_stops_at(10), profile=win, timeline=tl)
    assert (run.steps_done, run.stop_reason) == (10, "until")
    np.testing.assert_array_equal(run.trajectory["k"], np.arange(11))  # the plain count: steps 0..10 ran
    assert win.done and not win.reached and len(win.ran) == 0
    assert win.note == ("profile window 'window' (steps 50..50) not reached: the run stopped at step 10 (until); "
                        "no step of it ran, nothing was profiled")
    assert run.artifacts == {} and win.artifacts == {} and run.timings.window is None
    assert not win.session_dir.exists()
    back = load_trace(tl.write(tmp_path / "run.pftrace"))
    assert not back.steps() and not back.slices(track="window steps")


def test_a_window_cut_by_an_until_stop_reports_only_its_steps_that_ran(tmp_path, kernel):
    step, state, energies = kernel
    counter = (jnp.zeros((), jnp.int32), state)

    def counted(s):
        return s[0] + 1, step(s[1])

    win, tl = jl.ProfileWindow(50, 55, tmp_path / "prof"), Timeline()
    run = jl.run(counted, counter, 100, record={"k": lambda s: s[0]}, until=_stops_at(52), profile=win, timeline=tl,
                 chunk=7)
    assert (run.steps_done, run.stop_reason) == (52, "until")
    assert list(win.ran) == [50, 51] and win.reached
    assert "partly reached: the run stopped at step 52 (until); only steps 50..51 ran" in win.note
    assert run.timings.window.shape == (2,) and win.step_seconds().shape == (2,)
    assert sorted(load_trace(run.artifacts["jax_trace"]).steps()) == [50, 51, 52, 53, 54, 55]  # the raw trace
    back = load_trace(tl.write(tmp_path / "run.pftrace"))
    assert sorted(back.steps()) == [50, 51]  # what the run reports: the steps that ran
    assert win.note is not None and jl.ProfileWindow(0, 1, tmp_path).note is None

