"""Creating a trajectory never destroys one: the new file is made beside its path and renamed into
place once valid, one writer per path across processes. Faults for real: a second process on the
same path, two processes racing, SIGKILL at chosen points of creation and in a tight loop."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from storage_helpers import frames_for, simple_schema

import pytest_jaxlog as jl
from pytest_jaxlog.store.hdf5.writer import HDF5Writer

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
GUARD_S = 120

# A child that writes one trajectory whose values are all ``mark``; it reports each stage on
# stdout and, when asked, waits for a line on stdin before closing (so two writers overlap).
WRITER_CHILD = """
    import json, sys
    import numpy as np
    import pytest_jaxlog as jl
    from pytest_jaxlog.record.frames import Frames, LeafSpec, Schema
    from pytest_jaxlog.record.schedule import every

    path, mark, hold = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "hold"
    schema = Schema((LeafSpec("x", "x", (3,), np.dtype("float64"), every(1)),))
    w = jl.HDF5Writer(path)
    try:
        w.open(schema, {"provenance": {"mark": mark}})
    except jl.WriterError as exc:
        print(json.dumps({"won": False, "error": str(exc)}), flush=True)
        sys.exit(0)
    print(json.dumps({"won": True}), flush=True)
    if hold:
        sys.stdin.readline()
    fr = Frames()
    fr.add("x", np.arange(50), np.full((50, 3), mark))
    w.write(fr)
    w.close("complete", steps_done=49)
    print(json.dumps({"closed": True}), flush=True)
