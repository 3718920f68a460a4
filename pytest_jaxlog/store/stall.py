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
import os
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


class _Job(NamedTuple):
    fn: Callable[..., Any]
    args: tuple


class GuardedDisk(journal.Disk):
    """``journal.Disk`` whose reads, writes, truncations and syncs run on a helper thread, each
    waited for at most ``stall_s`` (see the module's docstring). The calls themselves are those
    of ``journal.SYSTEM`` at the time of the call (fault-injection tests replace it).

    Calls from the thread that made the disk (the writer's caller, creating the file, or finishing
    it after its writer thread died) run on that thread: no other thread waits for them, and the
    file's creation keeps its order of events (its helper thread starts with the writer thread's
    first call)."""

    def __init__(self, path: Path | str, stall_s: float):
        self.path = str(path)
        self.stall_s = float(stall_s)
        self._use = threading.Lock()  # one call at a time (the writer thread, or the caller before it)
        self._go = threading.Lock()  # released: a job is waiting for the helper thread
        self._done = threading.Lock()  # released: the helper thread finished the job
        self._go.acquire()
        self._done.acquire()
        self._job: _Job | None = None
        self._result: Any = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._stuck: StuckCall | None = None
        self._closed = False
        self._owner = threading.get_ident()

    # -- journal.Disk ---------------------------------------------------------------------------
    def pread(self, fd: int, n: int, offset: int) -> bytes:
        return self._call(lambda: f"pread of {n} bytes at offset {offset}", journal.SYSTEM.pread, fd, n, offset)

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        self._call(lambda: f"pwrite of {len(data)} bytes at offset {offset}", journal.SYSTEM.pwrite, fd, data, offset)

    def ftruncate(self, fd: int, size: int) -> None:
        self._call(lambda: f"ftruncate to {size} bytes", journal.SYSTEM.ftruncate, fd, size)

    def fsync(self, fd: int) -> None:
        self._call(lambda: "fsync", journal.SYSTEM.fsync, fd)

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
                self._thread = threading.Thread(target=self._serve, name=f"jaxlog-io:{Path(self.path).name}",
                                                daemon=True)
                self._thread.start()

    def close(self) -> None:
        """No more calls: the helper thread ends (unless it is stuck in one: it is left there)."""
        with self._use:
            if self._closed:
                return
            self._closed = True
            if self._thread is not None and self._stuck is None:
                self._job = None
                self._go.release()

    def _call(self, what: Callable[[], str], fn: Callable[..., Any], *args: Any) -> Any:
        with self._use:
            stuck = self._stuck
            if stuck is not None:
                raise DiskStalled(f"{stuck.describe()}; the disk stopped answering, so nothing more is written to it")
            if self._closed or threading.get_ident() == self._owner:  # see the class's docstring
                return fn(*args)
            if self._thread is None:  # not started (``start``): never from here, see ``start``
                return fn(*args)
            self._job = _Job(fn, args)
            since = time.monotonic()
            self._go.release()
            if not self._done.acquire(timeout=self.stall_s):
                call = StuckCall(self.path, what(), since)
                with _STUCK_LOCK:
                    if self._job is not None:  # (else it returned just now)
                        self._stuck = _STUCK[id(self)] = call
                if self._stuck is not None:
                    raise DiskStalled(f"{call.describe()} (HDF5Writer(stall_timeout_s={self.stall_s:g}) or "
                                      f"{STALL_ENV} sets how long a call may take); the file keeps its last commit")
                self._done.acquire()
            error, result = self._error, self._result
            self._error = self._result = None
            if error is not None:
                raise error
            return result

    def _serve(self) -> None:
        while True:
            self._go.acquire()
            job = self._job
            if job is None:
                return
            try:
                self._result = job.fn(*job.args)
            except BaseException as exc:  # noqa: BLE001  (raised on the calling thread)
                self._error = exc
            with _STUCK_LOCK:
                self._job = None
                if self._stuck is not None:  # the disk answered at last: nobody waits for it now
                    _STUCK.pop(id(self), None)
                    self._result = self._error = None
                    return
            self._done.release()


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
