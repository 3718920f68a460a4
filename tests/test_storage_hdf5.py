"""HDF5Writer -> load round-trips (bit for bit), the H5MD layout, and the reader's errors."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import h5py
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import DTYPES, assert_bitwise, batches, frames_for, simple_schema

import pytest_jaxlog as jl
from pytest_jaxlog.record.frames import FORMAT_VERSION, Frames, LeafSpec, Schema
from pytest_jaxlog.store.hdf5.writer import HDF5Writer
from pytest_jaxlog.record.schedule import at, every, window
from pytest_jaxlog.store.sinks import MemorySink
from pytest_jaxlog.store.hdf5.trajectory import Trajectory, load

schedules = st.one_of(
    st.builds(every, st.integers(1, 4), st.integers(0, 5)),
    st.builds(lambda s: at(*s), st.lists(st.integers(0, 25), min_size=1, max_size=6)),
    st.builds(lambda a, n, e: window(a, a + n, e), st.integers(0, 10), st.integers(0, 10), st.integers(1, 3)),
)
shapes = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)


@st.composite
def schemas(draw):
    """Random records: bare leaves, dicts and nested dicts, any dtype/shape/schedule."""
    batched = draw(st.booleans())
    n_sys = draw(st.integers(1, 3)) if batched else None
    dt = draw(st.sampled_from([None, 0.5, 1e-3]))
    leaves = []
    for r in range(draw(st.integers(1, 4))):
        name = f"r{r}"
        kind = draw(st.sampled_from(["leaf", "dict", "nested"]))
        if kind == "leaf":
            paths = [name]
        elif kind == "dict":
            paths = [f"{name}/{k}" for k in draw(st.sets(st.sampled_from("abc"), min_size=1))]
        else:
            paths = [f"{name}/{k}/{m}" for k in draw(st.sets(st.sampled_from("ab"), min_size=1))
                     for m in draw(st.sets(st.sampled_from(["u", "v", "value", "step"]), min_size=1))]
        sched = draw(schedules)
        per_leaf = draw(st.integers(0, 3)) == 0  # leaves of one record on different schedules
        for p in sorted(paths):
            if per_leaf:
                sched = draw(schedules)
            shape = draw(shapes)
            if batched:
                shape = (n_sys, *shape)
            key_impl = None
            if draw(st.integers(0, 9)) == 0:
                dtype, shape, key_impl = np.dtype(np.uint32), (*shape, 2), "threefry2x32"
            else:
                dtype = draw(st.sampled_from(DTYPES))
            leaves.append(LeafSpec(p, name, shape, dtype, sched, key_impl))
    return Schema(tuple(leaves), batched=batched, dt=dt)


def _check(traj: Trajectory, schema: Schema, expected: dict, status="complete", steps_done=None) -> None:
    assert traj.records == schema.paths
    assert traj.schema == schema or traj.schema.to_json() == schema.to_json()
    assert traj.status == status
    if steps_done is not None:
        assert traj.steps_done == steps_done
    for path, (steps, values) in expected.items():
        assert_bitwise(traj[path], values)
        np.testing.assert_array_equal(traj.steps(path), steps)
        assert traj.steps(path).dtype == np.int64
        if schema.dt is not None:
            np.testing.assert_array_equal(traj.time(path), steps * schema.dt)
        assert traj.key_impl(path) == schema[path].key_impl
        n = len(steps)
        if n:
            assert_bitwise(traj[path, n // 2], values[n // 2])
            assert_bitwise(traj[path, 1:n:2], values[1:n:2])
            assert_bitwise(traj[path, ::-1], values[::-1])
            idx = [n - 1, 0, n - 1]
            assert_bitwise(traj[path, idx], values[idx])
            np.testing.assert_array_equal(traj.steps(path, slice(1, None)), steps[1:])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas(), n_steps=st.integers(0, 25), cuts=st.lists(st.integers(0, 26), max_size=5),
       seed=st.integers(0, 2**32 - 1), queue_bytes=st.sampled_from([1, 2048, 1 << 28]),
       flush=st.sampled_from([0.0, 1.0]), compression=st.sampled_from([None, None, "gzip", "lzf"]))
def test_roundtrip_bit_for_bit(schema, n_steps, cuts, seed, queue_bytes, flush, compression):
    """Any schema, batch cuts, queue budget (1 byte: every batch goes one step at a time), flush
    interval and compression; the space reserved before each write always covered what it took."""
    rng = np.random.default_rng(seed)
    frames, expected = batches(schema, n_steps, cuts, rng)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.h5"
        w = HDF5Writer(path, queue_bytes=queue_bytes, flush_every_s=flush, compression=compression)
        mem = MemorySink()
        meta = {"run": {"steps": n_steps}, "provenance": {"jax": "x"}}
        w.open(schema, meta)
        mem.open(schema, meta)
        for fr in frames:
            w.write(fr)
            mem.write(fr)
        w.close("complete", steps_done=n_steps)
        mem.close("complete", steps_done=n_steps)
        assert w.stats["reserve_misses"] == 0 and w.stats["max_queue_bytes"] <= max(queue_bytes, 1 << 20)
        traj = load(path)
        _check(traj, schema, expected, steps_done=n_steps)
        assert traj.meta["run"] == {"steps": n_steps} and traj.provenance == {"jax": "x"}
        _check(Trajectory.from_sink(mem), schema, expected, steps_done=n_steps)
        # save() (golden files) round-trips too, from a file and from memory
        _check(load(traj.save(Path(tmp) / "copy.h5")), schema, expected, steps_done=n_steps)
        _check(load(Trajectory.from_sink(mem).save(Path(tmp) / "m.h5")), schema, expected)
        # the file opens with plain h5py and follows the H5MD layout
        with h5py.File(path, "r") as f:
            assert list(f["h5md"].attrs["version"]) == [1, 1]
            for leaf in schema.leaves:
                g = f["observables"][leaf.path]
                assert g["step"].dtype == np.int64 and g["step"].shape == (len(expected[leaf.path][0]),)
                assert g["value"].shape == (len(expected[leaf.path][0]), *leaf.shape)
                assert g["value"].maxshape[0] is None and g["value"].chunks is not None
                assert ("time" in g) == (schema.dt is not None)


def test_h5md_layout_with_plain_h5py(tmp_path):
    schema = simple_schema(shape=(4, 3), dt=0.25)
    w = HDF5Writer(tmp_path / "t.h5", author="Ada", particles={"atoms": {"position": "state/x"}})
    w.open(schema, {"run": {"steps": 9}})
    w.write(frames_for(schema, 0, 4))
    w.write(frames_for(schema, 5, 9))
    w.close("complete", steps_done=9)
    assert w.artifacts == {"trajectory": tmp_path / "t.h5"}
    with h5py.File(tmp_path / "t.h5", "r") as f:
        assert f["h5md"].attrs["version"].tolist() == [1, 1]
        assert f["h5md/author"].attrs["name"] == "Ada"
        assert f["h5md/creator"].attrs["name"] == "pytest-jaxlog"
        assert f["h5md/creator"].attrs["version"] == jl.__version__
        obs = f["observables/state/x"]
        assert obs["step"][:].tolist() == list(range(10))
        np.testing.assert_allclose(obs["time"][:], np.arange(10) * 0.25)
        assert obs["value"].shape == (10, 4, 3) and obs["value"].maxshape == (None, 4, 3)
        assert f["particles/atoms/position/value"].shape == (10, 4, 3)
        assert f["particles/atoms/box"].attrs["dimension"] == 3
        attrs = {k: json.loads(v) for k, v in f["jaxlog"].attrs.items() if k != "json_crc32"}
        assert attrs["format_version"] == FORMAT_VERSION
        assert attrs["status"] == "complete" and attrs["steps_done"] == 9 and attrs["violation"] is None
        assert Schema.from_json(attrs["schema"]) == schema or attrs["schema"] == schema.to_json()
        prov = attrs["provenance"]
        for key in ("jax", "jaxlib", "numpy", "h5py", "python", "pytest_jaxlog", "backend", "device_kind",
                    "device_count", "x64", "platform", "hostname", "time"):
            assert key in prov, key


def _layout(path) -> dict:
    """Every object of a file with its kind, shape, storage and attributes (the run's own
    attributes left out), and which names are hard links to one object."""
    out, objects = {}, {}
    with h5py.File(path, "r") as f:
        def visit(name, link):  # every link: a hard-linked object once per name
            obj = f[name]
            attrs = {k: np.asarray(v).tolist() for k, v in obj.attrs.items()
                     if k not in ("provenance", "meta", "json_crc32", "status", "steps_done")}
            if isinstance(obj, h5py.Dataset):
                out[name] = ("dataset", obj.shape, obj.maxshape, str(obj.dtype), obj.chunks, obj.compression,
                             obj.fletcher32, obj.shuffle, attrs)
            else:
                out[name] = ("group", attrs)
            objects.setdefault(h5py.h5o.get_info(obj.id).addr, []).append(name)

        f.visititems_links(visit)
        out["/"] = ("root", dict(f.attrs))
    return {"objects": out, "shared": sorted(names for names in objects.values() if len(names) > 1)}


def test_a_layout_made_again_is_copied_from_its_template_and_reads_back_the_same(tmp_path, monkeypatch):
    """The second file of a layout starts from the bytes of the first one's layout: the same
    objects, storage, links and attributes, its own provenance and meta, its own frames; a run
    of another length (other chunk rows) or other options is a layout of its own."""
    schema = simple_schema(shape=(4, 3), dt=0.25, extra=(LeafSpec("state/v", "state", (4, 3), np.dtype(np.float32),
                                                                  every(1)),))
    made = []
    create = h5py.Group.create_dataset
    monkeypatch.setattr(h5py.Group, "create_dataset", lambda self, *a, **k: made.append(a) or create(self, *a, **k))

    def write(name, steps, **kw):
        w = HDF5Writer(tmp_path / name, author="Ada", particles={"atoms": {"position": "state/x"}}, **kw)
        w.open(schema, {"provenance": {"mark": name}, "run": {"steps": steps}})
        w.write(frames_for(schema, 0, steps, seed=len(name) + steps))
        w.close("complete", steps_done=steps)
        n, made[:] = len(made), []
        return n

    assert write("a.h5", 9) == 7  # energy and state/x: value, step, time; state/v: value (its step and time: links)
    assert write("b.h5", 9) == 0  # copied: nothing made
    assert _layout(tmp_path / "b.h5") == _layout(tmp_path / "a.h5")
    assert ["observables/state/v/step", "observables/state/x/step"] in _layout(tmp_path / "b.h5")["shared"]
    for name in ("a.h5", "b.h5"):
        traj = load(tmp_path / name)  # the checksum over provenance and meta holds
        assert traj.provenance == {"mark": name} and traj.meta["run"] == {"steps": 9}
        assert traj.status == "complete" and traj.steps_done == 9
        expected = frames_for(schema, 0, 9, seed=len(name) + 9)
        for leaf in schema.leaves:
            assert_bitwise(traj[leaf.path], expected.values[leaf.path])
            np.testing.assert_array_equal(traj.time(leaf.path), np.arange(10) * 0.25)
        with h5py.File(tmp_path / name, "r") as f:
            assert f["particles/atoms/position/value"].shape == (10, 4, 3)
    assert write("c.h5", 40_000) == 7  # another length: chunks sized for it
    assert _layout(tmp_path / "c.h5") != _layout(tmp_path / "a.h5")
    assert write("d.h5", 9, compression="gzip") == 7


def test_pyh5md_reads_our_file(tmp_path):
    pyh5md = pytest.importorskip("pyh5md")
    schema = simple_schema(shape=(2, 3), dt=0.5)
    w = HDF5Writer(tmp_path / "t.h5")
    w.open(schema, {})
    fr = frames_for(schema, 0, 6)
    w.write(fr)
    w.close("complete", steps_done=6)
    f = pyh5md.File(str(tmp_path / "t.h5"), "r")  # checks /h5md, author, creator
    try:
        el = pyh5md.element(f["observables/state"], "x")
        assert el.element_type == "TimeElement"
        np.testing.assert_array_equal(el.step[:], np.arange(7))
        np.testing.assert_array_equal(el.time[:], np.arange(7) * 0.5)
        np.testing.assert_array_equal(el.value[:], fr.values["state/x"])
        energy = pyh5md.element(f["observables"], "energy")
        np.testing.assert_array_equal(energy.value[:], fr.values["energy"])
    finally:
        f.close()


def test_bfloat16_stored_as_uint16_read_back_as_bfloat16(tmp_path):
    schema = simple_schema(dtype=ml_dtypes.bfloat16)
    w = HDF5Writer(tmp_path / "t.h5")
    w.open(schema, {})
    fr = frames_for(schema, 0, 3)
    w.write(fr)
    w.close("complete", steps_done=3)
    with h5py.File(tmp_path / "t.h5", "r") as f:
        ds = f["observables/state/x/value"]
        assert ds.dtype == np.uint16 and ds.attrs["jaxlog_dtype"] == b"bfloat16"
    got = load(tmp_path / "t.h5")["state/x"]
    assert got.dtype == ml_dtypes.bfloat16
    assert_bitwise(got, fr.values["state/x"])


def test_prefix_gives_nested_dict_and_unknown_record_lists_recorded(tmp_path):
    leaves = tuple(LeafSpec(p, "state", (2,), np.dtype(np.float32), every(1))
                   for p in ("state/pos/a", "state/pos/b", "state/vel"))
    schema = Schema(leaves)
    w = HDF5Writer(tmp_path / "t.h5")
    w.open(schema, {})
    fr = frames_for(schema, 0, 2)
    w.write(fr)
    w.close("complete", steps_done=2)
    traj = load(tmp_path / "t.h5")
    nested = traj["state"]
    assert set(nested) == {"pos", "vel"} and set(nested["pos"]) == {"a", "b"}
    np.testing.assert_array_equal(nested["pos"]["b"], fr.values["state/pos/b"])
    np.testing.assert_array_equal(traj["state/pos", 1:]["a"], fr.values["state/pos/a"][1:])
    np.testing.assert_array_equal(traj.steps("state"), [0, 1, 2])
    assert "state/pos" in traj and "nope" not in traj
    with pytest.raises(jl.JaxlogError, match=r"'energy' is not recorded; recorded: state/pos/a, state/pos/b"):
        traj["energy"]
    with pytest.raises(jl.JaxlogError, match="no time"):
        traj.time("state/vel")


def test_key_records_wrap_back_into_typed_keys(tmp_path):
    jax = pytest.importorskip("jax")
    keys = jax.random.split(jax.random.key(42), 4)
    data = np.asarray(jax.random.key_data(keys))
    leaf = LeafSpec("key", "key", (2,), np.dtype(np.uint32), every(1), key_impl="threefry2x32")
    w = HDF5Writer(tmp_path / "t.h5")
    w.open(Schema((leaf,)), {})
    fr = Frames()
    fr.add("key", np.arange(4), data)
    w.write(fr)
    w.attach("postmortem", 3, {"state/key": keys[3], "state/x": np.ones(2, ml_dtypes.bfloat16)})
    w.close("complete", steps_done=3)
    traj = load(tmp_path / "t.h5")
    assert traj.key_impl("key") == "threefry2x32" and traj["key"].dtype == np.uint32
    wrapped = traj.wrap_keys("key")
    assert jax.dtypes.issubdtype(wrapped.dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(wrapped), data)
    pm = traj.postmortem
    assert list(pm) == [3]
    np.testing.assert_array_equal(pm[3]["state/key"], data[3])
    assert pm[3]["state/x"].dtype == ml_dtypes.bfloat16
    assert traj.attachment_key_impls("postmortem") == {"state/key": "threefry2x32"}
    copy = load(traj.save(tmp_path / "copy.h5"))
    assert copy.key_impl("key") == "threefry2x32"
    np.testing.assert_array_equal(copy.postmortem[3]["state/key"], data[3])
    assert copy.attachment_key_impls("postmortem") == {"state/key": "threefry2x32"}


def test_object_and_string_leaves_rejected_naming_the_record(tmp_path):
    for dtype in (object, "U3", "S2"):
        schema = Schema((LeafSpec("state/name", "state", (), np.dtype(dtype), every(1)),))
        w = HDF5Writer(tmp_path / "t.h5")
        with pytest.raises(jl.JaxlogError, match=r"record 'state/name'.*cannot be recorded"):
            w.open(schema, {})
        with pytest.raises(jl.JaxlogError, match=r"record 'state/name'"):
            MemorySink().open(schema, {})


def test_reader_errors_name_the_file_and_what_is_missing(tmp_path):
    with pytest.raises(jl.JaxlogError, match="no such trajectory file"):
        load(tmp_path / "missing.h5")
    (tmp_path / "text.h5").write_text("hello")
    with pytest.raises(jl.JaxlogError, match=r"text\.h5 is not a pytest-jaxlog trajectory: not an HDF5 file"):
        load(tmp_path / "text.h5")
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f.create_group("particles")
    with pytest.raises(jl.JaxlogError, match=r"other\.h5 is not a pytest-jaxlog trajectory: it has no /jaxlog group"):
        load(tmp_path / "other.h5")
    with h5py.File(tmp_path / "partial.h5", "w") as f:
        f.create_group("jaxlog").attrs["status"] = '"complete"'
    with pytest.raises(jl.JaxlogError, match="lacks format_version, schema, steps_done"):
        load(tmp_path / "partial.h5")
    schema = simple_schema()
    w = HDF5Writer(tmp_path / "new.h5")
    w.open(schema, {})
    w.close("complete", steps_done=0)
    with h5py.File(tmp_path / "new.h5", "r+") as f:
        f["jaxlog"].attrs["format_version"] = json.dumps(FORMAT_VERSION + 1)
    with pytest.raises(jl.JaxlogError, match=r"newer pytest-jaxlog \(format version 2; this version reads <= 1\)"):
        load(tmp_path / "new.h5")
    with pytest.raises(jl.JaxlogError, match=r"is a directory, not a trajectory file \(trajectory files in it: "
                                             r"new\.h5, other\.h5, partial\.h5, text\.h5\)"):
        load(tmp_path)


def test_overwrite_false_and_single_use(tmp_path):
    schema = simple_schema()
    w = HDF5Writer(tmp_path / "t.h5")
    w.open(schema, {})
    with pytest.raises(jl.JaxlogError, match="opened once"):
        w.open(schema, {})
    w.close("complete", steps_done=0)
    with pytest.raises(jl.JaxlogError, match="overwrite=False"):
        HDF5Writer(tmp_path / "t.h5", overwrite=False).open(schema, {})
    with pytest.raises(jl.WriterError, match="closed"):
        w.write(frames_for(schema, 0, 1))
    w.close("complete", steps_done=0)  # idempotent


def test_compression_and_large_frames(tmp_path):
    schema = simple_schema(shape=(300, 1000), dtype=np.float32)  # 1.2 MB frames: one frame per chunk
    w = HDF5Writer(tmp_path / "t.h5", compression="gzip")
    w.open(schema, {})
    fr = frames_for(schema, 0, 2)
    w.write(fr)
    w.close("complete", steps_done=2)
    with h5py.File(tmp_path / "t.h5", "r") as f:
        assert f["observables/state/x/value"].compression == "gzip"
    traj = load(tmp_path / "t.h5")
    assert_bitwise(traj["state/x", 1], fr.values["state/x"][1])


def test_timeline_gets_a_slice_per_batch(tmp_path):
    class Timeline:  # the _perfetto.Timeline interface the writer uses
        def __init__(self):
            self.slices = []

        def slice(self, track, name, start_ns, end_ns, args=None):
            self.slices.append((track, name, start_ns, end_ns, args))

    tl = Timeline()
    schema = simple_schema()
    w = HDF5Writer(tmp_path / "t.h5")
    w.set_timeline(tl)
    w.open(schema, {})
    w.write(frames_for(schema, 0, 3))
    w.write(frames_for(schema, 4, 5))
    w.close("complete", steps_done=5)
    assert [s[:2] for s in tl.slices] == [("writer", "write")] * 2
    assert all(s[3] >= s[2] for s in tl.slices) and tl.slices[0][4]["frames"] == 8


def test_live_file_readable_from_another_process(tmp_path):
    """While a run writes, another process (a CLI, a watcher) reads what has been flushed."""
    import subprocess
    import sys

    schema = simple_schema()
    w = HDF5Writer(tmp_path / "t.h5", flush_every_s=60.0)
    w.open(schema, {})
    w.write(frames_for(schema, 0, 9))
    w.flush()
    code = ("import sys; from pytest_jaxlog.store.hdf5.trajectory import load; t = load(sys.argv[1]); "
            "print(t.status, t.steps_done, len(t['energy']))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "t.h5")], capture_output=True, text=True,
                         check=True).stdout.split()
    w.close("complete", steps_done=9)
    assert out == ["running", "9", "10"]


# -- chunk sizing: HDF5 allocates whole chunks, so chunk size decides the file size --------------

def _data_bytes(path) -> int:
    """Bytes of dataset contents (``visititems`` visits a hard-linked step/time dataset once)."""
    sizes = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda _, obj: sizes.append(obj.size * obj.dtype.itemsize) if isinstance(obj, h5py.Dataset) else None)
    return sum(sizes)


def _write_all(path, schema, meta, n_steps, batch, **kw):
    w = HDF5Writer(path, **kw)
    w.open(schema, meta)
    for lo in range(0, n_steps + 1, batch):
        w.write(frames_for(schema, lo, min(lo + batch - 1, n_steps)))
    w.close("complete", steps_done=n_steps)


LJ_LIKE = Schema((LeafSpec("energy/total", "energy", (), np.dtype(np.float32), every(1)),
                  LeafSpec("energy/kinetic", "energy", (), np.dtype(np.float32), every(1)),
                  LeafSpec("positions", "positions", (64, 3), np.dtype(np.float32), every(10))), dt=0.005)


@settings(max_examples=200, deadline=None)
@given(schedules, st.integers(0, 40), st.integers(0, 60))
def test_count_between_matches_steps_between(schedule, lo, span):
    assert schedule.count_between(lo, lo + span) == len(schedule.steps_between(lo, lo + span))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 1 << 22), st.one_of(st.none(), st.integers(0, 10**7)))
def test_chunk_rows_tile_known_lengths(frame_bytes, frames):
    """Known length: equal chunks of at most 512 KiB (or one frame) tiling the run, < 1 frame unused
    per chunk; unknown: at most 64 KiB (or one frame), at least 4 KiB or 64 frames."""
    from pytest_jaxlog.store.hdf5.writer_thread import _CHUNK_BYTES, _OPEN_CHUNK_BYTES, _chunk_rows

    rows = _chunk_rows(frame_bytes, frames)
    assert rows >= 1
    if frames:
        n_chunks = -(-frames // rows)
        assert rows * max(1, frame_bytes) <= max(_CHUNK_BYTES, frame_bytes)
        assert n_chunks * rows - frames < n_chunks
    else:
        assert rows * max(1, frame_bytes) <= max(_OPEN_CHUNK_BYTES, frame_bytes)
        assert rows * max(1, frame_bytes) > 4096 - max(1, frame_bytes) or rows >= 64


def test_file_size_close_to_data_for_a_run_of_known_length(tmp_path):
    path = tmp_path / "t.h5"
    _write_all(path, LJ_LIKE, {"run": {"steps": 2000}}, 2000, 500)
    with h5py.File(path, "r") as f:
        assert f["observables/energy/total/value"].chunks == (2001,)
        assert f["observables/energy/total/step"].chunks == (2001,)
        assert f["observables/positions/value"].chunks == (201, 64, 3)
    data = _data_bytes(path)
    assert data == 2001 * (4 + 4 + 8 + 8) + 201 * (64 * 3 * 4 + 8 + 8)
    assert path.stat().st_size < data + 64 * 1024  # metadata only (it was 3.4x the data)
    traj = load(path)
    assert len(traj["positions"]) == 201 and traj.steps("energy/total")[-1] == 2000


def test_long_runs_get_big_chunks_and_resumed_runs_count_from_start_step(tmp_path):
    """Chunk shapes are fixed at open: a long run gets <= 512 KiB chunks (fast appends), a resumed
    run (start_step) is sized by its own span. Nothing needs to be written to see it."""
    w = HDF5Writer(tmp_path / "long.h5")
    w.open(LJ_LIKE, {"run": {"steps": 10**6}})
    w.close("complete", steps_done=0)
    w = HDF5Writer(tmp_path / "resumed.h5")
    w.open(LJ_LIKE, {"run": {"steps": 100, "start_step": 5000}})
    w.close("complete", steps_done=0)
    with h5py.File(tmp_path / "long.h5", "r") as f:
        assert f["observables/energy/total/value"].chunks == (125001,)  # 8 chunks of 488 KiB
        assert f["observables/energy/total/step"].chunks == (62501,)
        assert f["observables/positions/value"].chunks == (681, 64, 3)  # 100001 frames in 147 chunks
    with h5py.File(tmp_path / "resumed.h5", "r") as f:
        assert f["observables/energy/total/value"].chunks == (101,)
        assert f["observables/positions/value"].chunks == (11, 64, 3)


def test_unknown_length_small_chunks_and_more_frames_than_expected(tmp_path):
    """The Recorder does not know the run length: ~64 frames a chunk, 4 to 64 KiB, bound the unused
    tail (1.2 MB for this file with the former fixed 512 KiB/4096-row chunks). A wrong
    ``expected_frames`` only costs chunks: every frame is still written."""
    path = tmp_path / "open.h5"
    _write_all(path, LJ_LIKE, {"run": {"steps": None}}, 30, 7)
    with h5py.File(path, "r") as f:
        assert f["observables/energy/total/value"].chunks == (1024,)  # 4 KiB
        assert f["observables/energy/total/step"].chunks == (512,)
        assert f["observables/positions/value"].chunks == (64, 64, 3)  # 48 KiB
    assert path.stat().st_size < 48 * 1024 + 6 * 4096 + 64 * 1024
    schema = simple_schema()
    _write_all(tmp_path / "small.h5", schema, {}, 50, 9, expected_frames={"energy": 2, "state/x": 3})
    with h5py.File(tmp_path / "small.h5", "r") as f:
        assert f["observables/state/x/value"].chunks == (3, 3)
    traj = load(tmp_path / "small.h5")
    np.testing.assert_array_equal(traj.steps("state/x"), np.arange(51))
    assert traj["energy"].shape == (51,)


def test_save_is_gzip_shuffled_exactly_chunked_and_bit_exact(tmp_path):
    """Golden files: ``save`` sizes chunks to the data and compresses losslessly by default."""
    rng = np.random.default_rng(3)
    schema = Schema((LeafSpec("e", "e", (), np.dtype(np.float64), every(1)),
                     LeafSpec("b", "b", (4,), np.dtype(ml_dtypes.bfloat16), every(3)),
                     LeafSpec("c", "c", (2,), np.dtype(np.complex64), every(5))), dt=0.1)
    frames, expected = batches(schema, 300, [100, 250], rng)  # arbitrary bits: NaN payloads, subnormals
    src = tmp_path / "src.h5"
    w = HDF5Writer(src)
    w.open(schema, {"run": {"steps": None}})
    for fr in frames:
        w.write(fr)
    w.close("complete", steps_done=300)
    traj = load(src)
    gz = traj.save(tmp_path / "gz.h5")
    raw = traj.save(tmp_path / "raw.h5", compression=None)
    for p in (gz, raw):
        _check(load(p), schema, expected, steps_done=300)
    with h5py.File(gz, "r") as f:
        for leaf in schema.leaves:
            g = f["observables"][leaf.path]
            n = len(expected[leaf.path][0])
            for name in ("value", "step", "time"):
                assert g[name].compression == "gzip" and g[name].shuffle, (leaf.path, name)
                assert g[name].chunks[0] == n
    with h5py.File(raw, "r") as f:
        assert f["observables/e/value"].compression is None and not f["observables/e/value"].shuffle
    assert raw.stat().st_size < _data_bytes(raw) + 64 * 1024
    assert gz.stat().st_size < raw.stat().st_size  # steps and times compress even when values do not


def test_file_indexing_matches_numpy_on_the_values(tmp_path):
    """traj[name, frames, more...] on a file reads only the selected frames but means exactly what
    numpy means on the in-memory array (trailing indices, Ellipsis, broadcast fancy indices)."""
    schema = simple_schema(shape=(3, 2))
    w = HDF5Writer(tmp_path / "t.h5")
    w.open(schema, {})
    fr = frames_for(schema, 0, 9)
    w.write(fr)
    w.close("complete", steps_done=9)
    traj = load(tmp_path / "t.h5")
    full = fr.values["state/x"]
    keys = [slice(2, 4), -1, [5, 0, 5], np.arange(10) % 3 == 0, slice(None, None, -3), np.int64(4),
            (slice(2, 4), 1), (slice(2, 4), 1, 0), (-1, 0), (Ellipsis, 0), (slice(None), Ellipsis, 1),
            ([0, 1], [0, 2]), ([[0, 1], [2, 3]],), (None, 1), ([3, 1], slice(None), [1, 0])]
    for key in keys:
        got = traj["state/x", key] if not isinstance(key, tuple) else traj[("state/x", *key)]
        np.testing.assert_array_equal(got, full[key], err_msg=repr(key))
        assert got.shape == full[key].shape, key
    for bad in (10, -11, [0, 20], (0, 3)):
        with pytest.raises(IndexError):
            traj["state/x", bad] if not isinstance(bad, tuple) else traj[("state/x", *bad)]


def test_two_writers_of_one_path_and_a_directory_path_are_clear_errors(tmp_path):
    schema = simple_schema()
    first = HDF5Writer(tmp_path / "t.h5")
    first.open(schema, {})
    second = HDF5Writer(tmp_path / "sub" / ".." / "t.h5")  # the same file, spelled differently
    with pytest.raises(jl.JaxlogError, match=r"another HDF5Writer in this process is still writing"):
        second.open(schema, {})
    first.write(frames_for(schema, 0, 2))
    first.close("complete", steps_done=2)
    assert load(tmp_path / "t.h5").status == "complete"
    second = HDF5Writer(tmp_path / "t.h5")  # once the first is closed the path is free again
    second.open(schema, {})
    second.close("complete", steps_done=0)
    with pytest.raises(jl.JaxlogError, match=r"the path is a directory"):
        HDF5Writer(tmp_path).open(schema, {})


def test_bad_particles_mapping_is_refused_before_a_file_exists(tmp_path):
    schema = simple_schema()
    w = HDF5Writer(tmp_path / "t.h5", particles={"atoms": {"position": "state/nope"}})
    with pytest.raises(jl.JaxlogError, match=r"particles\['atoms'\]\['position'\]: record 'state/nope' is not "
                                             r"recorded; recorded: energy, state/x"):
        w.open(schema, {})
    assert not (tmp_path / "t.h5").exists()  # was a half-made file without /jaxlog that load() rejects
    w = HDF5Writer(tmp_path / "t.h5", particles={"atoms": {"position": "state/x"}})
    w.open(schema, {})
    w.close("complete", steps_done=0)
    assert load(tmp_path / "t.h5").status == "complete"
