"""A run's metadata: ``jl.run(..., meta={...})`` kept as JSON with the trajectory, read back as
``traj.meta`` and ``run.meta``, listed in the manifest, carried across ``jl.resume``; values
that are not JSON, strings handed to ``jl.log``, and hostile files each give one clear error."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.record.records import MAX_BYTES, READ_MAX_BYTES

for _name in jl.__all__:  # every jaxlog module loaded now, so classes stay the same objects across inline runs
    getattr(jl, _name)

from plugin_helpers import KERNEL, no_jaxlog_env  # noqa: E402,F401  (no_jaxlog_env: an autouse fixture)
from test_checkpoint import _StopAt  # noqa: E402  (Ctrl-C once the run has written a given step)

pytest_plugins = ["pytester"]

META = {"solver": {"name": "gd", "lr": 0.05, "tol": 1e-6}, "message": "converged in 37 steps", "seeds": [1, 2],
        "ok": True, "none": None}


def walk(s):
    return {"x": s["x"] * 0.9 + 1.0}


S0 = {"x": jnp.arange(3, dtype=jnp.float32)}


def test_meta_round_trips_through_the_file_and_memory(tmp_path):
    given = {**META, "pair": (1, "a"), "np": np.float32(0.5), "count": np.int64(3)}
    run = jl.run(walk, S0, 5, record={"x": lambda s: s["x"]}, meta=given, progress=False,
                 sinks=[jl.HDF5Writer(tmp_path / "t.h5")])
    want = {**META, "pair": [1, "a"], "np": 0.5, "count": 3}
    assert run.meta == want and run.trajectory.meta == want
    loaded = jl.load(tmp_path / "t.h5")
    assert loaded.meta == want and type(loaded.meta["count"]) is int
    assert loaded.description["run"]["driver"] == "run" and loaded.description["run"]["steps"] == 5
    np.testing.assert_array_equal(loaded["x"][-1], run.state["x"])
    memory = jl.run(walk, S0, 5, record={"x": lambda s: s["x"]}, meta=given, progress=False, sinks=[jl.MemorySink()])
    assert memory.trajectory.meta == want
    assert jl.load(loaded.save(tmp_path / "golden.h5")).meta == want  # goldens keep it


def test_a_run_without_meta_reads_back_an_empty_dict(tmp_path):
    run = jl.run(walk, S0, 3, progress=False, sinks=[jl.HDF5Writer(tmp_path / "t.h5")])
    assert run.meta == {} and jl.load(tmp_path / "t.h5").meta == {}
    with h5py.File(tmp_path / "t.h5", "r") as f:  # nothing of it in the file: the format of such runs is as it was
        assert "meta" not in json.loads(f["jaxlog"].attrs["meta"])["run"]


def test_the_file_stays_h5md_with_meta_as_json_text(tmp_path):
    jl.run(walk, S0, 3, progress=False, meta=META, sinks=[jl.HDF5Writer(tmp_path / "t.h5")])
    with h5py.File(tmp_path / "t.h5", "r") as f:
        assert list(f["h5md"].attrs["version"]) == [1, 1] and "observables" in f
        raw = f["jaxlog"].attrs["meta"]
        assert isinstance(raw, bytes)  # fixed-length text in the object header, as the other JSON attributes
        assert json.loads(raw)["run"]["meta"] == META


@pytest.mark.parametrize("meta, match", [
    ({"cfg": {"w": np.zeros(3)}}, r"meta= 'cfg/w' is a ndarray, not JSON"),
    ({"tags": {"a", "b"}}, r"meta= 'tags' is a set, not JSON"),
    ({"x": [1, object()]}, r"meta= 'x\[1\]' is a object, not JSON"),
    ({"bad": float("nan")}, r"meta= 'bad' is nan, which JSON cannot hold"),
    ({"cfg": {3: "three"}}, r"meta= key 3 under 'cfg' is a int; JSON object keys are strings"),
    (["not", "a", "dict"], r"meta= must be a dict of JSON values"),
    ({"big": "x" * (MAX_BYTES + 1)}, r"meta= is \d+ bytes of JSON, more than 1048576"),
])
def test_values_that_are_not_json_are_refused_naming_the_key(tmp_path, meta, match):
    with pytest.raises(jl.JaxlogError, match=match):
        jl.run(walk, S0, 3, progress=False, meta=meta, sinks=[jl.HDF5Writer(tmp_path / "t.h5")])
    assert not (tmp_path / "t.h5").exists()


def test_jl_log_of_a_string_or_an_object_points_to_meta():
    def says(s):
        jl.log("message", "converged")
        return walk(s)

    def objects(s):
        jl.log("config", object())
        return walk(s)

    for step, what in ((says, r"value leaf 'converged' is not an array"), (objects, r"of type object is not an array")):
        with pytest.raises(jl.JaxlogError, match=what + r".*goes in jl.run\(\.\.\., meta=\{\.\.\.\}\)"):
            jl.run(step, S0, 3, progress=False)


def test_resume_keeps_the_files_meta_and_refuses_another(tmp_path):
    path = tmp_path / "t.h5"
    common = {"record": {"x": lambda s: s["x"]}, "checkpoint": jl.every(5), "chunk": 3}
    with pytest.raises(KeyboardInterrupt):
        jl.run(walk, S0, 40, meta=META, sinks=[jl.HDF5Writer(path)], progress=_StopAt(40, 12), **common)
    assert jl.load(path).meta == META and jl.load(path).status == "stopped"
    with pytest.raises(jl.JaxlogError, match=r"resume\(\): meta= differs from the metadata of the run in the file"):
        jl.resume(path, walk, 40, meta={**META, "message": "other"}, progress=False, **common)
    run = jl.resume(path, walk, 40, progress=False, **common)
    assert run.steps_done == 40 and run.meta == META
    traj = jl.load(path)
    assert traj.meta == META and traj.status == "complete"
    np.testing.assert_array_equal(traj.steps("x"), np.arange(41))
    # the same meta given again is the file's: accepted
    with pytest.raises(KeyboardInterrupt):
        jl.run(walk, S0, 40, meta=META, sinks=[jl.HDF5Writer(tmp_path / "u.h5")], progress=_StopAt(40, 7), **common)
    assert jl.resume(tmp_path / "u.h5", walk, 40, meta=dict(META), progress=False, **common).meta == META


def _edit_meta(path: Path, text: bytes | str, *, drop_crc: bool = True) -> None:
    with h5py.File(path, "r+") as f:
        jl_attrs = f["jaxlog"].attrs
        del jl_attrs["meta"]
        jl_attrs["meta"] = np.bytes_(text) if isinstance(text, bytes) else text
        if drop_crc and "json_crc32" in jl_attrs:
            del jl_attrs["json_crc32"]


def test_a_hostile_meta_attribute_is_one_error_never_a_crash(tmp_path):
    path = tmp_path / "t.h5"
    jl.run(walk, S0, 3, progress=False, meta=META, sinks=[jl.HDF5Writer(path)])
    with h5py.File(path, "r") as f:
        good = bytes(f["jaxlog"].attrs["meta"])

    huge = good + b" " * (READ_MAX_BYTES + 1)  # valid JSON, but more than a reader takes
    _edit_meta(path, huge)
    with pytest.raises(jl.JaxlogError, match=r"attribute 'meta' of /jaxlog declares \d+ bytes, more than the 16777216"):
        jl.load(path)

    _edit_meta(path, b"\xff\xfe{garbled")
    with pytest.raises(jl.JaxlogError, match=r"attribute 'meta' of /jaxlog is not UTF-8 text"):
        jl.load(path)

    _edit_meta(path, good[:-7])
    with pytest.raises(jl.JaxlogError, match=r"/jaxlog attribute 'meta' is not JSON"):
        jl.load(path)

    doc = json.loads(good)
    doc["run"]["meta"] = ["not", "an", "object"]
    _edit_meta(path, json.dumps(doc).encode())
    with pytest.raises(jl.JaxlogError, match=r"holds the run's meta= as list, not an object"):
        jl.load(path)

    _edit_meta(path, good, drop_crc=False)  # restored (the checksum was dropped above): it reads again
    assert jl.load(path).meta == META


def test_meta_is_listed_in_the_manifest_entry_of_the_run(pytester):
    pytester.makepyfile(test_m=KERNEL + """
