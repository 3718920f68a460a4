"""A checkpoint that does not agree with itself or with its file is refused before a resume,
with one JaxlogError naming the cause: frames cut back below it (a gap), checkpoint groups
swapped (its own record names another step), a state stored with another dtype than its record
says. Each file is really tampered with h5py; an untampered copy resumes into exactly the
trajectory of the same run done without stopping."""

from __future__ import annotations

import shutil

import h5py
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl


def step(s):
    return {"x": s["x"] * 0.9 + 1.0, "n": s["n"] + 1}


S0 = {"x": jnp.arange(3, dtype=jnp.float32), "n": jnp.int32(0)}
RECORD = {"x": lambda s: s["x"], "n": jl.Record(lambda s: s["n"], every=3),
          "big": jl.Record(lambda s: s["x"][0], when=lambda s: s["x"][0] > 5.0)}  # filtered: frames only when it holds
CKPT = "jaxlog/attachments/checkpoint"


FROM = 30  # the checkpoint every test resumes from (the file's run went on to step 60)


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """A run of 60 steps with checkpoints every 10 steps."""
    path = tmp_path_factory.mktemp("run") / "t.h5"
    jl.run(step, S0, 60, record=RECORD, sinks=[jl.HDF5Writer(path)], checkpoint=jl.every(10), chunk=5, progress=False)
    assert jl.load(path).attachment_steps("checkpoint") == [10, 20, 30, 40, 50, 60]
    return path


def _copy(ran, tmp_path):
    path = tmp_path / "t.h5"
    shutil.copy(ran, path)
    return path


def _resume(path):
    return jl.resume(path, step, 60, from_step=FROM, record=RECORD, checkpoint=jl.every(10), chunk=5, progress=False)


def _refused(path, match):
    before = path.read_bytes()
    with pytest.raises(jl.JaxlogError, match=match) as info:
        _resume(path)
    assert path.read_bytes() == before  # refused before anything was written
    return info.value


def test_an_untampered_copy_resumes_into_the_uninterrupted_trajectory(ran, tmp_path):
    path = _copy(ran, tmp_path)
    _resume(path)
    ref = jl.run(step, S0, 60, record=RECORD, progress=False).trajectory
    got = jl.load(path)
    assert got.status == "complete" and got.records == ref.records
    for p in ref.records:
        np.testing.assert_array_equal(got.steps(p), ref.steps(p))
        np.testing.assert_array_equal(got[p], ref[p])


def test_frames_cut_back_below_the_checkpoint_are_a_gap_and_refused(ran, tmp_path):
    path = _copy(ran, tmp_path)
    k = FROM
    with h5py.File(path, "r+") as f:
        g = f["observables/x"]
        keep = int(np.searchsorted(g["step"][:], k - 5, side="right"))  # frames after k - 5 cut off
        for name in ("step", "value"):
            g[name].resize(keep, axis=0)
    assert jl.load(path).steps("x")[-1] == k - 5
    err = _refused(path, rf"checkpoint at step {k}: record 'x' .* has {k - 4} frames up to it where its "
                         rf"schedule names {k + 1} \(after step {k - 5} missing\).*cut back")
    assert str(path) in str(err)


def test_swapped_checkpoint_groups_are_refused(ran, tmp_path):
    path = _copy(ran, tmp_path)
    a, b = FROM - 10, FROM
    with h5py.File(path, "r+") as f:
        f.move(f"{CKPT}/{a}", f"{CKPT}/tmp")
        f.move(f"{CKPT}/{b}", f"{CKPT}/{a}")
        f.move(f"{CKPT}/tmp", f"{CKPT}/{b}")
    _refused(path, rf"checkpoint at step {b} holds the checkpoint of step {a} \(its own record says so\).*swapped")


def test_a_state_stored_as_float64_where_the_checkpoint_says_float32_is_refused(ran, tmp_path):
    path = _copy(ran, tmp_path)
    k = FROM
    with h5py.File(path, "r+") as f:
        name = f"{CKPT}/{k}/state/x"
        old = f[name]
        data, attrs = old[()].astype(np.float64), dict(old.attrs)
        del f[name]
        new = f.create_dataset(name, data=data)
        for k, v in attrs.items():
            new.attrs[k] = v
    assert jl.load(path).snapshot("checkpoint", k).arrays["state/x"].dtype == np.float64
    _refused(path, r"stored state does not match its own record \(state/x is float64\[3\], its record says "
                   r"float32\[3\]\)")
