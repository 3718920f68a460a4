"""``jaxlog export TRAJ.h5 --npz OUT.npz``: every record's values, steps and times read back with
numpy equal to ``jl.load``'s, and bad input one ``[jaxlog]`` line with exit code 2."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.cli import main


def _step(s):
    jl.log("e", jnp.sum(s["x"] ** 2))
    return {"x": s["x"] * 0.9 + jax.random.uniform(s["key"], (3,)), "key": jax.random.split(s["key"])[0]}


@pytest.fixture(scope="module")
def traj_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("export") / "t.h5"
    state = {"x": jnp.arange(3.0), "key": jax.random.key(1)}
    record = {"x": lambda s: s["x"], "key": jl.Record(lambda s: s["key"], every=3),
              "obs": jl.Record(lambda s: {"m": jnp.mean(s["x"]), "n": jnp.int32(3)}, every=4)}
    jl.run(_step, state, 10, record=record, dt=0.25, sinks=[jl.HDF5Writer(path)], progress=False)
    return path


def _expected(traj, paths):
    out = {}
    for p in paths:
        out[f"values/{p}"] = traj[p]
        out[f"steps/{p}"] = traj.steps(p)
        if traj.dt is not None:
            out[f"times/{p}"] = traj.time(p)
    return out


def _same(path, expected):
    with np.load(path) as z:
        assert sorted(z.files) == sorted(expected)
        for k, v in expected.items():
            assert z[k].dtype == v.dtype, k
            np.testing.assert_array_equal(z[k], v, err_msg=k)


def test_every_record_with_its_steps_and_times(traj_file, tmp_path, capsys):
    out = tmp_path / "t.npz"
    assert main(["export", str(traj_file), "--npz", str(out)]) == 0
    traj = jl.load(traj_file)
    assert set(traj.records) == {"x", "key", "obs/m", "obs/n", "log/e"}
    assert capsys.readouterr().out == f"wrote {out} (5 records)\n"
    _same(out, _expected(traj, traj.records))
    with np.load(out) as z:  # spelled out once: steps of every 3rd, times step x dt, a log from step 1
        np.testing.assert_array_equal(z["steps/key"], [0, 3, 6, 9])
        np.testing.assert_array_equal(z["times/obs/m"], [0.0, 1.0, 2.0])
        np.testing.assert_array_equal(z["steps/log/e"], np.arange(1, 11))
        assert z["values/x"].shape == (11, 3)


def test_records_chosen_and_a_name_without_npz_kept_as_given(traj_file, tmp_path):
    out = tmp_path / "only_obs"
    assert main(["export", str(traj_file), "--npz", str(out), "--records", "obs", "x"]) == 0
    assert out.exists() and not (tmp_path / "only_obs.npz").exists()
    _same(out, _expected(jl.load(traj_file), ["obs/m", "obs/n", "x"]))


def test_a_run_without_dt_has_no_times(tmp_path):
    ts = np.linspace(0.0, 1.0, 5)
    jl.from_arrays({"y": np.cos(ts)}, steps=np.arange(0, 10, 2), sinks=[jl.HDF5Writer(tmp_path / "a.h5")])
    assert main(["export", str(tmp_path / "a.h5"), "--npz", str(tmp_path / "a.npz")]) == 0
    _same(tmp_path / "a.npz", {"values/y": np.cos(ts), "steps/y": np.arange(0, 10, 2, dtype=np.int64)})


def test_bad_input_is_one_line_and_exit_2(traj_file, tmp_path, capsys):
    cases = [
        (["export", str(tmp_path / "nope.h5"), "--npz", str(tmp_path / "o.npz")],
         f"[jaxlog] trajectory {tmp_path / 'nope.h5'} does not exist"),
        (["export", str(traj_file), "--npz", str(tmp_path / "o.npz"), "--records", "nope"],
         "[jaxlog] record 'nope' is not recorded; recorded: x, key, obs/m, obs/n, log/e"),
        (["export", str(traj_file), "--npz", str(tmp_path / "missing" / "o.npz")],
         f"[jaxlog] cannot write {tmp_path / 'missing' / 'o.npz'}: directory {tmp_path / 'missing'} does not exist"),
        (["export", str(traj_file), "--npz", str(tmp_path)],
         f"[jaxlog] {tmp_path} is a directory; name the .npz file to write, e.g. {tmp_path / 'trajectory.npz'}"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        assert capsys.readouterr().err == message + "\n"
    assert not (tmp_path / "o.npz").exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # nothing half-written left behind
