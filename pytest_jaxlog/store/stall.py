"""A disk that stops answering: a write that never returns becomes an error, then an exit.

Why the writer's system calls run on a thread of their own: HDF5 writes through our file object
(``store.journal``) from inside an h5py call, which holds h5py's global lock. A ``pwrite`` or
``fsync`` that never returns (a hung disk, an NFS server gone) would keep that lock forever, and
every later h5py call of the process would wait for it: ``jl.load`` of any file, the next test's
writer, the plugin's end-of-session report, the interpreter's own teardown. So each call of the
writer's file object goes to a helper thread (``GuardedDisk``), and the writer thread waits for
it at most ``stall_s``: past that, the call raises ``DiskStalled`` inside the h5py call, which
fails and frees the lock; the writer keeps the error for its caller (next ``write`` or ``close``)
and finishes the file without writing to it again (it keeps its last commit). The helper thread
stays in the system call, holding nothing else.

Why the process then exits with status 1 (``_exit_if_stuck``): a thread stuck in a system call
cannot be joined or interrupted, and a process that wrote to a disk that stopped answering must
not look like a success. At exit, while such a call is still stuck, the process prints one line
saying which file, which call and for how long, flushes its streams and ends with ``os._exit(1)``.

``JAXLOG_STALL_S`` sets the default of ``stall_s`` (``HDF5Writer(stall_timeout_s=...)``).
"""

from __future__ import annotations

import atexit
import functools
import gc
import os
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

from ..errors import JaxlogError, WriterError
from . import journal

STALL_ENV = "JAXLOG_STALL_S"
DEFAULT_STALL_S = 60.0


def default_stall_s(fallback: float = DEFAULT_STALL_S) -> float:
    """``JAXLOG_STALL_S`` if set (seconds > 0), else ``fallback``."""
    text = os.environ.get(STALL_ENV, "").strip()
    if not text:
        return fallback
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise JaxlogError(f"{STALL_ENV}={text!r}: expected a number of seconds > 0 (how long a write to the "
                          f"trajectory file may take before the disk counts as hung)")
    return value


class DiskStalled(WriterError):
    """A system call on a trajectory file did not return within the writer's stall timeout."""


class StuckCall(NamedTuple):
    """A system call that has not returned: on which file, what, since when (``time.monotonic``)."""

    path: str
    call: str
    since: float
    job: Any = None  # the helper thread's call, to forget once it returns

    def describe(self, now: float | None = None) -> str:
        waited = (time.monotonic() if now is None else now) - self.since
        return f"{self.call} to {self.path} has not returned for {waited:.1f} s"


_STUCK: dict[int, StuckCall] = {}  # by id of the GuardedDisk; removed when the call returns
_STUCK_LOCK = threading.Lock()


def stuck_calls() -> list[StuckCall]:
    with _STUCK_LOCK:
        return list(_STUCK.values())


def stuck_note(path: Path | str) -> str:
    """``"; <call> has not returned for N s"`` for a stuck call on ``path``'s file, else ``""``."""
    mine = [c for c in stuck_calls() if c.path == str(path)]
    return f"; {mine[0].describe()}" if mine else ""


class _Job:
    """One call handed to the helper thread (``_serve``)."""

    __slots__ = ("fn", "args", "done", "result", "error", "started", "withdrawn", "abandoned")

    def __init__(self, fn: Callable[..., Any], args: tuple):
        self.fn, self.args = fn, args
        self.done = threading.Lock()
        self.done.acquire()
        self.result: Any = None
        self.error: BaseException | None = None
        self.started = False  # the helper thread called ``fn``
        self.withdrawn = False  # the waiting thread made the call itself: the helper must not
        self.abandoned = False  # the waiting thread gave up on it (the disk stopped answering)


_COLLECTOR: int | None = None  # the thread running a garbage collection now, if any


def _note_collector(phase: str, info: dict) -> None:
    global _COLLECTOR
    _COLLECTOR = threading.get_ident() if phase == "start" else None


gc.callbacks.append(_note_collector)
_POLL_S = 0.05  # how often the waiting thread looks whether the helper thread is collecting


def _serve(jobs: queue.SimpleQueue) -> None:
    """The helper thread's loop. Why it is so bare: a garbage collection runs on whichever thread
    allocates when one is due (or, on Python 3.12, on any thread at its next check), and an h5py
    object collected takes h5py's global lock, which the waiting writer thread holds: a collection
    here would wait for the writer, which waits for this call. So the loop allocates nothing
    (its calls are ``os`` functions, given a ready tuple) and the waiting thread, seeing this
    thread collect, makes the call itself (``GuardedDisk._call``).

    Why that is safe: the test of ``withdrawn``, the setting of ``started`` and the call have no
    point between them where the interpreter switches threads, so either this thread calls
    ``fn`` and ``started`` says so, or the waiting thread withdrew the call first and this thread
    never makes it; and a collection here after ``started`` comes after ``fn`` returned (nothing
    before it allocates), so the waiting thread makes again a call already made, which for these
    calls (a read, a write or a truncation at the same place, a sync) changes nothing."""
    get = jobs.get
    while True:
        job = get()
        if job is None:
            return
        if job.withdrawn:
            continue
        job.started = True
        try:
            job.result = job.fn(*job.args)
        except BaseException as exc:  # noqa: BLE001  (raised on the waiting thread)
            job.error = exc
        with _STUCK_LOCK:  # against the waiting thread giving up on it at this instant
            job.done.release()
            abandoned = job.abandoned
        if abandoned:  # the disk answered at last, after the writer gave up on it
            with _STUCK_LOCK:
                for key, call in list(_STUCK.items()):
                    if call.job is job:
                        del _STUCK[key]
            return


