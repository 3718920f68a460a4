"""One writer per trajectory path, across threads and processes.

Why a lock file beside the trajectory (``.<name>.jaxlog-lock``) and not a lock on the trajectory:
a new trajectory is written under a temporary name and renamed into place, so the path changes
inode while it is written and cannot carry the lock. Why ``flock``: two open files conflict even
inside one process, and the kernel drops the lock when its holder dies, so a killed run never
leaves a path locked (a stale lock file is taken over). The holder writes who it is into the
file, so the process that loses names the one that won.

The lock file is removed on release. A process that opened it just before can then lock the
removed inode, so the holder checks after locking that the path still names the inode it holds.
"""

from __future__ import annotations

import datetime
import errno
import os
import socket
import stat
import sys
import time
from pathlib import Path

from ..errors import WriterError

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
