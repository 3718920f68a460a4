"""Limits, for real, in child processes: a file size limit (``RLIMIT_FSIZE``), memory for large
steps (peak RSS), a writer thread that stalls (Ctrl-C and ``close`` must not hang), and SIGTERM
with frames still queued. No assertion depends on how fast anything runs; timeouts on the child
processes only turn a hang into a failure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from storage_helpers import frames_for, simple_schema

import pytest_jaxlog as jl
from pytest_jaxlog.store.hdf5.writer import QUEUE_BYTES, HDF5Writer

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
GUARD_S = 120


def run_child(code: str, *args, timeout=GUARD_S, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True,
                          text=True, env=ENV, timeout=timeout, **kw)


# -- a file size limit: an error and a valid file, never a crash ------------------------------------

FSIZE_CHILD = """
    import json, resource, sys
    import numpy as np
    import pytest_jaxlog as jl
    from pytest_jaxlog.record.frames import Frames, LeafSpec, Schema
    from pytest_jaxlog.record.schedule import every

    path, limit, batch, compression = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    schema = Schema((LeafSpec("e", "e", (), np.dtype("float64"), every(1)),
                     LeafSpec("x", "x", (2048,), np.dtype("float64"), every(1))), dt=0.1)  # 16 KiB a step
    if len(sys.argv) > 5:  # a file of this layout made before: the next one is copied from its template
        warm = jl.HDF5Writer(sys.argv[5], compression=None if compression == "none" else compression)
        warm.open(schema, {"provenance": {}})
        warm.close("complete", steps_done=0)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    w = jl.HDF5Writer(path, flush_every_s=0.0, compression=None if compression == "none" else compression)
    try:
        w.open(schema, {"provenance": {}})
    except jl.WriterError as exc:
        print(json.dumps({"error": str(exc), "handed": None, "misses": 0}))
        sys.exit(0)
    handed = -1
    try:
        for k in range(0, 4000, batch):
            steps = np.arange(k, k + batch)
            fr = Frames()
            fr.add("e", steps, steps * 1.0)
            fr.add("x", steps, np.random.default_rng(k).standard_normal((batch, 2048)))
            w.write(fr)
            handed = k + batch - 1
        w.close("complete")
        print(json.dumps({"error": None}))
    except jl.WriterError as exc:
        try:
            w.close("failed", steps_done=handed)
        except jl.WriterError:
            pass  # the same error, already caught above
        print(json.dumps({"error": str(exc), "handed": handed, "misses": w.stats["reserve_misses"]}))
