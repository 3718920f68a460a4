"""HDF5 trajectory writer: H5MD 1.1 layout, a background thread, bounded memory, crash-safe.

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

Why a thread and a queue bounded in bytes: the caller (the driver) only validates and enqueues,
so HDF5 I/O overlaps the next device chunk; when the disk is slower than the kernel the caller
blocks instead of buffering without limit, and a writer stuck on a hung disk makes the caller's
wait end with an error instead of a hang. Why this file format (superblock v2, ``libver="v108"``,
no SWMR): a plain HDF5 file any reader opens (SWMR files need ``h5clear`` or ``swmr=True``
readers after a crash, and take no new objects while written). Why HDF5 writes through our file
object (``store.hdf5.journal``): each flush is a commit, so a kill or a power loss at any instant
leaves the file as of its last flush, never half of one. Data chunks carry Fletcher-32 checksums,
so a flipped bit is a read error, not a wrong value.

Why the file is made beside its path and renamed into place: until the layout is complete and
flushed, the path keeps its previous trajectory (or nothing), so a kill, a full disk or a second
writer never leaves a half-made or truncated file there. A lock file beside the path
(``pathlock``) lets one writer at a time, across processes. Why space is reserved before each
write (``space``): a write that fails halfway through an HDF5 flush leaves a file that does not
open and an interpreter that crashes; running out of room is reported before anything is written,
and the file is finished with status ``failed``.

A writer-thread error is kept and raised on the caller's thread (next ``write`` or ``close``),
and ``close`` always finishes the file (status ``failed`` if the writer broke).
"""

from __future__ import annotations

import atexit
import getpass
import os
import re
import secrets
import threading
import time
import weakref
from pathlib import Path
from typing import Any, NamedTuple

import h5py
import numpy as np

from ...errors import JaxlogError, WriterError
from ...record.frames import FORMAT_VERSION, Frames, Schema
from ...record.values import is_integer
from ..dtypes import DTYPE_ATTR, KEY_IMPL_ATTR, check_frames, check_leaf_dtype, encode, storage_dtype, to_host
from ..handover import ByteQueue, CommitLedger, Item, Stalled
from ..protocol import STATUSES, Sink, copied_views, holds_device_views
from .guards import GuardedDisk, PathLock, default_stall_s, process_alive, stuck_note
from .journal import (
    CommittedFile,
    NoSpace,
    PendingSwap,
    SpaceReserve,
    durable_replace,
    opened,
    recover,
    roll_back,
    superblock_end,
)
from .parts import PartsWriter
from .layout import CRC_ATTR, CRC_COVERS, LIBVER, attr_text, json_crc32, json_text

QUEUE_BYTES = 128 << 20  # default byte budget of the hand-over queue
STALL_TIMEOUT_S = 60.0  # default: a writer thread that finishes nothing for this long is stuck
TMP_SUFFIX = ".jaxlog-tmp"
_TMP_MIDDLE = re.compile(r"\d+-[0-9a-f]{8}")
_CHUNK_BYTES = 1 << 19  # largest chunk of a run of known length (fits the 1 MiB chunk cache)
FRAME_CHUNK_BYTES = 1 << 20  # a frame larger than this is cut into chunks of at most this (see _frame_chunk)
_OPEN_CHUNK_BYTES = 1 << 16  # unknown run length: chunks of ~_OPEN_CHUNK_FRAMES frames within these bounds,
_OPEN_CHUNK_MIN = 1 << 12  # so each dataset's last, partly filled chunk wastes little
_OPEN_CHUNK_FRAMES = 64
_ITEM_BYTES = 256  # what a queued item costs besides its arrays (bounds a queue of tiny batches)
# Upper bounds of what HDF5 adds to a file, for the space reserved before a write (measured
# maxima are about half of these: chunk index blocks, object headers, aggregator blocks):
_INDEX_BYTES = 16 << 10  # per dataset given new chunks since the last flush
_CHUNK_OVERHEAD = 64  # per chunk allocated
_SLACK = 64 << 10  # per file, on top of everything
_LAYOUT_BYTES = 12 << 10  # per leaf at creation (group, datasets, object headers)
# /jaxlog attributes rewritten in place while the file is written: fixed-size strings never need
# new space in the file (a disk that is full still takes the final status)
_FIXED_ATTRS = {"status": 16, "steps_done": 24, "writer_error": 2048}
_LIVE: "weakref.WeakSet[HDF5Writer]" = weakref.WeakSet()
_STUCK: "set[HDF5Writer]" = set()  # writers whose thread stalled (kept: the thread may still hold h5py's lock)
_EMPTY_STEPS = np.zeros(0, dtype=np.int64)


def _same_file_key(path: Path) -> str:
    """The absolute, symlink-resolved path: two writers of one file compare equal."""
    try:
        return str(path.resolve())
    except OSError:
        return str(path.absolute())


def _fixed_json(name: str, value: Any) -> np.ndarray:
    """``value`` as JSON in the fixed-size string attribute ``name`` (long text is shortened)."""
    size = _FIXED_ATTRS[name]
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


def _frames_bytes(frames: Frames) -> int:
    return sum(v.nbytes for v in frames.values.values()) + sum(s.nbytes for s in frames.steps.values())


