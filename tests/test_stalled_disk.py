"""A disk that stops answering, for real: a preloaded C library makes every write and sync to one
trajectory file block forever once a trigger file exists (the system calls never return, as on a
hung disk or a dead NFS server). The run must raise a ``WriterError`` naming the file, the call and
how long it has been stuck; the process must go on (h5py still usable), then exit with status 1
and one ``[jaxlog]`` line on stderr; the file must load as exactly its last commit."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pytest_jaxlog.errors import JaxlogError
from pytest_jaxlog.store.hdf5.writer import HDF5Writer
from pytest_jaxlog.store.hdf5.guards import STALL_ENV
from pytest_jaxlog.store.hdf5.trajectory import load

GUARD_S = 120  # a hang guard for the child, never the assertion
REPO = Path(__file__).resolve().parents[1]
STEPS = 40
WIDTH = 256  # float32s per frame of "x"

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

/* Once the file HANG_TRIGGER exists, a write or sync to a file whose path ends with HANG_SUFFIX
   never returns; the first such call creates HANG_TRIGGER.hit. Other files are untouched. */

static int hangs(int fd) {
    const char *suffix = getenv("HANG_SUFFIX"), *trigger = getenv("HANG_TRIGGER");
    if (!suffix || !trigger || access(trigger, F_OK) != 0) return 0;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return 0;
    path[n] = 0;
    size_t ls = strlen(suffix);
    return (size_t)n >= ls && strcmp(path + n - ls, suffix) == 0;
}

static void never_return(void) {
    char hit[4200];
    snprintf(hit, sizeof hit, "%s.hit", getenv("HANG_TRIGGER"));
    int fd = open(hit, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (fd >= 0) close(fd);
    for (;;) pause();
}

#define REAL(name, ret, ...) \
    static ret (*real)(__VA_ARGS__); \
    if (!real) real = (ret (*)(__VA_ARGS__))dlsym(RTLD_NEXT, name)

ssize_t write(int fd, const void *b, size_t n) {
    REAL("write", ssize_t, int, const void *, size_t);
    if (hangs(fd)) never_return();
    return real(fd, b, n);
}
ssize_t pwrite(int fd, const void *b, size_t n, off_t at) {
    REAL("pwrite", ssize_t, int, const void *, size_t, off_t);
    if (hangs(fd)) never_return();
    return real(fd, b, n, at);
}
ssize_t pwrite64(int fd, const void *b, size_t n, off_t at) {
    REAL("pwrite64", ssize_t, int, const void *, size_t, off_t);
    if (hangs(fd)) never_return();
    return real(fd, b, n, at);
}
ssize_t pwritev(int fd, const struct iovec *v, int n, off_t at) {
    REAL("pwritev", ssize_t, int, const struct iovec *, int, off_t);
    if (hangs(fd)) never_return();
    return real(fd, v, n, at);
}
int fsync(int fd) {
    REAL("fsync", int, int);
    if (hangs(fd)) never_return();
    return real(fd);
}
int fdatasync(int fd) {
    REAL("fdatasync", int, int);
    if (hangs(fd)) never_return();
    return real(fd);
}
"""

