"""What ``jl.run`` accepts, ``jl.load`` reads: record and state keys and ``dt`` follow one rule
shared by the writer and the reader, so a name or dt the reader would refuse at the end is refused
at the start, naming it, before any file exists."""

from __future__ import annotations

import math
import re

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pytest_jaxlog as jl
from pytest_jaxlog.record.frames import Schema
from pytest_jaxlog.store.hdf5.trajectory import _schema_from_json

BAD_KEYS = ["..", ".", "", "a\x00b"]
BAD_DT = [float("nan"), float("inf"), -float("inf"), "0.1", True]


def _step(s):
    return {k: v * 0.5 + 1.0 for k, v in s.items()}


def _leaf(path):
    return {"path": path, "record": path.split("/")[0], "shape": [2], "dtype": "float32",
            "schedule": {"kind": "every", "n": 1, "start": 0}, "key_impl": None}


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_a_key_the_reader_refuses_is_refused_by_run_before_any_file(tmp_path, key):
    with pytest.raises(jl.JaxlogError, match="is not a/b/c names"):  # the reader, on a file naming it
        _schema_from_json({"leaves": [_leaf(f"s/{key}")], "batched": False, "dt": None}, tmp_path / "f.h5")
    path = tmp_path / "view.h5"
    with pytest.raises(jl.JaxlogError, match=re.escape(f"record 'v': pytree key {key!r} cannot be a record path")):
        jl.run(_step, {"x": jnp.zeros(2)}, 3, record={"v": lambda s: {key: s["x"]}}, sinks=[jl.HDF5Writer(path)],
               progress=False)
    assert not path.exists()
    path = tmp_path / "state.h5"
    with pytest.raises(jl.JaxlogError, match=re.escape(f"record 'state': pytree key {key!r} cannot be a record path")):
        jl.run(_step, {key: jnp.zeros(2)}, 3, record={"e": lambda s: sum(v.sum() for v in s.values())},
               sinks=[jl.HDF5Writer(path)], progress=False)
    assert not path.exists()


@pytest.mark.parametrize("dt", BAD_DT, ids=repr)
def test_a_dt_the_reader_refuses_is_refused_by_run_and_recorder_before_any_file(tmp_path, dt):
    with pytest.raises(jl.JaxlogError, match="'dt' must be a finite number or null"):
        _schema_from_json({"leaves": [_leaf("x")], "batched": False, "dt": dt}, tmp_path / "f.h5")
    path = tmp_path / "t.h5"
    with pytest.raises(jl.JaxlogError, match=re.escape(f"dt must be a finite number or None, got {dt!r}")):
        jl.run(_step, {"x": jnp.zeros(2)}, 3, record={"x": lambda s: s["x"]}, sinks=[jl.HDF5Writer(path)], dt=dt,
               progress=False)
    assert not path.exists()
    with pytest.raises(jl.JaxlogError, match="dt must be a finite number or None"):
        jl.Recorder({"x": lambda s: s["x"]}, dt=dt)
    with pytest.raises(jl.JaxlogError, match="dt must be a finite number or None"):
        Schema((), dt=dt)


def test_steps_a_file_cannot_hold_are_refused_by_the_schedules():
    for make in (lambda: jl.at(2**62), lambda: jl.every(2**62), lambda: jl.window(0, 2**62),
                 lambda: jl.every(1, start=2**62)):
        with pytest.raises(jl.JaxlogError, match=r"must be < 4611686018427387904"):
            make()
    assert jl.at(2**62 - 1).last_step() == 2**62 - 1


def _plain(n: int) -> list:
    """The states 0..n-1 of ``_step`` from ``arange(2)``, computed plainly."""
    x, want = np.arange(2, dtype=np.float32), []
    for _ in range(n):
        want.append(x.copy())
        x = x * np.float32(0.5) + np.float32(1.0)
    return want


KEY_CHARS = st.sampled_from(["a", "Z", "0", ".", "/", " ", "-", "\x00", "é", "_"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.text(KEY_CHARS, max_size=4),
       dt=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True, width=64)))
def test_whatever_run_accepts_loads_with_the_values_computed_plainly(tmp_path_factory, key, dt):
    path = tmp_path_factory.mktemp("p") / "t.h5"
    state = {key: jnp.arange(2, dtype=jnp.float32)}
    try:
        jl.run(_step, state, 4, record={"v": lambda s: {key: s[key]}}, sinks=[jl.HDF5Writer(path)], dt=dt,
               checkpoint=jl.every(2), progress=False)
    except jl.JaxlogError as exc:
        assert repr(key) in str(exc) or "dt" in str(exc)
        if "overflows a float64" not in str(exc):
            assert not path.exists()
            return
        # a dt whose times overflow only at a later step: the frames before it are kept, as they were
        traj = jl.load(path)
        kept = traj.steps(f"v/{key}")
        assert traj.status == "failed" and kept.tolist() == list(range(len(kept)))
        named = int(re.search(r"step (\d+): its time", str(exc)).group(1))  # the first step that overflows
        assert np.all(np.isfinite(traj.time(f"v/{key}"))) and named >= len(kept) and not math.isfinite(named * dt)
        np.testing.assert_array_equal(traj[f"v/{key}"], np.stack(_plain(5)[:len(kept)]) if len(kept) else
                                      np.zeros((0, 2), np.float32))
        return
    traj = jl.load(path)
    want = _plain(5)
    np.testing.assert_array_equal(traj[f"v/{key}"], np.stack(want))
    np.testing.assert_array_equal(traj.state(4)[key], want[4])
    if dt is not None:
        np.testing.assert_array_equal(traj.time(f"v/{key}"), np.arange(5) * dt)
