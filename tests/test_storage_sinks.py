"""MemorySink, CSVWriter, CallbackSink, in-memory trajectories, dtype helpers and provenance."""

from __future__ import annotations

import csv
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from storage_helpers import frames_for, simple_schema

import pytest_jaxlog as jl
from pytest_jaxlog.store.dtypes import check_frames, check_leaf_dtype, decode, encode, to_host
from pytest_jaxlog.record.frames import Frames, LeafSpec, Schema
from pytest_jaxlog.store.hdf5.layout import provenance
from pytest_jaxlog.record.schedule import at, every
from pytest_jaxlog.store.sinks import CallbackSink, CSVWriter, MemorySink
from pytest_jaxlog.store.hdf5.trajectory import Trajectory


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.reader(fh))


def test_csv_scalar_records_one_row_per_step_with_empty_cells(tmp_path):
    leaves = (LeafSpec("energy", "energy", (), np.dtype(np.float64), every(1)),
              LeafSpec("count", "count", (), np.dtype(np.int32), every(2)),
              LeafSpec("flag", "flag", (), np.dtype(np.bool_), at(3)),
              LeafSpec("x", "x", (3,), np.dtype(np.float32), every(1)))
    schema = Schema(leaves, dt=0.5)
    sink = CSVWriter(tmp_path / "out.csv")
    sink.open(schema, {})
    assert sink.columns == ("step", "time", "energy", "count", "flag")  # x (not scalar) left out
    for lo, hi in [(0, 2), (3, 4)]:
        fr = Frames()
        for leaf in leaves:
            steps = leaf.schedule.steps_between(lo, hi)
            fr.add(leaf.path, steps, (np.ones((len(steps), *leaf.shape)) * (steps.reshape(-1, *[1] * len(leaf.shape)) + 0.1)).astype(leaf.dtype))
        sink.write(fr)
        assert len(_rows(tmp_path / "out.csv")) == hi + 2  # flushed as frames arrive
    sink.close("complete", steps_done=4)
    rows = _rows(tmp_path / "out.csv")
    assert rows[0] == ["step", "time", "energy", "count", "flag"]
    assert rows[1] == ["0", "0.0", "0.1", "0", ""]
    assert rows[2] == ["1", "0.5", "1.1", "", ""]
    assert rows[4] == ["3", "1.5", "3.1", "", "1"]
    assert rows[5] == ["4", "2.0", "4.1", "4", ""]
    assert float(rows[2][2]) == 1.1  # repr: exact float64
    assert sink.artifacts == {"csv": tmp_path / "out.csv"}


def test_csv_batched_rows_per_system(tmp_path):
    schema = Schema((LeafSpec("energy", "energy", (3,), np.dtype(np.float64), every(1)),), batched=True)
    sink = CSVWriter(tmp_path / "b.csv", records=["energy"])
    sink.open(schema, {})
    fr = Frames()
    fr.add("energy", [0, 1], np.arange(6.0).reshape(2, 3))
    sink.write(fr)
    sink.close("complete", steps_done=1)
    rows = _rows(tmp_path / "b.csv")
    assert rows[0] == ["step", "system", "energy"]
    assert rows[1:] == [["0", "0", "0.0"], ["0", "1", "1.0"], ["0", "2", "2.0"],
                        ["1", "0", "3.0"], ["1", "1", "4.0"], ["1", "2", "5.0"]]


def test_csv_rejects_non_scalar_and_unknown_records(tmp_path):
    schema = simple_schema(shape=(4,))
    with pytest.raises(jl.JaxlogError, match=r"record 'state/x' has shape \(4,\).*scalar records only"):
        CSVWriter(tmp_path / "c.csv", records=["energy", "state"]).open(schema, {})
    with pytest.raises(jl.JaxlogError, match=r"'nope' is not recorded; recorded: energy, state/x"):
        CSVWriter(tmp_path / "c.csv", records=["nope"]).open(schema, {})
    only_x = Schema((schema["state/x"],))
    with pytest.raises(jl.JaxlogError, match="no scalar records"):
        CSVWriter(tmp_path / "c.csv").open(only_x, {})


def test_callback_sink_calls_and_wraps_errors():
    schema = simple_schema()
    seen = []
    opened = []
    sink = CallbackSink(lambda fr: seen.append(fr.last_step), on_open=lambda s, m: opened.append((s, m)))
    sink.open(schema, {"run": 1})
    sink.write(frames_for(schema, 0, 3))
    sink.write(frames_for(schema, 4, 6))
    sink.close("complete", steps_done=6)
    assert seen == [3, 6] and opened == [(schema, {"run": 1})]

    def boom(frames):
        raise KeyError("disk")

    bad = CallbackSink(boom)
    bad.open(schema, {})
    with pytest.raises(jl.WriterError, match=r"CallbackSink write callback .*boom raised KeyError") as info:
        bad.write(frames_for(schema, 0, 1))
    assert isinstance(info.value.__cause__, KeyError)
    with pytest.raises(jl.JaxlogError, match="must be callable"):
        CallbackSink(3)


