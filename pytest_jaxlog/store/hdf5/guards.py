"""What the world outside does to a trajectory file, guarded: a second writer of the same path
(the path lock) and a disk that stops answering (a call that never returns becomes an error,
then an exit)."""

from __future__ import annotations

import atexit
import collections
import datetime
import errno
import functools
import gc
import operator
import os
import queue
import socket
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

from ...errors import JaxlogError, WriterError
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

    __slots__ = ("fn", "args", "done", "result", "error", "withdrawn", "abandoned")

    def __init__(self, fn: Callable[..., Any], args: tuple):
        self.fn, self.args = fn, args
        self.done = threading.Lock()
        self.done.acquire()
        self.result: Any = None
        self.error: BaseException | None = None
        self.withdrawn = False  # the waiting thread made the call itself: the helper must not
        self.abandoned = False  # the waiting thread gave up on it (the disk stopped answering)


# Which thread is collecting garbage now. The gc callbacks are C calls (``setattr`` on a
# thread-local, ``dict.__setitem__``, ``OrderedDict.move_to_end``) and not a Python function on
# purpose: entering Python code is where the main thread takes its pending signals, and a
# KeyboardInterrupt raised inside a gc callback is reported as unraisable and lost: Ctrl-C would
# be ignored whenever it landed in a collection.
_GC_THREAD = threading.local()  # each thread's own: "start" -> the info of its last collection's start
_GC_LAST: dict[str, dict] = {}  # "start" -> the info of the last collection's start, on any thread
_GC_PHASE = collections.OrderedDict(start=None, stop=None)  # the last phase seen is the last key
gc.callbacks.extend([functools.partial(setattr, _GC_THREAD), functools.partial(operator.setitem, _GC_LAST),
                     _GC_PHASE.move_to_end])  # type: ignore[list-item]  # (phase, info): info is last=True


def _collecting(thread_gc: dict) -> bool:
    """Whether the thread whose ``_GC_THREAD`` dict is ``thread_gc`` is inside a garbage collection
    (collections do not nest, and one runs at a time); a wrong answer is rare and safe (see ``_serve``)."""
    start = thread_gc.get("start")
    return start is not None and start is _GC_LAST.get("start") and next(reversed(_GC_PHASE)) == "start"


_POLL_S = 0.05  # how often the waiting thread looks whether the helper thread is collecting
_JOIN_S = 1.0  # the most close() waits for the idle helper thread to end (a collection there may run finalizers)


