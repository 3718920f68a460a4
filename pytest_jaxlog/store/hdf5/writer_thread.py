"""The writer thread of ``HDF5Writer``: it owns the h5py file, its groups and datasets, and its
commits; the caller side (``store.hdf5.writer``) only validates, hands over and waits.

Layout::

    /h5md                       version=[1, 1]; author/ (name); creator/ (name, version)
    /observables/<path>/step    int64 [n]            (one H5MD time-dependent element per leaf)
    /observables/<path>/time    float64 [n]          (only when the run has dt)
    /observables/<path>/value   [n, *shape]          (ml_dtypes stored as uint views + jaxlog_dtype)
    /particles/<group>/<name>   hard links to observables (optional ``particles=`` mapping)
    /jaxlog                     attrs, JSON in fixed-length strings: format_version, schema,
                                provenance, meta, violation (under json_crc32), status,
                                steps_done, writer_error (fixed sizes, rewritten in place)
    /jaxlog/attachments/<name>/<step>/<path>   snapshots (post-mortem states)

(every name in it is spelt once, in ``store.hdf5.layout``). Why this file format (superblock v2,
``libver="v108"``, no SWMR): a plain HDF5 file any reader opens (SWMR files need ``h5clear`` or
``swmr=True`` readers after a crash, and take no new objects while written). Why HDF5 writes
through our file object (``store.hdf5.journal``): each flush is a commit, so a kill or a power
loss at any instant leaves the file as of its last flush, never half of one. Data chunks carry
Fletcher-32 checksums, so a flipped bit is a read error, not a wrong value.

Why the file is made beside its path and renamed into place: until the layout is complete and
flushed, the path keeps its previous trajectory (or nothing), so a kill, a full disk or a second
writer never leaves a half-made or truncated file there. Why space is reserved before each write
(``space``): a write that fails halfway through an HDF5 flush leaves a file that does not open and
an interpreter that crashes; running out of room is reported before anything is written, and the
file is finished with status ``failed``.
"""

from __future__ import annotations

import dataclasses
import getpass
import os
import re
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import h5py
import numpy as np

from ...errors import JaxlogError, WriterError
from ...record.frames import FORMAT_VERSION, Frames, Schema
from ..dtypes import encode, storage_dtype
from ..handover import ByteQueue, CommitLedger, Item
from .guards import GuardedDisk, PathLock, process_alive
from .journal import (
    CommittedFile,
    NoSpace,
    PendingSwap,
    SpaceReserve,
    durable_replace,
    opened,
    roll_back,
    superblock_end,
)
from .layout import (
    ATTACHMENTS,
    BOUNDARY_ATTR,
    BOX,
    CHECKPOINT,
    CRC_ATTR,
    CRC_COVERS,
    CREATOR_NAME,
    DIMENSION_ATTR,
    DTYPE_ATTR,
    FAILED,
    FIXED_ATTRS,
    FORMAT_VERSION_ATTR,
    H5MD,
    H5MD_AUTHOR,
    H5MD_CREATOR,
    H5MD_VERSION,
    JAXLOG,
    KEY_IMPL_ATTR,
    LIBVER,
    META_ATTR,
    NAME_ATTR,
    OBSERVABLES,
    PARTICLES,
    POSITION,
    PROVENANCE_ATTR,
    RUNNING,
    SCHEMA_ATTR,
    STATUS_ATTR,
    STEP,
    STEPS_DONE_ATTR,
    SUMMARY_ATTR,
    TIME,
    VALUE,
    VERSION_ATTR,
    VIOLATION_ATTR,
    WRITER_ERROR_ATTR,
    attr_text,
    json_crc32,
    json_text,
)

TMP_SUFFIX = ".jaxlog-tmp"
_TMP_MIDDLE = re.compile(r"\d+-[0-9a-f]{8}")
_CHUNK_BYTES = 1 << 19  # largest chunk of a run of known length (fits the 1 MiB chunk cache)
FRAME_CHUNK_BYTES = 1 << 20  # a frame larger than this is cut into chunks of at most this (see _frame_chunk)
_OPEN_CHUNK_BYTES = 1 << 16  # unknown run length: chunks of ~_OPEN_CHUNK_FRAMES frames within these bounds,
_OPEN_CHUNK_MIN = 1 << 12  # so each dataset's last, partly filled chunk wastes little
_OPEN_CHUNK_FRAMES = 64
# Upper bounds of what HDF5 adds to a file, for the space reserved before a write (measured
# maxima are about half of these: chunk index blocks, object headers, aggregator blocks):
_INDEX_BYTES = 16 << 10  # per dataset given new chunks since the last flush
_CHUNK_OVERHEAD = 64  # per chunk allocated
_SLACK = 64 << 10  # per file, on top of everything
_LAYOUT_BYTES = 12 << 10  # per leaf at creation (group, datasets, object headers)


