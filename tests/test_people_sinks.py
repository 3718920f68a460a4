"""Sinks for people: TensorBoard event files (read back with TensorBoard's own reader), log lines
through Python's logging, and per-step row callbacks; each checked against the trajectory the same
run recorded."""

from __future__ import annotations

import logging
import struct

import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.record.frames import Frames, LeafSpec, Schema
from pytest_jaxlog.record.schedule import every
from pytest_jaxlog.store import dashboards as tfevents


from pendulums import BATCHED, STATE, energy, step  # the kernel the sink tests share


def kinetic(state):
    return jnp.sum(0.5 * state["v"] ** 2, axis=-1)



def _accumulator(logdir):
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                                 reason="the test extra installs tensorboard (its reader checks our files)")
    acc = ea_mod.EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def test_crc32c_matches_the_standard_check_value_and_tensorboards_own():
    rows = np.frombuffer(b"123456789", np.uint8)[None, :]
    assert int(tfevents.crc32c_rows(rows)[0]) == 0xE3069283  # the CRC-32C check value
    stub = pytest.importorskip("tensorboard.compat.tensorflow_stub.pywrap_tensorflow")
    data = np.random.default_rng(0).integers(0, 256, (5, 37), dtype=np.uint8)
    ours = tfevents.masked_crc(data)
    assert [int(c) for c in ours] == [stub.masked_crc32c(bytes(r)) for r in data]


def test_event_steps_across_varint_lengths_read_back_exactly(tmp_path):
    """Steps whose varints take 1, 2, 3 and 5 bytes land in one batch: each keeps its value."""
    steps = np.array([0, 127, 128, 16383, 16384, 2**31 + 5])
    values = np.arange(len(steps) * 2, dtype=np.float64).reshape(-1, 2) + 0.5
    data = tfevents.file_header(1.0) + tfevents.scalar_events(["a/b", "c"], steps, values, 2.0)
    (tmp_path / "events.out.tfevents.0.test").write_bytes(data)
    acc = _accumulator(tmp_path)
    assert sorted(acc.Tags()["scalars"]) == ["a/b", "c"]
    for i, tag in enumerate(["a/b", "c"]):
        got = acc.Scalars(tag)
        assert [e.step for e in got] == steps.tolist()
        assert [e.value for e in got] == values[:, i].tolist()
        assert {e.wall_time for e in got} == {2.0}
    # framing: the first record is the file version, its length field is what follows
    (length,) = struct.unpack("<Q", data[:8])
    assert data[12:12 + length].endswith(tfevents.FILE_VERSION)


def test_tensorboard_writer_holds_the_runs_scalars(tmp_path):
    mem = jl.MemorySink()
    tb = jl.TensorBoardWriter(tmp_path / "tb")
    r = jl.run(step, STATE, 300, record={"energy": lambda s: {"total": energy(s), "kinetic": kinetic(s)},
                                         "x": jl.Record(lambda s: s["x"], every=10)},
               sinks=[mem, tb], chunk=64, progress=False)
    assert set(tb.artifacts) == {"tensorboard"} and tb.artifacts["tensorboard"].parent == tmp_path / "tb"
    assert r.artifacts["tensorboard"] == tb.artifacts["tensorboard"]
    acc = _accumulator(tmp_path / "tb")
    assert sorted(acc.Tags()["scalars"]) == ["energy/kinetic", "energy/total"]  # x is not a scalar
    traj = mem.trajectory
    for tag in ("energy/total", "energy/kinetic"):
        got = acc.Scalars(tag)
        assert [e.step for e in got] == traj.steps(tag).tolist() == list(range(301))
        np.testing.assert_array_equal(np.array([e.value for e in got], np.float32), traj[tag].astype(np.float32))


def test_tensorboard_writer_batched_runs_have_a_tag_per_system(tmp_path):
    tb = jl.TensorBoardWriter(tmp_path, records=["energy"])
    r = jl.run(step, BATCHED, 20, record={"energy": energy, "ke": jl.Record(kinetic, every=5)}, batched=True,
               sinks=[jl.MemorySink(), tb], progress=False)
    acc = _accumulator(tmp_path)
    assert sorted(acc.Tags()["scalars"]) == ["energy/system_0", "energy/system_1", "energy/system_2"]
    e = r.trajectory["energy"]
    for i in range(3):
        np.testing.assert_array_equal([x.value for x in acc.Scalars(f"energy/system_{i}")], e[:, i].astype(np.float32))


