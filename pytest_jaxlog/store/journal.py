"""Commits of an HDF5 file: a rollback journal under HDF5's own writes, so that a kill or a power
loss at any instant leaves the file as of its last commit, and a reader never sees a half-made one.

Why: HDF5 without SWMR updates its metadata in place, in no safe order. A process killed (or a
machine losing power) halfway through a flush leaves a file whose superblock, object headers and
chunk index disagree: it does not open, or a reader polling it meanwhile reads a mix. SWMR orders
the writes but forbids new objects while writing (checkpoints and post-mortem states are new
groups) and needs its own readers after a crash. So the writer hands HDF5 a file object (h5py's
``fileobj`` driver), ``CommittedFile``, which:

- writes bytes past the committed end (new chunks, new metadata blocks) straight to the file: the
  committed state references none of them;
- keeps writes inside the committed end (metadata rewritten in place, a partly filled chunk
  rewritten) in memory, in pages, served back to HDF5's reads;
- commits when HDF5 flushes (the driver's ``flush`` is the last call of ``H5Fflush`` and of a
  close, when the file is whole): the committed bytes of those pages go to the journal
  ``.<name>.jaxlog-journal`` beside the file (synced), then the pages to the file (synced), then
  the journal is marked clean (synced).

A kill or power loss before the journal is whole leaves the committed bytes untouched; after it,
the journal holds them. The next writer of the path rolls the file back (``recover``, under the
path's lock); a reader reads the file through the journal (``open_committed``) without changing
anything. The journal names the file's inode, so it follows renames and hard links and never
applies to another file. A reader that raced a commit sees the journal's generation change and
reads again (``generation``). SQLite's rollback journal works the same way.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import stat
import struct
import time
import weakref
import zlib
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import WriterError
from .space import NO_SPACE, NoSpace

try:
    import fcntl
except ImportError:  # Windows: no flock; readers then rely on the generation check alone
    fcntl = None  # type: ignore[assignment]

PAGE = 4096  # bytes per page kept in memory for a write inside the committed end
JOURNAL_SUFFIX = ".jaxlog-journal"
_MAGIC = b"JAXLOGJ1"
_VERSION = 1
_HOT, _CLEAN = 1, 0
# magic, version, state, generation, st_dev, st_ino, committed size, entries, payload bytes, crc32
_HEADER = struct.Struct("<8sIIQQQQIQI")
_ENTRY = struct.Struct("<QI")  # offset, length (then the committed bytes)
_MAX_PAYLOAD = 1 << 34  # a header declaring more is not a journal of ours: never read
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
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
    """The journal of the trajectory written at ``target`` (one per path, like its lock)."""
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


class Header(NamedTuple):
    state: int
    generation: int
    dev: int
    ino: int
    committed: int  # the file's size at the commit the journal restores
    entries: int
    payload: int  # bytes of entries after the header


def _header_bytes(h: Header, payload: bytes) -> bytes:
    raw = _HEADER.pack(_MAGIC, _VERSION, h.state, h.generation, h.dev, h.ino, h.committed, h.entries, h.payload, 0)
    crc = zlib.crc32(payload, zlib.crc32(raw[:-4]))
    return raw[:-4] + struct.pack("<I", crc)


def _parse_header(raw: bytes) -> Header | None:
    if len(raw) < _HEADER.size:
        return None
    magic, version, state, gen, dev, ino, committed, entries, payload, _ = _HEADER.unpack_from(raw)
    if magic != _MAGIC or version != _VERSION or state not in (_HOT, _CLEAN) or payload > _MAX_PAYLOAD:
        return None
    return Header(state, gen, dev, ino, committed, entries, payload)


class Entry(NamedTuple):
    offset: int
    data: bytes  # the committed bytes at ``offset``


class JournalState(NamedTuple):
    """A journal read whole and checked: ``hot`` means the file may hold a commit half applied,
    and ``entries`` (with ``committed``, the size) restore its last commit."""

    header: Header
    entries: tuple[Entry, ...]

    @property
    def hot(self) -> bool:
        return self.header.state == _HOT

    def names(self, st: os.stat_result) -> bool:
        return (self.header.dev, self.header.ino) == (st.st_dev, st.st_ino)


def _open_journal_read(path: Path) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except OSError:
        return None  # none (the usual case), a planted link, or unreadable: not a journal
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _read_journal(target: Path, disk: Disk, *, whole: bool) -> tuple[Header, bytes, bytes] | None:
    """The journal's header (``whole``: with its payload, and the header read again after it),
    or None where there is none of ours."""
    fd = _open_journal_read(journal_path(target))
    if fd is None:
        return None
    try:
        raw = disk.pread(fd, _HEADER.size, 0)
        header = _parse_header(raw)
        if header is None or not whole:
            return None if header is None else (header, b"", raw)
        payload = disk.pread(fd, header.payload, _HEADER.size) if header.payload else b""
        return header, payload, disk.pread(fd, _HEADER.size, 0)  # unchanged while the payload was read
    except OSError:
        return None
    finally:
        os.close(fd)


def read_state(target: Path, disk: Disk | None = None) -> JournalState | None:
    """The journal of ``target`` when it is whole and checks out; None otherwise (absent, torn by a
    kill while it was written, or not one of ours): then the file's committed bytes were never
    touched by a commit in progress."""
    read = _read_journal(target, _disk(disk), whole=True)
    if read is None:
        return None
    header, payload, raw = read
    if len(payload) != header.payload or _header_bytes(header, payload) != raw[:_HEADER.size]:
        return None
    entries, at = [], 0
    for _ in range(header.entries):
        if at + _ENTRY.size > len(payload):
            return None
        offset, n = _ENTRY.unpack_from(payload, at)
        at += _ENTRY.size
        if at + n > len(payload) or offset + n > header.committed:
            return None
        entries.append(Entry(offset, bytes(payload[at:at + n])))
        at += n
    return JournalState(header, tuple(entries))


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
    fd = _open_journal_read(journal_path(target))
    if fd is None:
        yield
        return
    try:
        _flock(fd, fcntl.LOCK_SH if fcntl is not None else 0, _HOLD_S)
        yield
    finally:
        os.close(fd)  # and the lock with it


def generation(target: Path, disk: Disk | None = None) -> int | None:
    """What a reader compares before and after a read: it changes whenever a commit starts."""
    read = _read_journal(target, _disk(disk), whole=False)
    return None if read is None else read[0].generation


class Journal:
    """The writer's journal file: created at its first commit that changes committed bytes, kept
    (its blocks too, so a full disk still takes the next commit's) until the writer closes."""

    def __init__(self, target: Path, file_fd: int, *, durable: bool, disk: Disk | None = None):
        self.path = journal_path(target)
        self.file_fd = file_fd
        self.durable = durable
        self.disk = _disk(disk)
        self.fd: int | None = None
        self.generation = time.time_ns()  # above any earlier writer's: a reader sees a change
        self.allocated = 0

    def _open(self) -> int:
        for _ in range(8):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o644)
            except OSError as exc:
                if exc.errno == errno.ELOOP:  # a link planted at the journal's name: the name goes, never its target
                    os.unlink(self.path)
                    continue
                raise
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                self.disk.ftruncate(fd, 0)
                if self.durable:
                    sync_directory(self.path, self.disk)
                return fd
            os.close(fd)
            if not stat.S_ISREG(st.st_mode):
                raise WriterError(f"{self.path} is not a regular file; remove it")
            os.unlink(self.path)  # a hard link to some other file: never written through
        raise WriterError(f"{self.path} keeps being replaced")

    def hot(self, committed: int, entries: list[Entry]) -> None:
        """The committed bytes the next writes replace, whole and synced before any is replaced."""
        if self.fd is None:
            self.fd = self._open()
        parts = []
        for e in entries:
            parts.append(_ENTRY.pack(e.offset, len(e.data)))
            parts.append(e.data)
        payload = b"".join(parts)
        st = os.fstat(self.file_fd)
        if fcntl is not None:
            _flock(self.fd, fcntl.LOCK_EX, _HOLD_S)  # readers of the previous commit finish first
        self.generation += 1
        header = Header(_HOT, self.generation, st.st_dev, st.st_ino, committed, len(entries), len(payload))
        need = _HEADER.size + len(payload)
        if need > self.allocated and hasattr(os, "posix_fallocate"):
            try:  # blocks claimed for this and later commits (a full disk fails here, before any write)
                os.posix_fallocate(self.fd, 0, max(need, 2 * self.allocated, 64 << 10))
                self.allocated = max(need, 2 * self.allocated, 64 << 10)
            except OSError as exc:
                if exc.errno in NO_SPACE:
                    raise NoSpace(f"no room for the journal of a commit of {self.path.name.removeprefix('.')[:-len(JOURNAL_SUFFIX)]}"
                                  f" ({need} bytes, beside it): {os.strerror(exc.errno)}; the file keeps its last "
                                  f"commit") from None
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)):
                    raise
        self.disk.pwrite(self.fd, payload, _HEADER.size)  # the payload first: a whole header means a whole journal
        self.disk.pwrite(self.fd, _header_bytes(header, payload), 0)
        if self.durable:
            self.disk.fsync(self.fd)

    def clean(self) -> None:
        """The commit is applied and synced: the journal restores nothing any more."""
        header = Header(_CLEAN, self.generation, 0, 0, 0, 0, 0)
        self.disk.pwrite(self.fd, _header_bytes(header, b""), 0)
        if self.durable:
            self.disk.fsync(self.fd)

    def unlock(self) -> None:
        """Readers may read again (after a commit, or a commit that failed: they then read the
        file through the hot journal)."""
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
            self.disk.unlink(self.path)
        except OSError:
            pass  # gone already, or cannot go: a clean journal left behind restores nothing either


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
        self.pages: dict[int, bytearray] = {}
        self.originals: dict[int, bytes] = {}  # the committed bytes of each page (what the journal keeps)
        self.pos = 0
        self.journal = Journal(target, fd, durable=durable, disk=disk)
        self.discarding = False
        self.changed = False  # written or truncated since the last commit (else a commit has nothing to do)
        self.directory_unsynced = False  # renamed to its path, the directory not synced since
        self.error: BaseException | None = None  # what a commit raised (HDF5 reports only that it failed)

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
        if size >= self.committed:
            self.disk.ftruncate(self.fd, size)  # HDF5's end of allocation: cuts a reserved tail, as its own driver does
        else:  # committed bytes are cut only at the commit; until then they read as zeros
            self.disk.ftruncate(self.fd, self.committed)
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
        if end > self.committed:  # new bytes: straight to the file
            at = max(offset, self.committed)
            self.disk.pwrite(self.fd, data[at - offset:], at)
        stop = min(end, self.committed)
        if offset < stop:  # committed bytes: into pages until the commit
            lo = offset // PAGE * PAGE
            hi = min(((stop - 1) // PAGE + 1) * PAGE, self.committed)
            have = self.disk.pread(self.fd, hi - lo, lo)  # one call for the whole span
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

    def _read(self, offset: int, n: int) -> bytes:
        out = bytearray(n)
        have = self.disk.pread(self.fd, n, offset) if n else b""
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
    def commit(self) -> None:
        """Make the file as HDF5 has it now the committed state (see the module's docstring). A
        file not in place yet is only synced before it takes its path (``sync``)."""
        if self.discarding or not self.changed:
            return
        entries = []
        for p in sorted(self.pages):
            start = p * PAGE
            stop = min(start + PAGE, self.committed)
            old = self.originals[p]
            if old == self.pages[p][:stop - start]:  # rewritten with the same bytes (the committed rows
                del self.pages[p]                     # of a partly filled chunk): nothing to replace
                continue
            entries.append(Entry(start, old))
        if self.size < self.committed:
            entries.append(Entry(self.size, self.disk.pread(self.fd, self.committed - self.size, self.size)))
        try:
            if entries:
                fresh = self.journal.fd is None
                self.journal.hot(self.committed, entries)
                if fresh and self.durable:  # the journal's new name synced with the directory: the rename too
                    self.directory_unsynced = False
            for p in sorted(self.pages):
                start = p * PAGE
                self.disk.pwrite(self.fd, memoryview(self.pages[p])[:min(PAGE, self.committed - start)], start)
            if self.size < self.committed:
                self.disk.ftruncate(self.fd, self.size)
            if self.durable and self.in_place:
                self.disk.fsync(self.fd)
                if self.directory_unsynced:
                    sync_directory(self.target, self.disk)
                    self.directory_unsynced = False
            if entries:
                self.journal.clean()
        finally:
            if entries:
                self.journal.unlock()
        self.committed = self.cut = self.size if self.in_place else 0
        self.pages.clear()
        self.originals.clear()
        self.changed = False

    def sync(self) -> None:
        """The bytes written so far on the disk (before the file takes its path: a power loss
        after the rename then finds it whole)."""
        if self.durable:
            self.disk.fsync(self.fd)

    def now_in_place(self, *, directory_synced: bool) -> None:
        """The file was just committed and renamed to its path: from now on commits are journaled
        (and the first syncs the directory, unless the rename did: the rename is then durable
        before the first frame is acknowledged, for one sync less per file)."""
        self.in_place = True
        self.committed = self.cut = self.size
        self.directory_unsynced = not directory_synced

    def discard(self) -> None:
        """Write nothing more: the file keeps its last commit (a write failed; HDF5 may retry its
        dirty metadata on close, which must neither fail nor reach the file)."""
        self.discarding = True
        self.pages.clear()
        self.originals.clear()

    def close(self) -> None:
        """After HDF5 closed the file (its last flush committed everything)."""
        self.journal.remove()


def recover(target: Path, disk: Disk | None = None) -> bool:
    """Roll back a commit a killed writer left half applied (its journal is hot and names the
    file at ``target``), then remove the journal. Only under the path's lock: no live writer.
    Returns whether the file was rolled back."""
    disk = _disk(disk)
    state = read_state(target, disk)
    rolled = False
    if state is not None and state.hot:
        try:
            fd = os.open(target, os.O_RDWR | _NOFOLLOW)
        except OSError:
            fd = None
        if fd is not None:
            try:
                if state.names(os.fstat(fd)):
                    for e in state.entries:
                        disk.pwrite(fd, e.data, e.offset)
                    disk.ftruncate(fd, state.header.committed)
                    disk.fsync(fd)
                    rolled = True
            finally:
                os.close(fd)
    jpath = journal_path(target)
    if os.path.lexists(jpath):
        try:
            disk.unlink(jpath)
        except OSError:
            pass
    return rolled


class CommittedView(_FileObject):
    """A read-only file object: the file as of the commit a hot journal restores, read through it
    (the file is not changed: a reader never writes). ``fd`` stays the caller's to close."""

    def __init__(self, fd: int, state: JournalState, disk: Disk | None = None):
        self.fd = fd
        self.disk = _disk(disk)
        self.size = state.header.committed
        self.entries = sorted(state.entries)
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
        for e in self.entries:
            lo, hi = max(offset, e.offset), min(end, e.offset + len(e.data))
            if lo < hi:
                out[lo - offset:hi - offset] = e.data[lo - e.offset:hi - e.offset]
        return bytes(out)