"""


@pytest.mark.parametrize("limit, batch, compression", [
    (1 << 20, 1, "none"),  # the reported case: 1 MiB, 16 KiB a step
    (1 << 20, 7, "gzip"),
    (400_000, 3, "none"),
    (3 << 20, 16, "lzf"),
])
def test_file_size_limit_is_an_error_and_leaves_a_valid_failed_file(tmp_path, limit, batch, compression):
    path = tmp_path / "t.h5"
    r = run_child(FSIZE_CHILD, path, limit, batch, compression)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])  # was a segfault (rc 139) at exit
    out = json.loads(r.stdout)
    assert out["error"] and "file size limit" in out["error"] and "t.h5" in out["error"], out
    assert out["misses"] == 0  # the space reserved before each write covered what it took
    assert path.stat().st_size <= limit
    traj = jl.load(path)  # was "truncated file" / "addr overflow"
    assert traj.status == "failed" and "file size limit" in traj.writer_error
    steps = traj.steps("x")
    n = len(steps)
    np.testing.assert_array_equal(steps, np.arange(n))  # a whole prefix: the batches that made it
    assert n % batch == 0 and n <= out["handed"] + 1 and traj.steps_done == max(n - 1, 0)
    assert len(traj.steps("e")) == n
    for k in range(0, n, batch):
        np.testing.assert_array_equal(traj["x", k:k + batch], np.random.default_rng(k).standard_normal((batch, 2048)))
    np.testing.assert_array_equal(traj.time("x"), steps * 0.1)
    assert n > 0


@pytest.mark.parametrize("template", [False, True], ids=["made", "copied"])
def test_file_size_limit_at_creation_leaves_the_previous_file(tmp_path, tmp_path_factory, template):
    path = tmp_path / "t.h5"
    w = HDF5Writer(path)
    w.open(simple_schema(), {})
    w.write(frames_for(simple_schema(), 0, 4))
    w.close("complete", steps_done=4)
    before = path.read_bytes()
    warm = [tmp_path_factory.mktemp("warm") / "w.h5"] if template else []
    r = run_child(FSIZE_CHILD, path, 20_000, 1, "none", *warm)  # not even the layout fits
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    out = json.loads(r.stdout)
    assert out["handed"] is None and "no room to write the file's layout" in out["error"], out
    assert path.read_bytes() == before and jl.load(path).status == "complete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.h5"]  # no temporary or lock file left


def test_file_size_limit_under_jl_run(tmp_path):
    path = tmp_path / "run.h5"
    code = """
        import resource, sys
        import jax.numpy as jnp
        import pytest_jaxlog as jl
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
        try:
            jl.run(lambda s: s + 1.0, jnp.zeros(4096, jnp.float32), 400, chunk=8,  # 16 KiB a step
                   record={"x": lambda s: s}, sinks=[jl.HDF5Writer(sys.argv[1])], progress=False)
            print("no error")
        except jl.WriterError as exc:
            print("WriterError:", exc)
    """
    r = run_child(code, path)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.startswith("WriterError: [jaxlog] no room to write") and "file size limit" in r.stdout
    traj = jl.load(path)
    assert traj.status == "failed"
    n = len(traj.steps("x"))
    assert 0 < n < 64 and traj.steps_done == n - 1
    np.testing.assert_array_equal(traj.steps("x"), np.arange(n))
    np.testing.assert_array_equal(traj["x"][:, 0], np.arange(n, dtype=np.float32))


# -- memory: bounded by bytes, not batches ------------------------------------------------------------

def test_queue_is_bounded_in_bytes_and_big_batches_go_in_slices(tmp_path):
    schema = simple_schema(shape=(4096,), dtype=np.float64)  # 32 KiB a step
    w = HDF5Writer(tmp_path / "t.h5", queue_bytes=100_000)
    w.open(schema, {})
    big = frames_for(schema, 0, 39)  # 1.3 MB in one batch: 13 times the budget
    w.write(big)
    w.close("complete", steps_done=39)
    assert w.stats["max_queue_bytes"] <= 100_000
    assert w.stats["batches"] >= 13 and w.stats["frames"] == 2 * 40
    traj = jl.load(tmp_path / "t.h5")
    np.testing.assert_array_equal(traj["state/x"], big.values["state/x"])
    np.testing.assert_array_equal(traj.steps("energy"), np.arange(40))
    # one step larger than the whole budget goes alone, once the queue is empty
    w = HDF5Writer(tmp_path / "one.h5", queue_bytes=1000)
    w.open(schema, {})
    for k in range(3):
        w.write(frames_for(schema, k, k))
    w.close("complete", steps_done=2)
    assert w.stats["max_queue_bytes"] < 2 * 4096 * 8
    assert len(jl.load(tmp_path / "one.h5")["state/x"]) == 3
    with pytest.raises(jl.JaxlogError, match=r"queue_bytes=0"):
        HDF5Writer(tmp_path / "x.h5", queue_bytes=0)


RSS_CHILD = """
    import json, sys, time
    import numpy as np
    import pytest_jaxlog as jl
    from pytest_jaxlog.record.frames import Frames, LeafSpec, Schema
    from pytest_jaxlog.record.schedule import every

    class SlowDisk(jl.HDF5Writer):  # the disk takes longer than the kernel to produce a step
        def _append(self, frames):
            time.sleep(0.2)
            super()._append(frames)

    shape = (1000, 32000)  # float32: 128 MB a step
    schema = Schema((LeafSpec("x", "x", shape, np.dtype("float32"), every(1)),))
    w = SlowDisk(sys.argv[1])
    def peak_rss_kib():  # this process's own high-water mark (ru_maxrss keeps the parent's across exec)
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

    w.open(schema, {"provenance": {}})
    base = peak_rss_kib()
    for k in range(10):
        fr = Frames()
        fr.add("x", np.array([k]), np.full((1, *shape), k, np.float32))  # a fresh step, as a driver makes
        w.write(fr)
        del fr
    w.close("complete", steps_done=9)
    peak = peak_rss_kib()
    print(json.dumps({"base_kib": base, "peak_kib": peak, "max_queue_bytes": w.stats["max_queue_bytes"],
                      "blocked_s": w.stats["blocked_s"]}))
