"""A real full file system: a small tmpfs mounted for the test (root, where mounting is
allowed; skipped with the reason elsewhere). Every run that fills it raises, and leaves a file
``jl.load`` opens, finished as failed, holding consistent frames from the first step on, and
its checkpoints. (Under ``RLIMIT_FSIZE`` alone the failure never showed: HDF5 cuts the file
to its end of allocation at each flush, which on a real file system frees the claimed space.)"""

from __future__ import annotations

import os
import shutil
import subprocess

import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.parametrize("size, chunk, checkpoint, steps", [
    (256, 1, False, 2000), (256, 1, True, 2000), (4096, 3, False, 2000), (4096, 3, True, 2000), (1000, 5, True, 2000),
    (100, 50, True, 2000), (256, 1, False, 400), (256, 1, True, 400), (4096, 3, True, 400), (1000, 5, True, 400),
])
def test_a_run_that_fills_the_disk_leaves_a_loadable_failed_file(small_fs, size, chunk, checkpoint, steps):
    path = small_fs / "t.h5"
    kwargs = {"checkpoint": jl.every(7)} if checkpoint else {}
    try:
        jl.run(lambda s: s + 1.0, jnp.zeros(size, jnp.float32), steps, record={"x": lambda s: s, "e": lambda s: s[0]},
               sinks=[jl.HDF5Writer(path, flush_every_s=0.0)], chunk=chunk, progress=False, **kwargs)
        filled = False  # it fit (the claimed space is cut back at close)
    except jl.JaxlogError as exc:
        assert "no room to write" in str(exc) and "No space left on device" in str(exc), exc
        filled = True
    traj = jl.load(path)
    if filled:
        assert traj.status == "failed" and "No space left" in traj.writer_error
    else:
        assert traj.status == "complete" and len(traj.steps("x")) == steps + 1
    steps = traj.steps("x")
    assert len(steps) >= 1
    np.testing.assert_array_equal(steps, np.arange(len(steps)))
    np.testing.assert_array_equal(traj["x"], np.repeat(np.arange(len(steps), dtype=np.float32)[:, None], size, 1))
    np.testing.assert_array_equal(traj.steps("e"), steps)
    for step in traj.attachment_steps("checkpoint"):
        assert step < len(steps)
        np.testing.assert_array_equal(traj.snapshot("checkpoint", step).arrays["state"], np.full(size, step, np.float32))
