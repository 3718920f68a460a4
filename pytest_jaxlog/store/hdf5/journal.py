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

import atexit
import bisect
import contextlib
import errno
import os
import resource
import stat
import struct
import time
import warnings
import weakref
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

from ...errors import JaxlogError, JaxlogRuntimeWarning, WriterError

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
        """A commit cuts the file just past its rollback journal (``store.hdf5.journal``), which frees
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

# ---------------------------------------------------------------------------------------------
# Commits of an HDF5 file: a rollback journal kept inside the file, under HDF5's own writes, so
# that a kill or a power loss at any instant leaves the file as of its last commit, a reader never
# sees a half-made one, and the file read on its own, anywhere, reads that commit.
#
# Why: HDF5 without SWMR updates its metadata in place, in no safe order. A process killed (or a
# machine losing power) halfway through a flush leaves a file whose superblock, object headers and
# chunk index disagree: it does not open, or a reader polling it meanwhile reads a mix. SWMR orders
# the writes but forbids new objects while writing (checkpoints and post-mortem states are new
# groups) and needs its own readers after a crash. So the writer hands HDF5 a file object (h5py's
# ``fileobj`` driver), ``CommittedFile``, which:
#
# - writes bytes past the committed end (new chunks, new metadata blocks) to the file, the
#   committed state references none of them: held while they follow each other (HDF5 writes them
#   in order, a few hundred bytes at a time) and written in one call, at the commit at the latest;
# - keeps writes inside the committed end (metadata rewritten in place, a partly filled chunk
#   rewritten) in memory, in pages, served back to HDF5's reads;
# - commits when HDF5 flushes (the driver's ``flush`` is the last call of ``H5Fflush`` and of a
#   close, when the file is whole): the committed bytes of those pages go to the file's tail, past
#   HDF5's end of file, closed by a trailer at the file's very end (the committed size, where the
#   entries are, a CRC-32 over all of it), synced; then the pages, synced; then the tail is zeroed
#   (the trailer with it), synced.
#
# A kill or a power loss before the trailer is whole leaves the committed bytes untouched (a torn
# tail lies past HDF5's end of file, which no reader reads); after it, the file itself holds what
# restores its last commit. Every reader looks at the file's last bytes: with a whole trailer it
# reads the file as of that commit (``CommittedView``) without changing anything, and the next
# writer of the path rolls the commit back (``recover``, under the path's lock). Why in the file and
# not beside it: a file moved, copied, hard-linked or uploaded without its dot files (CI artifact
# uploads often drop them) carries what restores it. A journal beside the file was left behind on
# the way, and the half-applied commit then read as data: a new ``steps_done`` and new values with
# their steps read as 0, and no error. The journal ends the file until HDF5 writes past it: it
# goes to blocks the writer claimed before its writes (a full disk still takes the commit of the
# final status), and the writer cuts the file at HDF5's end of file when it closes it.
#
# Beside the file, ``.<name>.jaxlog-journal`` holds only what a live writer shares with its
# readers: the commit generation and a lock. A read holds the next commit off (a commit waits up to
# ``_HOLD_S`` for readers), and a reader that raced a commit sees the generation change and reads
# again (``generation``). Nothing in it is ever applied to a file: it is opened non-blocking,
# without following links, checked to be a regular file, only its fixed-size header is read, and
# anything else at its name (a FIFO, a directory, a link, a rollback journal of an earlier
# version, junk) is ignored with a one-line warning. SQLite's rollback journal works the same way,
# in a file of its own.

try:
    import fcntl
except ImportError:  # Windows: no flock; readers then rely on the generation check alone
    fcntl = None  # type: ignore[assignment]

PAGE = 4096  # bytes per page kept in memory for a write inside the committed end
# Why the writer batches its system calls: on the writer thread each one is handed to the disk's
# helper thread and waited for (``store.hdf5.guards``), some 60 us on a 2-core machine where the
# call itself takes 2; a short run's close made some 35 of them, most of its time.
HOLD_BELOW = 1 << 16  # new bytes in writes smaller than this are held, to be written together
HOLD_MAX = 1 << 20  # bytes held at most (then written)
WINDOW = 1 << 16  # committed bytes read in one call, kept until the commit changes them
JOURNAL_SUFFIX = ".jaxlog-journal"
# The rollback journal in the file's tail: entries (offset, length, then the committed bytes),
# then the trailer, whose last byte is the file's last byte.
_TAIL_MAGIC = b"JAXLOGT1"
_TAIL_VERSION = 1
# magic, version, generation, committed size, offset of the entries, their bytes, their count, crc32
_TAIL = struct.Struct("<8sIQQQQII")
_ENTRY = struct.Struct("<QI")  # offset, length (then the committed bytes)
# The file beside it: magic, version, generation, crc32. Version 1 was a rollback journal (a
# header of 60 bytes, then its entries); one is recognised, and never applied.
_SIDE_MAGIC = b"JAXLOGJ1"
_SIDE_VERSION = 2
_SIDE = struct.Struct("<8sIQI")
_SIDE_READ = 64  # bytes of a file beside a trajectory ever read
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_HOLD_S = 1.0  # longest a commit waits for readers (a reader may be stuck: the commit then goes on)


_OPEN: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()  # HDF5 file -> our file object


def opened(h5file: Any, fileobj: "CommittedFile | CommittedView") -> Any:
    """``h5file`` (an ``h5py.File`` over ``fileobj``), closed at exit if still open (``_close_at_exit``)."""
    _OPEN[h5file] = fileobj
    return h5file


@atexit.register
def _close_at_exit() -> None:
    """HDF5 closes the files still open when the process ends from C, after Python is gone, and
    a close calls back into their file objects: the process would crash. So they are closed here
    first, writing nothing more (a writer's file keeps its last commit)."""
    for h5file, fileobj in list(_OPEN.items()):
        try:
            if isinstance(fileobj, CommittedFile):
                fileobj.discard()
            h5file.close()
        except Exception:  # noqa: BLE001  (exit path: the file keeps its last commit whatever happens)
            pass


def journal_path(target: Path) -> Path:
    """The file beside the trajectory at ``target`` where its live writer keeps the commit
    generation and lock its readers check (one per path, like the path's lock)."""
    return target.with_name(f".{target.name}{JOURNAL_SUFFIX}")


class Disk:
    """The system calls a commit makes, in one object: a test replaces it with one that drops what
    was not synced when the "power" goes (``tests/test_storage_commit.py``), as SQLite's crash
    tests do."""

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        return os.pread(fd, n, offset)

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        view, done = memoryview(data), 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], offset + done)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def rename(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)

    def unlink(self, path: Path) -> None:
        os.unlink(path)