def test_tensorboard_writer_refuses_what_it_cannot_show(tmp_path):
    with pytest.raises(jl.JaxlogError, match=r"record 'x' has shape \(4,\); TensorBoard takes scalar records only"):
        jl.run(step, STATE, 2, record={"x": lambda s: s["x"]}, sinks=[jl.TensorBoardWriter(tmp_path, records=["x"])],
               progress=False)
    schema = Schema((LeafSpec("z", "z", (), np.dtype(np.complex64), every(1)),))
    with pytest.raises(jl.JaxlogError, match="record 'z' has dtype complex64; only real numbers"):
        jl.TensorBoardWriter(tmp_path, records=["z"]).open(schema, {})


def test_tensorboard_writer_error_surfaces_on_the_callers_thread(tmp_path):
    schema = Schema((LeafSpec("e", "e", (), np.dtype(np.float64), every(1)),))
    tb = jl.TensorBoardWriter(tmp_path)
    tb.open(schema, {})
    tb._fh.close()  # the disk goes away under the writer thread
    frames = Frames()
    frames.add("e", np.arange(3), np.ones(3))
    tb.write(frames)
    with pytest.raises(jl.WriterError, match=r"TensorBoardWriter\(.*events.out.tfevents.*ValueError"):
        tb.close("complete", steps_done=2)
    with pytest.raises(jl.WriterError, match="is closed, cannot write"):
        tb.write(frames)


def test_logging_sink_lines_in_pytests_captured_log(caplog):
    caplog.set_level(logging.INFO, logger="pytest_jaxlog")
    r = jl.run(step, STATE, 30, record={"energy": lambda s: {"total": energy(s)}, "ke": jl.Record(kinetic, every=10)},
               sinks=[jl.MemorySink(), jl.LoggingSink(every=10)], progress=False)
    traj = r.trajectory
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "pytest_jaxlog"]
    expected = [f"step {k}: energy/total={traj['energy/total'][k]:.6g} ke={traj['ke'][k // 10]:.6g}"
                for k in (0, 10, 20, 30)]
    assert lines == expected
    assert all(rec.levelno == logging.INFO for rec in caplog.records if rec.name == "pytest_jaxlog")


def test_logging_sink_batched_level_and_named_logger(caplog):
    caplog.set_level(logging.DEBUG, logger="md")
    r = jl.run(step, BATCHED, 4, record={"energy": energy}, batched=True,
               sinks=[jl.MemorySink(), jl.LoggingSink("md", level=logging.DEBUG, every=jl.at(4), fmt=".3f")],
               progress=False)
    e = r.trajectory["energy"]
    assert [rec.getMessage() for rec in caplog.records if rec.name == "md"] == [
        f"step 4 system {i}: energy={e[4, i]:.3f}" for i in range(3)]
    caplog.clear()
    caplog.set_level(logging.WARNING, logger="md")  # below the level: nothing formatted, nothing logged
    jl.run(step, BATCHED, 4, record={"energy": energy}, batched=True,
           sinks=[jl.LoggingSink("md", level=logging.INFO)], progress=False)
    assert not [rec for rec in caplog.records if rec.name == "md"]


def test_callback_rows_one_dict_per_system_per_recorded_step():
    seen = []
    r = jl.run(step, BATCHED, 6, record={"energy": energy, "ke": jl.Record(kinetic, every=3),
                                         "x": jl.Record(lambda s: s["x"], every=3)}, batched=True,
               sinks=[jl.MemorySink(), jl.CallbackSink(lambda k, rows: seen.append((k, rows)), rows=True)],
               chunk=4, progress=False)
    traj = r.trajectory
    assert [k for k, _ in seen] == list(range(7))
    for k, rows in seen:
        assert len(rows) == 3
        for i, row in enumerate(rows):
            want = {"step": k, "system": i, "energy": float(traj["energy"][k, i])}
            if k % 3 == 0:
                want["ke"] = float(traj["ke"][k // 3, i])
            assert row == want  # x (not scalar per system) is not a row's cell
            assert type(row["step"]) is int and type(row["system"]) is int
            assert all(type(v) is float for name, v in row.items() if name not in ("step", "system"))


def test_callback_default_still_gets_frames():
    batches = []
    jl.run(step, STATE, 5, record={"energy": energy}, sinks=[jl.CallbackSink(batches.append)], progress=False)
    assert all(isinstance(b, Frames) for b in batches)
    assert np.concatenate([b.steps["energy"] for b in batches]).tolist() == list(range(6))
