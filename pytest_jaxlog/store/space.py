"""Disk space claimed before HDF5 writes, so running out of it is an error, never a broken file.

Why: when a write fails halfway through a flush (disk full, ``ulimit -f``), HDF5 has already
updated part of the file's metadata (the superblock's end-of-file among it): the file no longer
opens, and closing or garbage-collecting the h5py objects afterwards crashes the interpreter.
So the writer asks for the space first: ``posix_fallocate`` allocates the blocks (and checks
the file size limit) up to an upper bound of what the next operation can add, and the operation
runs only if that succeeded. Writes below the reserved size need no new blocks and cannot fail
for lack of space. The reserved tail past HDF5's end of file is harmless (HDF5 opens such a file)
and is cut when the writer closes the file (``trim``).
"""

from __future__ import annotations

import errno
import os
import resource
from typing import Callable, NamedTuple

from ..errors import WriterError

NO_SPACE = (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC))
_HEADROOM = 1 << 20  # reserve this much beyond the need (fewer fallocate calls), when the room allows


class NoSpace(WriterError):
    """The next write would not fit (disk full, quota, file size limit): nothing was written."""


class SuperblockEnd(NamedTuple):
    eof: int  # the end-of-file address stored in the superblock (version 2 or 3)


def file_size_limit() -> int | None:
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else int(soft)


class SpaceReserve:
    """Blocks claimed for one open file (``fd`` opened by the writer on it)."""

    def __init__(self, fd: int, name: str):
        self.fd = fd
        self.name = name
        self.reserved = 0  # bytes [0, reserved) have blocks (the first call claims the whole file)
        self.supported = hasattr(os, "posix_fallocate")

    def ensure(self, need: int, what: str | Callable[[], str]) -> None:
        """Make bytes [0, need) of the file writable without new blocks; ``NoSpace`` otherwise.
        ``what`` names the data for the message (a callable: only built when needed)."""
        if need <= self.reserved:
            return
        if callable(what):
            what = what()
        limit = file_size_limit()
        if limit is not None and need > limit:
            raise NoSpace(f"no room to write {what} to {self.name}: the file would grow to about {need} bytes, "
                          f"past the file size limit of {limit} bytes (ulimit -f / RLIMIT_FSIZE)")
        if not self.supported:
            self._check_free(need, what)
            return
        target = need + min(_HEADROOM, need)
        if limit is not None:
            target = min(target, limit)
        for size in (target, need) if target > need else (need,):
            try:
                os.posix_fallocate(self.fd, self.reserved, size - self.reserved)
            except OSError as exc:
                if exc.errno in NO_SPACE:
                    if size == need:
                        raise NoSpace(f"no room to write {what} to {self.name}: {os.strerror(exc.errno)} "
                                      f"(the file needs about {need} bytes)") from None
                    continue
                # the file system cannot preallocate (some network/FUSE file systems): check the free space
                self.supported = False
                self._check_free(need, what)
                return
            self.reserved = size
            return

    def forget(self) -> None:
        """A commit cuts the file just past its rollback journal (``store.journal``), which frees
        the claimed tail, and HDF5 may leave holes where it allocated without writing: after a
        flush nothing is taken as claimed, and the next ``ensure`` claims the blocks of the whole
        file again (a real full file system failed writes below the size once claimed:
        ``test_storage_full_disk.py``)."""
        self.reserved = 0

    def _check_free(self, need: int, what: str) -> None:
        """Best effort where blocks cannot be claimed: enough free space for the growth, now."""
        try:
            st = os.fstatvfs(self.fd)
            size = os.fstat(self.fd).st_size
        except OSError:
            return  # no way to tell: HDF5 will report a failure itself
        free = st.f_bavail * st.f_frsize
        if need - size > free:
            raise NoSpace(f"no room to write {what} to {self.name}: {free} bytes free on its file system, "
                          f"the file needs about {need - size} more")


def superblock_end(fd: int) -> SuperblockEnd | None:
    """The end-of-file address of a version 2/3 superblock at offset 0 (what this writer creates)."""
    try:
        head = os.pread(fd, 48, 0)
    except OSError:
        return None
    if len(head) < 48 or head[:8] != b"\x89HDF\r\n\x1a\n" or head[8] not in (2, 3) or head[9] != 8:
        return None
    if int.from_bytes(head[12:20], "little") != 0:  # a base address: not a file this writer made
        return None
    return SuperblockEnd(int.from_bytes(head[28:36], "little"))


def trim(fd: int) -> None:
    """Cut the reserved tail past the end of file that the superblock records. Through the
    writer's own descriptor: the path may name another file by now."""
    end = superblock_end(fd)
    if end is None:
        return
    try:
        if os.fstat(fd).st_size > end.eof > 0:
            os.ftruncate(fd, end.eof)
    except OSError:
        return  # the tail only costs disk space; the file is valid with it
