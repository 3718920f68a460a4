"""Sinks that keep frames past ``write`` keep copies of views of device buffers, and only of those."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import pytest_jaxlog as jl
from pytest_jaxlog.record.frames import Frames
from pytest_jaxlog.store.protocol import device_view, owned, owned_frames


def _device_rows():
    """Rows 1..2 of a buffer of 4 rows, as the driver reads a large set on the CPU."""
    buf = jnp.arange(12, dtype=jnp.float32).reshape(4, 3)
    return buf, np.from_dlpack(buf)[1:3]


def test_a_view_of_a_device_buffer_is_copied_and_nothing_else():
    buf, rows = _device_rows()
    assert device_view(rows) and device_view(rows[:, 1:])
    copy = owned(rows)
    assert not np.shares_memory(copy, rows) and copy.flags.owndata
    assert np.array_equal(copy, np.arange(3, 9, dtype=np.float32).reshape(2, 3))
    plain = np.arange(12.0).reshape(4, 3)
    assert not device_view(plain) and not device_view(plain[1:3])
    view = plain[1:3]
    assert owned(view) is view  # a user's array (a slice of it included): kept as given
    assert not device_view(np.float64(1.0)) and not device_view([1, 2])


def test_frames_copied_only_where_a_value_is_a_device_view():
    _, rows = _device_rows()
    plain = Frames()
    plain.add("e", np.arange(2), np.ones(2))
    assert owned_frames(plain) is plain
    mixed = Frames()
    mixed.add("e", np.arange(1, 3), np.ones(2))
    mixed.add("x", np.arange(1, 3), rows)
    out = owned_frames(mixed)
    assert out.values["e"] is mixed.values["e"]
    assert not np.shares_memory(out.values["x"], rows) and np.array_equal(out.values["x"], rows)
    assert np.array_equal(out.steps["x"], [1, 2])


def test_memory_sink_and_hdf5_writer_keep_copies(tmp_path):
    _, rows = _device_rows()
    frames = Frames()
    frames.add("x", np.arange(1, 3), rows)
    mem = jl.MemorySink()
    run = jl.run(lambda x: x + 1, jnp.zeros(3, jnp.float32), 2, record={"x": lambda x: x}, sinks=[mem],
                 progress=False)
    assert run.steps_done == 2
    fresh = jl.MemorySink()
    fresh.open(mem.schema, {})
    fresh.write(frames)
    kept = fresh._values["x"][0]
    assert not np.shares_memory(kept, rows) and np.array_equal(kept, rows)
    path = tmp_path / "t.h5"
    w = jl.HDF5Writer(path)
    w.open(mem.schema, {})
    w.write(frames)
    w.close("complete", steps_done=2)
    got = jl.load(path)
    assert np.array_equal(got["x"], rows) and list(got.steps("x")) == [1, 2]