"""


def test_peak_rss_for_128_mb_steps_stays_under_1_gb(tmp_path):
    path = tmp_path / "big.h5"
    r = run_child(RSS_CHILD, path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    print(out)
    assert out["blocked_s"] > 0  # the producer was faster than the disk: the bound was tested
    assert out["peak_kib"] * 1024 < 1 << 30  # 8 queued batches reached 1.5 GB
    assert out["max_queue_bytes"] <= QUEUE_BYTES
    traj = jl.load(path)
    assert traj.status == "complete" and len(traj.steps("x")) == 10
    assert traj["x", 9][999, 31999] == 9


# -- a stalled writer thread: bounded waits, then a clear error --------------------------------------

STALL_CHILD = """
    import json, signal, sys, threading
    import numpy as np
    import pytest_jaxlog as jl
    from pytest_jaxlog.record.frames import Frames, LeafSpec, Schema
    from pytest_jaxlog.record.schedule import every

    stalled = threading.Event()

    class HungDisk(jl.HDF5Writer):  # the third batch never returns from the disk
        def _append(self, frames):
            if self.stats["batches"] == 2:
                stalled.set()
                threading.Event().wait()
            super()._append(frames)

    def report():
        stalled.wait()
        print("stalled", flush=True)

    threading.Thread(target=report, daemon=True).start()
    schema = Schema((LeafSpec("x", "x", (1024,), np.dtype("float64"), every(1)),))
    w = HungDisk(sys.argv[1], queue_bytes=40_000, stall_timeout_s=float(sys.argv[2]), flush_every_s=0.0)
    w.open(schema, {"provenance": {}})
    status = "complete"
    try:
        for k in range(1000):
            fr = Frames()
            fr.add("x", np.array([k]), np.full((1, 1024), k, np.float64))
            w.write(fr)  # blocks once the queue is full behind the hung write
    except KeyboardInterrupt:
        status = "stopped"
        print("interrupted", flush=True)
    except jl.WriterError as exc:
        print("write:", exc, flush=True)
    try:
        w.close(status)
        print("closed", flush=True)
    except jl.WriterError as exc:
        print("close:", exc, flush=True)
"""


def _stalled_child(path, stall_s: str, ctrl_c: bool = False) -> list[str]:
    """STALL_CHILD's lines once it exits (rc 0); ``ctrl_c``: SIGINT while write() waits behind
    the hung writer."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(STALL_CHILD), str(path), stall_s],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stdout.readline() == "stalled\n", proc.stderr.read()
        if ctrl_c:
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=GUARD_S)  # was: close() waited in queue.put forever
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    return out.splitlines()


def test_ctrl_c_with_a_hung_disk_does_not_hang_close(tmp_path):
    path = tmp_path / "t.h5"
    lines = _stalled_child(path, "2.0", ctrl_c=True)
    assert lines[0] == "interrupted" and lines[1].startswith("close: [jaxlog] closing ")
    assert "has written nothing for 2 s" in lines[1] and "stall_timeout_s" in lines[1] and "t.h5" in lines[1]
    traj = jl.load(path)  # what was flushed before the hang
    assert traj.status == "running"
    np.testing.assert_array_equal(traj.steps("x"), [0, 1])


