"""Faults: a failing writer, bad frames, interrupts, a SIGKILL, and bounded memory under a slow disk.

Every test that could hang runs its body in a thread with a join timeout (a hang fails the test
instead of freezing the suite); no assertion depends on how fast anything is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
from pathlib import Path

import h5py
import numpy as np
import pytest
from storage_helpers import frames_for, simple_schema

import pytest_jaxlog as jl
from pytest_jaxlog.record.frames import Frames
from pytest_jaxlog.store.hdf5.guards import GuardedDisk
from pytest_jaxlog.store.hdf5.writer import HDF5Writer
from pytest_jaxlog.store.hdf5.trajectory import load

GUARD_S = 60  # a hang guard, not a performance threshold
REPO = Path(__file__).resolve().parents[1]


def no_hang(fn, *args):
    """Run fn in a thread; fail (instead of hanging the suite) if it does not finish."""
    result: dict = {}

    def target():
        try:
            result["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001
            result["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(GUARD_S)
    assert not t.is_alive(), f"{fn.__name__} hung"
    if "error" in result:
        raise result["error"]
    return result.get("value")


class FailingWriter(HDF5Writer):
    """A writer whose disk 'fills up' at batch ``fail_at`` (fault injection on the writer thread)."""

    def __init__(self, *args, fail_at: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_at = fail_at
        self.batches = 0

    def _append(self, frames):
        if self.batches == self.fail_at:
            raise OSError(28, "No space left on device")
        self.batches += 1
        super()._append(frames)


def test_writer_thread_failure_surfaces_on_next_write_and_file_stays_valid(tmp_path):
    schema = simple_schema()
    w = FailingWriter(tmp_path / "t.h5", fail_at=2, queue_bytes=1024)
    w.open(schema, {})

    def produce():
        for k in range(200):  # the error must surface long before the end
            w.write(frames_for(schema, 10 * k, 10 * k + 9))
        return k

    with pytest.raises(jl.WriterError) as info:
        no_hang(produce)
    err = info.value
    assert isinstance(err.__cause__, OSError) and "No space left" in str(err)
    assert "t.h5" in str(err)
    no_hang(w.close, "failed")  # never hangs; the error was already raised once
    traj = load(tmp_path / "t.h5")
    assert traj.status == "failed" and "No space left" in traj.writer_error
    np.testing.assert_array_equal(traj.steps("energy"), np.arange(20))  # the two batches before the failure
    assert traj.steps_done == 19  # not the last step handed over to the broken writer


def test_writer_failure_mid_run_leaves_steps_done_at_what_the_file_holds(tmp_path):
    import jax.numpy as jnp

    w = FailingWriter(tmp_path / "t.h5", fail_at=2, queue_bytes=1024)
    with pytest.raises(jl.WriterError, match="No space left"):
        no_hang(lambda: jl.run(lambda s: s + 1.0, jnp.float32(0), 40, chunk_budget_bytes=4 * 4,
                               record={"e": lambda s: s}, sinks=[w], progress=False))  # batches of 4 steps
    traj = load(tmp_path / "t.h5")
    assert traj.status == "failed" and list(traj.steps("e")) == list(range(9))
    assert traj.steps_done == 8  # the driver had handed over more (up to 12 or beyond)


def test_writer_error_raised_at_close_when_no_write_followed(tmp_path):
    schema = simple_schema()
    w = FailingWriter(tmp_path / "t.h5", fail_at=0)
    w.open(schema, {})
    w.write(frames_for(schema, 0, 4))
    with pytest.raises(jl.WriterError, match=r"t\.h5.*No space left") as info:
        no_hang(lambda: w.close("complete", steps_done=4))
    assert isinstance(info.value.__cause__, OSError)
    assert load(tmp_path / "t.h5").status == "failed"


def test_real_h5py_failure_names_record_and_steps(tmp_path):
    schema = simple_schema()
    w = HDF5Writer(tmp_path / "t.h5")
    w.open(schema, {})
    w.flush()
    w._worker.columns.dsets["state/x"].dsid.close()  # the dataset handle goes bad under the writer: h5py raises
    w.write(frames_for(schema, 0, 4))
    with pytest.raises(jl.WriterError, match=r"record 'state/x' \(steps 0\.\.4\) to .*t\.h5 failed") as info:
        no_hang(lambda: w.close("complete", steps_done=4))
    assert info.value.__cause__ is not None
    assert load(tmp_path / "t.h5").status == "failed"


def test_shape_change_at_step_k_is_rejected_naming_record_and_step(tmp_path):
    schema = simple_schema(shape=(3, 3))
    w = HDF5Writer(tmp_path / "t.h5")
    w.open(schema, {})
    w.write(frames_for(schema, 0, 36))
    bad = Frames()
    bad.add("state/x", np.arange(37, 40), np.zeros((3, 3, 4)))
    with pytest.raises(jl.JaxlogError, match=r"record 'state/x': value at step 37 has shape \(3, 4\), expected \(3, 3\)"):
        w.write(bad)
    bad = Frames()
    bad.add("state/x", [37], np.zeros((1, 3, 3), np.float32))
    with pytest.raises(jl.JaxlogError, match=r"record 'state/x': value at step 37 has dtype float32, expected float64"):
        w.write(bad)
    again = Frames()
    again.add("energy", [36], np.zeros(1))
    with pytest.raises(jl.JaxlogError, match=r"record 'energy': step 36 written after step 36"):
        w.write(again)
    unknown = Frames()
    unknown.add("nope", [40], np.zeros(1))
    with pytest.raises(jl.JaxlogError, match=r"record 'nope' is not in the schema; recorded: energy, state/x"):
        w.write(unknown)
    w.close("failed", steps_done=36)
    traj = load(tmp_path / "t.h5")
    assert traj.status == "failed" and traj.steps_done == 36
    np.testing.assert_array_equal(traj.steps("state/x"), np.arange(37))


def _driver_loop(w, schema, raise_at, exc):
    """What the driver does: write batches, close in ``finally`` with the status the exception implies."""
    status = "complete"
    k = -1
    try:
        w.open(schema, {})
        for k in range(10):
            if k == raise_at:
                raise exc
            w.write(frames_for(schema, 5 * k, 5 * k + 4))
    except KeyboardInterrupt:
        status = "stopped"
        raise
    except BaseException:
        status = "failed"
        raise
    finally:
        w.close(status, steps_done=5 * k - 1 if k > 0 else 0)


@pytest.mark.parametrize("exc, status", [(KeyboardInterrupt(), "stopped"), (ZeroDivisionError("boom"), "failed")])
def test_exception_in_caller_leaves_closed_valid_file(tmp_path, exc, status):
    schema = simple_schema()
    w = HDF5Writer(tmp_path / "t.h5", flush_every_s=60.0)  # nothing flushed by the timer: close must do it
    with pytest.raises(type(exc)):
        _driver_loop(w, schema, 4, exc)
    traj = load(tmp_path / "t.h5")
    assert traj.status == status and traj.steps_done == 19
    np.testing.assert_array_equal(traj.steps("energy"), np.arange(20))


CHILD = textwrap.dedent(
    """
    import sys, numpy as np
    from pytest_jaxlog.record.frames import Frames, LeafSpec, Schema
    from pytest_jaxlog.record.schedule import every
    from pytest_jaxlog.store.hdf5.writer import HDF5Writer

    path, mode = sys.argv[1], sys.argv[2]
    schema = Schema((LeafSpec("energy", "energy", (), np.dtype("float64"), every(1)),
                     LeafSpec("state/x", "state", (64, 3), np.dtype("float32"), every(2))))
    w = HDF5Writer(path, flush_every_s=0.01 if mode == "kill" else 60.0)
    w.open(schema, {"provenance": {"child": True}})

    def batch(k):
        fr = Frames()
        steps = np.arange(10 * k, 10 * k + 10)
        fr.add("energy", steps, steps * 0.5)
        xs = steps[steps % 2 == 0]
        fr.add("state/x", xs, np.broadcast_to(xs[:, None, None], (len(xs), 64, 3)).astype(np.float32))
        return fr

    status = "complete"
    written = [0]  # batches written

    def keep_writing():  # (a function: Python 3.13.0 lets an interrupt at a loop's jump in a try escape it)
        while True:  # keep writing (and flushing on the timer) until killed / interrupted
            w.write(batch(written[0]))
            written[0] += 1
            if mode == "exit" and written[0] == 30:
                sys.exit(0)  # never calls close: the atexit hook must finish the file

    try:
        for k in range(20):
            w.write(batch(k))
            written[0] += 1
        w.flush()
        print("flushed", 10 * 20 - 1, flush=True)
        keep_writing()
    except KeyboardInterrupt:
        status = "stopped"
    finally:
        if mode != "exit":
            w.close(status, steps_done=10 * written[0] - 1)
    """
)


def _spawn(tmp_path, mode):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "t.h5"), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    assert line.startswith("flushed"), proc.stderr.read()
    return proc, int(line.split()[1])


def _check_prefix_consistent(traj, flushed_last):
    """Every frame up to ``flushed_last`` is there; anything after it is whole and correct too."""
    e_steps, x_steps = traj.steps("energy"), traj.steps("state/x")
    assert len(e_steps) >= flushed_last + 1
    np.testing.assert_array_equal(e_steps, np.arange(len(e_steps)))
    np.testing.assert_array_equal(traj["energy"], e_steps * 0.5)
    np.testing.assert_array_equal(x_steps, np.arange(len(x_steps)) * 2)
    assert x_steps[-1] >= flushed_last - 1
    x = traj["state/x"]
    np.testing.assert_array_equal(x[:, 0, 0], x_steps.astype(np.float32))
    np.testing.assert_array_equal(x, np.broadcast_to(x[:, :1, :1], x.shape))


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2])
def test_sigkill_after_flush_leaves_readable_file_with_flushed_frames(tmp_path, delay):
    proc, flushed_last = _spawn(tmp_path, "kill")
    time.sleep(delay)  # kill at different points of the ongoing writes (not a timing assertion)
    proc.send_signal(signal.SIGKILL)
    proc.wait(GUARD_S)
    assert proc.returncode == -signal.SIGKILL
    with h5py.File(tmp_path / "t.h5", "r") as f:  # plain h5py opens it
        assert f["observables/energy/step"].shape[0] >= flushed_last + 1
        assert f["h5md"].attrs["version"].tolist() == [1, 1]
    traj = load(tmp_path / "t.h5")
    assert traj.status == "running"  # it never finished
    assert traj.steps_done >= flushed_last and traj.provenance == {"child": True}
    _check_prefix_consistent(traj, flushed_last)


def test_sigint_in_child_closes_with_status_stopped(tmp_path):
    proc, flushed_last = _spawn(tmp_path, "stop")
    proc.send_signal(signal.SIGINT)
    proc.wait(GUARD_S)
    assert proc.returncode == 0, proc.stderr.read()
    traj = load(tmp_path / "t.h5")
    assert traj.status == "stopped"
    _check_prefix_consistent(traj, flushed_last)
    # every frame handed over before the interrupt is in the file (flush_every_s=60: close wrote them)
    assert traj.steps("energy")[-1] >= traj.steps_done - 10


INTERRUPTED_POLL = textwrap.dedent(
    """
    import inspect, signal, sys, threading, time, numpy as np
    from pytest_jaxlog.record.frames import Frames, LeafSpec, Schema
    from pytest_jaxlog.record.schedule import every
    from pytest_jaxlog.store.hdf5.writer import HDF5Writer

    signal.signal(signal.SIGINT, signal.default_int_handler)  # (a child of a background job ignores it)

    class SlowWriter(HDF5Writer):
        def _append(self, frames):
            time.sleep(0.02)  # a backlog builds up: the thread is writing when the caller is interrupted
            super()._append(frames)

    # where the interrupt lands: the first line the main thread runs in a check of the writer
    # thread's life once armed, inside Thread.is_alive's wait (Python 3.11, 3.12) or a flag's read
    wait = getattr(threading.Thread, "_wait_for_tstate_lock", None)
    lines = set()
    if wait is not None:
        src, first = inspect.getsourcelines(wait)
        lines = {first + i for i, text in enumerate(src) if "lock.acquire(" in text}
    armed = False

    def trace(frame, event, arg):
        if armed and event == "line" and (frame.f_lineno in lines and frame.f_code is wait.__code__
                                          or frame.f_code.co_name == "alive"):
            sys.settrace(None)
            signal.raise_signal(signal.SIGINT)
        return trace

    schema = Schema((LeafSpec("energy", "energy", (), np.dtype("float64"), every(1)),))
    w = SlowWriter(sys.argv[1], queue_bytes=4096, flush_every_s=60.0)
    w.open(schema, {})
    handed = -1
    status = "complete"
    sys.settrace(trace)
    try:
        for k in range(200):
            fr = Frames()
            steps = np.arange(10 * k, 10 * k + 10)
            fr.add("energy", steps, steps * 0.5)
            armed = k >= 20  # the queue is full by then
            w.write(fr)
            handed = int(steps[-1])
    except KeyboardInterrupt:
        status = "stopped"
    sys.settrace(None)
    w.close(status, steps_done=handed)
    print(status, handed)
    """
)


def test_ctrl_c_while_the_caller_checks_the_writer_thread_keeps_every_frame(tmp_path):
    """On Python 3.11 and 3.12 an interrupt inside ``Thread.is_alive`` marks the running thread
    stopped; a writer that asked its thread's life that way then finished the file on the
    caller's thread while the thread still wrote its backlog (steps lost, or HDF5 ids closed
    under the thread: 'identifier is not of specified type'). The interrupt is raised at the
    first line of such a check once the queue is full."""
    script = tmp_path / "child.py"
    script.write_text(INTERRUPTED_POLL)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "t.h5")], capture_output=True, text=True,
                          timeout=GUARD_S, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr
    status, handed = proc.stdout.split()
    assert status == "stopped" and int(handed) >= 199  # interrupted after the 20th batch
    traj = load(tmp_path / "t.h5")
    assert traj.status == "stopped" and traj.steps_done == int(handed)
    np.testing.assert_array_equal(traj.steps("energy"), np.arange(int(handed) + 1))  # every frame handed over


def test_writer_never_closed_is_finished_at_exit(tmp_path):
    proc, flushed_last = _spawn(tmp_path, "exit")
    proc.wait(GUARD_S)
    assert proc.returncode == 0, proc.stderr.read()
    traj = load(tmp_path / "t.h5")
    assert traj.status == "failed"
    np.testing.assert_array_equal(traj.steps("energy"), np.arange(300))  # 30 batches, all handed over


class SlowWriter(HDF5Writer):
    """A deliberately slow disk: each batch write waits a little on the writer thread."""

    def _append(self, frames):
        time.sleep(0.01)
        super()._append(frames)


def test_slow_writer_keeps_memory_bounded(tmp_path):
    n_batches, frames_per_batch = 40, 4
    shape = (256, 1024)  # 1 MiB per frame (float32), 4 MiB per batch
    schema = simple_schema(shape=shape, dtype=np.float32)
    batch_bytes = frames_per_batch * int(np.prod(shape)) * 4
    queue_bytes = 2 * batch_bytes + 4096  # two batches (with their steps and energies)
    w = SlowWriter(tmp_path / "t.h5", queue_bytes=queue_bytes, flush_every_s=60.0)
    w.open(schema, {})

    def produce():
        tracemalloc.start()
        try:
            for k in range(n_batches):
                fr = Frames()
                steps = np.arange(k * frames_per_batch, (k + 1) * frames_per_batch)
                fr.add("energy", steps, np.zeros(frames_per_batch))
                fr.add("state/x", steps, np.full((frames_per_batch, *shape), k, np.float32))
                w.write(fr)
                del fr
            w.close("complete", steps_done=n_batches * frames_per_batch - 1)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    peak = no_hang(produce)
    # the queue's budget (it counts the batch the writer holds) + the one being built + the one
    # being handed over, plus 1 MiB of bookkeeping (Frames/dicts/h5py buffers, traced on both
    # threads); an unbounded queue would reach ~160 MiB
    bound = queue_bytes + 2 * batch_bytes + 2**20
    total = n_batches * batch_bytes
    print(f"peak {peak / 2**20:.1f} MiB, bound {bound / 2**20:.1f} MiB, produced {total / 2**20:.0f} MiB, "
          f"stats {w.stats}")
    assert peak < bound < total / 4
    assert w.stats["max_queue_bytes"] <= queue_bytes and w.stats["blocked_s"] > 0  # the producer did wait
    traj = load(tmp_path / "t.h5")
    assert traj["state/x", -1][0, 0] == n_batches - 1 and len(traj.steps("state/x")) == n_batches * frames_per_batch


class DyingWriter(HDF5Writer):
    """The writer thread itself dies (not an error it could catch and keep)."""

    def _run(self):
        raise SystemExit


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_dead_writer_thread_raises_on_write_and_close_finishes_the_file(tmp_path):
    schema = simple_schema()
    w = DyingWriter(tmp_path / "t.h5")
    w.open(schema, {})
    w._thread.join(GUARD_S)
    with pytest.raises(jl.WriterError, match=r"writer thread of .*t\.h5 died"):
        w.write(frames_for(schema, 0, 3))
    no_hang(w.close, "complete")
    traj = load(tmp_path / "t.h5")
    assert traj.status == "failed" and "died" in traj.writer_error


def test_a_disk_guard_that_cannot_start_fails_the_writer_naming_why(tmp_path, monkeypatch):
    """The writer thread starts the disk guard's helper thread as its first act; where no thread
    can be started, the writer writes nothing unguarded: the caller's next write or flush raises
    the cause, and the file, in place since the open, says the run failed and why."""
    def no_thread(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(GuardedDisk, "start", no_thread)
    schema = simple_schema()
    w = HDF5Writer(tmp_path / "t.h5")
    w.open(schema, {})
    with pytest.raises(jl.WriterError, match="guard against a hung disk could not start its thread: RuntimeError: "
                                             "can't start new thread"):
        w.write(frames_for(schema, 0, 3))
        w.flush()  # (the write raises it when the thread said so first)
    no_hang(w.close, "complete")
    traj = load(tmp_path / "t.h5")
    assert traj.status == "failed" and "could not start its thread" in traj.writer_error
    assert len(traj.steps(schema.paths[0])) == 0  # nothing written past the open


# -- a kill inside the rewrite of the partly filled last chunk ---------------------------------------

TORN_CHILD = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from pytest_jaxlog.record.frames import Frames, LeafSpec, Schema
    from pytest_jaxlog.record.schedule import every
    from pytest_jaxlog.store.hdf5.writer import HDF5Writer

    w = HDF5Writer(sys.argv[1], flush_every_s=60.0)
    w.open(Schema((LeafSpec("x", "x", (8,), np.dtype("float32"), every(1)),)), {"provenance": {}})
    for k in range(int(sys.argv[2])):
        fr = Frames()
        fr.add("x", np.array([k]), np.full((1, 8), k, np.float32))
        w.write(fr)
    w.flush()
    os._exit(0)  # killed: the file stays "running"
    """
)