SYSTEM = Disk()  # looked up at each call: a test puts its own in its place


def _disk(disk: Disk | None) -> Disk:
    return SYSTEM if disk is None else disk


def sync_file(path: Path, disk: Disk | None = None) -> None:
    """Sync a file written whole by another library (h5py's own driver) before it is renamed into
    place, so the new name never points at bytes still in the page cache."""
    disk = _disk(disk)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        disk.fsync(fd)
    finally:
        os.close(fd)


def sync_directory(path: Path, disk: Disk | None = None) -> None:
    """Make a rename or a new name in ``path``'s directory survive a power loss (best effort: some
    file systems cannot open a directory)."""
    disk = _disk(disk)
    try:
        fd = os.open(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return
    try:
        disk.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def durable_replace(src: Path, dst: Path, *, durable: bool = True, disk: Disk | None = None) -> None:
    """``os.replace`` whose result survives a power loss: the file's bytes are synced by its last
    commit, the new name by syncing the directory after the rename."""
    disk = _disk(disk)
    disk.rename(src, dst)
    if durable:
        sync_directory(dst, disk)


class Entry(NamedTuple):
    offset: int
    data: bytes  # the bytes at ``offset`` (a journal's: the committed ones)


class Tail(NamedTuple):
    """The trailer of a rollback journal in a file's tail."""

    generation: int
    committed: int  # the file's size at the commit the journal restores
    offset: int  # where the entries are (past ``committed``)
    payload: int  # their bytes
    entries: int  # their count


def _tail_bytes(t: Tail, payload: bytes) -> bytes:
    raw = _TAIL.pack(_TAIL_MAGIC, _TAIL_VERSION, t.generation, t.committed, t.offset, t.payload, t.entries, 0)
    crc = zlib.crc32(payload, zlib.crc32(raw[:-4]))
    return raw[:-4] + struct.pack("<I", crc)


def _parse_tail(raw: bytes, size: int) -> Tail | None:
    """The trailer that ends a file of ``size`` bytes, checked against that size before anything
    it declares is read: the entries lie between the committed end and the trailer, and there are
    no more of them than pages of the committed file, each a page at most."""
    if len(raw) != _TAIL.size:
        return None
    magic, version, gen, committed, offset, payload, entries, _ = _TAIL.unpack(raw)
    end = size - _TAIL.size
    if magic != _TAIL_MAGIC or version != _TAIL_VERSION or not committed <= offset <= end \
            or payload > end - offset or entries > -(-committed // PAGE) \
            or not entries * (_ENTRY.size + 1) <= payload <= entries * (_ENTRY.size + PAGE):
        return None
    return Tail(gen, committed, offset, payload, entries)


def _parse_entries(payload: bytes, tail: Tail) -> tuple[Entry, ...] | None:
    """The entries, each checked before the next is parsed: in order, apart, each inside one
    page of the committed file, from its start."""
    out, at, prev = [], 0, 0
    for _ in range(tail.entries):
        if at + _ENTRY.size > len(payload):
            return None
        offset, n = _ENTRY.unpack_from(payload, at)
        at += _ENTRY.size
        if not 0 < n <= PAGE or offset % PAGE or offset < prev or offset + n > tail.committed or at + n > len(payload):
            return None
        out.append(Entry(offset, bytes(payload[at:at + n])))
        at += n
        prev = offset + n
    return tuple(out) if at == len(payload) else None


class JournalState(NamedTuple):
    """A whole, checked journal found in a file: the file may hold a commit half applied, and
    ``entries`` (with ``committed``, the size) restore its last commit."""

    tail: Tail
    entries: tuple[Entry, ...]

    @property
    def hot(self) -> bool:
        return True  # a journal is whole only while its commit is applied (or was, when a kill came)

    @property
    def committed(self) -> int:
        return self.tail.committed


def read_tail(fd: int, disk: Disk | None = None) -> JournalState | None:
    """The rollback journal at the end of the open file ``fd`` when it is whole and checks out;
    None otherwise (none, the usual case, or torn by a kill while it was written: then the file's
    committed bytes were never touched by the commit). Reads no more than the file holds."""
    disk = _disk(disk)
    size = disk.size(fd)
    if size < _TAIL.size:
        return None
    raw = disk.pread(fd, _TAIL.size, size - _TAIL.size)
    tail = _parse_tail(raw, size)
    if tail is None:
        return None
    payload = disk.pread(fd, tail.payload, tail.offset) if tail.payload else b""
    if len(payload) != tail.payload or _tail_bytes(tail, payload) != raw:
        return None
    entries = _parse_entries(payload, tail)
    return None if entries is None else JournalState(tail, entries)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def open_file(target: Path) -> int:
    """A trajectory opened for reading: without blocking (a FIFO at its path would hang an open),
    and refused (``JaxlogError``) unless it is a regular file. ``FileNotFoundError`` when absent."""
    fd = os.open(target, os.O_RDONLY | _NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise JaxlogError(f"{target} is {_kind(mode)}, not a trajectory file")
    return fd


def read_state(target: Path, disk: Disk | None = None) -> JournalState | None:
    """The rollback journal of the file at ``target`` (``read_tail``); None where there is none,
    or no regular file."""
    try:
        fd = open_file(target)
    except (OSError, JaxlogError):
        return None
    try:
        return read_tail(fd, disk)
    except OSError:
        return None
    finally:
        os.close(fd)


_NOTED: set[tuple[str, str]] = set()


def _note(target: Path, why: str) -> None:
    """Say once per process, in one line, that what lies at ``target``'s journal name is ignored."""
    key = (str(target), why)
    if key in _NOTED:
        return
    _NOTED.add(key)
    warnings.warn(JaxlogRuntimeWarning(f"[jaxlog] {target}: ignoring {journal_path(target).name} beside it ({why}); "
                                       f"nothing beside a trajectory is applied to it"), stacklevel=4)


def _open_side(target: Path) -> int | None:
    """The file beside ``target`` (``journal_path``) opened for reading, when it is a regular
    file; None otherwise (absent, the usual case; anything else is noted and closed unread,
    opened without blocking, so a FIFO cannot hold the reader, and a link is not followed)."""
    try:
        fd = os.open(journal_path(target), os.O_RDONLY | _NONBLOCK | _NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            _note(target, "a symbolic link")
        elif exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            _note(target, f"it cannot be opened: {exc.strerror}")
        return None
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        mode = 0
    if not stat.S_ISREG(mode):
        os.close(fd)
        _note(target, _kind(mode))
        return None
    return fd


def _side_generation(target: Path, raw: bytes) -> int | None:
    """The generation in the header ``raw`` read beside ``target``; None for anything else
    (noted, but for a header being written: empty, or begun)."""
    if len(raw) < _SIDE.size and raw[:len(_SIDE_MAGIC)] == _SIDE_MAGIC[:len(raw)]:
        return None  # just made by its writer, which writes its header next
    if len(raw) >= _SIDE.size:
        magic, version, gen, crc = _SIDE.unpack_from(raw)
        if magic == _SIDE_MAGIC and version == _SIDE_VERSION:
            return gen if crc == zlib.crc32(raw[:_SIDE.size - 4]) else None  # (None: read while rewritten)
        if magic == _SIDE_MAGIC and version == 1:
            _note(target, "a rollback journal of an earlier pytest-jaxlog or of another file; this version keeps a "
                          "commit's rollback journal inside the file")
            return None
    _note(target, "not a file of pytest-jaxlog")
    return None


def _flock(fd: int, kind: int, wait_s: float) -> bool:
    """``flock`` within ``wait_s`` (False: not taken; nobody waits forever on another process)."""
    if fcntl is None:
        return False
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.0005)
        except OSError:  # a file system without locks
            return False


@contextlib.contextmanager
def reading(target: Path):
    """Hold off the next commit of ``target``'s live writer while a read runs (a commit waits up
    to ``_HOLD_S`` for readers): a writer committing more often than a read takes would otherwise
    overlap every read of a live file."""
    fd = _open_side(target)
    if fd is None:
        yield
        return
    try:
        _flock(fd, fcntl.LOCK_SH if fcntl is not None else 0, _HOLD_S)
        yield
    finally:
        os.close(fd)  # and the lock with it


def generation(target: Path) -> int | None:
    """What a reader compares before and after a read: it changes whenever a commit starts (its
    journal whole in the file first: a reader that sees the new generation finds the journal)."""
    fd = _open_side(target)
    if fd is None:
        return None
    try:
        raw = os.pread(fd, _SIDE_READ, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    return _side_generation(target, raw)


def _side_bytes(gen: int) -> bytes:
    raw = _SIDE.pack(_SIDE_MAGIC, _SIDE_VERSION, gen, 0)
    return raw[:-4] + struct.pack("<I", zlib.crc32(raw[:-4]))


class Journal:
    """The writer's journal: the rollback journal of each commit in the file's tail (``hot``,
    ``clean``), and the generation and lock beside the file, made at the first commit that
    changes committed bytes and kept until the writer closes."""

    def __init__(self, target: Path, file_fd: int, *, durable: bool, disk: Disk | None = None):
        self.path = journal_path(target)
        self.target = target
        self.file_fd = file_fd
        self.durable = durable
        self.disk = _disk(disk)
        self.fd: int | None = None  # the file beside
        self.side = True  # whether one can be made (something planted at its name: the writer goes on without)
        self.generation = time.time_ns()  # above any earlier writer's: a reader sees a change
        self.span: tuple[int, int] | None = None  # where a journal is whole in the file, until ``clean``
        self.dead: tuple[int, int] | None = None  # bytes past HDF5's end of file its commit leaves behind

    def _open(self) -> int | None:
        """The file beside, made as a regular file of one name (a link planted there is removed,
        never written through); None where something else is there."""
        for _ in range(8):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _NONBLOCK | _NOFOLLOW, 0o644)
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    return None
                try:
                    os.unlink(self.path)  # a link planted at the journal's name: the name goes, never its target
                except OSError:
                    return None
                continue
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                os.ftruncate(fd, 0)
                return fd
            os.close(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            os.unlink(self.path)  # a hard link to some other file: never written through
        return None

    def _side_fd(self) -> int | None:
        if self.fd is None and self.side:
            self.fd = self._open()
            self.side = self.fd is not None
        return self.fd

    def _claim(self, end: int, stop: int) -> None:
        """Blocks for bytes ``[end, stop)`` of the file, before any is written: a full disk or the
        file size limit fails the commit here, the file as it was."""
        def no_room(why: str) -> NoSpace:
            return NoSpace(f"no room for the journal of a commit of {self.target.name} ({stop - end} bytes at its "
                           f"end): {why}; the file keeps its last commit")

        limit = file_size_limit()
        if limit is not None and stop > limit:
            raise no_room(f"past the file size limit of {limit} bytes (ulimit -f / RLIMIT_FSIZE)")
        if not hasattr(os, "posix_fallocate"):
            return
        try:
            os.posix_fallocate(self.file_fd, end, stop - end)
        except OSError as exc:
            if exc.errno in NO_SPACE:
                raise no_room(os.strerror(exc.errno)) from None
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)):
                raise

    def hot(self, committed: int, entries: list[Entry], *, size: int, start: int) -> None:
        """The committed bytes the next writes replace, whole and synced in the file's tail before
        any is replaced: past ``start`` (HDF5's end of file ``size``, the committed end, bytes
        written past it), closed by the trailer at the file's end. Then the generation moves on."""
        parts = []
        for e in entries:
            parts.append(_ENTRY.pack(e.offset, len(e.data)))
            parts.append(e.data)
        payload = b"".join(parts)
        end = self.disk.size(self.file_fd)
        stop = start + len(payload) + _TAIL.size  # the journal ends the file
        if stop > end:
            self._claim(end, stop)
        elif stop < end:  # the tail past it (blocks claimed for writes to come) goes, as a flush cuts it
            self.disk.ftruncate(self.file_fd, stop)
        side = self._side_fd()
        if side is not None and fcntl is not None:
            _flock(side, fcntl.LOCK_EX, _HOLD_S)  # readers of the previous commit finish first
        tail = Tail(self.generation + 1, committed, start, len(payload), len(entries))
        self.disk.pwrite(self.file_fd, payload + _tail_bytes(tail, payload), start)
        if self.durable:
            self.disk.fsync(self.file_fd)
        self.span, self.dead = (start, stop), ((size, start) if size < start else None)
        self.generation += 1
        if side is not None:  # after the journal: a reader that sees the new generation finds it
            os.pwrite(side, _side_bytes(self.generation), 0)

    def clean(self, *, applied: bool = True) -> None:
        """The commit is applied and synced (``applied``; else its pages were put back): the
        journal is zeroed, its trailer with it (synced), so the file restores nothing any more.
        Only then are the bytes past HDF5's end of file that the commit left behind (committed
        bytes it cut, bytes written past the end and freed) zeroed too, so that a region HDF5
        takes there again reads as zeros, as in a file cut at its end (the rest of the tail is
        zeros already; not synced: past the end of file, no reader reads them)."""
        if self.span is None:
            return
        lo, hi = self.span
        self.disk.pwrite(self.file_fd, bytes(hi - lo), lo)
        if self.durable:
            self.disk.fsync(self.file_fd)
        self.span = None
        dead, self.dead = self.dead, None
        if dead is not None and applied:
            lo, hi = dead
            self.disk.pwrite(self.file_fd, bytes(hi - lo), lo)

    def unlock(self) -> None:
        """Readers may read again (after a commit, or a commit that failed: they then read the
        file through the journal whole in it)."""
        if fcntl is not None and self.fd is not None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            except OSError:
                pass

    def remove(self) -> None:
        fd, self.fd = self.fd, None
        if fd is None:
            return
        os.close(fd)
        try:
            os.unlink(self.path)
        except OSError:
            pass  # gone already, or cannot go: a generation left behind restores nothing either


class _FileObject:
    """What h5py's ``fileobj`` driver calls to read: a position, seeks from the start, the
    position or the end (``size``), and reads of ``n`` bytes (``_read``) that move it."""

    pos: int
    size: int

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else self.size + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            n = max(0, self.size - self.pos)
        out = self._read(self.pos, n)
        self.pos += n
        return out

    def _read(self, offset: int, n: int) -> bytes:
        raise NotImplementedError


class CommittedFile(_FileObject):
    """The file object HDF5 writes through (see the module's docstring).

    ``in_place=False``: a file not at its path yet (made beside it, renamed once whole), which
    nothing reads: written straight through, no journal, until ``now_in_place``. ``durable``: sync
    at each commit, so a power loss keeps the last one (a kill keeps it either way)."""

    def __init__(self, fd: int, target: Path, *, in_place: bool = True, durable: bool = True, disk: Disk | None = None):
        self.fd = fd
        self.target = target
        self.disk = disk = _disk(disk)
        self.durable = durable
        self.size = disk.size(fd)  # HDF5's end of file: grows with writes, set by truncate
        self.in_place = in_place
        self.committed = self.size if in_place else 0
        self.cut = self.committed  # committed bytes from here on read as zeros (truncated since the commit)
        self.dirty_to = self.size  # bytes past HDF5's end of file up to here may not be zeros (written, then cut)
        self.pages: dict[int, bytearray] = {}
        self.originals: dict[int, bytes] = {}  # the committed bytes of each page (what the journal keeps)
        self.pos = 0
        self.journal = Journal(target, fd, durable=durable, disk=disk)
        self.discarding = False
        self.changed = False  # written or truncated since the last commit (else a commit has nothing to do)
        self.error: BaseException | None = None  # what a commit raised (HDF5 reports only that it failed)
        self.held = bytearray()  # new bytes past the committed end, held to be written together
        self.held_at = 0  # where they start
        self.window: tuple[int, bytes] | None = None  # (start, the committed bytes there), as on the disk

    # -- the rest of the file protocol h5py's fileobj driver calls -----------------------------
    def writable(self) -> bool:
        return True


    def write(self, data: bytes | bytearray | memoryview) -> int:
        n = len(data)
        try:
            self._write(self.pos, memoryview(data).cast("B"))
        except BaseException as exc:
            self.error = self.error or exc
            raise
        self.pos += n
        return n

    def truncate(self, size: int | None = None) -> int:
        size = self.pos if size is None else int(size)
        if self.discarding:
            return size
        self.changed = self.changed or size != self.size
        self.size = size
        if size > self.disk.size(self.fd):  # HDF5's end of allocation: the file grows to it (a reader needs it whole)
            self.disk.ftruncate(self.fd, size)
        # never shorter here: the tail past HDF5's end of file (blocks claimed for writes to come,
        # committed bytes cut, which the last commit needs until the next is whole) is cut by the
        # next commit, just past its journal (``Journal.hot``), and at HDF5's end of file when the
        # writer closes the file
        if size < self.committed:  # committed bytes are cut only at the commit; until then they read as zeros
            self.cut = min(self.cut, size)
            for p, page in self.pages.items():
                start = p * PAGE
                if start + PAGE > size:
                    page[max(0, size - start):] = bytes(PAGE - max(0, size - start))
        return size

    def flush(self) -> None:
        try:
            self.commit()
        except BaseException as exc:
            self.error = self.error or exc
            raise

    # -- pages --------------------------------------------------------------------------------
    def _write(self, offset: int, data: memoryview) -> None:
        if self.discarding:
            return
        end = offset + len(data)
        if end > self.committed:  # new bytes: to the file (held while they follow each other)
            at = max(offset, self.committed)
            self._new_bytes(at, data[at - offset:])
            self.dirty_to = max(self.dirty_to, end)
        stop = min(end, self.committed)
        if offset < stop:  # committed bytes: into pages until the commit
            lo = offset // PAGE * PAGE
            hi = min(((stop - 1) // PAGE + 1) * PAGE, self.committed)
            have = self._on_disk(lo, hi - lo)  # one call for the whole span, or none
            for p in range(lo // PAGE, (hi - 1) // PAGE + 1):
                start = p * PAGE
                a, b = max(offset, start), min(stop, start + PAGE)
                new = data[a - offset:b - offset]
                page = self.pages.get(p)
                if page is None:
                    if b <= self.cut and have[a - lo:b - lo] == bytes(new):
                        continue  # the committed bytes written again (a partly filled chunk's rows): no page
                    original = have[start - lo:min(start + PAGE, hi) - lo]
                    page = bytearray(PAGE)
                    page[:len(original)] = original
                    if self.cut < start + PAGE:
                        page[max(0, self.cut - start):] = bytes(PAGE - max(0, self.cut - start))
                    self.originals[p] = original
                    self.pages[p] = page
                page[a - start:b - start] = new
        self.size = max(self.size, end)
        self.changed = True

    def _new_bytes(self, at: int, data: memoryview) -> None:
        """New bytes at ``at``: a small write is added to those held when it continues or
        overwrites them, else those are written and it is held; a large one (a chunk of data) is
        written at once, never copied (those held first, where it overlaps them)."""
        held = self.held
        if len(data) >= HOLD_BELOW:
            self._write_held_within(at, at + len(data))
            self.disk.pwrite(self.fd, data, at)
            return
        k = at - self.held_at
        if held and 0 <= k <= len(held) and k + len(data) <= HOLD_MAX:
            if k + len(data) <= len(held):
                held[k:k + len(data)] = data
            else:
                held[k:] = data
            return
        self.write_held()
        self.held, self.held_at = bytearray(data), at

    def write_held(self) -> None:
        """The new bytes held, to the file (before a commit, a read of them, a sync)."""
        if self.held:
            self.disk.pwrite(self.fd, self.held, self.held_at)
            self.held = bytearray()  # a new one: a call given up on (a hung disk) may still hold the old

    def _write_held_within(self, lo: int, hi: int) -> None:
        """The held bytes written if any lies in ``[lo, hi)`` (a read of them, a write over them)."""
        if self.held and lo < self.held_at + len(self.held) and self.held_at < hi:
            self.write_held()

    def _on_disk(self, offset: int, n: int) -> bytes:
        """The file's bytes ``[offset, offset + n)`` as on the disk (the new bytes held written
        first); committed ones from the window read before where it has them."""
        end = offset + n
        if end <= self.committed and n <= WINDOW:
            w = self.window
            if w is None or not (w[0] <= offset and end <= w[0] + len(w[1])):
                lo = offset // WINDOW * WINDOW
                hi = min(max(end, lo + WINDOW), self.committed)
                w = self.window = (lo, self.disk.pread(self.fd, hi - lo, lo))
            return w[1][offset - w[0]:end - w[0]]
        self._write_held_within(offset, end)
        return self.disk.pread(self.fd, n, offset) if n else b""

    def _read(self, offset: int, n: int) -> bytes:
        out = bytearray(n)
        have = self._on_disk(offset, n)
        out[:len(have)] = have
        end = offset + n
        lo, hi = max(offset, self.cut), min(end, self.committed)
        if lo < hi:  # committed bytes truncated since the commit
            out[lo - offset:hi - offset] = bytes(hi - lo)
        at = offset
        while at < min(end, self.committed):
            p, within = divmod(at, PAGE)
            k = min(PAGE - within, min(end, self.committed) - at)
            page = self.pages.get(p)
            if page is not None:
                out[at - offset:at - offset + k] = page[within:within + k]
            at += k
        if end > self.size:  # past HDF5's end of file (a reserved tail, a cut one): zeros
            lo = max(offset, self.size)
            out[lo - offset:] = bytes(end - lo)
        return bytes(out)

    # -- commits ------------------------------------------------------------------------------
    @property
    def hot(self) -> bool:
        """Whether the file holds the journal of a commit not finished (one that failed midway)."""
        return self.journal.span is not None

    def commit(self) -> None:
        """Make the file as HDF5 has it now the committed state (see the module's docstring). A
        file not in place yet is only synced before it takes its path (``sync``)."""
        if self.discarding or not self.changed:
            return
        self.write_held()
        self.window = None  # the pages below change the committed bytes
        # committed bytes past HDF5's end of file now (it cut the file) are never written by the
        # commit: the journal needs none of them, and they are zeroed once it is done (``clean``)
        cut = min(self.size, self.committed)
        entries = []
        for p in sorted(self.pages):
            start = p * PAGE
            if start >= cut:
                continue
            stop = min(start + PAGE, cut)
            old = self.originals[p][:stop - start]
            if old == self.pages[p][:stop - start]:  # rewritten with the same bytes (the committed rows
                del self.pages[p]                     # of a partly filled chunk): nothing to replace
                continue
            entries.append(Entry(start, old))
        try:
            if entries:
                self.journal.hot(self.committed, entries, size=self.size,
                                 start=max(self.size, self.committed, self.dirty_to))
            elif self.dirty_to > max(self.size, self.committed):  # written past the end, then cut: zeros again
                lo = max(self.size, self.committed)
                self.disk.pwrite(self.fd, bytes(self.dirty_to - lo), lo)
            for run in _runs(self.pages, cut):
                self.disk.pwrite(self.fd, run.data, run.offset)
            if self.durable and self.in_place:
                self.disk.fsync(self.fd)
            if entries:
                self.journal.clean()
        except BaseException:
            if self.hot:
                self._undo(entries)
            raise
        finally:
            if entries:
                self.journal.unlock()
        self.committed = self.cut = self.size if self.in_place else 0
        self.dirty_to = self.size
        self.pages.clear()
        self.originals.clear()
        self.changed = False

    def _undo(self, entries: list[Entry]) -> None:
        """A commit failed after its journal was whole (a failing disk): the committed bytes are
        put back, so that the file is its last commit and the next one starts from it (the pages
        stay, to be committed again). Should that fail too, nothing more is written: the file
        keeps its last commit through the journal in it (a reader reads through it, the next
        writer of the path rolls it back), and HDF5's writes past its end, which may reach the
        journal, never do."""
        try:
            for e in entries:
                self.disk.pwrite(self.fd, e.data, e.offset)
            if self.durable:
                self.disk.fsync(self.fd)
            self.journal.clean(applied=False)
        except BaseException:  # noqa: BLE001  (the commit's own error is the one raised)
            self.discard()

    def sync(self) -> None:
        """The bytes written so far on the disk (before the file takes its path: a power loss
        after the rename then finds it whole)."""
        self.write_held()
        if self.durable:
            self.disk.fsync(self.fd)

    def now_in_place(self) -> None:
        """The file was just committed, synced and renamed to its path (the directory synced):
        from now on commits are journaled."""
        self.write_held()
        self.in_place = True
        self.committed = self.cut = self.size

    def discard(self) -> None:
        """Write nothing more: the file keeps its last commit (a write failed; HDF5 may retry its
        dirty metadata on close, which must neither fail nor reach the file)."""
        self.discarding = True
        self.pages.clear()
        self.originals.clear()
        self.held = bytearray()

    def close(self) -> None:
        """After HDF5 closed the file (its last flush committed everything): the tail past its
        end of file is cut, unless a commit that failed left its journal there (the file needs it:
        a reader reads through it, the next writer rolls it back)."""
        self.journal.remove()
        if not self.hot:
            trim(self.fd)


def _runs(pages: dict[int, bytearray], cut: int) -> list[Entry]:
    """The pages below ``cut`` as runs of neighbours, to write with a call each (HDF5's metadata
    sits together at the file's start: a commit's pages mostly make one run)."""
    runs: list[list] = []  # [start, end, views]
    for p in sorted(pages):
        start = p * PAGE
        if start >= cut:
            break
        view = memoryview(pages[p])[:min(PAGE, cut - start)]
        if runs and runs[-1][1] == start:
            runs[-1][1] += len(view)
            runs[-1][2].append(view)
        else:
            runs.append([start, start + len(view), [view]])
    return [Entry(start, b"".join(views)) for start, _, views in runs]


def roll_back(fd: int, disk: Disk | None = None) -> bool:
    """Restore the last commit of the open file ``fd`` from the journal whole in it, if any, and
    cut the file there (entries synced before the journal goes). Only with no live writer.
    Returns whether there was one."""
    disk = _disk(disk)
    state = read_tail(fd, disk)
    if state is None:
        return False
    for e in state.entries:
        disk.pwrite(fd, e.data, e.offset)
    disk.fsync(fd)
    disk.ftruncate(fd, state.committed)
    disk.fsync(fd)
    return True


def recover(target: Path, disk: Disk | None = None) -> bool:
    """Before a writer takes the path ``target`` (under its lock: no live writer): roll back a
    commit a killed writer left half applied in the file there (``roll_back``) and remove what
    is at the journal's name beside it (a link's name, never its target). A directory there is
    refused (``WriterError``) before anything is touched. Returns whether the file was rolled back."""
    disk = _disk(disk)
    jpath = journal_path(target)
    try:
        mode: int | None = os.lstat(jpath).st_mode
    except OSError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise WriterError(f"cannot write {target}: {jpath} beside it is a directory, where pytest-jaxlog keeps what "
                          f"readers of the live file check; remove it")
    if mode is not None:
        try:
            disk.unlink(jpath)
        except OSError:
            pass
    try:
        fd = os.open(target, os.O_RDWR | _NONBLOCK | _NOFOLLOW)
    except OSError:
        return False  # none (the usual case), or a link: the writer replaces the link, never writes through it
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and roll_back(fd, disk)
    finally:
        os.close(fd)


class CommittedView(_FileObject):
    """A read-only file object: the file as of the commit its journal restores, read through it
    (the file is not changed: a reader never writes). ``fd`` stays the caller's to close."""

    def __init__(self, fd: int, state: JournalState, disk: Disk | None = None):
        self.fd = fd
        self.disk = _disk(disk)
        self.size = state.committed
        self.entries = state.entries  # in order and apart (``_parse_entries``)
        self.starts = [e.offset for e in self.entries]
        self.pos = 0

    def flush(self) -> None:
        """Nothing to write: a reader's view."""

    def truncate(self, size: int | None = None) -> int:
        raise OSError(errno.EROFS, "a committed view is read-only")

    def _read(self, offset: int, n: int) -> bytes:
        end = offset + n
        out = bytearray(n)
        have = self.disk.pread(self.fd, min(n, max(0, self.size - offset)), offset) if offset < self.size else b""
        out[:len(have)] = have
        i = max(0, bisect.bisect_right(self.starts, offset) - 1)  # the entries this read overlaps, and only those
        while i < len(self.entries) and self.starts[i] < end:
            e = self.entries[i]
            lo, hi = max(offset, e.offset), min(end, e.offset + len(e.data))
            if lo < hi:
                out[lo - offset:hi - offset] = e.data[lo - e.offset:hi - e.offset]
            i += 1
        return bytes(out)

# ---------------------------------------------------------------------------------------------
# A file that takes its path only once it holds a checkpoint (``jl.resume``'s new file).
#
# Why: a resume rewrites its trajectory into a new file (the frames up to the checkpoint it
# continues from, then its own). Were the new file renamed into place as soon as it exists, a kill
# before it holds that checkpoint would leave the path with a file nothing can resume from, the old
# trajectory only under a hidden name. So the new file is written under its temporary name, and
# renamed over the path (atomically: the path names one whole file at every instant) right after
# the writer has flushed a checkpoint at or past the step the resume continues from. A writer that
# closes before that never touches the path: its file is removed and the previous one stays.

@dataclass
class PendingSwap:
    """The new file under its temporary name ``where`` until a checkpoint at step ``at`` or later
    is on disk; then ``path``."""

    where: Path
    path: Path
    at: int
    durable: bool = True  # the rename survives a power loss (the directory is synced after it)
    done: bool = False

    def due(self, step: int) -> bool:
        """Whether a checkpoint at ``step`` makes the file take the path."""
        return not self.done and step >= self.at

    def checkpoint_written(self, step: int) -> None:
        """A checkpoint at ``step`` was written and flushed: the file takes the path if it is due."""
        if self.due(step):
            durable_replace(self.where, self.path, durable=self.durable)
            self.where, self.done = self.path, True

    def abandon(self) -> None:
        """The writer closed without a due checkpoint: its file goes, the path keeps what it had."""
        if not self.done:
            try:
                os.unlink(self.where)
            except FileNotFoundError:
                pass
