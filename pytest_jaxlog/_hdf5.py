"""HDF5 trajectory writer: H5MD 1.1 layout, a background thread, bounded memory, crash-safe.

Layout::

    /h5md                       version=[1, 1]; author/ (name); creator/ (name, version)
    /observables/<path>/step    int64 [n]            (one H5MD time-dependent element per leaf)
    /observables/<path>/time    float64 [n]          (only when the run has dt)
    /observables/<path>/value   [n, *shape]          (ml_dtypes stored as uint views + jaxlog_dtype)
    /particles/<group>/<name>   hard links to observables (optional ``particles=`` mapping)
    /jaxlog                     attrs, JSON strings: format_version, schema, provenance, meta,
                                status, steps_done, violation, writer_error
    /jaxlog/attachments/<name>/<step>/<path>   snapshots (post-mortem states)

Why a thread and a bounded queue: the caller (the driver) only validates and enqueues, so
HDF5 I/O overlaps the next device chunk; when the disk is slower than the kernel the caller
blocks on ``put`` instead of buffering without limit. Why this file format (superblock v2,
``libver="v108"``, no SWMR): flushed at an interval, such a file opens with plain h5py after
a SIGKILL (SWMR files need ``h5clear`` or ``swmr=True`` readers after a crash).
A writer-thread error is kept and raised on the caller's thread (next ``write`` or ``close``),
and ``close`` always finishes the file (status ``failed`` if the writer broke).
"""

from __future__ import annotations

import atexit
import getpass
import json
import os
import queue
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ._dtypes import DTYPE_ATTR, KEY_IMPL_ATTR, check_frames, check_leaf_dtype, encode, storage_dtype, to_host
from ._errors import JaxlogError, WriterError
from ._frames import FORMAT_VERSION, Frames, Schema
from ._sink import STATUSES

LIBVER = ("v108", "v108")
_CHUNK_BYTES = 1 << 19  # largest chunk of a run of known length (fits the 1 MiB chunk cache)
_OPEN_CHUNK_BYTES = 1 << 16  # unknown run length: chunks of ~_OPEN_CHUNK_FRAMES frames within these bounds,
_OPEN_CHUNK_MIN = 1 << 12  # so each dataset's last, partly filled chunk wastes little
_OPEN_CHUNK_FRAMES = 64
_POLL_S = 0.05  # how often a blocked caller re-checks that the writer thread is alive
_LIVE: "weakref.WeakSet[HDF5Writer]" = weakref.WeakSet()
_EMPTY_STEPS = np.zeros(0, dtype=np.int64)


def _same_file_key(path: Path) -> str:
    """The absolute, symlink-resolved path: two writers of one file compare equal."""
    try:
        return str(path.resolve())
    except OSError:
        return str(path.absolute())


def _json(value: Any) -> str:
    return json.dumps(value, default=_json_default)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    return repr(obj)


class _Column:
    """Appends rows to one resizable dataset through the low-level h5py API, caching the memory
    type and dataspaces: the high-level ``resize`` + ``__setitem__`` pair re-derives them per call
    and costs ~5x more, which dominates the small batches a fast kernel produces."""

    __slots__ = ("ds", "dsid", "mtype", "spaces")

    def __init__(self, ds: h5py.Dataset):
        self.ds, self.dsid = ds, ds.id
        self.mtype = None
        self.spaces: dict[tuple, Any] = {}

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


