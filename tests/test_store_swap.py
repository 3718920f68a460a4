"""``HDF5Writer(replace_at_checkpoint=k)`` (``store/hdf5/journal.py``): the new file takes the path only
once a checkpoint at step ``k`` or later is on disk; a writer closed before leaves the path's
previous file as it was and no temporary file beside it."""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl

from resume_helpers import FailAt


def step(s):
    return {"x": s["x"] * 0.5 + 1.0}


S0 = {"x": jnp.arange(3, dtype=jnp.float32)}
RECORD = {"x": lambda s: s["x"]}


def _run(path, steps, at, *more):
    return jl.run(step, S0, steps, record=RECORD, checkpoint=jl.every(10), chunk=5, progress=False,
                  sinks=[jl.HDF5Writer(path, replace_at_checkpoint=at), *more])


@pytest.fixture
def old(tmp_path):
    path = tmp_path / "t.h5"
    jl.run(step, S0, 3, record=RECORD, sinks=[jl.HDF5Writer(path)], progress=False)
    return path


def _beside(path):
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)


def test_the_path_changes_only_at_the_checkpoint(old):
    before, ino = old.read_bytes(), os.stat(old).st_ino
    seen = {}

    def look(frames):  # before the checkpoint at 20 is written, the path holds the old file
        if frames.last_step <= 15:
            seen[frames.last_step] = os.stat(old).st_ino == ino and old.read_bytes() == before

    _run(old, 40, 20, jl.CallbackSink(look))
    assert seen and all(seen.values())
    traj = jl.load(old)
    assert traj.status == "complete" and traj.steps_done == 40 and traj.attachment_steps("checkpoint") == [10, 20, 30, 40]
    np.testing.assert_array_equal(traj.steps("x"), np.arange(41))
    assert _beside(old) == []


def test_a_writer_closed_before_the_checkpoint_leaves_the_previous_file(old):
    before = old.read_bytes()
    with pytest.raises(jl.JaxlogError):
        _run(old, 40, 20, FailAt(15))
    assert old.read_bytes() == before and jl.load(old).steps_done == 3
    assert _beside(old) == []  # its own file removed, the lock released


def test_a_writer_that_failed_after_the_checkpoint_has_the_path(old):
    with pytest.raises(jl.JaxlogError):
        _run(old, 40, 20, FailAt(25))
    traj = jl.load(old)
    assert traj.status == "failed" and 20 in traj.attachment_steps("checkpoint")
    assert _beside(old) == []