def _fixed_json(name: str, value: Any) -> np.ndarray:
    """``value`` as JSON in the fixed-size string attribute ``name`` (long text is shortened)."""
    size = FIXED_ATTRS[name]
    text = json_text(value)
    if len(text.encode()) > size:
        s = str(value)
        while len(text.encode()) > size:
            s = s[: max(0, len(s) - max(16, len(text.encode()) - size))]
            text = json_text(s + " ...")
    return np.array(text.encode(), dtype=f"S{size}")


class _Column:
    """Appends rows to one resizable dataset through the low-level h5py API, caching the memory
    type and dataspaces: the high-level ``resize`` + ``__setitem__`` pair re-derives them per call
    and costs ~5x more, which dominates the small batches a fast kernel produces.

    Also bounds the file space an append can take (``growth``), from the chunk shape."""

    __slots__ = ("dsid", "mtype", "spaces", "rows", "chunk_alloc", "compressed", "gen")

    def __init__(self, dsid: Any, shape: "_ColumnShape", compressed: bool):
        self.dsid = dsid
        self.mtype = None
        self.spaces: dict[tuple, Any] = {}
        chunks = shape.chunks
        slab = 1  # chunks per row of chunks (frames larger than one chunk)
        for n, c in zip(shape.frame, chunks[1:]):
            slab *= max(1, -(-max(n, 1) // c))
        nbytes = int(np.prod(chunks, dtype=np.int64)) * shape.itemsize
        if compressed:  # deflate/lzf may expand incompressible data a little
            nbytes += nbytes // 16 + 1024
        self.rows = int(chunks[0])
        self.chunk_alloc = slab * (nbytes + _CHUNK_OVERHEAD)
        self.compressed = compressed
        self.gen = -1  # the flush generation this column last grew in

    def growth(self, old: int, n: int, gen: int) -> int:
        """Bytes of file an append of ``n`` rows after ``old`` can allocate before the next flush."""
        r = self.rows
        new = -(-(old + n) // r) - -(-old // r)
        extra = 0
        if self.gen != gen:  # first growth since the flush: the chunk index may grow too
            self.gen = gen
            extra = _INDEX_BYTES
            if old % r:  # the partly filled chunk is written (allocated) again at the flush
                new += 1
        elif self.compressed and old % r:  # a compressed partial chunk may move at each eviction
            new += 1
        return new * self.chunk_alloc + extra

    def append(self, old: int, arr: np.ndarray) -> None:
        n = arr.shape[0]
        dsid = self.dsid
        dsid.set_extent((old + n, *arr.shape[1:]))
        if arr.size == 0:
            return
        if self.mtype is None:
            self.mtype = h5py.h5t.py_create(arr.dtype)
        mspace = self.spaces.get(arr.shape)
        if mspace is None:
            mspace = self.spaces[arr.shape] = h5py.h5s.create_simple(arr.shape)
        fspace = dsid.get_space()
        fspace.select_hyperslab((old,) + (0,) * (arr.ndim - 1), arr.shape)
        dsid.write(mspace, fspace, arr, mtype=self.mtype)


class _ColumnShape(NamedTuple):
    """What a column needs to know of its dataset (asked of HDF5 once per layout)."""

    chunks: tuple
    frame: tuple  # the shape of one row
    itemsize: int

    @classmethod
    def of(cls, ds: h5py.Dataset) -> "_ColumnShape":
        return cls(tuple(ds.chunks), tuple(ds.shape[1:]), ds.dtype.itemsize)


class _Template(NamedTuple):
    """A layout's file as made, flushed, before the run's own attributes (provenance, meta and
    their checksum): the bytes a file of the same layout starts from, and its columns by HDF5
    name. Making the layout (groups, datasets, attributes, one HDF5 call each) is most of a
    short run's file; copying it and opening its columns costs a fraction of that."""

    data: bytes
    columns: dict  # HDF5 name -> _ColumnShape


_TEMPLATES: dict[str, _Template] = {}  # per process, by layout key; the oldest goes beyond _TEMPLATE_KEEP
_TEMPLATES_LOCK = threading.Lock()  # writers may be opened from several threads
_TEMPLATE_KEEP = 16
_TEMPLATE_MAX_BYTES = 1 << 20  # a layout with a larger file (thousands of records) is made each time


class _Group(NamedTuple):
    """Leaves of one view with one schedule: they share their step (and time) datasets."""

    paths: list
    step: _Column
    time: _Column | None


def _frame_chunk(shape: tuple, itemsize: int) -> tuple[int, ...]:
    """The chunk of one frame larger than ``FRAME_CHUNK_BYTES``: its leading axes cut so a chunk
    holds at most that (the trailing axes whole where they fit). Why: HDF5 writes a checksummed
    chunk through two buffers of its size (the filter's input and output), so a chunk of a whole
    128 MB frame held 256 MB more while it was written."""
    limit = FRAME_CHUNK_BYTES
    dims = [max(1, int(s)) for s in shape]
    out = list(dims)
    for i in range(len(dims)):
        rest = int(np.prod(dims[i + 1:], dtype=np.int64)) * itemsize
        if rest <= limit:
            out[i] = max(1, min(dims[i], limit // max(1, rest)))
            break
        out[i] = 1
    return tuple(out)


def _chunk_rows(frame_bytes: int, frames: int | None = None) -> int:
    """Frames per chunk. HDF5 allocates whole chunks, so chunk size is file size: a run of known
    length (``frames``) gets equal chunks of at most ``_CHUNK_BYTES`` that tile it (a short run: one
    chunk, exactly its data; a long one: big chunks, fast appends, < 1 frame unused per chunk).
    Unknown length: ~64 frames a chunk, 4 to 64 KiB (scalars and steps: 4 KiB), so the last, partly
    filled chunk of each dataset wastes little."""
    frame_bytes = max(1, frame_bytes)
    if frames:
        per_chunk = max(1, _CHUNK_BYTES // frame_bytes)
        n_chunks = -(-frames // per_chunk)
        return int(-(-frames // n_chunks))
    target = min(_OPEN_CHUNK_BYTES, max(_OPEN_CHUNK_MIN, _OPEN_CHUNK_FRAMES * frame_bytes))
    return int(max(1, target // frame_bytes))


def _frames_per_leaf(schema: Schema, meta: dict) -> dict[str, int]:
    """Most frames each leaf can get, from ``meta["run"]`` (``steps``, ``start_step``); empty when the
    length is unknown (``jl.Recorder``). An upper bound: steps ``start..start+steps`` inclusive."""
    run = (meta or {}).get("run") or {}
    steps, start = run.get("steps"), run.get("start_step") or 0
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0 or not isinstance(start, int):
        return {}
    return {leaf.path: leaf.schedule.count_between(start, start + steps) for leaf in schema.leaves}


def frames_bytes(frames: Frames) -> int:
    return sum(v.nbytes for v in frames.values.values()) + sum(s.nbytes for s in frames.steps.values())


def _write_all(fd: int, data: bytes) -> None:
    view, at = memoryview(data), 0
    while at < len(view):
        at += os.pwrite(fd, view[at:], at)


def close_discarding(f: h5py.File, cf: CommittedFile | None) -> None:
    """Close an h5py file whose writes have failed without writing any more to it.

    After a failed write HDF5 retries its dirty metadata on every flush and close, and h5py's
    clean-up after a failed close crashes the interpreter (at once or at exit). The file object
    under it drops every write from here on, so the close succeeds and the file keeps its last
    commit (``store.hdf5.journal``)."""
    if cf is not None:
        cf.discard()
    try:
        f.close()
    except Exception:  # noqa: BLE001  (writes are dropped; the error it reports is the one we have)
        pass


def remove_stale_temps(path: Path) -> None:
    """Temporary files of this path left by killed writers (the caller holds the path's lock, so no
    live writer owns one)."""
    prefix = f".{path.name}."
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return
    for entry in entries:
        name = entry.name
        resumed = name[len(prefix) + len("resume-"):] if name.startswith(prefix + "resume-") else ""
        if name.startswith(prefix) and name.endswith(TMP_SUFFIX) and \
                _TMP_MIDDLE.fullmatch(name[len(prefix):-len(TMP_SUFFIX)]) or \
                resumed.isdigit() and int(resumed) != os.getpid() and not process_alive(int(resumed)):
            # (the second name of the file a resume killed mid-way was replacing: this run replaces it too)
            try:
                os.unlink(entry.path)
            except OSError:
                pass  # gone already, or not ours to remove: it only takes space


@dataclasses.dataclass(frozen=True)
class WriterSettings:
    """An ``HDF5Writer``'s options, as given (its keyword arguments, checked): what the caller side
    and the writer thread both read, and what a part file's writer is made alike with."""

    flush_every_s: float
    queue_bytes: int
    stall_timeout_s: float
    compression: str | None
    compression_opts: Any
    shuffle: bool
    checksums: bool
    expected_frames: dict[str, int] | None
    author: str | None
    particles: dict[str, dict[str, str]]
    overwrite: bool
    replace_at_checkpoint: int | None
    durable: bool


class Attachment(NamedTuple):
    """A snapshot handed to the writer thread: its arrays on the host, each with its PRNG impl
    (None for plain arrays)."""

    name: str
    step: int
    host: dict  # path -> (array, impl or None)


class Closing(NamedTuple):
    """How the caller closes the file: what ``finalize`` writes last."""

    status: str
    steps_done: int
    violation: dict | None
    summary: dict | None


class WriterSteps(NamedTuple):
    """What the thread does with the items it takes: ``HDF5Writer``'s own methods, which call this
    class's, so a subclass of the writer wraps a step of its thread (the tests inject faults so)."""

    append: Callable[[Frames], None]
    attach: Callable[[str, int, dict], None]
    finalize: Callable[[Closing], None]


class WriterLink:
    """What the caller side and the writer thread share: the hand-over queue, the ledger of
    hand-overs against commits, the guarded disk, the path's lock, the counters, and the way
    back: the thread's first error (raised on the caller's thread) and that the file is finished."""

    __slots__ = ("queue", "ledger", "disk", "lock", "stats", "error", "finalized", "_error_lock")

    def __init__(self, path: Path, settings: WriterSettings):
        self.queue = ByteQueue(settings.queue_bytes, settings.stall_timeout_s)
        self.ledger = CommitLedger(settings.flush_every_s)  # hand-overs against commits: the lag bound
        self.disk = GuardedDisk(path, settings.stall_timeout_s)  # a hung disk never holds h5py's lock (store.hdf5.guards)
        self.lock = PathLock(path)
        self.stats = {"batches": 0, "frames": 0, "bytes": 0, "flushes": 0, "max_queue_bytes": 0,
                      "blocked_s": 0.0, "reserve_misses": 0}
        self.error: BaseException | None = None
        self.finalized = False
        self._error_lock = threading.Lock()

    def set_error(self, err: BaseException) -> None:
        """Keep the first error only: a later one is a consequence of it."""
        with self._error_lock:
            if self.error is None:
                self.error = err


class Columns:
    """The file's datasets as the writer appends to them: each leaf's value column, and the step
    (and time) columns each group of leaves shares, with their rows so far."""

    __slots__ = ("dsets", "groups", "rows")

    def __init__(self) -> None:
        self.dsets: dict[str, _Column] = {}
        self.groups: dict[tuple, _Group] = {}
        self.rows: dict[tuple, int] = {}


class _Growth:
    """The file's size at the last flush, the growth bound reserved since, and the flush
    generation (a column's first growth in a generation may grow its chunk index too)."""

    __slots__ = ("flushed_end", "unflushed", "gen")

    def __init__(self) -> None:
        self.flushed_end = 0
        self.unflushed = 0
        self.gen = 0


class WriterThread:
    """The file side of an ``HDF5Writer``: makes the file (``create``, on the caller's thread,
    before the thread starts), then on the writer thread (``run``) appends frames and
    attachments, commits, and finishes the file (``finalize``; on the caller's thread instead when
    the writer thread died)."""

    def __init__(self, path: Path, settings: WriterSettings, link: WriterLink):
        self.path = path
        self.settings = settings
        self.link = link
        self.stats = link.stats
        self.schema: Schema | None = None
        self.timeline: Any = None  # a ``profiling.timeline.Timeline``: a slice per batch written
        self.columns = Columns()
        self._growth = _Growth()
        self._texts: dict[str, str] = {}  # the JSON attributes, as written at creation
        self._file: h5py.File | None = None
        self._jl: Any = None  # the /jaxlog group
        self._fixed: dict[str, Any] = {}  # name -> open attribute handle (see ``_open_fixed``)
        self._cf: CommittedFile | None = None  # the file object HDF5 writes through: commits (store.hdf5.journal)
        self._fd: int | None = None  # our own descriptor on the file: space reservation and trim
        self._space: SpaceReserve | None = None
        self._swap: PendingSwap | None = None  # the file under its temporary name until a checkpoint
        self._written_step = -1  # highest step written
        self._complete_step = -1  # last step of the last batch written whole

    @property
    def in_place(self) -> bool:
        """Whether the file is at its path (or at its temporary name for a swap): from then on,
        it is finished (``finalize``) however the run ends."""
        return self._file is not None

    def __repr__(self) -> str:
        return f"WriterThread({str(self.path)!r})"

    def create(self, schema: Schema, meta: dict) -> None:
        """The complete, flushed layout under a temporary name, then renamed to ``path``; the
        writer is open as soon as the file is in place (``in_place``), even if this raises. A layout made before in this process
        is copied from its template (see ``_Template``)."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}-{secrets.token_hex(4)}{TMP_SUFFIX}")
        self.schema = schema
        frames = _frames_per_leaf(schema, meta) if self.settings.expected_frames is None else self.settings.expected_frames
        self._texts = {FORMAT_VERSION_ATTR: json_text(FORMAT_VERSION), SCHEMA_ATTR: json_text(schema.to_json()),
                       PROVENANCE_ATTR: json_text(meta.get(PROVENANCE_ATTR)), META_ATTR: json_text(meta),
                       VIOLATION_ATTR: json_text(None)}
        key = self._layout_key(self._texts[SCHEMA_ATTR], frames)
        template = _TEMPLATES.get(key)
        own = (len(self._texts[PROVENANCE_ATTR]) + len(self._texts[META_ATTR])) * 2 + _LAYOUT_BYTES
        f = None
        try:
            self._fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                               | getattr(os, "O_CLOEXEC", 0), 0o666)
            self._space = SpaceReserve(self._fd, str(self.path))
            if template is None:
                self._cf = CommittedFile(self._fd, self.path, in_place=False, durable=self.settings.durable, disk=self.link.disk)
                f = opened(h5py.File(self._cf, "w", libver=LIBVER), self._cf)
                layout = len(self._texts[SCHEMA_ATTR]) * 2 + _LAYOUT_BYTES * (len(schema.leaves) + 4)
                self._space.ensure(f.id.get_filesize() + layout + own + _SLACK, "the file's layout")
                columns = self._build(f, schema, frames, None)
                self._commit(f)
                self._keep_template(key, columns)
            else:
                self._space.ensure(len(template.data) + own + _SLACK, "the file's layout")
                _write_all(self._fd, template.data)
                self._cf = CommittedFile(self._fd, self.path, in_place=False, durable=self.settings.durable, disk=self.link.disk)
                f = opened(h5py.File(self._cf, "r+", libver=LIBVER), self._cf)
                self._build(f, schema, frames, template)
            jl = self._jl
            for name in (PROVENANCE_ATTR, META_ATTR):
                jl.attrs[name] = attr_text(self._texts[name])
            jl.attrs[CRC_ATTR] = np.uint32(json_crc32(self._texts))
            self._commit(f)
            self._growth.flushed_end = f.id.get_filesize()
            if self._growth.flushed_end > self._space.reserved:
                self.stats["reserve_misses"] += 1
            self._space.forget()
            if self.settings.replace_at_checkpoint is None:
                self._cf.sync()
                # the directory synced here, not at the first commit: in the open, which overlaps the
                # first chunk's work, and not in the close of a short run, which waits for it
                durable_replace(tmp, self.path, durable=self.settings.durable)
                self._cf.now_in_place()
            else:
                self._swap = PendingSwap(tmp, self.path, self.settings.replace_at_checkpoint, durable=self.settings.durable)
            self._file = f
        except BaseException as exc:
            if self._file is None and f is not None and not os.path.lexists(tmp):  # renamed, then interrupted
                self._file = f
            if self._file is not None:  # in place already: the caller finishes it
                raise
            if f is not None:
                close_discarding(f, self._cf)
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            try:
                os.unlink(tmp)
            except OSError:
                pass  # never created
            if isinstance(exc, JaxlogError) or not isinstance(exc, Exception):
                raise
            raise WriterError(f"cannot create trajectory file {self.path}: {exc}") from exc

    def _author(self) -> str:
        if self.settings.author is not None:
            return self.settings.author
        try:
            return getpass.getuser()
        except Exception:  # noqa: BLE001  (no user name in this environment: an H5MD author is still needed)
            return "unknown"

    def _layout_key(self, schema_text: str, frames: dict) -> str:
        """Everything the file's layout depends on: equal keys, byte-equal layouts."""
        from ...version import __version__

        return json_text([schema_text, sorted(frames.items()), self.settings.compression, self.settings.compression_opts,
                      self.settings.shuffle, self.settings.checksums, self._author(), self.settings.particles, __version__,
                      h5py.version.hdf5_version, LIBVER])

    def _keep_template(self, key: str, columns: dict) -> None:
        """The bytes of the layout just made and flushed (through our descriptor: HDF5 wrote
        them), kept for the next file of this layout."""
        end = superblock_end(self._fd)
        if end is None or end.eof > _TEMPLATE_MAX_BYTES:
            return
        data = os.pread(self._fd, end.eof, 0)
        if len(data) != end.eof:
            return
        with _TEMPLATES_LOCK:
            if len(_TEMPLATES) >= _TEMPLATE_KEEP:
                _TEMPLATES.pop(next(iter(_TEMPLATES)))
            _TEMPLATES[key] = _Template(data, columns)

    def _build(self, f: h5py.File, schema: Schema, frames: dict, template: _Template | None) -> dict:
        """The layout without the run's own attributes: made in ``f``, or (``template``) found
        in ``f`` as copied from the template, and only its columns opened. Returns the shapes of
        the columns it made, by HDF5 name."""
        from ...version import __version__

        made = template is None
        if made:
            h5md = f.create_group(H5MD)
            h5md.attrs[VERSION_ATTR] = np.array(H5MD_VERSION, dtype=np.int32)
            f.create_group(H5MD_AUTHOR).attrs[NAME_ATTR] = self._author()
            creator = f.create_group(H5MD_CREATOR)
            creator.attrs[NAME_ATTR] = CREATOR_NAME
            creator.attrs[VERSION_ATTR] = __version__
            obs = f.create_group(OBSERVABLES)
        self.columns = Columns()
        columns: dict[str, _ColumnShape] = {}
        kw: dict[str, Any] = {}
        if self.settings.compression is not None:
            kw = {"compression": self.settings.compression, "compression_opts": self.settings.compression_opts}
        if self.settings.shuffle:
            kw["shuffle"] = True
        if self.settings.checksums:
            kw["fletcher32"] = True
        compressed = self.settings.compression is not None

        def column(g: Any, path: str, name: str, **create: Any) -> _Column:
            where = f"{OBSERVABLES}/{path}/{name}"
            if made:
                ds = g.create_dataset(name, **create, **kw)
                shape = columns[where] = _ColumnShape.of(ds)
                return _Column(ds.id, shape, compressed)
            return _Column(h5py.h5d.open(f.id, where.encode()), template.columns[where], compressed)

        for leaf in schema.leaves:
            g = obs.create_group(leaf.path) if made else None
            stored, dname = storage_dtype(leaf.dtype)
            frame_bytes = int(np.prod(leaf.shape, dtype=np.int64)) * stored.itemsize
            n = frames.get(leaf.path)
            rows = _chunk_rows(frame_bytes, n)
            # zero-size frame dims: HDF5 chunks must be >= 1, so such dims get an unlimited max
            maxshape = (None, *(s if s > 0 else None for s in leaf.shape))
            chunks = (rows, *(max(1, s) for s in leaf.shape)) if frame_bytes <= FRAME_CHUNK_BYTES \
                else (1, *_frame_chunk(leaf.shape, stored.itemsize))
            self.columns.dsets[leaf.path] = column(g, leaf.path, VALUE, shape=(0, *leaf.shape), maxshape=maxshape,
                                            dtype=stored, chunks=chunks)
            if made and dname is not None:
                g[VALUE].attrs[DTYPE_ATTR] = attr_text(dname)
            if made and leaf.key_impl is not None:
                g[VALUE].attrs[KEY_IMPL_ATTR] = attr_text(leaf.key_impl)
            # Leaves of one view with one schedule share their step/time datasets (H5MD allows
            # hard-linked step/time): fewer HDF5 calls per batch, which dominate small batches.
            key = (leaf.record, json_text(leaf.schedule.to_json()))
            group = self.columns.groups.get(key)
            if group is None:
                scalar = {"shape": (0,), "maxshape": (None,), "chunks": (_chunk_rows(8, n),)}
                step = column(g, leaf.path, STEP, dtype=np.int64, **scalar)
                tds = column(g, leaf.path, TIME, dtype=np.float64, **scalar) if schema.dt is not None else None
                group = self.columns.groups[key] = _Group([], step, tds)
                self.columns.rows[key] = 0
            elif made:
                g[STEP] = obs[f"{group.paths[0]}/{STEP}"]
                if group.time is not None:
                    g[TIME] = obs[f"{group.paths[0]}/{TIME}"]
            group.paths.append(leaf.path)
        if not made:
            self._jl = f[JAXLOG]
            self._open_fixed()
            return columns
        for particles, mapping in self.settings.particles.items():
            pg = f.require_group(PARTICLES).create_group(particles)
            for name, path in mapping.items():
                pg[name] = obs[path]  # hard link: same element, H5MD particle name
            pos = mapping.get(POSITION)
            dim = int(schema[pos].shape[-1]) if pos and schema[pos].shape else 0
            box = pg.create_group(BOX)
            box.attrs[DIMENSION_ATTR] = np.int32(dim)
            box.attrs[BOUNDARY_ATTR] = np.array([b"none"] * dim, dtype="S8") if dim else np.array([], dtype="S8")
        jl = f.create_group(JAXLOG)
        for attr in (FORMAT_VERSION_ATTR, SCHEMA_ATTR, VIOLATION_ATTR):
            jl.attrs[attr] = attr_text(self._texts[attr])
        jl.attrs[STATUS_ATTR] = _fixed_json(STATUS_ATTR, RUNNING)
        jl.attrs[STEPS_DONE_ATTR] = _fixed_json(STEPS_DONE_ATTR, 0)
        jl.attrs[WRITER_ERROR_ATTR] = _fixed_json(WRITER_ERROR_ATTR, None)
        jl.create_group(ATTACHMENTS)
        self._jl = jl
        self._open_fixed()
        return columns

    def _open_fixed(self) -> None:
        """Handles on the fixed-size attributes rewritten in place (steps done at every flush,
        the status at the end): a write through one is a few times cheaper than ``attrs.modify``,
        which looks the attribute up and checks its type first."""
        self._fixed = {name: h5py.h5a.open(self._jl.id, name.encode()) for name in FIXED_ATTRS}

    def _set_fixed(self, name: str, value: Any) -> None:
        handle = self._fixed.get(name)
        if handle is not None and handle.valid:
            handle.write(_fixed_json(name, value))
        else:  # the file was opened again to finish it (its writer thread died)
            self._jl.attrs.modify(name, _fixed_json(name, value))

    # -- writer thread ----------------------------------------------------------------------
    def run(self, steps: WriterSteps) -> None:
        """The writer thread: takes the items handed over, commits every ``flush_every_s`` while
        frames wait, and returns once the file is finished."""
        q = self.link.queue
        try:
            # here, its first act, and not in the caller's open: starting a thread waits until the
            # new one runs, which on a loaded machine (the run's chunk computing, pytest-xdist's
            # workers) costs the caller milliseconds; and this thread holds nothing of h5py yet
            self.link.disk.start()
        except BaseException as exc:  # noqa: BLE001  (kept and raised on the caller's thread)
            self._keep_error(exc, "the guard against a hung disk could not start its thread: ")
        next_flush = time.monotonic() + self.settings.flush_every_s
        dirty = False
        while True:
            item = q.get(max(0.0, next_flush - time.monotonic()) if dirty else None)
            try:
                if item is None:
                    pass
                elif item.kind == "frames":
                    self.link.ledger.took()
                    if self.link.error is None:
                        steps.append(item.payload)
                        dirty = True
                elif item.kind == "attach":
                    if self.link.error is None:
                        steps.attach(item.payload.name, item.payload.step, item.payload.host)
                        dirty = True
                elif item.kind == "flush":
                    try:
                        if self.link.error is None:
                            self._flush()
                            dirty = False
                            next_flush = time.monotonic() + self.settings.flush_every_s
                    finally:
                        item.payload.set()
                elif item.kind == "close":
                    steps.finalize(item.payload)
                    return
                if dirty and self.link.error is None and time.monotonic() >= next_flush:
                    self._flush()
                    dirty = False
                    next_flush = time.monotonic() + self.settings.flush_every_s
            except BaseException as exc:  # noqa: BLE001  (kept and raised on the caller's thread)
                self._keep_error(exc)
                dirty = False
                if item is not None and item.kind == "close":
                    self.link.finalized = True
                    return
            finally:
                if item is not None:  # its frames let go first: the room ``done`` makes is memory freed
                    done, item = Item(item.kind, None, item.nbytes), None
                    q.done(done)

    def _keep_error(self, exc: BaseException, doing: str = "") -> None:
        """The thread's error, as the caller's thread raises it: a ``WriterError`` as it is, any
        other one as a ``WriterError`` naming the file (and what failed) caused by it."""
        if not isinstance(exc, WriterError) or doing:
            err = WriterError(f"writing {self.path} failed: {doing}{type(exc).__name__}: {exc}")
            err.__cause__ = exc
            exc = err
        self.link.set_error(exc)

    def _file_end(self) -> int:
        return self._file.id.get_filesize()

    def _reserve(self, growth: int, what) -> int:
        """Claim the space ``growth`` more bytes of file need (``NoSpace`` before anything is written)."""
        need = self._growth.flushed_end + self._growth.unflushed + growth + _SLACK
        self._space.ensure(need, what)
        self._growth.unflushed += growth
        return need

    def _check_end(self, bound: int) -> None:
        if self._file_end() > bound:  # the growth bound was wrong: counted, for the tests to see
            self.stats["reserve_misses"] += 1

    def append(self, frames: Frames) -> None:
        t0 = time.perf_counter_ns()
        nbytes = nframes = 0
        dt = self.schema.dt if self.schema is not None else None
        plan = []
        growth = 0
        gen = self._growth.gen
        for key, group in self.columns.groups.items():
            first = next((p for p in group.paths if p in frames.steps and len(frames.steps[p])), None)
            if first is None:
                continue
            steps = frames.steps[first]
            n, old = len(steps), self.columns.rows[key]
            for path in group.paths:
                growth += self.columns.dsets[path].growth(old, n, gen)
            growth += group.step.growth(old, n, gen)
            if group.time is not None:
                growth += group.time.growth(old, n, gen)
            plan.append((key, group, steps, old))
        if not plan:
            return
        bound = self._reserve(growth, lambda: f"the frames of steps {min(int(s[0]) for _, _, s, _ in plan)}.."
                                              f"{frames.last_step} ({frames_bytes(frames)} bytes)")
        for key, group, steps, old in plan:
            n = len(steps)
            path = group.paths[0]
            try:
                for path in group.paths:
                    values = frames.values[path]
                    self.columns.dsets[path].append(old, encode(np.ascontiguousarray(values)))
                    nbytes += values.nbytes
                    nframes += n
                    self.link.queue.tick()
                if group.time is not None:
                    group.time.append(old, np.ascontiguousarray(frames.times_of(group.paths, steps, dt), dtype=np.float64))
                # step last: a frame counts (for the reader) once its step is there
                group.step.append(old, np.ascontiguousarray(steps, dtype=np.int64))
                self.columns.rows[key] = old + n
            except Exception as exc:
                raise WriterError(
                    f"writing record {path!r} (steps {int(steps[0])}..{int(steps[-1])}) to {self.path} failed: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            self._written_step = max(self._written_step, int(steps[-1]))
        self._check_end(bound)
        last = frames.last_step
        if last is not None:
            self._complete_step = max(self._complete_step, last)
        self.stats["batches"] += 1
        self.stats["frames"] += nframes
        self.stats["bytes"] += nbytes
        if self.timeline is not None:
            try:
                self.timeline.slice(
                    "writer", "write", t0, time.perf_counter_ns(), {"frames": nframes, "bytes": nbytes}
                )
            except Exception:  # noqa: BLE001  (the timeline is a diagnostic; it must not fail the writes)
                pass

    def write_attachment(self, name: str, step: int, host: dict) -> None:
        if name == CHECKPOINT:  # on disk only after every frame before it, and then at once, whole
            self._flush()
        growth = sum(arr.nbytes + arr.nbytes // 16 + 2 * _LAYOUT_BYTES for arr, _ in host.values()) + 2 * _LAYOUT_BYTES
        bound = self._reserve(growth, f"attachment {name!r} at step {step}")
        try:
            g = self._file[f"{JAXLOG}/{ATTACHMENTS}"].require_group(name).require_group(str(step))
            for path, (arr, impl) in host.items():
                if path in g:
                    del g[path]
                _, dname = storage_dtype(arr.dtype)
                arr = encode(np.asarray(arr, order="C"))  # keeps 0-d arrays 0-d
                kw = {"chunks": arr.shape, "fletcher32": True} if self.settings.checksums and arr.ndim and arr.size else {}
                ds = g.create_dataset(path, data=arr, **kw)
                if dname is not None:
                    ds.attrs[DTYPE_ATTR] = attr_text(dname)
                if impl is not None:
                    ds.attrs[KEY_IMPL_ATTR] = attr_text(impl)
        except Exception as exc:
            raise WriterError(f"writing attachment {name!r} at step {step} to {self.path} failed: {exc}") from exc
        self._check_end(bound)
        if name == CHECKPOINT:
            self._flush()
            if self._swap is not None and self._swap.due(step):
                self._cf.sync()  # its bytes on the disk before it takes the path
                self._swap.checkpoint_written(step)
                self._cf.now_in_place()

    def _flush(self) -> None:
        started = time.monotonic()
        f = self._file
        bound = self._growth.flushed_end + self._growth.unflushed + _SLACK
        self._set_fixed(STEPS_DONE_ATTR, max(self._written_step, 0))
        self._commit(f)
        self._space.forget()
        self._check_end(bound)
        self._growth.flushed_end = self._file_end()
        self._growth.unflushed = 0
        self._growth.gen += 1
        self.stats["flushes"] += 1
        self.link.ledger.commit_done(started, self._written_step)

    def _commit(self, f: h5py.File) -> None:
        """``f.flush()``, which commits (``store.hdf5.journal``); HDF5 reports a failed commit only as
        a failed flush, so the commit's own error is the one raised."""
        try:
            f.flush()
        except Exception as exc:
            cause = self._cf.error if self._cf is not None else None
            if cause is None:
                raise
            self._cf.error = None
            if isinstance(cause, WriterError):
                raise cause from exc
            raise WriterError(f"committing {self.path} failed: {type(cause).__name__}: {cause}") from cause

    def _reopen(self) -> h5py.File:
        """The file again, to finish it, after its writer thread died (the pages it had not
        committed are gone: the file holds its last commit)."""
        where = self.path if self._swap is None else self._swap.where
        if self._fd is None:
            self._fd = os.open(where, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        if self._cf is not None:
            self._cf.discard()
            self._cf.close()
        roll_back(self._fd)  # a commit that failed midway: the file as of the one before, to open
        self._cf = CommittedFile(self._fd, self.path, in_place=self._swap is None or self._swap.done,
                                 durable=self.settings.durable, disk=self.link.disk)
        return opened(h5py.File(self._cf, "r+"), self._cf)

    def finalize(self, closing: Closing) -> None:
        """Final attributes and close; always closes the file and frees the path, even after a
        writer error. A file whose last write failed is closed without writing more to it."""
        status, steps_done, violation, summary = closing
        f = self._file
        try:
            if f is None or not f.id.valid:
                f = self._file = self._reopen()
                self._jl = f[JAXLOG]
            jl = self._jl
            error = self.link.error
            if error is not None:
                status = FAILED
                # the caller handed over more than the broken writer wrote: say what the file holds
                steps_done = min(int(steps_done), max(self._complete_step, 0))
            if violation is not None:
                text = json_text(violation)
                try:
                    self._reserve(2 * len(text.encode()) + _LAYOUT_BYTES, "the violation")
                    jl.attrs[VIOLATION_ATTR] = attr_text(text)
                    if CRC_ATTR in jl.attrs:  # not in a file reopened from an older version
                        texts = {k: jl.attrs[k] for k in CRC_COVERS}
                        jl.attrs.modify(CRC_ATTR, np.uint32(json_crc32(texts)))
                except NoSpace as exc:
                    error = error or exc
            if summary is not None:
                text = json_text(summary)
                try:
                    self._reserve(2 * len(text.encode()) + _LAYOUT_BYTES, "the run's summary")
                    jl.attrs[SUMMARY_ATTR] = attr_text(text)
                except NoSpace as exc:
                    error = error or exc
            if error is not None:
                self._set_fixed(WRITER_ERROR_ATTR, str(error))
            self._set_fixed(STATUS_ATTR, status)
            self._set_fixed(STEPS_DONE_ATTR, int(steps_done))
            started = time.monotonic()
            self._commit(f)
            self.link.ledger.commit_done(started, self._written_step)
        except BaseException:
            if f is not None:
                close_discarding(f, self._cf)
            raise
        finally:
            self._fixed = {}  # their ids are closed with the file
            try:
                if f is not None and f.id.valid:
                    f.close()
            finally:
                self._release()
                self.link.finalized = True  # last: close() returns once the path is free again

    def _release(self) -> None:
        """After the file is closed: cut the reserved tail (``CommittedFile.close``), free the path."""
        fd, self._fd = self._fd, None
        if self._cf is not None:
            self._cf.close()
        self.link.disk.close()
        if fd is not None:
            os.close(fd)
        try:
            if self._swap is not None:
                self._swap.abandon()
        finally:
            self.link.lock.release()