"""


def spawn(*args, stdin=None):
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER_CHILD), *map(str, args)],
                            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)


def write_file(path: Path, mark: float, steps: int = 10) -> None:
    schema = simple_schema()
    w = HDF5Writer(path)
    w.open(schema, {"provenance": {"mark": mark}})
    fr = frames_for(schema, 0, steps - 1)
    fr.values["energy"][:] = mark
    w.write(fr)
    w.close("complete", steps_done=steps - 1)


def test_second_writer_in_another_process_fails_naming_the_holder_and_touches_nothing(tmp_path):
    path = tmp_path / "t.h5"
    schema = simple_schema()
    w = HDF5Writer(path)
    w.open(schema, {})
    w.write(frames_for(schema, 0, 9))
    w.flush()
    before = path.read_bytes()
    inode = path.stat().st_ino
    child = spawn(path, 2.0, "no")
    out, err = child.communicate(timeout=GUARD_S)
    res = json.loads(out)
    assert res["won"] is False, err
    assert res["error"].startswith(f"[jaxlog] cannot write {path}: another writer is writing it (pid {os.getpid()} on ")
    assert "give each run its own path" in res["error"]
    assert path.read_bytes() == before and path.stat().st_ino == inode  # was truncated to 0 bytes
    w.write(frames_for(schema, 10, 19))
    w.close("complete", steps_done=19)
    traj = jl.load(path)
    assert traj.status == "complete"
    np.testing.assert_array_equal(traj.steps("energy"), np.arange(20))
    np.testing.assert_array_equal(traj["state/x"], np.concatenate([frames_for(schema, 0, 9).values["state/x"],
                                                                   frames_for(schema, 10, 19).values["state/x"]]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.h5"]  # no lock or temporary file left


def test_a_stale_lock_file_is_taken_over_with_only_the_new_holder_in_it(tmp_path):
    """A lock file a killed writer left (no lock held on it, a longer text in it) is locked and
    rewritten: it then names the new holder alone, and is gone once the file is done."""
    from pytest_jaxlog.store.hdf5.guards import lock_path

    path = tmp_path / "t.h5"
    lock_path(path).write_text("pid 1 on a machine long gone, running a command with a very long name " * 20)
    schema = simple_schema()
    w = HDF5Writer(path)
    w.open(schema, {})
    holder = lock_path(path).read_text()
    assert holder.startswith(f"pid {os.getpid()} on ") and "long gone" not in holder
    w.write(frames_for(schema, 0, 4))
    w.close("complete", steps_done=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.h5"]
    assert jl.load(path).status == "complete"


def test_two_processes_on_one_path_exactly_one_wins(tmp_path):
    path = tmp_path / "t.h5"
    write_file(path, 0.0)  # an older trajectory there
    a = spawn(path, 1.0, "hold", stdin=subprocess.PIPE)
    b = spawn(path, 2.0, "hold", stdin=subprocess.PIPE)
    try:
        first = {name: json.loads(p.stdout.readline()) for name, p in (("a", a), ("b", b))}
        winners = [name for name, res in first.items() if res["won"]]
        assert len(winners) == 1, first  # both hold their writer open now: they overlap
        winner, loser = (a, b) if winners == ["a"] else (b, a)
        lost = first["b" if winners == ["a"] else "a"]
        assert lost["error"].startswith(f"[jaxlog] cannot write {path}: another writer is writing it (pid {winner.pid} ")
        for p in (a, b):
            p.stdin.write("\n")
            p.stdin.flush()
        out, err = winner.communicate(timeout=GUARD_S)
        assert json.loads(out.splitlines()[-1]) == {"closed": True}, err
        loser.communicate(timeout=GUARD_S)
    finally:
        a.kill()
        b.kill()
    mark = 1.0 if winners == ["a"] else 2.0
    traj = jl.load(path)  # the winner's file, complete and valid
    assert traj.status == "complete" and traj.provenance == {"mark": mark}
    np.testing.assert_array_equal(traj["x"], np.full((50, 3), mark))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.h5"]


# SIGKILL at a chosen point of creation: the child kills itself there (a real SIGKILL, no mock).
KILL_CHILD = """
    import os, signal, sys
    import h5py
    import numpy as np
    import pytest_jaxlog as jl
    from pytest_jaxlog.record.frames import LeafSpec, Schema
    from pytest_jaxlog.record.schedule import every

    path, point = sys.argv[1], sys.argv[2]

    def die(*a, **k):
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "file":  # the temporary file exists, empty
        real_group = h5py.File.create_group
        h5py.File.create_group = lambda self, *a, **k: die()
    elif point == "layout":  # half the datasets made
        real = h5py.Group.create_dataset
        calls = []
        def create_dataset(self, *a, **k):
            calls.append(1)
            if len(calls) == 5:
                die()
            return real(self, *a, **k)
        h5py.Group.create_dataset = create_dataset
    elif point == "rename":  # complete and flushed, not yet in place
        os.replace = die
    elif point == "after":  # in place, the writer thread (and with it the disk's helper thread) not started yet
        import threading
        real_start = threading.Thread.start
        def start(self):
            if self.name.startswith("jaxlog-hdf5"):
                die()
            return real_start(self)
        threading.Thread.start = start
    schema = Schema(tuple(LeafSpec(f"r{i}", f"r{i}", (4,), np.dtype("float32"), every(1)) for i in range(6)))
    if point == "copy":  # a file of this layout made before; the next one dies while its template is copied
        import tempfile
        warm = jl.HDF5Writer(os.path.join(tempfile.mkdtemp(), "warm.h5"))
        warm.open(schema, {"provenance": {}})
        warm.close("complete", steps_done=0)
        from pytest_jaxlog.store.hdf5 import writer_thread as hdf5
        hdf5._write_all = lambda fd, data: (os.pwrite(fd, data[:len(data) // 2], 0), die())  # half copied
    jl.HDF5Writer(path).open(schema, {"provenance": {"mark": 9}})
"""


@pytest.mark.parametrize("point", ["file", "layout", "copy", "rename", "after"])
def test_sigkill_during_creation_keeps_the_previous_trajectory(tmp_path, point):
    path = tmp_path / "t.h5"
    write_file(path, 5.0)
    before = path.read_bytes()
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(KILL_CHILD), str(path), point], capture_output=True,
                       text=True, env=ENV, timeout=GUARD_S)
    assert r.returncode == -signal.SIGKILL, r.stderr
    traj = jl.load(path)  # was a 0- or 48-byte file that neither h5py nor jl.load opens
    if point == "after":  # renamed into place: the new, empty trajectory
        assert traj.status == "running" and traj.provenance == {"mark": 9} and len(traj.steps("r0")) == 0
    else:
        assert path.read_bytes() == before
        assert traj.status == "complete" and (traj["energy"] == 5.0).all()
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name != "t.h5")
    if point != "after":  # the killed writer's temporary file, and its (unlocked) lock file
        assert len(leftovers) == 2 and leftovers[0].endswith(".jaxlog-tmp") and leftovers[1].endswith("-lock")
    write_file(path, 6.0)  # the next writer takes the path over and removes what the killed one left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.h5"]
    assert (jl.load(path)["energy"] == 6.0).all()


TERM_CHILD = """
    import os, signal, sys, threading
    import jax.numpy as jnp
    import pytest_jaxlog as jl

    path, point = sys.argv[1], sys.argv[2]

    def then_term(fn):
        def wrapped(*args, **kwargs):
            out = fn(*args, **kwargs)
            if point == "renamed" or (point == "started" and args[0].name.startswith("jaxlog-hdf5")):
                os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode after this returns
            return out
        return wrapped

    if point == "renamed":  # the file just moved into place, the writer not marked open yet
        os.replace = then_term(os.replace)
    else:  # the writer thread just started, open() not returned yet
        threading.Thread.start = then_term(threading.Thread.start)
    try:
        jl.run(lambda s: s + 1.0, jnp.zeros(3), 50, record={"s": lambda s: s}, sinks=[jl.HDF5Writer(path)],
               progress=False)
    except KeyboardInterrupt as exc:
        print("interrupted", type(exc).__name__, flush=True)
    point = "done"  # no more signals
    traj = jl.load(path)
    print(traj.status, traj.steps_done, len(traj.steps("s")), flush=True)
    w = jl.HDF5Writer(path, overwrite=True)
    w.open(jl.load(path).schema, {"provenance": {"again": 1}})
    w.close("complete", steps_done=0)
    print("reopened", flush=True)
"""


@pytest.mark.parametrize("point", ["renamed", "started"])
def test_sigterm_while_the_writer_opens_leaves_a_stopped_file_and_a_free_path(tmp_path, point):
    """SIGTERM (or Ctrl-C) between the file moving into place and the writer's open returning:
    the file says ``stopped`` (it stayed ``running``, or was closed ``failed`` at exit) and the
    process can write the path again (its lock was held until exit)."""
    path = tmp_path / "t.h5"
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(TERM_CHILD), str(path), point], capture_output=True,
                       text=True, env=ENV, timeout=GUARD_S)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["interrupted Terminated", "stopped 0 0", "reopened"], r.stdout + r.stderr
    traj = jl.load(path)
    assert traj.status == "complete" and traj.provenance == {"again": 1}


LOOP_CHILD = """
    import sys
    import numpy as np
    import pytest_jaxlog as jl
    from pytest_jaxlog.record.frames import Frames, LeafSpec, Schema
    from pytest_jaxlog.record.schedule import every

    schema = Schema(tuple(LeafSpec(f"r{i}", f"r{i}", (8,), np.dtype("float64"), every(1)) for i in range(8)))
    warm = jl.HDF5Writer(sys.argv[1] + ".warm")  # imports done before the kills start
    warm.open(schema, {"provenance": {}})
    warm.close("complete", steps_done=0)
    print("ready", flush=True)
    k = 0
    while True:
        k += 1
        w = jl.HDF5Writer(sys.argv[1], flush_every_s=0.0)
        w.open(schema, {"provenance": {"k": k}})
        fr = Frames()
        for i in range(8):
            fr.add(f"r{i}", np.arange(3), np.full((3, 8), k, np.float64))
        w.write(fr)
        w.close("complete", steps_done=2)
"""


def test_sigkill_in_a_tight_loop_never_leaves_an_unopenable_file(tmp_path):
    path = tmp_path / "t.h5"
    write_file(path, 1.0)
    rng = random.Random(7)
    statuses = []
    for _ in range(12):
        proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(LOOP_CHILD), str(path)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        try:
            assert proc.stdout.readline() == "ready\n", proc.stderr.read()
            time.sleep(rng.uniform(0.0, 0.1))  # a random point of the create/write/close cycles
            proc.send_signal(signal.SIGKILL)
            proc.wait(GUARD_S)
        finally:
            proc.kill()
        try:
            traj = jl.load(path)  # the previous trajectory or a new one
        except jl.JaxlogError as exc:
            # killed in the middle of an HDF5 flush of a file already in place: the file is in
            # place and says what is wrong in one error (HDF5 without SWMR is not crash-consistent)
            assert "t.h5" in str(exc)
            statuses.append("damaged")
            continue
        if "r0" not in traj:  # no loop iteration got its file in place yet
            assert traj.status == "complete" and (traj["energy"] == 1.0).all()
            statuses.append("first")
            continue
        assert traj.status in ("complete", "running")
        k = traj.provenance["k"]
        try:
            for i in range(8):
                n = len(traj.steps(f"r{i}"))
                assert n in ((0, 3) if traj.status == "running" else (3,))
                np.testing.assert_array_equal(traj[f"r{i}"], np.full((n, 8), k, np.float64))
        except jl.JaxlogError as exc:
            # the kill tore a record's chunk index mid-flush: only a file still being written can
            # be torn, and reading it names the file and the record
            assert traj.status == "running", exc
            assert "t.h5" in str(exc) and "/observables/r" in str(exc)
            statuses.append("damaged")
            continue
        statuses.append(traj.status)
    print(statuses)
    # the kills landed inside the loop's create/write/close cycles, and most left a file that opens
    assert any(s in ("complete", "running") for s in statuses), statuses
    assert statuses.count("damaged") == 0, statuses  # every flush is a commit (store/hdf5/journal.py)
    write_file(path, 2.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.h5", "t.h5.warm"]


def test_close_returns_once_the_path_is_free(tmp_path):
    """The writer thread finishes the file, then frees the path; close() returns after both, so
    the same process can write that path again at once (it raced the lock's release)."""
    from pytest_jaxlog.store.hdf5.guards import lock_path

    path = tmp_path / "t.h5"
    schema = simple_schema()
    for k in range(30):
        w = HDF5Writer(path)
        w.open(schema, {})
        assert lock_path(path).exists()
        w.write(frames_for(schema, 0, k))
        w.close("complete", steps_done=k)
        assert not lock_path(path).exists() and not w._thread.is_alive()
    assert len(jl.load(path).steps("energy")) == 30


def test_a_loser_that_locks_an_instant_before_the_holder_writes_its_name_still_names_it(tmp_path):
    """The winner locks the lock file first and writes who it is just after: a second writer
    failing to lock in between waits for the name, and never says 'holder unknown'."""
    import fcntl
    import threading

    from pytest_jaxlog.errors import WriterError
    from pytest_jaxlog.store.hdf5.guards import PathLock, lock_path

    path = tmp_path / "t.h5"
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # locked, nothing written yet
    late = threading.Timer(0.3, lambda: os.pwrite(fd, b"pid 4242 on elsewhere since now: run.py", 0))
    late.start()
    try:
        with pytest.raises(WriterError) as caught:
            PathLock(path).acquire()
    finally:
        late.join()
        os.close(fd)
    assert str(caught.value).startswith(f"[jaxlog] cannot write {path}: another writer is writing it "
                                        f"(pid 4242 on elsewhere since now: run.py); ")