def _tear(path: Path, chunk: int) -> int:
    """Stale the checksum of chunk ``chunk`` of x's values, as a kill inside its rewrite does;
    returns the rows per chunk."""
    with h5py.File(path, "r") as f:
        ds = f["observables/x/value"]
        info = ds.id.get_chunk_info(chunk)
        rows = ds.chunks[0]
    with open(path, "r+b") as fh:  # the checksum is the chunk's last 4 bytes
        fh.seek(info.byte_offset + info.size - 4)
        old = fh.read(4)
        fh.seek(info.byte_offset + info.size - 4)
        fh.write(bytes(b ^ 0xFF for b in old))
    return rows


def test_a_kill_inside_the_last_chunks_rewrite_loses_none_of_its_flushed_rows(tmp_path):
    path = tmp_path / "t.h5"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, "-c", TORN_CHILD, str(path), "4000"], check=True, env=env, timeout=GUARD_S)
    with h5py.File(path, "r") as f:
        n_chunks = f["observables/x/value"].id.get_num_chunks()
    assert n_chunks >= 2  # the last chunk and earlier ones
    rows = _tear(path, n_chunks - 1)
    assert 4000 % rows  # the torn chunk is a partly filled one, as a flush leaves it
    with h5py.File(path, "r") as f, pytest.raises(OSError, match="filter"):
        f["observables/x/value"][:]  # HDF5 itself refuses the torn chunk
    traj = jl.load(path)
    assert traj.status == "running"
    x = traj["x"]
    np.testing.assert_array_equal(x, np.broadcast_to(np.arange(4000, dtype=np.float32)[:, None], (4000, 8)))
    np.testing.assert_array_equal(traj["x", 3990:], x[3990:])
    # a damaged earlier chunk is damage, not a torn append
    _tear(path, 0)
    with pytest.raises(jl.JaxlogError, match=r"reading record 'x' \(value\) failed: the file is damaged"):
        jl.load(path)["x"]


def test_a_finished_file_with_a_bad_last_chunk_is_damaged(tmp_path):
    path = tmp_path / "t.h5"
    w = HDF5Writer(path)
    w.open(simple_schema(), {"provenance": {}})
    w.write(frames_for(simple_schema(), 0, 50))
    w.close("complete", steps_done=49)
    with h5py.File(path, "r") as f:
        ds = f["observables/energy/value"]
        info = ds.id.get_chunk_info(ds.id.get_num_chunks() - 1)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + info.size - 4)
        old = fh.read(4)
        fh.seek(info.byte_offset + info.size - 4)
        fh.write(bytes(b ^ 0xFF for b in old))
    assert jl.load(path).status == "complete"
    with pytest.raises(jl.JaxlogError, match=r"reading record 'energy' \(value\) failed: the file is damaged"):
        jl.load(path)["energy"]