def test_memory_trajectory_same_interface():
    schema = simple_schema(shape=(2,), dt=0.1)
    sink = MemorySink()
    sink.open(schema, {"provenance": {"jax": "v"}, "run": {"steps": 9}})
    a, b = frames_for(schema, 0, 4), frames_for(schema, 5, 9)
    sink.write(a)
    sink.write(b)
    sink.attach("postmortem", 9, {"state/x": np.ones(2)})
    sink.close("violated", steps_done=9, violation={"step": 7})
    traj = Trajectory.from_sink(sink)
    assert traj.path is None and traj.status == "violated" and traj.steps_done == 9
    assert traj.violation == {"step": 7} and traj.provenance == {"jax": "v"} and traj.meta["run"] == {"steps": 9}
    np.testing.assert_array_equal(traj["state/x"], np.concatenate([a.values["state/x"], b.values["state/x"]]))
    np.testing.assert_array_equal(traj["state"]["x"], traj["state/x"])
    np.testing.assert_array_equal(traj["energy", 3:5], traj["energy"][3:5])
    np.testing.assert_allclose(traj.time("energy"), np.arange(10) * 0.1)
    assert list(traj.postmortem) == [9]
    assert sink.trajectory.records == ("energy", "state/x")
    with pytest.raises(jl.JaxlogError, match="recorded: energy, state/x"):
        traj["potential"]
    with pytest.raises(jl.JaxlogError, match="never opened"):
        Trajectory.from_sink(MemorySink())


def test_memory_sink_does_not_copy_and_validates():
    schema = simple_schema()
    sink = MemorySink()
    sink.open(schema, {})
    fr = frames_for(schema, 0, 3)
    sink.write(fr)
    assert sink.frames().values["state/x"] is fr.values["state/x"]  # handed-over arrays are kept, not copied
    bad = Frames()
    bad.add("state/x", [4], np.zeros((1, 5)))
    with pytest.raises(jl.JaxlogError, match=r"record 'state/x': value at step 4 has shape \(5,\), expected \(3,\)"):
        sink.write(bad)


@settings(max_examples=30, deadline=None)
@given(dtype=st.sampled_from(["bfloat16", "float8_e4m3fn", "float8_e5m2", "int4", "float16", "bool", "complex64"]),
       seed=st.integers(0, 2**31))
def test_encode_decode_bitwise(dtype, seed):
    dt = np.dtype(getattr(ml_dtypes, dtype, dtype))
    rng = np.random.default_rng(seed)
    if dt.kind == "b":
        x = rng.integers(0, 2, 7).astype(dt)
    elif dtype == "int4":
        x = rng.integers(-8, 8, 7).astype(dt)
    else:
        x = rng.integers(0, 256, 7 * dt.itemsize, dtype=np.uint8).view(dt)
    stored = encode(x)
    assert stored.dtype.kind in "biufc"
    name = dt.name if stored.dtype != dt else None
    back = decode(stored, name)
    assert back.dtype == dt and np.array_equal(back.view(np.uint8), x.view(np.uint8))


def test_check_leaf_dtype_and_to_host():
    for bad in (object, "U4", "S3", "M8[s]"):
        with pytest.raises(jl.JaxlogError, match=r"record 'r/a': leaves of dtype"):
            check_leaf_dtype("r/a", bad)
    with pytest.raises(jl.JaxlogError, match=r"record 'r/s'"):
        to_host(np.array(["a"]), "r/s")
    arr, impl = to_host(np.arange(3), "x")
    assert impl is None and arr.dtype == np.int64
    jax = pytest.importorskip("jax")
    arr, impl = to_host(jax.random.key(1), "k")
    assert impl == "threefry2x32" and arr.dtype == np.uint32 and arr.shape == (2,)
    arr, impl = to_host(jax.numpy.ones(3, jax.numpy.bfloat16), "b")
    assert impl is None and arr.dtype == ml_dtypes.bfloat16
    sink = MemorySink()
    sink.open(simple_schema(), {})
    sink.attach("postmortem", 5, {"state/key": jax.random.key(3), "state/x": jax.numpy.zeros(3)})
    sink.close("failed", steps_done=5)
    traj = Trajectory.from_sink(sink)
    assert traj.postmortem[5]["state/key"].dtype == np.uint32
    assert traj.attachment_key_impls("postmortem") == {"state/key": "threefry2x32"}


def test_check_frames_steps_must_increase():
    schema = simple_schema()
    fr = Frames()
    fr.add("energy", [0, 2, 1], np.zeros(3))
    with pytest.raises(jl.JaxlogError, match=r"record 'energy': steps must increase, got step 1 after 2"):
        check_frames(schema, fr)


def test_provenance_fields():
    prov = provenance()
    for key in ("jax", "jaxlib", "numpy", "h5py", "python", "pytest_jaxlog", "backend", "device_kind",
                "device_count", "x64", "platform", "hostname", "time"):
        assert key in prov, key
    assert prov["backend"] == "cpu" and prov["device_count"] >= 1 and prov["time"].endswith("+00:00")


def test_storage_modules_do_not_import_jax():
    code = ("import sys, pytest_jaxlog.store.hdf5.writer, pytest_jaxlog.store.hdf5.trajectory, pytest_jaxlog.store.sinks, "
            "pytest_jaxlog.store.dtypes, pytest_jaxlog.store.hdf5.layout; assert 'jax' not in sys.modules, 'jax imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
