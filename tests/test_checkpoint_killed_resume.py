"""A resume killed at any instant leaves a path that resumes to the trajectory of the run done
in one go, and the next run leaves no second name of the old file behind.

The resume runs in a child process whose disk is slow to take the checkpoint (its writer waits
before attaching one), and is killed with SIGKILL at chosen instants: once its second name of
the old file exists, and once its new file has replaced the old one at the path (which it does
only once that file holds the checkpoint it continued from)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import pytest_jaxlog as jl

GUARD_S = 120  # a hang guard, not a performance threshold
REPO = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent(
    """
    import sys, time
    import jax.numpy as jnp
    import pytest_jaxlog as jl
    from pytest_jaxlog.store.hdf5.writer import HDF5Writer


    def step(s):
        return {"x": s["x"] * 0.5 + 1.0, "n": s["n"] + 1}


    RECORD = {"x": lambda s: s["x"], "n": lambda s: s["n"]}
    S0 = {"x": jnp.arange(3, dtype=jnp.float32), "n": jnp.int32(0)}
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "slow":  # a disk slow to take the checkpoint: the window after the swap is wide
        attach = HDF5Writer.attach

        def slow_attach(self, name, *args, **kwargs):
            if name == "checkpoint":
                time.sleep(2.0)
            return attach(self, name, *args, **kwargs)

        HDF5Writer.attach = slow_attach
    if mode == "whole":
        jl.run(step, S0, 60, record=RECORD, sinks=[jl.HDF5Writer(path)], checkpoint=jl.every(10), chunk=5, progress=False)
    elif mode == "first":
        jl.run(step, S0, 30, record=RECORD, sinks=[jl.HDF5Writer(path)], checkpoint=jl.every(10), chunk=5, progress=False)
    else:
        jl.resume(path, step, 60, from_step=30, record=RECORD, checkpoint=jl.every(10), chunk=5, progress=False)
    print("done", flush=True)
    """
)


def _child(tmp_path, mode, path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, str(script), mode, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _finish(proc):
    out, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 0 and "done" in out, err[-3000:]


def _kill_when(proc, ready) -> None:
    deadline = time.monotonic() + GUARD_S
    while not ready():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the resume never reached the instant"
        time.sleep(0.0005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(GUARD_S)


def _second_names(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if ".resume-" in p.name)


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    d = tmp_path_factory.mktemp("whole")
    _finish(_child(d, "whole", d / "t.h5"))
    return jl.load(d / "t.h5")


@pytest.mark.parametrize("instant", ["second-name", "swapped"])
def test_a_resume_killed_at_an_instant_leaves_a_path_that_resumes(tmp_path, whole, instant):
    path = tmp_path / "t.h5"
    _finish(_child(tmp_path, "first", path))
    before = path.read_bytes()
    ino = os.stat(path).st_ino
    proc = _child(tmp_path, "slow", path)
    if instant == "second-name":
        _kill_when(proc, lambda: bool(_second_names(path)))
    else:
        _kill_when(proc, lambda: path.exists() and os.stat(path).st_ino != ino)
        # the new file takes the path only once it holds the checkpoint it continued from
        assert 30 in jl.load(path).attachment_steps("checkpoint")
    assert _second_names(path)  # the old trajectory, under its second name only
    _finish(_child(tmp_path, "resume", path))
    assert _second_names(path) == []  # nothing left behind
    traj = jl.load(path)
    assert traj.status == "complete" and traj.steps_done == whole.steps_done
    for name in ("x", "n"):
        np.testing.assert_array_equal(traj.steps(name), whole.steps(name))
        np.testing.assert_array_equal(traj[name], whole[name])
    if instant == "second-name":
        assert path.read_bytes() != before  # resumed into a new file


def test_a_plain_run_over_the_path_removes_what_a_killed_resume_left(tmp_path):
    path = tmp_path / "t.h5"
    _finish(_child(tmp_path, "first", path))
    ino = os.stat(path).st_ino
    proc = _child(tmp_path, "slow", path)
    _kill_when(proc, lambda: path.exists() and os.stat(path).st_ino != ino)
    assert _second_names(path)
    _finish(_child(tmp_path, "first", path))
    assert _second_names(path) == [] and jl.load(path).status == "complete"