def _count_between(schedule: Any, lo: int, hi: int) -> int:
    """``len(schedule.steps_between(lo, hi))`` without building the array (runs may be 2**31 steps)."""
    from ._schedule import Every, Window

    if isinstance(schedule, Window):
        n, start, hi = schedule.every, schedule.start, min(hi, schedule.stop)
    elif isinstance(schedule, Every):
        n, start = schedule.n, schedule.start
    else:
        return len(schedule.steps_between(lo, hi))
    lo = max(lo, start)
    first = start + -(-(lo - start) // n) * n
    return 0 if first > hi else (hi - first) // n + 1


def _frames_per_leaf(schema: Schema, meta: dict) -> dict[str, int]:
    """Most frames each leaf can get, from ``meta["run"]`` (``steps``, ``start_step``); empty when the
    length is unknown (``jl.Recorder``). An upper bound: steps ``start..start+steps`` inclusive."""
    run = (meta or {}).get("run") or {}
    steps, start = run.get("steps"), run.get("start_step") or 0
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0 or not isinstance(start, int):
        return {}
    return {leaf.path: _count_between(leaf.schedule, start, start + steps) for leaf in schema.leaves}


class HDF5Writer:
    """Sink writing an H5MD trajectory file from a background thread.

    ``flush_every_s``: how often data and ``steps_done`` reach the disk (what survives a kill).
    ``queue_size``: batches in flight; a full queue blocks ``write`` (bounded memory).
    ``compression``: h5py filter for all datasets (``"gzip"``, ``"lzf"``, None; lossless, so values
    read back bit for bit); ``shuffle`` (default: on with compression) helps it on numbers.
    ``expected_frames``: ``{leaf path: frames}`` when known up front (``Trajectory.save``); otherwise
    taken from the run length in ``meta["run"]``. It only sizes chunks (file size): more frames still fit.
    ``particles``: ``{group: {"position": "state/positions", ...}}`` adds H5MD particle links.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        flush_every_s: float = 1.0,
        queue_size: int = 8,
        compression: str | None = None,
        compression_opts: Any = None,
        shuffle: bool | None = None,
        expected_frames: dict[str, int] | None = None,
        author: str | None = None,
        particles: dict[str, dict[str, str]] | None = None,
        overwrite: bool = True,
    ):
        if queue_size < 1:
            raise JaxlogError(f"HDF5Writer(queue_size={queue_size}): needs at least 1")
        if flush_every_s < 0:
            raise JaxlogError(f"HDF5Writer(flush_every_s={flush_every_s}): must be >= 0")
        self.path = Path(path)
        self.flush_every_s = float(flush_every_s)
        self.queue_size = int(queue_size)
        self.compression = compression
        self.compression_opts = compression_opts
        self.shuffle = compression is not None if shuffle is None else bool(shuffle)
        self.expected_frames = None if expected_frames is None else {str(k): int(v) for k, v in expected_frames.items()}
        self.author = author
        self.particles = particles or {}
        self.overwrite = overwrite
        self.schema: Schema | None = None
        self.stats = {"batches": 0, "frames": 0, "bytes": 0, "flushes": 0, "max_queue": 0, "blocked_s": 0.0}
        self._queue: queue.Queue = queue.Queue(maxsize=self.queue_size)
        self._thread: threading.Thread | None = None
        self._file: h5py.File | None = None
        self._error: BaseException | None = None
        self._error_raised = False
        self._state = "new"  # new -> open -> closed
        self._finalized = False
        self._last_steps: dict[str, int] = {}
        self._max_step = -1  # highest step handed over (caller side)
        self._written_step = -1  # highest step written (writer side)
        self._complete_step = -1  # last step of the last batch written whole (writer side)
        self._timeline = None
        self._lock = threading.Lock()

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
            if other is not self and other._state == "open" and _same_file_key(other.path) == mine:
                raise JaxlogError(f"HDF5Writer({self.path}): another HDF5Writer in this process is still writing "
                                  f"that file (two writers of one path in a run, or one not closed); give each "
                                  f"writer its own path")
        self.schema = schema
        self.path.parent.mkdir(parents=True, exist_ok=True)
        meta = dict(meta or {})
        if "provenance" not in meta:
            from ._provenance import provenance

            meta["provenance"] = provenance()
        try:
            self._file = self._create(schema, meta)
        except Exception as exc:
            if self._file is not None:  # we created (truncated) it: a half-made file fails later readers
                self._file.close()
                self._file = None
                try:
                    self.path.unlink()
                except OSError:
                    pass
            raise WriterError(f"cannot create trajectory file {self.path}: {exc}") from exc
        self._state = "open"
        self._thread = threading.Thread(target=self._run, name=f"jaxlog-hdf5:{self.path.name}", daemon=True)
        _LIVE.add(self)
        self._thread.start()

    def set_timeline(self, timeline: Any) -> None:
        """Record a slice per batch write on the ``writer`` track of a ``_perfetto.Timeline``."""
        self._timeline = timeline

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
        self._max_step = max(self._max_step, last)
        self._put(("frames", frames))

    def _check_groups(self, frames: Frames) -> None:
        """Leaves sharing step datasets must arrive together, with the same steps."""
        for paths, *_ in self._groups.values():
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
        self._put(("attach", str(name), int(step), host))

    def flush(self) -> None:
        """Block until everything handed over so far is on disk (survives a kill)."""
        self._raise_pending()
        if self._state != "open":
            return
        done = threading.Event()
        self._put(("flush", done))
        while not done.wait(_POLL_S):
            if self._thread is None or not self._thread.is_alive():
                break
        self._raise_pending()

    def close(self, status: str = "complete", *, steps_done: int | None = None, violation: dict | None = None) -> None:
        """Flush, write the final status, close the file; raise a writer error not raised yet."""
        if status not in STATUSES:
            raise JaxlogError(f"close(status={status!r}): expected one of {', '.join(STATUSES)}")
        if self._state == "new":
            self._state = "closed"
            return
        if self._state == "closed":
            self._raise_pending()
            return
        self._state = "closed"
        if steps_done is None:
            steps_done = max(self._max_step, 0)
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._put(("close", status, int(steps_done), violation), check_error=False)
            while thread.is_alive():
                thread.join(_POLL_S)
        if not self._finalized:  # the thread died unexpectedly: finish the file here
            try:
                self._finalize(status, int(steps_done), violation)
            except Exception as exc:
                err = WriterError(f"finishing {self.path} failed: {exc}")
                err.__cause__ = exc
                self._set_error(err)
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

    def _check_alive(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            err = WriterError(f"the writer thread of {self.path} died; frames after step {self._max_step} were not written")
            err.__cause__ = self._error
            self._set_error(err)
            self._raise_pending()
            raise err

    def _put(self, item: tuple, check_error: bool = True) -> None:
        q = self._queue
        try:
            q.put_nowait(item)
        except queue.Full:
            t0 = time.perf_counter()
            while True:
                if check_error:
                    self._raise_pending()
                if self._thread is None or not self._thread.is_alive():
                    if check_error:
                        self._check_alive()
                    return
                try:
                    q.put(item, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue
            self.stats["blocked_s"] += time.perf_counter() - t0
        size = q.qsize()
        if size > self.stats["max_queue"]:
            self.stats["max_queue"] = size

    def _set_error(self, err: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = err

    # -- file layout (caller thread in open, writer thread afterwards) -------------------------
    def _create(self, schema: Schema, meta: dict) -> h5py.File:
        from . import __version__

        f = h5py.File(self.path, "w", libver=LIBVER)
        self._file = f
        h5md = f.create_group("h5md")
        h5md.attrs["version"] = np.array([1, 1], dtype=np.int32)
        author = self.author
        if author is None:
            try:
                author = getpass.getuser()
            except Exception:
                author = "unknown"
        f.create_group("h5md/author").attrs["name"] = author
        creator = f.create_group("h5md/creator")
        creator.attrs["name"] = "pytest-jaxlog"
        creator.attrs["version"] = __version__
        obs = f.create_group("observables")
        self._dsets: dict[str, h5py.Dataset] = {}
        # (record, schedule) -> [leaf paths, step dataset, time dataset or None, rows written]
        self._groups: dict[tuple, list] = {}
        frames = _frames_per_leaf(schema, meta) if self.expected_frames is None else self.expected_frames
        kw: dict[str, Any] = {}
        if self.compression is not None:
            kw = {"compression": self.compression, "compression_opts": self.compression_opts}
        if self.shuffle:
            kw["shuffle"] = True
        for leaf in schema.leaves:
            g = obs.create_group(leaf.path)
            stored, dname = storage_dtype(leaf.dtype)
            frame_bytes = int(np.prod(leaf.shape, dtype=np.int64)) * stored.itemsize
            n = frames.get(leaf.path)
            rows = _chunk_rows(frame_bytes, n)
            # zero-size frame dims: HDF5 chunks must be >= 1, so such dims get an unlimited max
            maxshape = (None, *(s if s > 0 else None for s in leaf.shape))
            chunks = (rows, *(max(1, s) for s in leaf.shape)) if frame_bytes <= (1 << 30) else True
            value = g.create_dataset(
                "value", shape=(0, *leaf.shape), maxshape=maxshape, dtype=stored, chunks=chunks, **kw
            )
            if dname is not None:
                value.attrs[DTYPE_ATTR] = dname
            if leaf.key_impl is not None:
                value.attrs[KEY_IMPL_ATTR] = leaf.key_impl
            self._dsets[leaf.path] = _Column(value)
            # Leaves of one view with one schedule share their step/time datasets (H5MD allows
            # hard-linked step/time): fewer HDF5 calls per batch, which dominate small batches.
            key = (leaf.record, _json(leaf.schedule.to_json()))
            group = self._groups.get(key)
            if group is None:
                scalar = {"shape": (0,), "maxshape": (None,), "chunks": (_chunk_rows(8, n),), **kw}
                step = g.create_dataset("step", dtype=np.int64, **scalar)
                tds = None
                if schema.dt is not None:
                    tds = g.create_dataset("time", dtype=np.float64, **scalar)
                self._groups[key] = group = [[], _Column(step), None if tds is None else _Column(tds), 0]
            else:
                g["step"] = group[1].ds
                if group[2] is not None:
                    g["time"] = group[2].ds
            group[0].append(leaf.path)
        for group, mapping in self.particles.items():
            pg = f.require_group("particles").create_group(group)
            for name, path in mapping.items():
                if path not in schema:
                    raise JaxlogError(f"particles[{group!r}][{name!r}]: record {path!r} is not recorded")
                pg[name] = obs[path]  # hard link: same element, H5MD particle name
            pos = mapping.get("position")
            dim = int(schema[pos].shape[-1]) if pos and schema[pos].shape else 0
            box = pg.create_group("box")
            box.attrs["dimension"] = np.int32(dim)
            box.attrs["boundary"] = np.array([b"none"] * dim, dtype="S8") if dim else np.array([], dtype="S8")
        jl = f.create_group("jaxlog")
        jl.attrs["format_version"] = _json(FORMAT_VERSION)
        jl.attrs["schema"] = _json(schema.to_json())
        jl.attrs["provenance"] = _json(meta.get("provenance"))
        jl.attrs["meta"] = _json(meta)
        jl.attrs["status"] = _json("running")
        jl.attrs["steps_done"] = _json(0)
        jl.attrs["violation"] = _json(None)
        jl.attrs["writer_error"] = _json(None)
        jl.create_group("attachments")
        f.flush()
        return f

    # -- writer thread ----------------------------------------------------------------------
    def _run(self) -> None:
        q = self._queue
        next_flush = time.monotonic() + self.flush_every_s
        dirty = False
        while True:
            try:
                item = q.get(timeout=max(0.0, next_flush - time.monotonic()) if dirty else None)
            except queue.Empty:
                item = None
            try:
                if item is None:
                    pass
                elif item[0] == "frames":
                    if self._error is None:
                        self._append(item[1])
                        dirty = True
                elif item[0] == "attach":
                    if self._error is None:
                        self._write_attachment(*item[1:])
                        dirty = True
                elif item[0] == "flush":
                    try:
                        if self._error is None:
                            self._flush()
                            dirty = False
                            next_flush = time.monotonic() + self.flush_every_s
                    finally:
                        item[1].set()
                elif item[0] == "close":
                    self._finalize(*item[1:])
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
                if item is not None and item[0] == "close":
                    self._finalized = True
                    return

    def _append(self, frames: Frames) -> None:
        t0 = time.perf_counter_ns()
        nbytes = nframes = 0
        dt = self.schema.dt if self.schema is not None else None
        for group in self._groups.values():
            paths, step_ds, time_ds, old = group
            first = next((p for p in paths if p in frames.steps and len(frames.steps[p])), None)
            if first is None:
                continue
            steps = frames.steps[first]
            n = len(steps)
            path = first
            try:
                for path in paths:
                    values = frames.values[path]
                    self._dsets[path].append(old, encode(np.ascontiguousarray(values)))
                    nbytes += values.nbytes
                    nframes += n
                if time_ds is not None:
                    time_ds.append(old, np.ascontiguousarray(steps * dt, dtype=np.float64))
                # step last: a frame counts (for the reader) once its step is there
                step_ds.append(old, np.ascontiguousarray(steps, dtype=np.int64))
                group[3] = old + n
            except Exception as exc:
                raise WriterError(
                    f"writing record {path!r} (steps {int(steps[0])}..{int(steps[-1])}) to {self.path} failed: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            self._written_step = max(self._written_step, int(steps[-1]))
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
            except Exception:
                pass

    def _write_attachment(self, name: str, step: int, host: dict) -> None:
        try:
            g = self._file["jaxlog/attachments"].require_group(name).require_group(str(step))
            for path, (arr, impl) in host.items():
                if path in g:
                    del g[path]
                ds = g.create_dataset(path, data=encode(np.ascontiguousarray(arr)))
                _, dname = storage_dtype(arr.dtype)
                if dname is not None:
                    ds.attrs[DTYPE_ATTR] = dname
                if impl is not None:
                    ds.attrs[KEY_IMPL_ATTR] = impl
        except Exception as exc:
            raise WriterError(f"writing attachment {name!r} at step {step} to {self.path} failed: {exc}") from exc

    def _flush(self) -> None:
        f = self._file
        f["jaxlog"].attrs["steps_done"] = _json(max(self._written_step, 0))
        f.flush()
        self.stats["flushes"] += 1

    def _finalize(self, status: str, steps_done: int, violation: dict | None) -> None:
        """Final attributes and close; always closes the file, even after a writer error."""
        f = self._file
        try:
            if f is None or not f.id.valid:
                f = h5py.File(self.path, "r+")
            jl = f["jaxlog"]
            if self._error is not None:
                status = "failed"
                jl.attrs["writer_error"] = _json(str(self._error))
                # the caller handed over more than the broken writer wrote: say what the file holds
                steps_done = min(int(steps_done), max(self._complete_step, 0))
            jl.attrs["status"] = _json(status)
            jl.attrs["steps_done"] = _json(int(steps_done))
            jl.attrs["violation"] = _json(violation)
            f.flush()
        finally:
            self._finalized = True
            try:
                if f is not None:
                    f.close()
            finally:
                if self._file is not None and self._file.id.valid:
                    self._file.close()

    def __repr__(self) -> str:
        return f"HDF5Writer({str(self.path)!r}, {self._state})"


@atexit.register
def _close_abandoned() -> None:
    """A writer the caller never closed still leaves a valid file (status ``failed``)."""
    for writer in list(_LIVE):
        try:
            writer.close("failed")
        except BaseException:  # noqa: BLE001  (exit path: the error was the caller's to see)
            pass