def _serve(jobs: queue.SimpleQueue, published: list) -> None:
    """The helper thread's loop. Why it is so bare: a garbage collection runs on whichever thread
    allocates when one is due (or, on Python 3.12, on any thread at its next check), and an h5py
    object collected takes h5py's global lock, which the waiting writer thread holds: a collection
    here would wait for the writer, which waits for this call. So the loop allocates nothing
    (its calls are ``os`` functions, given a ready tuple) and the waiting thread, seeing this
    thread collect, makes the call itself (``GuardedDisk._call``).

    Why that is safe: the test of ``withdrawn`` and the call have no point between them where the
    interpreter switches threads, so either the waiting thread withdrew the call first and this
    thread never makes it, or this thread calls ``fn``; and a collection here then comes after
    ``fn`` returned (nothing before it allocates), so the waiting thread makes again a call
    already made, which for these calls (a read, a write or a truncation at the same place, a
    sync) changes nothing."""
    get = jobs.get
    published.append(_GC_THREAD.__dict__)  # (before the loop: no call is waited for yet)
    while True:
        job = get()
        if job is None:
            return
        if job.withdrawn:
            continue
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
        self._helper_gc: list[dict] = []  # the helper thread's ``_GC_THREAD`` dict, once it runs
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
        """Start the helper thread: from the writer thread as its first act, before it makes
        any HDF5 call. Why not on the first call: the writer thread's calls come from inside
        h5py, which holds its global lock there, and starting a thread waits for the new thread
        to run, which needs the interpreter's lock; a thread holding that while it waits for
        h5py's lock (the next writer opening a file) then deadlocks all three. Until it runs,
        every call is made where it is asked (the owner's creating the file needs none)."""
        with self._use:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=_serve, args=(self._jobs, self._helper_gc),
                                                name=f"jaxlog-io:{Path(self.path).name}", daemon=True)
                self._thread.start()
                while not self._helper_gc:  # its first act; the first call may come right after
                    time.sleep(0.0001)

    def close(self) -> None:
        """No more calls: the helper thread ends (unless it is stuck in one: it is left there).
        Waited for: it is idle, so it ends at once, and a closed writer leaves no thread behind
        (a test counting threads after a run, or a process forking, sees none)."""
        with self._use:
            if self._closed:
                return
            self._closed = True
            thread = self._thread if self._stuck is None else None
            if thread is not None:
                self._jobs.put(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(_JOIN_S)

    def _call(self, what: Callable[[], str], fn: Callable[..., Any], args: tuple) -> Any:
        with self._use:
            stuck = self._stuck
            if stuck is not None:
                raise DiskStalled(f"{stuck.describe()}; the disk stopped answering, so nothing more is written to it")
            if self._closed or self._thread is None or threading.get_ident() == self._owner:
                return fn(*args)  # see the class's docstring; not started: never from here (``start``)
            job = _Job(fn, args)
            since = time.monotonic()
            self._deadline = deadline = since + self.stall_s
            self._jobs.put(job)
            while not job.done.acquire(timeout=max(0.0, min(_POLL_S, deadline - time.monotonic()))):
                if _collecting(self._helper_gc[0]):  # it may wait for h5py's lock, held here: see ``_serve``
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

# ---------------------------------------------------------------------------------------------
# One writer per trajectory path, across threads and processes.
#
# Why a lock file beside the trajectory (``.<name>.jaxlog-lock``) and not a lock on the trajectory:
# a new trajectory is written under a temporary name and renamed into place, so the path changes
# inode while it is written and cannot carry the lock. Why ``flock``: two open files conflict even
# inside one process, and the kernel drops the lock when its holder dies, so a killed run never
# leaves a path locked (a stale lock file is taken over). The holder writes who it is into the
# file, so the process that loses names the one that won.
#
# The lock file is removed on release. A process that opened it just before can then lock the
# removed inode, so the holder checks after locking that the path still names the inode it holds.

try:
    import fcntl
except ImportError:  # Windows: no flock; the in-process check in HDF5Writer still applies
    fcntl = None  # type: ignore[assignment]

LOCK_SUFFIX = ".jaxlog-lock"
_HOLDER_WAIT_S = 2.0  # how long a loser waits for the winner to write who it is
_ATTEMPTS = 32  # a lock file replaced between our open and our lock, this many times in a row: give up


def lock_path(target: Path) -> Path:
    return target.with_name(f".{target.name}{LOCK_SUFFIX}")


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (on this host): names that carry a pid are stale once it is gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: alive
    return True


def _holder_text() -> str:
    cmd = " ".join(sys.argv)[:300] if sys.argv else "?"
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return f"pid {os.getpid()} on {socket.gethostname()} since {now}: {cmd}"


class PathLock:
    """Exclusive right to create and write ``target``; ``acquire`` raises ``WriterError`` naming
    the process that holds it."""

    def __init__(self, target: Path):
        self.target = target
        self.path = lock_path(target)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if fcntl is None or self._fd is not None:
            return
        for _ in range(_ATTEMPTS):
            fd = self._open()
            if fd is None:  # something else was planted at the lock's name, now removed: again
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = self._wait_for_holder(fd)
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                    # the file system cannot lock (ENOLCK, EOPNOTSUPP: some network mounts): write
                    # without the cross-process check, as HDF5 does with HDF5_USE_FILE_LOCKING=FALSE
                    self._unlink()
                    return
                raise WriterError(
                    f"cannot write {self.target}: another writer is writing it ({holder or 'holder unknown'}); "
                    f"one path takes one writer at a time: give each run its own path"
                ) from None
            try:
                same = os.path.samestat(os.fstat(fd), os.lstat(self.path))
            except FileNotFoundError:
                same = False
            if not same:  # the previous holder removed the file we locked: lock the current one
                os.close(fd)
                continue
            # written, then cut to its length (a stale holder's longer text): never truncated to
            # zero, which on ext4 makes the file's close and unlink flush it (~0.1 ms per run)
            text = _holder_text().encode()
            os.pwrite(fd, text, 0)
            os.ftruncate(fd, len(text))
            self._fd = fd
            return
        raise WriterError(f"cannot lock {self.target} for writing: {self.path} keeps being replaced")

    def _open(self) -> int | None:
        """The lock file, opened without following a link and checked to be a regular file of
        one name: written into, a symbolic or hard link planted at the lock's name would overwrite
        whatever it names. Such a link is removed (the name only, never what it points to) and
        None returned; anything else that is not a regular file is refused."""
        flags = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP and os.path.islink(self.path):
                self._unlink()
                return None
            raise WriterError(f"cannot lock {self.target} for writing: {self.path}: {exc.strerror}") from None
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            return fd
        os.close(fd)
        if stat.S_ISREG(st.st_mode):  # a hard link to some other file
            self._unlink()
            return None
        raise WriterError(f"cannot lock {self.target} for writing: {self.path} is not a regular file; remove it")

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            self._unlink()  # while still locked: a waiter then sees the inode is gone
        finally:
            os.close(fd)

    def _unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass  # removed by hand: nothing left to clean

    @classmethod
    def _wait_for_holder(cls, fd: int) -> str:
        """The holder's text; a holder that has just locked the file writes it an instant later,
        so an empty file is read again for up to ``_HOLDER_WAIT_S``."""
        deadline = time.monotonic() + _HOLDER_WAIT_S
        while not (holder := cls._read_holder(fd)) and time.monotonic() < deadline:
            time.sleep(0.01)
        return holder

    @staticmethod
    def _read_holder(fd: int) -> str:
        try:
            return os.pread(fd, 1024, 0).decode(errors="replace").strip()
        except OSError:
            return ""