def test_write_with_a_hung_disk_raises_instead_of_blocking_forever(tmp_path):
    path = tmp_path / "t.h5"
    lines = _stalled_child(path, "1.0")
    assert lines[0].startswith("write: [jaxlog] writing ") and "has written nothing for 1 s" in lines[0]
    assert lines[1].startswith("close: [jaxlog] closing ") and "for over 1 s" in lines[1]  # not waited again
    assert jl.load(path).status == "running"


class Gate(HDF5Writer):
    """A disk that hangs until the test lets it go."""

    gate = threading.Event()

    def _append(self, frames):
        if self.stats["batches"] == 1:
            self.gate.wait()
        super()._append(frames)


def test_close_gives_up_on_a_stalled_writer_and_the_writer_finishes_if_it_recovers(tmp_path):
    schema = simple_schema()
    w = Gate(tmp_path / "t.h5", stall_timeout_s=0.5, flush_every_s=60.0)
    w.open(schema, {})
    for k in range(3):
        w.write(frames_for(schema, 10 * k, 10 * k + 9))
    with pytest.raises(jl.WriterError, match=r"closing .*t\.h5: the writer thread has written nothing"):
        w.close("stopped")
    with pytest.raises(jl.JaxlogError, match="another writer is writing it"):  # still locked: it may resume
        HDF5Writer(tmp_path / "t.h5").open(schema, {})
    w.gate.set()  # the disk comes back: the queued close finishes the file
    w._thread.join(GUARD_S)
    assert not w._thread.is_alive()
    traj = jl.load(tmp_path / "t.h5")
    assert traj.status == "stopped"
    np.testing.assert_array_equal(traj.steps("energy"), np.arange(30))
    other = HDF5Writer(tmp_path / "t.h5")  # and the path is free again
    other.open(schema, {})
    other.close("complete", steps_done=0)


# -- SIGTERM with frames queued: close("stopped") writes every frame handed over ----------------------

TERM_CHILD = """
    import json, os, signal, sys, time
    import numpy as np
    import pytest_jaxlog as jl
    from pytest_jaxlog.record.frames import Frames, LeafSpec, Schema
    from pytest_jaxlog.record.schedule import every

    class SlowDisk(jl.HDF5Writer):
        def _append(self, frames):
            time.sleep(0.02)
            super()._append(frames)

    path, mode = sys.argv[1], sys.argv[2]
    schema = Schema((LeafSpec("x", "x", (64,), np.dtype("float64"), every(1)),))
    w = SlowDisk(path, flush_every_s=60.0, queue_bytes=16_000)  # nothing reaches the disk by the timer
    w.open(schema, {"provenance": {}})
    handed = -1

    def on_term(signum, frame):
        queued = w._queue.bytes
        if mode == "handler":  # close right in the handler (the main thread may be inside write)
            w.close("stopped", steps_done=handed)
            print(json.dumps({"handed": handed, "queued": queued}), flush=True)
            os._exit(0)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        for k in range(100000):
            fr = Frames()
            fr.add("x", np.array([k]), np.full((1, 64), k, np.float64))
            w.write(fr)
            handed = k
            if k == 50:
                print("go", flush=True)
    except KeyboardInterrupt:
        queued = w._queue.bytes
        w.close("stopped", steps_done=handed)
        print(json.dumps({"handed": handed, "queued": queued}), flush=True)
"""


@pytest.mark.parametrize("mode", ["exception", "handler"])
def test_sigterm_with_frames_queued_leaves_every_frame_handed_over(tmp_path, mode):
    path = tmp_path / "t.h5"
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(TERM_CHILD), str(path), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stdout.readline() == "go\n", proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=GUARD_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    res = json.loads(out)
    assert res["queued"] > 0  # frames were waiting for the slow disk when the signal came
    traj = jl.load(path)
    assert traj.status == "stopped" and traj.steps_done == res["handed"]
    np.testing.assert_array_equal(traj.steps("x"), np.arange(res["handed"] + 1))  # every frame handed over
    np.testing.assert_array_equal(traj["x"][:, 0], np.arange(res["handed"] + 1, dtype=np.float64))