class GuardedDisk(journal.Disk):
    """``journal.Disk`` whose reads, writes, truncations and syncs run on a helper thread, each
    waited for at most ``stall_s`` (see the module's docstring).

    Calls from the thread that made the disk (the writer's caller, creating the file, or finishing
    it after its writer thread died) run on that thread: no other thread waits for them. So do
    all calls while ``journal.SYSTEM`` is not the real disk (fault-injection tests replace it):
    the helper thread makes ``os`` calls only (see ``_serve``)."""

    def __init__(self, path: Path | str, stall_s: float):
        self.path = str(path)
        self.stall_s = float(stall_s)
        self._use = threading.Lock()  # one call at a time (the writer thread, or the caller before it)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stuck: StuckCall | None = None
        self._deadline: float | None = None  # of the call in flight on the helper thread
        self._closed = False
        self._owner = threading.get_ident()

    # -- journal.Disk ---------------------------------------------------------------------------
    def pread(self, fd: int, n: int, offset: int) -> bytes:
        if type(journal.SYSTEM) is not journal.Disk:
            return journal.SYSTEM.pread(fd, n, offset)
        return self._call(lambda: f"pread of {n} bytes at offset {offset}", os.pread, (fd, n, offset))

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        if type(journal.SYSTEM) is not journal.Disk:
            journal.SYSTEM.pwrite(fd, data, offset)
            return
        view, done = memoryview(data), 0
        while done < len(view):  # a short write: the rest is a call of its own
            at, rest = offset + done, view[done:]
            done += self._call(functools.partial("pwrite of {} bytes at offset {}".format, len(rest), at), os.pwrite,
                               (fd, rest, at))

    def ftruncate(self, fd: int, size: int) -> None:
        if type(journal.SYSTEM) is not journal.Disk:
            journal.SYSTEM.ftruncate(fd, size)
            return
        self._call(lambda: f"ftruncate to {size} bytes", os.ftruncate, (fd, size))

    def fsync(self, fd: int) -> None:
        if type(journal.SYSTEM) is not journal.Disk:
            journal.SYSTEM.fsync(fd)
            return
        self._call(lambda: "fsync", os.fsync, (fd,))

    def size(self, fd: int) -> int:
        return journal.SYSTEM.size(fd)

    def rename(self, src: Path, dst: Path) -> None:
        journal.SYSTEM.rename(src, dst)

    def unlink(self, path: Path) -> None:
        journal.SYSTEM.unlink(path)

    # -- the helper thread ----------------------------------------------------------------------
    def start(self) -> None:
        """Start the helper thread, from the thread opening the writer, before any HDF5 call.
        Why not on the first call: the writer thread's calls come from inside h5py, which holds
        its global lock there, and starting a thread waits for the new thread to run, which needs
        the interpreter's lock; a thread holding that while it waits for h5py's lock (the next
        writer opening a file) then deadlocks all three."""
        with self._use:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=_serve, args=(self._jobs,),
                                                name=f"jaxlog-io:{Path(self.path).name}", daemon=True)
                self._thread.start()

    def close(self) -> None:
        """No more calls: the helper thread ends (unless it is stuck in one: it is left there)."""
        with self._use:
            if self._closed:
                return
            self._closed = True
            if self._thread is not None and self._stuck is None:
                self._jobs.put(None)

    def _call(self, what: Callable[[], str], fn: Callable[..., Any], args: tuple) -> Any:
        with self._use:
            stuck = self._stuck
            if stuck is not None:
                raise DiskStalled(f"{stuck.describe()}; the disk stopped answering, so nothing more is written to it")
            thread = self._thread
            if self._closed or thread is None or threading.get_ident() == self._owner:
                return fn(*args)  # see the class's docstring; not started: never from here (``start``)
            job = _Job(fn, args)
            since = time.monotonic()
            self._deadline = deadline = since + self.stall_s
            self._jobs.put(job)
            while not job.done.acquire(timeout=max(0.0, min(_POLL_S, deadline - time.monotonic()))):
                if _COLLECTOR == thread.ident:  # it may wait for h5py's lock, held here: see ``_serve``
                    job.withdrawn = True
                    self._deadline = None
                    return fn(*args)
                if time.monotonic() < deadline:
                    continue
                call = StuckCall(self.path, what(), since, job)
                with _STUCK_LOCK:
                    if not job.done.acquire(False):  # (else it returned just now)
                        job.abandoned = True
                        self._stuck = _STUCK[id(self)] = call
                if self._stuck is not None:
                    raise DiskStalled(f"{call.describe()} (HDF5Writer(stall_timeout_s={self.stall_s:g}) or "
                                      f"{STALL_ENV} sets how long a call may take); the file keeps its last commit")
                break
            self._deadline = None
            if job.error is not None:
                raise job.error
            return job.result

    def in_flight_until(self) -> float | None:
        """When the call the helper thread is making now counts as stuck (``time.monotonic``), or
        None when it makes none: a caller waiting for the writer lets the call's own timeout speak
        first, so the error names the call that hung."""
        return self._deadline


@atexit.register
def _exit_if_stuck() -> None:
    """See the module's docstring. Registered when this module is first imported, before the
    writer's own exit hook (``hdf5._close_abandoned``), so it runs after it: writers never closed
    are closed first (a stuck one gives up after its stall timeout)."""
    stuck = stuck_calls()
    if not stuck:
        return
    try:
        import logging

        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        what = "; ".join(c.describe() for c in stuck)
        sys.stderr.write(f"[jaxlog] exiting with status 1: {what} (a hung disk or file system?); the file keeps "
                         f"its last commit\n")
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001  (the exit must happen whatever the streams do)
        pass
    os._exit(1)
