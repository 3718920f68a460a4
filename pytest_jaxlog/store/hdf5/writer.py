"""HDF5 trajectory writer, its caller side: ``HDF5Writer``, the sink a run writes through. The
file, its layout and its commits are the writer thread's (``store.hdf5.writer_thread``).

Why a thread and a queue bounded in bytes: the caller (the driver) only validates and enqueues,
so HDF5 I/O overlaps the next device chunk; when the disk is slower than the kernel the caller
blocks instead of buffering without limit, and a writer stuck on a hung disk makes the caller's
wait end with an error instead of a hang. A lock file beside the path (``pathlock``) lets one
writer at a time, across processes.

A writer-thread error is kept and raised on the caller's thread (next ``write`` or ``close``),
and ``close`` always finishes the file (status ``failed`` if the writer broke).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ...errors import JaxlogError, WriterError
from ...record.frames import Frames, Schema
from ...record.values import is_integer
from ..dtypes import check_frames, check_leaf_dtype, to_host
from ..handover import Item, Stalled, WorkerThread
from ..protocol import STATUSES, Sink, copied_views, holds_device_views
from .guards import PathLock, default_stall_s, stuck_note
from .journal import CommittedFile, opened, recover
from .layout import COMPLETE, FAILED, JAXLOG, PROVENANCE_ATTR, STOPPED, attr_text, provenance
from .parts import PartsWriter
from .writer_thread import (
    FRAME_CHUNK_BYTES as FRAME_CHUNK_BYTES,  # the drivers size their frames by it
    Attachment,
    Closing,
    WriterLink,
    WriterSteps,
    WriterSettings,
    WriterThread,
    close_discarding,
    frames_bytes,
    remove_stale_temps,
)

QUEUE_BYTES = 128 << 20  # default byte budget of the hand-over queue
STALL_TIMEOUT_S = 60.0  # default: a writer thread that finishes nothing for this long is stuck
_ITEM_BYTES = 256  # what a queued item costs besides its arrays (bounds a queue of tiny batches)
_LIVE: "weakref.WeakSet[HDF5Writer]" = weakref.WeakSet()
_STUCK: "set[HDF5Writer]" = set()  # writers whose thread stalled (kept: the thread may still hold h5py's lock)
_EMPTY_STEPS = np.zeros(0, dtype=np.int64)


def _same_file_key(path: Path) -> str:
    """The absolute, symlink-resolved path: two writers of one file compare equal."""
    try:
        return str(path.resolve())
    except OSError:
        return str(path.absolute())


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
        self.settings = WriterSettings(
            flush_every_s=float(flush_every_s), queue_bytes=int(queue_bytes), stall_timeout_s=float(stall_timeout_s),
            compression=compression, compression_opts=compression_opts,
            shuffle=compression is not None if shuffle is None else bool(shuffle), checksums=bool(checksums),
            expected_frames=None if expected_frames is None else {str(k): int(v) for k, v in expected_frames.items()},
            author=author, particles=particles or {}, overwrite=overwrite,
            replace_at_checkpoint=None if replace_at_checkpoint is None else int(replace_at_checkpoint),
            durable=bool(durable))
        self.schema: Schema | None = None
        self._link = WriterLink(self.path, self.settings)
        self.stats = self._link.stats
        self._queue = self._link.queue
        self._ledger = self._link.ledger
        self._disk = self._link.disk
        self._lock = self._link.lock
        self._worker = WriterThread(self.path, self.settings, self._link)  # the file's side
        self._thread: WorkerThread | None = None
        self._error_raised = False
        self._state = "new"  # new -> open -> closing -> closed
        self._stalled = False
        self._last_steps: dict[str, int] = {}
        self._max_step = -1  # highest step handed over
        self._closing: Closing | None = None  # how close() was asked to finish the file

    # the settings, as the keyword arguments named them (a part file's writer is made alike: ``store.hdf5.parts``)
    flush_every_s = property(lambda self: self.settings.flush_every_s)
    queue_bytes = property(lambda self: self.settings.queue_bytes)
    stall_timeout_s = property(lambda self: self.settings.stall_timeout_s)
    compression = property(lambda self: self.settings.compression)
    compression_opts = property(lambda self: self.settings.compression_opts)
    shuffle = property(lambda self: self.settings.shuffle)
    checksums = property(lambda self: self.settings.checksums)
    expected_frames = property(lambda self: self.settings.expected_frames)
    author = property(lambda self: self.settings.author)
    particles = property(lambda self: self.settings.particles)
    overwrite = property(lambda self: self.settings.overwrite)
    replace_at_checkpoint = property(lambda self: self.settings.replace_at_checkpoint)
    durable = property(lambda self: self.settings.durable)

    @property
    def _error(self) -> BaseException | None:
        """The writer thread's first error (raised on the caller's thread once)."""
        return self._link.error

    @property
    def _finalized(self) -> bool:
        return self._link.finalized

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
        if PROVENANCE_ATTR not in meta:
            meta[PROVENANCE_ATTR] = provenance()
        self._lock.acquire()  # WriterError naming the other writer; nothing touched yet
        try:
            if self.path.exists() and not self.overwrite:  # created meanwhile by another writer
                raise JaxlogError(f"{self.path} exists and HDF5Writer(overwrite=False)")
            recover(self.path)  # a commit a killed writer left half applied: rolled back first
            remove_stale_temps(self.path)
            self._worker.create(schema, meta)  # (the disk's helper thread starts on the writer thread)
            self._state = "open"  # the file is in place
            self._thread = WorkerThread(self._run, f"jaxlog-hdf5:{self.path.name}")
            _LIVE.add(self)
            self._thread.start()
        except BaseException as exc:
            if self._worker.in_place:  # renamed into place, then interrupted
                self._state = "open"
            if self._state != "open":
                self._lock.release()
                raise
            # the file is in place (e.g. Ctrl-C or SIGTERM while the thread started): finish it
            # here, so it says how the run ended and the path is free, as a failed open must leave it
            try:
                self.close(STOPPED if isinstance(exc, KeyboardInterrupt) else FAILED, steps_done=0)
            except BaseException as also:  # noqa: BLE001  (the open's own error is the one to see)
                exc.add_note(f"[jaxlog] finishing {self.path} after the failed open also failed: {also}")
            raise

    def set_timeline(self, timeline: Any) -> None:
        """Record a slice per batch write on the ``writer`` track of a ``_perfetto.Timeline``."""
        self._worker.timeline = timeline

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
        nbytes = frames_bytes(frames)
        if nbytes + _ITEM_BYTES <= self.queue_bytes:
            self._hand_over(frames, nbytes + _ITEM_BYTES)
        else:
            for piece in _slices(frames, self.queue_bytes - _ITEM_BYTES):
                self._hand_over(piece, frames_bytes(piece) + _ITEM_BYTES)
        self._max_step = max(self._max_step, last)

    def _check_groups(self, frames: Frames) -> None:
        """Leaves sharing step datasets must arrive together, with the same steps."""
        for group in self._worker.columns.groups.values():
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
        self._put(Item("attach", Attachment(str(name), int(step), host), nbytes))

    def flush(self) -> None:
        """Block until everything handed over so far is on disk (survives a kill)."""
        self._raise_pending()
        if self._state != "open":
            return
        done = threading.Event()
        self._put(Item("flush", done, 0))
        self._wait(done.is_set, "flushing")
        self._raise_pending()

    def close(self, status: str = COMPLETE, *, steps_done: int | None = None, violation: dict | None = None,
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
            self._closing = Closing(status, int(steps_done), violation, summary)
            thread = self._thread
            if thread is not None and thread.alive():
                self._queue.put(Item("close", self._closing, 0), thread.alive, force=True)
        # "closing": a close interrupted (Ctrl-C) or stalled before; wait again
        if not self._stalled:
            self._wait(lambda: self._finalized, "closing")
        elif not self._finalized:
            self._raise_stalled("closing")
        if not self._finalized:  # the thread died unexpectedly: finish the file here
            try:
                assert self._closing is not None  # set before the state left "open"
                self._finalize(self._closing)
            except Exception as exc:
                err = WriterError(f"finishing {self.path} failed: {exc}")
                err.__cause__ = exc
                self._link.set_error(err)
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
        return self._thread is not None and self._thread.alive()

    def _check_alive(self) -> None:
        if not self._alive():
            err = WriterError(f"the writer thread of {self.path} died; frames after step {self._max_step} were not written")
            err.__cause__ = self._error
            self._link.set_error(err)
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

    # -- the writer thread's steps: each a method here, so a subclass wraps one (fault injection) --
    def _run(self) -> None:
        self._worker.run(WriterSteps(append=self._append, attach=self._write_attachment, finalize=self._finalize))

    def _append(self, frames: Frames) -> None:
        self._worker.append(frames)

    def _write_attachment(self, name: str, step: int, host: dict) -> None:
        self._worker.write_attachment(name, step, host)

    def _finalize(self, closing: Closing) -> None:
        self._worker.finalize(closing)

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
            f[JAXLOG].attrs[name] = attr_text(text)
        except BaseException:
            close_discarding(f, cf)
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
            writer.close(FAILED)
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
    stuck = [w for w in _STUCK if w._thread is not None and w._thread.alive()]
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