def _slices(frames: Frames, budget: int) -> list[Frames]:
    """``frames`` cut at step boundaries into pieces of at most ``budget`` bytes each (a single
    step larger than that is a piece of its own). Views, not copies."""
    present = [p for p in frames.values if len(frames.steps[p])]
    all_steps = np.unique(np.concatenate([frames.steps[p] for p in present]))
    per_step = np.zeros(len(all_steps), dtype=np.int64)
    for p in present:
        pos = np.searchsorted(all_steps, frames.steps[p])
        row = frames.values[p][0].nbytes + 8
        np.add.at(per_step, pos, row)
    pieces, lo, acc = [], 0, 0
    for i, b in enumerate(per_step.tolist()):
        if acc and acc + b > budget:
            pieces.append((lo, i))
            lo, acc = i, 0
        acc += b
    pieces.append((lo, len(all_steps)))
    out = []
    for a, b in pieces:
        first, last = all_steps[a], all_steps[b - 1]
        fr = Frames()
        for p in frames.values:
            steps = frames.steps[p]
            i, j = np.searchsorted(steps, first, "left"), np.searchsorted(steps, last, "right")
            fr.add(p, steps[i:j], frames.values[p][i:j])
        out.append(fr)
    return out


def _write_all(fd: int, data: bytes) -> None:
    view, at = memoryview(data), 0
    while at < len(view):
        at += os.pwrite(fd, view[at:], at)


def _close_discarding(f: h5py.File, cf: CommittedFile | None) -> None:
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