# case "queue": the disk stops after step 10's batch is committed, while the run still hands
# batches over (the caller then waits on a full queue); "close": after the last batch is committed,
# so the final status's commit never returns; "exit": a writer left open, closed by the exit hook
CHILD = textwrap.dedent(
    """
    import os, sys
    import jax.numpy as jnp
    import pytest_jaxlog as jl
    from pytest_jaxlog.store.hdf5.writer import HDF5Writer

    case, path, trigger, steps, width = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    writer = HDF5Writer(path, stall_timeout_s=1.0, flush_every_s=0, queue_bytes=4 * 4 * width)
    stop_after = {"queue": 10, "close": steps, "exit": steps}[case]


    def hang_the_disk(frames):
        if frames.last_step >= stop_after and not os.path.exists(trigger):
            writer.flush()  # everything so far committed: what the file must keep
            print("committed", frames.last_step, flush=True)
            open(trigger, "w").close()


    record = {"e": lambda s: s[0], "x": lambda s: s}
    state = jnp.arange(width, dtype=jnp.float32)
    if case == "exit":  # never closed: the exit hook finishes it
        rec = jl.Recorder(record, sinks=[writer, jl.CallbackSink(hang_the_disk)], flush_every=1)
        rec.__enter__()
        for k in range(steps + 1):
            rec.log(state + k, k)
        print("returned", flush=True)
        raise SystemExit(0)
    try:
        jl.run(lambda s: s + 1.0, state, steps, record=record, sinks=[writer, jl.CallbackSink(hang_the_disk)],
               chunk_budget_bytes=4 * 4 * width)
    except jl.WriterError as exc:
        print("raised:", exc, flush=True)
    print("handed over up to", writer._max_step, flush=True)
    probe = path + ".probe.h5"  # h5py is still usable in this process: another file, written and read
    jl.run(lambda s: s + 1.0, jnp.float32(0), 5, record={"e": lambda s: s}, sinks=[HDF5Writer(probe)])
    print("probe", jl.load(probe).steps("e").tolist(), flush=True)
    print("returned", flush=True)
    """
)


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc or gcc) to build the hung-disk library")
    if not sys.platform.startswith("linux"):
        pytest.skip("the hung-disk library finds a descriptor's file through Linux's /proc/self/fd")
    where = tmp_path_factory.mktemp("shim")
    (where / "hang.c").write_text(SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(where / "hang.so"), str(where / "hang.c"), "-ldl"],
                   check=True, capture_output=True, timeout=GUARD_S)
    return where / "hang.so"


def _env(shim: Path, suffix: str, trigger: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), LD_PRELOAD=str(shim), HANG_SUFFIX=suffix, HANG_TRIGGER=str(trigger))
    env.pop(STALL_ENV, None)
    return env


def _child(tmp_path: Path, shim: Path, case: str) -> tuple[subprocess.CompletedProcess, Path, Path]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    path, trigger = tmp_path / "t.h5", tmp_path / "trigger"
    proc = subprocess.run([sys.executable, str(script), case, str(path), str(trigger), str(STEPS), str(WIDTH)],
                          capture_output=True, text=True, env=_env(shim, "/t.h5", trigger), timeout=GUARD_S)
    assert (tmp_path / "trigger.hit").exists(), proc.stdout + proc.stderr  # the disk did stop answering
    return proc, path, trigger


def _one_exit_line(proc: subprocess.CompletedProcess, path: Path) -> str:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "[jaxlog]" in line]
    assert len(lines) == 1, proc.stderr
    (line,) = lines
    assert line.startswith("[jaxlog] exiting with status 1: ") and str(path) in line, line
    assert re.search(r"(pwrite|fsync|write)\b[^;]* has not returned for \d+\.\d s", line), line
    return line


def _raised(proc: subprocess.CompletedProcess, path: Path) -> str:
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("raised: ")]
    assert line.startswith("raised: [jaxlog] ") and str(path) in line, line
    # what was being written, and for how long it has been stuck
    assert re.search(r"(pwrite|fsync) [^;]*to " + re.escape(str(path)) + r" has not returned for 1\.\d s", line), line
    return line


def _committed(proc: subprocess.CompletedProcess) -> int:
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("committed ")]
    return int(line.split()[1])


def _holds_exactly(path: Path, last: int) -> None:
    """The file is its last commit: steps 0..last, each value as computed plainly."""
    traj = load(path)
    assert traj.status == "running"  # the final status never reached the disk
    for name in ("e", "x"):
        np.testing.assert_array_equal(traj.steps(name), np.arange(last + 1))
    plain = np.arange(WIDTH, dtype=np.float32)[None, :] + np.arange(last + 1, dtype=np.float32)[:, None]
    np.testing.assert_array_equal(traj["x"], plain)
    np.testing.assert_array_equal(traj["e"], plain[:, 0])