def test_meta(jaxlog):
    jaxlog.run(rotate, STATE, 6, record={"energy": energy}, meta={"config": {"dt": 0.01}, "note": "plain"})
    jaxlog.run(rotate, STATE, 4, record={"energy": energy}, name="bare")
    with jaxlog.recorder({"energy": energy}, name="loop", meta={"loop": "by hand"}) as rec:
        s = STATE
        for k in range(3):
            rec.log(s, k)
            s = rotate(s)
""")
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "--jaxlog-keep=all",
                                "--jaxlog-dir=out/jaxlog")
    result.assert_outcomes(passed=1)
    base = pytester.path / "out/jaxlog"
    doc = json.loads((base / "manifest.json").read_text())
    (test,) = doc["tests"]
    runs = {r["name"]: r for r in test["runs"]}
    assert runs["trajectory"]["meta"] == {"config": {"dt": 0.01}, "note": "plain"}
    assert runs["bare"]["meta"] == {}
    assert runs["loop"]["meta"] == {"loop": "by hand"}
    assert jl.load(base / test["artifacts"]["trajectory"]).meta == {"config": {"dt": 0.01}, "note": "plain"}


def test_a_recorder_and_from_arrays_keep_meta_as_a_run_does(tmp_path):
    with jl.Recorder({"x": lambda s: s["x"]}, sinks=[jl.HDF5Writer(tmp_path / "r.h5")], meta=META) as rec:
        s = S0
        for k in range(4):
            rec.log(s, k)
            s = walk(s)
    assert rec.meta == META and rec.trajectory.meta == META
    loaded = jl.load(tmp_path / "r.h5")
    assert loaded.meta == META and loaded.description["run"]["driver"] == "recorder" and len(loaded["x"]) == 4
    arrays = jl.from_arrays({"e": np.arange(5.0)}, sinks=[jl.HDF5Writer(tmp_path / "a.h5")],
                            meta={"n": np.int64(5), "pair": (1, "a")})
    assert arrays.meta == {"n": 5, "pair": [1, "a"]} == jl.load(tmp_path / "a.h5").meta
    assert jl.from_arrays({"e": np.arange(2.0)}).meta == {} == jl.Recorder({"x": lambda s: s["x"]}).meta
    # refused where given, naming the key, before anything is written
    with pytest.raises(jl.JaxlogError, match=r"meta= 'cfg/w' is a ndarray, not JSON"):
        jl.Recorder({"x": lambda s: s["x"]}, sinks=[jl.HDF5Writer(tmp_path / "bad.h5")], meta={"cfg": {"w": np.ones(2)}})
    with pytest.raises(jl.JaxlogError, match=r"meta= 'tags' is a set, not JSON"):
        jl.from_arrays({"e": np.arange(2.0)}, sinks=[jl.HDF5Writer(tmp_path / "bad.h5")], meta={"tags": {"a"}})
    assert not (tmp_path / "bad.h5").exists()


def test_a_typed_scalar_from_jax_is_a_number():
    run = jl.run(walk, S0, 1, progress=False, meta={"lr": jnp.float32(0.25), "flag": jnp.bool_(True),
                                                     "n": jax.numpy.int32(4)})
    assert run.meta == {"lr": 0.25, "flag": True, "n": 4}
