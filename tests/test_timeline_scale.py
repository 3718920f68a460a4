"""The run timeline scales: counter samples carry their step number, and a long run's counter
tracks are thinned (the trace says so) so the ``.pftrace`` stays a fraction of the trajectory."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import pytest_jaxlog as jl
from pytest_jaxlog.profiling.timeline import MAX_COUNTER_SAMPLES, NOTES_TRACK, _extremes


def step(s):
    v = s["v"] - 0.01 * jnp.sin(s["x"])
    return {"x": s["x"] + 0.01 * v, "v": v}


def observables(s):
    ke = jnp.sum(0.5 * s["v"] ** 2)
    pe = -jnp.sum(jnp.cos(s["x"]))
    return {"total": ke + pe, "kinetic": ke, "potential": pe, "temperature": ke / 32}


STATE = {"x": jnp.linspace(0.0, 1.0, 64), "v": jnp.zeros(64)}


def _run(tmp_path, steps):
    tl = jl.Timeline()
    r = jl.run(step, STATE, steps, record={"energy": observables, "x": jl.Record(lambda s: s["x"], every=1000)},
               sinks=[jl.HDF5Writer(tmp_path / "t.h5")], timeline=tl, progress=False)
    return r, jl.load_trace(tl.write(tmp_path / "t.pftrace"))


def test_a_60000_step_timeline_is_a_quarter_of_its_trajectory_at_most(tmp_path):
    r, trace = _run(tmp_path, 60_000)
    size, trajectory_size = (tmp_path / "t.pftrace").stat().st_size, (tmp_path / "t.h5").stat().st_size
    assert size <= trajectory_size / 4, (size, trajectory_size)
    traj = r.trajectory
    paths = ["energy/kinetic", "energy/potential", "energy/temperature", "energy/total"]
    assert sorted(trace.counters) == paths
    notes = {i.args["counter"]: i.args for i in trace.instants("counter downsampled")}
    assert sorted(notes) == paths and {i.track for i in trace.instants("counter downsampled")} == {NOTES_TRACK}
    for path in paths:
        steps, values = trace.counter_steps[path], trace.counters[path][1]
        assert len(values) <= MAX_COUNTER_SAMPLES and notes[path]["samples"] == 60_001
        assert notes[path]["kept"] == len(values)
        assert steps[0] == 0 and steps[-1] == 60_000 and (np.diff(steps) > 0).all()
        recorded = traj[path].astype(np.float64)
        np.testing.assert_array_equal(values, recorded[steps])  # each sample is the value at its step
        assert values.max() == recorded.max() and values.min() == recorded.min()  # the extremes stay


def test_a_short_run_keeps_every_sample_with_its_step(tmp_path):
    r, trace = _run(tmp_path, 300)
    assert trace.instants("counter downsampled") == []
    for path in ("energy/total", "energy/kinetic"):
        np.testing.assert_array_equal(trace.counter_steps[path], np.arange(301))
        np.testing.assert_array_equal(trace.counters[path][1], r.trajectory[path].astype(np.float64))


def test_thinning_keeps_a_spike_and_a_nan_wherever_they_are():
    rng = np.random.default_rng(1)
    for n in (2_001, 10_000, 123_457):
        values = rng.normal(size=n)
        spike, nan = rng.integers(1, n - 1, 2)
        values[spike] = 100.0
        values[nan] = np.nan
        keep = _extremes(values, np.arange(n), 500)
        assert len(keep) <= 500 and (np.diff(keep) > 0).all() and keep[0] == 0 and keep[-1] == n - 1
        assert spike in keep or (nan in keep and abs(int(nan) - int(spike)) < n // 200)
        assert nan in keep


def test_a_run_of_any_length_holds_a_bounded_timeline_covering_all_its_steps(tmp_path):
    """200,000 samples arrive in chunks: the timeline holds a bounded number while they come,
    and the written track spans every part of the run evenly, with the spike and its count."""
    tl = jl.Timeline()
    n, chunk = 200_000, 1_000
    values = np.sin(np.arange(n) / 5000.0)
    values[123_456] = 50.0
    held = []
    for k in range(0, n, chunk):
        tl.counter_series("e", np.arange(k, k + chunk) * 1000, values[k:k + chunk], steps=np.arange(k, k + chunk))
        held.append(sum(len(c.values) for c in tl._ev.counters))
    assert max(held) <= 16 * MAX_COUNTER_SAMPLES + chunk
    trace = jl.load_trace(tl.write(tmp_path / "long.pftrace"))
    steps, got = trace.counter_steps["e"], trace.counters["e"][1]
    assert len(got) <= MAX_COUNTER_SAMPLES and steps[0] == 0 and steps[-1] == n - 1
    np.testing.assert_array_equal(got, values[steps])
    assert 123_456 in steps.tolist()
    per_tenth = np.bincount(steps * 10 // n, minlength=10)
    assert per_tenth.min() >= 0.8 * per_tenth.max(), per_tenth  # early steps are not crowded out
    (note,) = trace.instants("counter downsampled")
    assert note.args["samples"] == n and note.args["kept"] == len(got)


def test_counter_steps_are_written_beside_the_values(tmp_path):
    tl = jl.Timeline()
    tl.counter_series("e", [10, 20, 30], [1.0, 2.0, 3.0], steps=[4, 8, 12])
    tl.counter_series("f", [10, 20], [1.0, 2.0])  # no steps given: -1 in the reader
    trace = jl.load_trace(tl.write(tmp_path / "c.pftrace"))
    assert trace.counter_steps["e"].tolist() == [4, 8, 12]
    assert trace.counter_steps["f"].tolist() == [-1, -1]