def test_a_disk_hung_mid_run_fails_the_run_and_exits_1(tmp_path, shim):
    proc, path, _ = _child(tmp_path, shim, "queue")
    _raised(proc, path)
    handed = int(next(line for line in proc.stdout.splitlines() if line.startswith("handed over up to")).split()[-1])
    assert handed < STEPS  # raised while the run was handing batches over, not at its close
    assert "probe [0, 1, 2, 3, 4, 5]" in proc.stdout  # h5py was not left locked by the stuck call
    assert proc.stdout.rstrip().endswith("returned")
    _one_exit_line(proc, path)
    _holds_exactly(path, _committed(proc))
    assert 10 <= _committed(proc) < STEPS


def test_a_disk_hung_at_close_fails_the_close_and_exits_1(tmp_path, shim):
    proc, path, _ = _child(tmp_path, shim, "close")
    _raised(proc, path)
    assert "probe [0, 1, 2, 3, 4, 5]" in proc.stdout
    _one_exit_line(proc, path)
    assert _committed(proc) == STEPS
    _holds_exactly(path, STEPS)  # every frame was committed before; only the final status is missing


def test_a_disk_hung_at_interpreter_exit_exits_1(tmp_path, shim):
    proc, path, _ = _child(tmp_path, shim, "exit")
    assert proc.stdout.rstrip().endswith("returned")
    _one_exit_line(proc, path)
    _holds_exactly(path, _committed(proc))


PYTEST_CHILD = textwrap.dedent(
    """
    import os
    import jax.numpy as jnp
    import pytest_jaxlog as jl

    def hang_the_disk(frames):
        if frames.last_step >= 10:
            open(os.environ["HANG_TRIGGER"], "w").close()

    def test_hung(jaxlog):
        jaxlog.run(lambda s: s + 1.0, jnp.float32(0), 200, name="hung", chunk=5, record={"e": lambda s: s},
                   sinks=[jl.CallbackSink(hang_the_disk)], writer_kwargs={"stall_timeout_s": 1.0, "flush_every_s": 0})

    def test_after(jaxlog):
        jaxlog.run(lambda s: s + 1.0, jnp.float32(0), 5, name="after", record={"e": lambda s: s})
        assert jaxlog.load("after").steps("e").tolist() == [0, 1, 2, 3, 4, 5]
    """
)


def test_a_pytest_session_with_a_hung_disk_goes_on_and_exits_1(tmp_path, shim):
    (tmp_path / "test_disk.py").write_text(PYTEST_CHILD)
    trigger = tmp_path / "trigger"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_disk.py"],
                          cwd=tmp_path, capture_output=True, text=True, env=_env(shim, "/hung.h5", trigger),
                          timeout=GUARD_S)
    assert (tmp_path / "trigger.hit").exists(), proc.stdout + proc.stderr
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"(WriterError|DiskStalled): \[jaxlog\] (pwrite|fsync) [^;]*hung\.h5 has not returned for 1\.\d s", proc.stdout)
    (path,) = (tmp_path / ".jaxlog").rglob("hung.h5")
    _one_exit_line(proc, path)
    traj = load(path)  # a committed prefix of the run (the writer may not have committed a frame yet), each value its step
    steps = traj.steps("e")
    assert traj.status == "running" and len(steps) < 201  # the run never committed its end
    np.testing.assert_array_equal(steps, np.arange(len(steps)))
    np.testing.assert_array_equal(traj["e"], np.arange(len(steps), dtype=np.float32))


def test_the_stall_timeout_default_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(STALL_ENV, "2.5")
    assert HDF5Writer(tmp_path / "a.h5").stall_timeout_s == 2.5
    assert HDF5Writer(tmp_path / "b.h5", stall_timeout_s=7).stall_timeout_s == 7.0  # an argument wins
    monkeypatch.delenv(STALL_ENV)
    assert HDF5Writer(tmp_path / "c.h5").stall_timeout_s == 60.0
    for bad in ("0", "-1", "soon", "inf", "nan"):
        monkeypatch.setenv(STALL_ENV, bad)
        with pytest.raises(JaxlogError, match=rf"^\[jaxlog\] {STALL_ENV}='{re.escape(bad)}': expected a number"):
            HDF5Writer(tmp_path / "d.h5")