class HDF5Writer(Sink):
    """Sink writing an H5MD trajectory file from a background thread.

    ``flush_every_s``: how often data and ``steps_done`` reach the disk (what survives a kill).
    A frame handed over is committed within ``flush_every_s`` plus two commits' time: ``write``
    waits for the writer when it falls further behind (``store.handover``); ``committed_step`` says
    where the disk is.
    ``queue_bytes``: memory handed over to the writer thread and not yet written; ``write`` waits
    while it is full, a batch larger than this goes in slices (one step at least).
    ``stall_timeout_s``: a caller waiting on the writer thread (full queue, ``flush``, ``close``)
    gives up with ``WriterError`` once the thread has written nothing for this long (a hung disk).
    ``compression``: h5py filter for all datasets (``"gzip"``, ``"lzf"``, None; lossless, so values
    read back bit for bit); ``shuffle`` (default: on with compression) helps it on numbers.
    ``checksums``: Fletcher-32 per chunk, so corrupted data fails to read instead of reading wrong.
    ``expected_frames``: ``{leaf path: frames}`` when known up front (``Trajectory.save``); otherwise
    taken from the run length in ``meta["run"]``. It only sizes chunks (file size): more frames still fit.
    ``particles``: ``{group: {"position": "state/positions", ...}}`` adds H5MD particle links.
    ``overwrite``: replace an existing file at ``path`` (only once the new one is valid).
    ``replace_at_checkpoint``: a step; the new file takes ``path`` only once it holds a checkpoint
    at that step or later, and a writer closed before leaves the path as it was (``store.hdf5.journal``:
    how ``jl.resume`` rewrites a trajectory).
    ``durable``: sync each commit (every flush, checkpoint and the close) to the disk, so a power
    loss keeps the last one; without it a kill still does (``store.hdf5.journal``).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        flush_every_s: float = 1.0,
        queue_bytes: int = QUEUE_BYTES,
        stall_timeout_s: float | None = None,
        compression: str | None = None,
        compression_opts: Any = None,
        shuffle: bool | None = None,
        checksums: bool = True,
        expected_frames: dict[str, int] | None = None,
        author: str | None = None,
        particles: dict[str, dict[str, str]] | None = None,
        overwrite: bool = True,
        replace_at_checkpoint: int | None = None,
        durable: bool = True,
    ):
        if not is_integer(queue_bytes) or queue_bytes < 1:
            raise JaxlogError(f"HDF5Writer(queue_bytes={queue_bytes!r}): needs an integer number of bytes >= 1")
        if flush_every_s < 0:
            raise JaxlogError(f"HDF5Writer(flush_every_s={flush_every_s}): must be >= 0")
        if stall_timeout_s is None:  # JAXLOG_STALL_S, else STALL_TIMEOUT_S
            stall_timeout_s = default_stall_s(STALL_TIMEOUT_S)
        if not stall_timeout_s > 0:
            raise JaxlogError(f"HDF5Writer(stall_timeout_s={stall_timeout_s}): must be > 0")
        self.path = Path(path)
        self.flush_every_s = float(flush_every_s)
        self.queue_bytes = int(queue_bytes)
        self.stall_timeout_s = float(stall_timeout_s)
        self.compression = compression
        self.compression_opts = compression_opts
        self.shuffle = compression is not None if shuffle is None else bool(shuffle)
        self.checksums = bool(checksums)
        self.expected_frames = None if expected_frames is None else {str(k): int(v) for k, v in expected_frames.items()}
        self.author = author
        self.particles = particles or {}
        self.overwrite = overwrite
        self.replace_at_checkpoint = None if replace_at_checkpoint is None else int(replace_at_checkpoint)
        self.durable = bool(durable)
        self._cf: CommittedFile | None = None  # the file object HDF5 writes through: commits (store.hdf5.journal)
        self._swap: PendingSwap | None = None  # the file under its temporary name until a checkpoint
        self.schema: Schema | None = None
        self.stats = {"batches": 0, "frames": 0, "bytes": 0, "flushes": 0, "max_queue_bytes": 0,
                      "blocked_s": 0.0, "reserve_misses": 0}
        self._queue = ByteQueue(self.queue_bytes, self.stall_timeout_s)
        self._disk = GuardedDisk(self.path, self.stall_timeout_s)  # a hung disk never holds h5py's lock (store.hdf5.guards)
        self._ledger = CommitLedger(self.flush_every_s)  # hand-overs against commits: the lag bound
        self._thread: threading.Thread | None = None
        self._file: h5py.File | None = None
        self._fixed: dict[str, Any] = {}  # name -> open attribute handle (see ``_open_fixed``)
        self._fd: int | None = None  # our own descriptor on the file: space reservation and trim
        self._space: SpaceReserve | None = None
        self._lock = PathLock(self.path)
        self._error: BaseException | None = None
        self._error_raised = False
        self._state = "new"  # new -> open -> closing -> closed
        self._finalized = False
        self._stalled = False
        self._last_steps: dict[str, int] = {}
        self._max_step = -1  # highest step handed over (caller side)
        self._written_step = -1  # highest step written (writer side)
        self._complete_step = -1  # last step of the last batch written whole (writer side)
        self._timeline = None
        self._error_lock = threading.Lock()
        # writer side: file size at the last flush, growth bound since, flush generation
        self._flushed_end = 0
        self._unflushed = 0
        self._gen = 0
        self._groups: dict[tuple, _Group] = {}
        self._rows: dict[tuple, int] = {}

    # -- Sink protocol (caller thread) ----------------------------------------------------
    def open(self, schema: Schema, meta: dict[str, Any]) -> None:
        if self._state != "new":
            raise JaxlogError(f"HDF5Writer({self.path}): a writer is opened once; make a new one per run")
        for leaf in schema.leaves:
            check_leaf_dtype(leaf.path, leaf.dtype)
        if self.path.exists() and not self.overwrite:
            raise JaxlogError(f"{self.path} exists and HDF5Writer(overwrite=False)")
        if self.path.is_dir():
            raise JaxlogError(f"HDF5Writer({self.path}): the path is a directory; give a file path (e.g. "
                              f"{self.path / 'trajectory.h5'})")
        for group, mapping in self.particles.items():  # before the file exists: a bad mapping leaves none
            for name, path in mapping.items():
                if path not in schema:
                    raise JaxlogError(f"HDF5Writer({self.path}): particles[{group!r}][{name!r}]: record {path!r} "
                                      f"is not recorded; recorded: {', '.join(schema.paths) or '(none)'}")
        mine = _same_file_key(self.path)
        for other in list(_LIVE):
            if other is not self and other._state in ("open", "closing") and _same_file_key(other.path) == mine:
                raise JaxlogError(f"HDF5Writer({self.path}): another HDF5Writer in this process is still writing "
                                  f"that file (two writers of one path in a run, or one not closed); give each "
                                  f"writer its own path")
        self.schema = schema
        self.path.parent.mkdir(parents=True, exist_ok=True)
        meta = dict(meta or {})
        if "provenance" not in meta:
            from .layout import provenance

            meta["provenance"] = provenance()
        self._lock.acquire()  # WriterError naming the other writer; nothing touched yet
        try:
            if self.path.exists() and not self.overwrite:  # created meanwhile by another writer
                raise JaxlogError(f"{self.path} exists and HDF5Writer(overwrite=False)")
            recover(self.path)  # a commit a killed writer left half applied: rolled back first
            self._remove_stale_temps()
            self._disk.start()  # before any HDF5 call: never from inside one (store.hdf5.guards)
            self._create_beside(schema, meta)  # in place and "open" from here on
            self._thread = threading.Thread(target=self._run, name=f"jaxlog-hdf5:{self.path.name}", daemon=True)
            _LIVE.add(self)
            self._thread.start()
        except BaseException as exc:
            if self._state != "open":
                self._lock.release()
                raise
            # the file is in place (e.g. Ctrl-C or SIGTERM while the thread started): finish it
            # here, so it says how the run ended and the path is free, as a failed open must leave it
            try:
                self.close("stopped" if isinstance(exc, KeyboardInterrupt) else "failed", steps_done=0)
            except BaseException as also:  # noqa: BLE001  (the open's own error is the one to see)
                exc.add_note(f"[jaxlog] finishing {self.path} after the failed open also failed: {also}")
            raise

    def set_timeline(self, timeline: Any) -> None:
        """Record a slice per batch write on the ``writer`` track of a ``_perfetto.Timeline``."""
        self._timeline = timeline

    takes_processes = True

    def for_processes(self) -> Sink:
        """This process's part file, written by a writer with the same options, and in process 0
        the index at the path (``store.hdf5.parts``)."""
        return PartsWriter(self)

    def write(self, frames: Frames) -> None:
        self._raise_pending()
        if self._state != "open":
            raise WriterError(f"HDF5Writer({self.path}) is {self._state}, cannot write")
        assert self.schema is not None
        check_frames(self.schema, frames, self._last_steps)
        self._check_groups(frames)
        last = frames.last_step
        if last is None:
            return
        self._check_alive()
        self._keep_up()
        nbytes = _frames_bytes(frames)
        if nbytes + _ITEM_BYTES <= self.queue_bytes:
            self._hand_over(frames, nbytes + _ITEM_BYTES)
        else:
            for piece in _slices(frames, self.queue_bytes - _ITEM_BYTES):
                self._hand_over(piece, _frames_bytes(piece) + _ITEM_BYTES)
        self._max_step = max(self._max_step, last)

    def _check_groups(self, frames: Frames) -> None:
        """Leaves sharing step datasets must arrive together, with the same steps."""
        for group in self._groups.values():
            paths = group.paths
            if len(paths) == 1:
                continue
            ref = None
            for path in paths:
                steps = frames.steps.get(path)
                if steps is None:
                    steps = _EMPTY_STEPS
                if ref is None:
                    ref, ref_path = steps, path
                elif steps is not ref and not np.array_equal(steps, ref):
                    raise JaxlogError(
                        f"records {ref_path!r} and {path!r} (one view, one schedule) must be written together "
                        f"with the same steps; got {len(ref)} and {len(steps)} steps in one batch"
                    )

    def attach(self, name: str, step: int, tree: dict[str, np.ndarray], *, key_impls: dict[str, str] | None = None) -> None:
        """Store a snapshot; typed key arrays are stored as key data with their impl (``key_impls``
        names the impl of arrays that already are key data)."""
        self._raise_pending()
        if self._state != "open":
            raise WriterError(f"HDF5Writer({self.path}) is {self._state}, cannot attach {name!r}")
        host = {}
        for path, leaf in tree.items():
            arr, impl = to_host(leaf, path)
            host[path] = (arr, impl or (key_impls or {}).get(path))
        nbytes = sum(a.nbytes for a, _ in host.values()) + _ITEM_BYTES
        self._put(Item("attach", (str(name), int(step), host), nbytes))

    def flush(self) -> None:
        """Block until everything handed over so far is on disk (survives a kill)."""
        self._raise_pending()
        if self._state != "open":
            return
        done = threading.Event()
        self._put(Item("flush", done, 0))
        self._wait(done.is_set, "flushing")
        self._raise_pending()

    def close(self, status: str = "complete", *, steps_done: int | None = None, violation: dict | None = None,
              summary: dict | None = None) -> None:
        """Write every frame handed over, the final status (and the run's ``summary``: why it
        stopped, per-system steps), and close the file; raise a writer error not raised yet.

        Safe to call from the main thread at any time, a signal handler included (e.g. with
        ``status="stopped"`` on SIGTERM or Ctrl-C while ``write`` waits for room). A writer thread
        that writes nothing for ``stall_timeout_s`` makes it raise ``WriterError`` instead of
        waiting forever; the file then keeps status ``running`` and what was flushed before."""
        if status not in STATUSES:
            raise JaxlogError(f"close(status={status!r}): expected one of {', '.join(STATUSES)}")
        if self._state == "new":
            self._state = "closed"
            return
        if self._state == "closed":
            self._raise_pending()
            return
        if self._state == "open":
            self._state = "closing"
            if steps_done is None:
                steps_done = max(self._max_step, 0)
            self._close_args = (status, int(steps_done), violation, summary)
            thread = self._thread
            if thread is not None and thread.is_alive():
                self._queue.put(Item("close", self._close_args, 0), thread.is_alive, force=True)
        # "closing": a close interrupted (Ctrl-C) or stalled before; wait again
        if not self._stalled:
            self._wait(lambda: self._finalized, "closing")
        elif not self._finalized:
            self._raise_stalled("closing")
        if not self._finalized:  # the thread died unexpectedly: finish the file here
            try:
                self._finalize(*self._close_args)
            except Exception as exc:
                err = WriterError(f"finishing {self.path} failed: {exc}")
                err.__cause__ = exc
                self._set_error(err)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(1.0)  # finalized is its last act: it returns at once
        self._state = "closed"
        _LIVE.discard(self)
        self._raise_pending()

    @property
    def artifacts(self) -> dict[str, Path]:
        return {"trajectory": self.path}

    # -- caller-side helpers ----------------------------------------------------------------
    def _raise_pending(self) -> None:
        err = self._error
        if err is not None and not self._error_raised:
            self._error_raised = True
            raise err

    def _alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _check_alive(self) -> None:
        if not self._alive():
            err = WriterError(f"the writer thread of {self.path} died; frames after step {self._max_step} were not written")
            err.__cause__ = self._error
            self._set_error(err)
            self._raise_pending()
            raise err

    def _hand_over(self, frames: Frames, nbytes: int) -> None:
        """Queue a batch; one holding views of a device's buffers is copied (``store.protocol``) once
        the queue has room for it, so the copy waiting for room never adds to what the queue holds."""
        # (only the writer thread makes room; other batches wait for it in ``_put``, as they did)
        if holds_device_views(frames):  # found once per batch: copied below, after any wait for room
            if not self._stalled and not self._queue.room(nbytes):
                t0 = time.monotonic()
                self._wait(lambda: self._queue.room(nbytes) or not self._alive(), "writing")
                self.stats["blocked_s"] += time.monotonic() - t0
            frames = copied_views(frames)
        self._put(Item("frames", frames, nbytes))
        self._ledger.handed(frames.last_step if frames.last_step is not None else self._max_step)

    def _keep_up(self) -> None:
        """Backpressure in time (``store.handover``): before more frames go in, wait for the commit of
        those handed over longer ago than the bound, so the file never trails the run by more."""
        ledger = self._ledger
        while not self._stalled and (due := ledger.overdue()) is not None:
            t0 = time.monotonic()
            self._wait(lambda: ledger.committed >= due or self._error is not None or not self._alive(), "committing")
            ledger.waited(time.monotonic() - t0)
            self._raise_pending()
            self._check_alive()
        self.stats.update(ledger.stats())

    @property
    def committed_step(self) -> int | None:
        """The last step of the frames on disk (a kill keeps them); None before the first commit."""
        step = self._ledger.committed_step
        return step if step >= 0 else None

    def _put(self, item: Item) -> None:
        if self._stalled:
            self._raise_stalled("writing")
        try:
            waited = self._queue.put(item, self._alive, self._raise_pending)
        except Stalled as exc:
            self._raise_stalled("writing", exc.waited_s)
        if waited < 0:
            self._check_alive()
        elif waited:
            self.stats["blocked_s"] += waited
        self.stats["max_queue_bytes"] = self._queue.max_bytes

    def _wait(self, predicate, what: str) -> None:
        try:
            self._queue.wait_for(predicate, self._alive)
        except Stalled as exc:
            self._raise_stalled(what, exc.waited_s)

    def _raise_stalled(self, what: str, waited_s: float | None = None) -> None:
        """``waited_s`` None: the thread was found stalled before, it is not waited for again.
        A system call of the writer thread's in flight is given until its own timeout: its error
        names the call and the file (``store.hdf5.guards``), where this one can only say the thread is stuck."""
        until = self._disk.in_flight_until()
        if until is not None and waited_s is not None:
            while (left := until - time.monotonic()) > -1.0 and self._error is None and self._alive():
                time.sleep(min(0.05, max(left + 1.0, 0.0)))
            self._raise_pending()
        self._stalled = True
        waited = f"{waited_s:.0f} s" if waited_s is not None else f"over {self.stall_timeout_s:.0f} s"
        _LIVE.discard(self)  # the exit hook must not wait on it again
        _STUCK.add(self)
        pending = self._queue.bytes
        raise WriterError(
            f"{what} {self.path}: the writer thread has written nothing for {waited} (a hung disk or "
            f"file system?); {pending} bytes handed over (up to step {self._max_step}) are not on disk and the "
            f"file keeps status 'running' with the frames flushed before. The thread finishes the file if it "
            f"recovers; HDF5Writer(stall_timeout_s=...) sets how long to wait{stuck_note(self.path)}"
        )

    def _set_error(self, err: BaseException) -> None:
        with self._error_lock:
            if self._error is None:
                self._error = err

    # -- file creation (caller thread) ---------------------------------------------------------
    def _remove_stale_temps(self) -> None:
        """Temporary files of this path left by killed writers (we hold the path's lock, so no
        live writer owns one)."""
        prefix = f".{self.path.name}."
        try:
            entries = list(os.scandir(self.path.parent))
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

    def _create_beside(self, schema: Schema, meta: dict) -> None:
        """The complete, flushed layout under a temporary name, then renamed to ``path``; the
        writer is ``open`` as soon as the file is in place. A layout made before in this process
        is copied from its template (see ``_Template``)."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}-{secrets.token_hex(4)}{TMP_SUFFIX}")
        frames = _frames_per_leaf(schema, meta) if self.expected_frames is None else self.expected_frames
        self._texts = {"format_version": json_text(FORMAT_VERSION), "schema": json_text(schema.to_json()),
                       "provenance": json_text(meta.get("provenance")), "meta": json_text(meta), "violation": json_text(None)}
        key = self._layout_key(self._texts["schema"], frames)
        template = _TEMPLATES.get(key)
        own = (len(self._texts["provenance"]) + len(self._texts["meta"])) * 2 + _LAYOUT_BYTES
        f = None
        try:
            self._fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                               | getattr(os, "O_CLOEXEC", 0), 0o666)
            self._space = SpaceReserve(self._fd, str(self.path))
            if template is None:
                self._cf = CommittedFile(self._fd, self.path, in_place=False, durable=self.durable, disk=self._disk)
                f = opened(h5py.File(self._cf, "w", libver=LIBVER), self._cf)
                layout = len(self._texts["schema"]) * 2 + _LAYOUT_BYTES * (len(schema.leaves) + 4)
                self._space.ensure(f.id.get_filesize() + layout + own + _SLACK, "the file's layout")
                columns = self._build(f, schema, frames, None)
                self._commit(f)
                self._keep_template(key, columns)
            else:
                self._space.ensure(len(template.data) + own + _SLACK, "the file's layout")
                _write_all(self._fd, template.data)
                self._cf = CommittedFile(self._fd, self.path, in_place=False, durable=self.durable, disk=self._disk)
                f = opened(h5py.File(self._cf, "r+", libver=LIBVER), self._cf)
                self._build(f, schema, frames, template)
            jl = self._jl
            for name in ("provenance", "meta"):
                jl.attrs[name] = attr_text(self._texts[name])
            jl.attrs[CRC_ATTR] = np.uint32(json_crc32(self._texts))
            self._commit(f)
            self._flushed_end = f.id.get_filesize()
            if self._flushed_end > self._space.reserved:
                self.stats["reserve_misses"] += 1
            self._space.forget()
            if self.replace_at_checkpoint is None:
                self._cf.sync()
                durable_replace(tmp, self.path, durable=False)  # the directory is synced by the first commit
                self._cf.now_in_place(directory_synced=False)
            else:
                self._swap = PendingSwap(tmp, self.path, self.replace_at_checkpoint, durable=self.durable)
            self._file, self._state = f, "open"
        except BaseException as exc:
            if self._state != "open" and f is not None and not os.path.lexists(tmp):  # renamed, then interrupted
                self._file, self._state = f, "open"
            if self._state == "open":  # in place already: open() finishes it
                raise
            if f is not None:
                _close_discarding(f, self._cf)
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
        if self.author is not None:
            return self.author
        try:
            return getpass.getuser()
        except Exception:  # noqa: BLE001  (no user name in this environment: an H5MD author is still needed)
            return "unknown"

    def _layout_key(self, schema_text: str, frames: dict) -> str:
        """Everything the file's layout depends on: equal keys, byte-equal layouts."""
        from ...version import __version__

        return json_text([schema_text, sorted(frames.items()), self.compression, self.compression_opts,
                      self.shuffle, self.checksums, self._author(), self.particles, __version__,
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
            h5md = f.create_group("h5md")
            h5md.attrs["version"] = np.array([1, 1], dtype=np.int32)
            f.create_group("h5md/author").attrs["name"] = self._author()
            creator = f.create_group("h5md/creator")
            creator.attrs["name"] = "pytest-jaxlog"
            creator.attrs["version"] = __version__
            obs = f.create_group("observables")
        self._dsets: dict[str, _Column] = {}
        self._groups = {}
        self._rows = {}
        columns: dict[str, _ColumnShape] = {}
        kw: dict[str, Any] = {}
        if self.compression is not None:
            kw = {"compression": self.compression, "compression_opts": self.compression_opts}
        if self.shuffle:
            kw["shuffle"] = True
        if self.checksums:
            kw["fletcher32"] = True
        compressed = self.compression is not None

        def column(g: Any, path: str, name: str, **create: Any) -> _Column:
            where = f"observables/{path}/{name}"
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
            self._dsets[leaf.path] = column(g, leaf.path, "value", shape=(0, *leaf.shape), maxshape=maxshape,
                                            dtype=stored, chunks=chunks)
            if made and dname is not None:
                g["value"].attrs[DTYPE_ATTR] = attr_text(dname)
            if made and leaf.key_impl is not None:
                g["value"].attrs[KEY_IMPL_ATTR] = attr_text(leaf.key_impl)
            # Leaves of one view with one schedule share their step/time datasets (H5MD allows
            # hard-linked step/time): fewer HDF5 calls per batch, which dominate small batches.
            key = (leaf.record, json_text(leaf.schedule.to_json()))
            group = self._groups.get(key)
            if group is None:
                scalar = {"shape": (0,), "maxshape": (None,), "chunks": (_chunk_rows(8, n),)}
                step = column(g, leaf.path, "step", dtype=np.int64, **scalar)
                tds = column(g, leaf.path, "time", dtype=np.float64, **scalar) if schema.dt is not None else None
                group = self._groups[key] = _Group([], step, tds)
                self._rows[key] = 0
            elif made:
                g["step"] = obs[f"{group.paths[0]}/step"]
                if group.time is not None:
                    g["time"] = obs[f"{group.paths[0]}/time"]
            group.paths.append(leaf.path)
        if not made:
            self._jl = f["jaxlog"]
            self._open_fixed()
            return columns
        for group, mapping in self.particles.items():
            pg = f.require_group("particles").create_group(group)
            for name, path in mapping.items():
                pg[name] = obs[path]  # hard link: same element, H5MD particle name
            pos = mapping.get("position")
            dim = int(schema[pos].shape[-1]) if pos and schema[pos].shape else 0
            box = pg.create_group("box")
            box.attrs["dimension"] = np.int32(dim)
            box.attrs["boundary"] = np.array([b"none"] * dim, dtype="S8") if dim else np.array([], dtype="S8")
        jl = f.create_group("jaxlog")
        for key in ("format_version", "schema", "violation"):
            jl.attrs[key] = attr_text(self._texts[key])
        jl.attrs["status"] = _fixed_json("status", "running")
        jl.attrs["steps_done"] = _fixed_json("steps_done", 0)
        jl.attrs["writer_error"] = _fixed_json("writer_error", None)
        jl.create_group("attachments")
        self._jl = jl
        self._open_fixed()
        return columns

    def _open_fixed(self) -> None:
        """Handles on the fixed-size attributes rewritten in place (steps done at every flush,
        the status at the end): a write through one is a few times cheaper than ``attrs.modify``,
        which looks the attribute up and checks its type first."""
        self._fixed = {name: h5py.h5a.open(self._jl.id, name.encode()) for name in _FIXED_ATTRS}

    def _set_fixed(self, name: str, value: Any) -> None:
        handle = self._fixed.get(name)
        if handle is not None and handle.valid:
            handle.write(_fixed_json(name, value))
        else:  # the file was opened again to finish it (its writer thread died)
            self._jl.attrs.modify(name, _fixed_json(name, value))

    # -- writer thread ----------------------------------------------------------------------
    def _run(self) -> None:
        q = self._queue
        next_flush = time.monotonic() + self.flush_every_s
        dirty = False
        while True:
            item = q.get(max(0.0, next_flush - time.monotonic()) if dirty else None)
            try:
                if item is None:
                    pass
                elif item.kind == "frames":
                    self._ledger.took()
                    if self._error is None:
                        self._append(item.payload)
                        dirty = True
                elif item.kind == "attach":
                    if self._error is None:
                        self._write_attachment(*item.payload)
                        dirty = True
                elif item.kind == "flush":
                    try:
                        if self._error is None:
                            self._flush()
                            dirty = False
                            next_flush = time.monotonic() + self.flush_every_s
                    finally:
                        item.payload.set()
                elif item.kind == "close":
                    self._finalize(*item.payload)
                    return
                if dirty and self._error is None and time.monotonic() >= next_flush:
                    self._flush()
                    dirty = False
                    next_flush = time.monotonic() + self.flush_every_s
            except BaseException as exc:  # noqa: BLE001  (kept and raised on the caller's thread)
                err = exc
                if not isinstance(exc, WriterError):
                    err = WriterError(f"writing {self.path} failed: {type(exc).__name__}: {exc}")
                    err.__cause__ = exc
                self._set_error(err)
                dirty = False
                if item is not None and item.kind == "close":
                    self._finalized = True
                    return
            finally:
                if item is not None:  # its frames let go first: the room ``done`` makes is memory freed
                    done, item = Item(item.kind, None, item.nbytes), None
                    q.done(done)

    def _file_end(self) -> int:
        return self._file.id.get_filesize()

    def _reserve(self, growth: int, what) -> int:
        """Claim the space ``growth`` more bytes of file need (``NoSpace`` before anything is written)."""
        need = self._flushed_end + self._unflushed + growth + _SLACK
        self._space.ensure(need, what)
        self._unflushed += growth
        return need

    def _check_end(self, bound: int) -> None:
        if self._file_end() > bound:  # the growth bound was wrong: counted, for the tests to see
            self.stats["reserve_misses"] += 1

    def _append(self, frames: Frames) -> None:
        t0 = time.perf_counter_ns()
        nbytes = nframes = 0
        dt = self.schema.dt if self.schema is not None else None
        plan = []
        growth = 0
        gen = self._gen
        for key, group in self._groups.items():
            first = next((p for p in group.paths if p in frames.steps and len(frames.steps[p])), None)
            if first is None:
                continue
            steps = frames.steps[first]
            n, old = len(steps), self._rows[key]
            for path in group.paths:
                growth += self._dsets[path].growth(old, n, gen)
            growth += group.step.growth(old, n, gen)
            if group.time is not None:
                growth += group.time.growth(old, n, gen)
            plan.append((key, group, steps, old))
        if not plan:
            return
        bound = self._reserve(growth, lambda: f"the frames of steps {min(int(s[0]) for _, _, s, _ in plan)}.."
                                              f"{frames.last_step} ({_frames_bytes(frames)} bytes)")
        for key, group, steps, old in plan:
            n = len(steps)
            path = group.paths[0]
            try:
                for path in group.paths:
                    values = frames.values[path]
                    self._dsets[path].append(old, encode(np.ascontiguousarray(values)))
                    nbytes += values.nbytes
                    nframes += n
                    self._queue.tick()
                if group.time is not None:
                    group.time.append(old, np.ascontiguousarray(frames.times_of(group.paths, steps, dt), dtype=np.float64))
                # step last: a frame counts (for the reader) once its step is there
                group.step.append(old, np.ascontiguousarray(steps, dtype=np.int64))
                self._rows[key] = old + n
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
        if self._timeline is not None:
            try:
                self._timeline.slice(
                    "writer", "write", t0, time.perf_counter_ns(), {"frames": nframes, "bytes": nbytes}
                )
            except Exception:  # noqa: BLE001  (the timeline is a diagnostic; it must not fail the writes)
                pass

    def _write_attachment(self, name: str, step: int, host: dict) -> None:
        if name == "checkpoint":  # on disk only after every frame before it, and then at once, whole
            self._flush()
        growth = sum(arr.nbytes + arr.nbytes // 16 + 2 * _LAYOUT_BYTES for arr, _ in host.values()) + 2 * _LAYOUT_BYTES
        bound = self._reserve(growth, f"attachment {name!r} at step {step}")
        try:
            g = self._file["jaxlog/attachments"].require_group(name).require_group(str(step))
            for path, (arr, impl) in host.items():
                if path in g:
                    del g[path]
                _, dname = storage_dtype(arr.dtype)
                arr = encode(np.asarray(arr, order="C"))  # keeps 0-d arrays 0-d
                kw = {"chunks": arr.shape, "fletcher32": True} if self.checksums and arr.ndim and arr.size else {}
                ds = g.create_dataset(path, data=arr, **kw)
                if dname is not None:
                    ds.attrs[DTYPE_ATTR] = attr_text(dname)
                if impl is not None:
                    ds.attrs[KEY_IMPL_ATTR] = attr_text(impl)
        except Exception as exc:
            raise WriterError(f"writing attachment {name!r} at step {step} to {self.path} failed: {exc}") from exc
        self._check_end(bound)
        if name == "checkpoint":
            self._flush()
            if self._swap is not None and self._swap.due(step):
                self._cf.sync()  # its bytes on the disk before it takes the path
                self._swap.checkpoint_written(step)
                self._cf.now_in_place(directory_synced=True)

    def _flush(self) -> None:
        started = time.monotonic()
        f = self._file
        bound = self._flushed_end + self._unflushed + _SLACK
        self._set_fixed("steps_done", max(self._written_step, 0))
        self._commit(f)
        self._space.forget()
        self._check_end(bound)
        self._flushed_end = self._file_end()
        self._unflushed = 0
        self._gen += 1
        self.stats["flushes"] += 1
        self._ledger.commit_done(started, self._written_step)

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
                                 durable=self.durable, disk=self._disk)
        return opened(h5py.File(self._cf, "r+"), self._cf)

    def _finalize(self, status: str, steps_done: int, violation: dict | None, summary: dict | None = None) -> None:
        """Final attributes and close; always closes the file and frees the path, even after a
        writer error. A file whose last write failed is closed without writing more to it."""
        f = self._file
        try:
            if f is None or not f.id.valid:
                f = self._file = self._reopen()
                self._jl = f["jaxlog"]
            jl = self._jl
            error = self._error
            if error is not None:
                status = "failed"
                # the caller handed over more than the broken writer wrote: say what the file holds
                steps_done = min(int(steps_done), max(self._complete_step, 0))
            if violation is not None:
                text = json_text(violation)
                try:
                    self._reserve(2 * len(text.encode()) + _LAYOUT_BYTES, "the violation")
                    jl.attrs["violation"] = attr_text(text)
                    if CRC_ATTR in jl.attrs:  # not in a file reopened from an older version
                        texts = {k: jl.attrs[k] for k in CRC_COVERS}
                        jl.attrs.modify(CRC_ATTR, np.uint32(json_crc32(texts)))
                except NoSpace as exc:
                    error = error or exc
            if summary is not None:
                text = json_text(summary)
                try:
                    self._reserve(2 * len(text.encode()) + _LAYOUT_BYTES, "the run's summary")
                    jl.attrs["summary"] = attr_text(text)
                except NoSpace as exc:
                    error = error or exc
            if error is not None:
                self._set_fixed("writer_error", str(error))
            self._set_fixed("status", status)
            self._set_fixed("steps_done", int(steps_done))
            started = time.monotonic()
            self._commit(f)
            self._ledger.commit_done(started, self._written_step)
        except BaseException:
            if f is not None:
                _close_discarding(f, self._cf)
            raise
        finally:
            self._fixed = {}  # their ids are closed with the file
            try:
                if f is not None and f.id.valid:
                    f.close()
            finally:
                self._release()
                self._finalized = True  # last: close() returns once the path is free again

    def _release(self) -> None:
        """After the file is closed: cut the reserved tail (``CommittedFile.close``), free the path."""
        fd, self._fd = self._fd, None
        if self._cf is not None:
            self._cf.close()
        self._disk.close()
        if fd is not None:
            os.close(fd)
        try:
            if self._swap is not None:
                self._swap.abandon()
        finally:
            self._lock.release()

    def __repr__(self) -> str:
        return f"HDF5Writer({str(self.path)!r}, {self._state})"


def set_text_attr(path: Path, name: str, text: str, *, durable: bool = True) -> None:
    """Set the ``/jaxlog`` attribute ``name`` of a closed trajectory in one commit (a kill leaves
    the file with it or without it), under the path's lock."""
    lock = PathLock(path)
    lock.acquire()
    fd = None
    cf = None
    try:
        recover(path)
        fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        cf = CommittedFile(fd, path, durable=durable)
        f = opened(h5py.File(cf, "r+"), cf)
        try:
            f["jaxlog"].attrs[name] = attr_text(text)
        except BaseException:
            _close_discarding(f, cf)
            raise
        f.close()
    finally:
        if cf is not None:
            cf.close()
        if fd is not None:
            os.close(fd)
        lock.release()


@atexit.register
def _close_abandoned() -> None:
    """A writer the caller never closed still leaves a valid file (status ``failed``); a writer
    thread stuck in a write (a hung disk) is abandoned, see ``_exit_past_stuck_writers``."""
    for writer in list(_LIVE):
        try:
            writer.close("failed")
        except BaseException:  # noqa: BLE001  (exit path: the error was the caller's to see)
            pass
    _exit_past_stuck_writers()


def _h5py_lock_free(tries: int = 20) -> bool:
    """Whether h5py's global lock can be taken (a live thread holds it only briefly)."""
    try:
        from h5py._objects import phil
    except ImportError:  # an h5py without it: nothing to tell, exit as usual
        return True
    for _ in range(tries):
        if phil.acquire(False):
            phil.release()
            return True
        time.sleep(0.01)
    return False


def _exit_past_stuck_writers() -> None:
    """A thread stuck inside an HDF5 call holds h5py's global lock forever, and the interpreter's
    shutdown frees h5py objects, which takes that lock: the process would never exit. So when a
    stalled writer thread is still alive at exit and h5py's lock stays taken, the process ends
    here, status 1, after flushing the standard streams and logging (exit handlers registered
    before this module's import and the interpreter's own teardown are skipped). A stalled thread
    stuck outside h5py leaves the lock free: the process then exits as it would."""
    stuck = [w for w in _STUCK if w._thread is not None and w._thread.is_alive()]
    if not stuck or _h5py_lock_free():
        return
    import logging
    import sys

    names = ", ".join(str(w.path) for w in stuck)
    try:
        print(f"[jaxlog] exiting with status 1 without waiting for the writer thread of {names}, stuck in a "
              f"write (a hung disk or file system?); its file keeps status 'running' and the frames flushed "
              f"before", file=sys.stderr)
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    except BaseException:  # noqa: BLE001  (the exit must happen whatever the streams do)
        pass
    os._exit(1)