class _Cycle:
    """Garbage only a collection frees: it holds an h5py object, whose release takes h5py's lock."""

    def __init__(self, held):
        self.me, self.held = self, held


def test_a_collection_on_the_io_thread_waiting_for_h5pys_lock_is_not_a_stall(tmp_path):
    """The writer thread waits for its helper thread while inside an h5py call, holding h5py's
    global lock; a garbage collection on the helper thread that frees an h5py object waits for
    that lock. The waiting thread must see the collection and make the call itself, not wait out
    the stall timeout and call a working disk hung. The call here stands for one during which a
    collection begins: made on the helper thread, then made again (the same bytes at the same
    place) on the waiting thread."""
    import gc
    import threading

    import h5py
    from h5py._objects import phil

    from pytest_jaxlog.store.hdf5.guards import GuardedDisk, stuck_calls

    other = h5py.File(tmp_path / "other.h5", "w")
    other["x"] = np.arange(3)
    target = tmp_path / "t.bin"
    fd = os.open(target, os.O_RDWR | os.O_CREAT, 0o644)
    disk = GuardedDisk(target, stall_s=GUARD_S)
    disk.start()
    made_on: list[str] = []

    def collect_then_write(fd: int, data: bytes, at: int) -> int:
        made_on.append(threading.current_thread().name)
        gc.collect()  # on the helper thread: waits for h5py's lock, held by the writer below
        return os.pwrite(fd, data, at)

    outcome: dict = {}

    def writer() -> None:  # the writer thread, inside an h5py call
        with phil:
            try:
                outcome["written"] = disk._call(lambda: "pwrite", collect_then_write, (fd, b"abc", 5))
            except Exception as exc:  # noqa: BLE001  (the assertion below shows it)
                outcome["error"] = repr(exc)

    was_enabled = gc.isenabled()
    gc.disable()  # no collection but the helper thread's frees the cycle
    _Cycle(other["x"])
    thread = threading.Thread(target=writer, name="writer")
    thread.start()
    thread.join(GUARD_S + 30)
    if was_enabled:
        gc.enable()
    try:
        assert outcome == {"written": 3}
        assert made_on[0].startswith("jaxlog-io:") and made_on[1] == "writer"
        assert target.read_bytes() == b"\0" * 5 + b"abc"
        assert stuck_calls() == []
    finally:
        disk.close()
        os.close(fd)
        other.close()


CTRL_C_IN_COLLECTIONS = textwrap.dedent(
    """
    import gc, itertools, os, signal, sys, threading, time
    import pytest_jaxlog.store.hdf5.guards  # registers its gc callbacks
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (a child of a background job ignores it)
    gc.set_threshold(1)  # a collection at nearly every allocation: the signal lands in one often


    def spin(deadline):  # (a function: Python 3.13.0 lets an interrupt at a loop's jump in a try escape it)
        while time.monotonic() < deadline:  # allocating in C: the gc callbacks are the only Python code run
            list(map(list, itertools.repeat((), 100_000)))

    lost = 0
    for trial in range(int(sys.argv[1])):
        try:  # sent from another thread: os.kill to itself would raise at once, outside any collection
            threading.Timer(0.001 * (trial % 10), os.kill, (os.getpid(), signal.SIGINT)).start()
            spin(time.monotonic() + 2.0)
            lost += 1
        except KeyboardInterrupt:
            pass
    print("lost", lost)
    """
)


def test_ctrl_c_landing_in_a_garbage_collection_is_not_lost(tmp_path):
    """The guard's gc callbacks see every collection, the main thread's too. A Python function
    there is where a pending signal is taken, and the KeyboardInterrupt raised in a gc callback is
    reported as unraisable and dropped: a run would ignore Ctrl-C (seen as a writer's child that
    never stopped). Every interrupt must reach the main thread."""
    script = tmp_path / "child.py"
    script.write_text(CTRL_C_IN_COLLECTIONS)
    proc = subprocess.run([sys.executable, str(script), "20"], capture_output=True, text=True, timeout=GUARD_S + 120,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["lost", "0"], proc.stderr[-2000:]
    assert "KeyboardInterrupt" not in proc.stderr
