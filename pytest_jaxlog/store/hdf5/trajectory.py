"""Reading trajectories: one interface for files (``jl.load``) and memory (``run.trajectory``).

File reads are lazy: ``traj["x", 10:20]`` reads those 10 frames from disk, nothing else.
The file is opened per read (no handle kept), so a trajectory object never pins a file.

A file may come from anywhere (a CI artifact, an attachment): ``load`` checks everything it will
rely on (the /jaxlog attributes, the schema, each record's datasets against it) and every read
re-checks the objects it touches, since the path may name another file by then. Objects are
reached through hard links only and data is read only from the file itself (``h5safe``).
Anything malformed is one ``JaxlogError`` naming the file and what is wrong.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Sequence, TypeVar

import h5py
import numpy as np

from ...errors import JaxlogError
from ...record.frames import FORMAT_VERSION, MAX_RANK, MAX_SIZE, Frames, Schema, dtype_from_name
from ...record.records import READ_MAX_BYTES, WHEN, described_run, is_record_path, leaf_paths, run_meta
from ...record.schedule import schedule_from_json
from ...record.values import is_dt, is_integer
from ..dtypes import (
    beyond_dicts,
    check_leaf_dtype,
    decode,
    storage_dtype,
    template,
    wrap_key_data,
)
from ..protocol import STATUSES
from . import h5safe, journal
from .h5safe import select_frames
from .layout import (
    ATTACHMENTS,
    CHECKPOINT,
    CHECKPOINT_META,
    CRC_ATTR,
    DTYPE_ATTR,
    FAILED,
    FORMAT_VERSION_ATTR,
    GOLDEN_ATTR,
    JAXLOG,
    KEY_IMPL_ATTR,
    META_ATTR,
    OBSERVABLES,
    OPTIONAL_ATTRS,
    PARTS_ATTR,
    POSTMORTEM,
    PROVENANCE_ATTR,
    REQUIRED_ATTRS,
    RUNNING,
    SCHEMA_ATTR,
    STATUS_ATTR,
    STEP,
    STEPS_DONE_ATTR,
    SUMMARY_ATTR,
    TIME,
    VALUE,
    VIOLATION_ATTR,
    WRITER_ERROR_ATTR,
    json_crc32,
    json_text,
)
from .parts import PartIndex, invalid_index, read_blocks, read_index
from .writer import HDF5Writer, set_text_attr

__all__ = ['npz_arrays', 'export_npz']

_T = TypeVar("_T")
_REQUIRED = REQUIRED_ATTRS
_OPTIONAL = OPTIONAL_ATTRS
_READ_ERRORS = (OSError, RuntimeError, KeyError)  # what h5py raises for unreadable or corrupted data


_RACED_READS = 20  # reads of a live file that may each overlap one of its writer's commits


_REOPENS = 8  # opens of a path that each found another file there by the time HDF5 opened it


def _open(path: Path) -> h5py.File:
    """The file as of its last commit: read through the rollback journal in it while a commit is
    being applied, or after a writer was killed applying one (``store.hdf5.journal``); the file is
    never changed. Opened without blocking, and only if it is a regular file."""
    for _ in range(_REOPENS):
        fd = journal.open_file(path)
        try:
            st = os.fstat(fd)
            state = journal.read_tail(fd)
        except BaseException:
            os.close(fd)
            raise
        if state is not None:
            view = journal.CommittedView(fd, state)
            weakref.finalize(view, os.close, fd)  # HDF5 holds the view until the file is closed
            return journal.opened(h5py.File(view, "r"), view)
        try:
            f = _open_plain(path)
        finally:
            os.close(fd)
        try:
            same = os.path.samestat(st, os.fstat(f.id.get_vfd_handle()))
        except (OSError, RuntimeError, ValueError, TypeError, AttributeError):
            same = True  # a driver without a descriptor: the generation check still applies
        if same:
            return f
        f.close()  # the path names another file since it was checked: check that one
    raise JaxlogError(f"{path}: the file at this path was replaced {_REOPENS} times while it was opened; read it again")


def _open_plain(path: Path) -> h5py.File:
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        msg = str(exc)
        if "lock" in msg:  # a live writer in another process holds the lock: read what it flushed
            return h5py.File(path, "r", locking=False)
        if "open for write" in msg or "consistency flags" in msg:
            return h5py.File(path, "r", swmr=True)  # a SWMR writer died: its data is consistent
        raise


def _read(ds: h5py.Dataset, n: int, index: Any) -> np.ndarray:
    """``values[:n][index]`` with numpy's semantics, reading only the frames ``index`` selects
    (see ``store.hdf5.h5safe``)."""
    if index is None:
        return ds[:n]
    if 0 in ds.shape[1:]:  # h5py cannot select in zero-size dataspaces; nothing to read anyway
        return np.empty((n, *ds.shape[1:]), dtype=ds.dtype)[index]
    rows, local = select_frames(index, n)
    if rows is None:
        block = ds[:n]
    elif isinstance(rows, slice):  # a non-empty one, or slice(0, 0)
        block = ds[rows]
    else:  # h5py takes no empty index array
        block = ds[rows] if len(rows) else ds[0:0]
    return np.asarray(block)[local]


class Snapshot(NamedTuple):
    """One stored state (a checkpoint, a post-mortem state): its step, its arrays by path, and
    the PRNG impl of each path whose array is key data."""

    step: int
    arrays: dict[str, np.ndarray]
    key_impls: dict[str, str]


class _LeafData(NamedTuple):
    step: h5py.Dataset
    value: h5py.Dataset
    time: h5py.Dataset | None
    dtype_name: str | None  # the jaxlog_dtype attribute of value (ml_dtypes), checked against the schema


def _attr_text(obj: Any, key: str, file: Path, where: str) -> str | None:
    """A string attribute (str or bytes) or None if absent; JaxlogError if it is anything else."""
    try:
        if key not in obj.attrs:
            return None
        raw = obj.attrs[key]
    except (*_READ_ERRORS, TypeError, ValueError) as exc:
        raise JaxlogError(f"{file}: cannot read attribute {key!r} of {where} ({type(exc).__name__}: {exc})") from None
    if isinstance(raw, np.ndarray) and raw.shape == () and raw.dtype.kind in "SUO":
        raw = raw[()]
    if isinstance(raw, bytes):
        try:
            raw = raw.decode()
        except UnicodeDecodeError:
            raise JaxlogError(f"{file}: attribute {key!r} of {where} is not UTF-8 text") from None
    if not isinstance(raw, str):
        raise JaxlogError(f"{file}: attribute {key!r} of {where} is not a string (got {type(raw).__name__})")
    return raw


def leaf_data(f: h5py.File, file: Path, leaf: Any) -> _LeafData:
    """The datasets of one record, each checked against the schema (shape, dtype, layout)."""
    where = f"/{OBSERVABLES}/{leaf.path}"
    obs = h5safe.group(h5safe.child(f, OBSERVABLES, file, f"/{OBSERVABLES}"), file, f"/{OBSERVABLES}")
    g = h5safe.group(h5safe.get(obs, leaf.path, file, f"/{OBSERVABLES}"), file, where)
    step = h5safe.dataset(h5safe.child(g, STEP, file, f"{where}/{STEP}"), file, f"{where}/{STEP}")
    value = h5safe.dataset(h5safe.child(g, VALUE, file, f"{where}/{VALUE}"), file, f"{where}/{VALUE}")
    tds = h5safe.child(g, TIME, file, f"{where}/{TIME}")
    if tds is not None:
        tds = h5safe.dataset(tds, file, f"{where}/time")
        if tds.ndim != 1 or tds.dtype.kind != "f":
            raise JaxlogError(f"{file}: {where}/time has shape {tds.shape} and dtype {tds.dtype}; expected 1-d floats")
    if step.ndim != 1 or step.dtype.kind not in "iu":
        raise JaxlogError(f"{file}: {where}/step has shape {step.shape} and dtype {step.dtype}; expected 1-d integers")
    stored, dname = storage_dtype(leaf.dtype)
    if value.ndim != 1 + len(leaf.shape) or tuple(value.shape[1:]) != tuple(leaf.shape):
        raise JaxlogError(f"{file}: {where}/value has shape {value.shape}; the schema says frames of shape "
                          f"{tuple(leaf.shape)}")
    if value.dtype != stored:
        raise JaxlogError(f"{file}: {where}/value has dtype {value.dtype}; the schema says {leaf.dtype}")
    attr = _attr_text(value, DTYPE_ATTR, file, f"{where}/value")
    if attr != dname:
        raise JaxlogError(f"{file}: {where}/value is marked as {attr or 'plain ' + str(value.dtype)}; the schema "
                          f"says {leaf.dtype}")
    return _LeafData(step, value, tds, dname)


def _nest(flat: dict[str, Any], prefix: str) -> dict:
    """{"a/b/c": x} under prefix "a" -> {"b": {"c": x}}."""
    out: dict = {}
    for path, value in flat.items():
        parts = path[len(prefix) + 1 :].split("/") if prefix else path.split("/")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def _steps_summary(steps: np.ndarray) -> str:
    if not len(steps):
        return "none"
    if len(steps) <= 6:
        return ", ".join(str(int(s)) for s in steps)
    return f"{len(steps)} steps from {int(steps[0])} to {int(steps[-1])}"


def _rebuild(flat: dict[str, np.ndarray], impls: dict[str, str], like: Any, *, where: str, prefix: str = "state",
             frames: bool = False) -> Any:
    """``like``'s pytree with its leaves taken from ``flat`` (``{"<prefix>/<key path>": array}``);
    ``frames``: each array has a leading frame axis before ``like``'s leaf shape."""
    import jax

    pairs, treedef = jax.tree_util.tree_flatten_with_path(like)
    paths = leaf_paths(prefix, [kp for kp, _ in pairs])
    missing = [p for p in paths if p not in flat]
    if missing:
        raise JaxlogError(f"{where} does not match like=: the file has no {', '.join(missing[:5])} "
                          f"(it holds {', '.join(sorted(flat)[:8]) or 'nothing'})")
    extra = sorted(set(flat) - set(paths))
    if extra:
        raise JaxlogError(f"{where} does not match like=: like= has no leaf for {', '.join(extra[:5])}")
    leaves = []
    for path, (_, like_leaf) in zip(paths, pairs):
        value = flat[path]
        impl = impls.get(path.removeprefix("state/")) or impls.get(path)
        if impl is not None:
            value = wrap_key_data(value, impl, f"{where}: {path}")
        want, got = getattr(like_leaf, "shape", None), tuple(value.shape)[1 if frames else 0:]
        if want is not None and got != tuple(want):
            raise JaxlogError(f"{where}: leaf {path} has {'frames of ' if frames else ''}shape {got}, like= has "
                              f"{tuple(want)}")
        leaves.append(value)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _containers(meta: Any) -> Any:
    """A checkpoint's state structure as a template when it is made of tuples and lists (and
    dicts, None, arrays), from the structure the checkpoint keeps; None otherwise (a state of
    dicts alone reads back from its paths; other pytree types need ``like=``)."""
    if meta is None:
        return None
    try:
        text = json.loads(bytes(np.asarray(meta, dtype=np.uint8)).decode()).get("treedef")
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError):
        return None
    found = template(text)
    return found if beyond_dicts(found) else None


# ---------------------------------------------------------------------------------------------
# Where a trajectory's frames come from. ``Trajectory`` reads every frame through one
# ``FrameSource``: a memory one (``run.trajectory``, ``jl.from_arrays``), a file one (``jl.load``),
# the parts of a run over several processes, and one system of a batched trajectory. A source
# answers ``read(path, what, index)``: record ``path``'s values (``VALUE``), steps (``STEP``) or
# stored times (``TIME``; None where it keeps none: the times are then step * dt), of the frames
# ``index`` selects (numpy's semantics; None: all).


class FrameSource:
    """The frames of a trajectory's records, read on demand."""

    def read(self, path: str, what: str, index: Any) -> Any:
        raise NotImplementedError


class MemoryFrames(FrameSource):
    """Frames held in memory (a ``MemorySink``'s, a golden's made from arrays)."""

    def __init__(self, frames: Frames):
        self.frames = frames

    def read(self, path: str, what: str, index: Any) -> Any:
        if what == VALUE:
            arr = self.frames.values[path]
        elif what == STEP:
            arr = self.frames.steps[path]
        else:
            arr = self.frames.times.get(path)  # given with the frames (jl.from_arrays(time=...)), else none
            if arr is None:
                return None
        return arr if index is None else arr[index]


def _check_chunks_once(file: Path | None, checked: set[tuple], ds: h5py.Dataset, rows: int, where: str) -> None:
    """``h5safe.check_chunks`` once per dataset and version of the file (a live file is re-checked)."""
    key = None
    if file is not None:
        try:
            st = os.stat(file)
            key = (where, rows, st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            pass
    if key is not None and key in checked:
        return
    h5safe.check_chunks(ds, rows, file, where)
    if key is not None:
        checked.add(key)


class FileFrames(FrameSource):
    """Frames read from a trajectory file, lazily: the file is opened per read (no handle kept),
    each read re-checks the datasets it touches, and a live file is read as of one commit."""

    def __init__(self, path: Path, schema: Schema, info: dict):
        self.path = path
        self.schema = schema
        self._running = info.get(STATUS_ATTR, RUNNING) == RUNNING  # a live (or killed) writer's file
        self._lengths: dict[str, int] | None = None
        self._chunks_ok: set[tuple] = set()  # datasets whose chunk index was checked

    def read(self, path: str, what: str, index: Any) -> Any:
        return _committed_read(self.path, lambda f: self._read_in(f, path, what, index))

    def lengths(self, f: h5py.File) -> dict[str, int]:
        """Frames per record: the shortest of step/value(/time), so a killed writer's half-appended batch
        is not shown."""
        if self._lengths is None or self._running:
            lengths = {}
            for leaf in self.schema.leaves:
                d = leaf_data(f, self.path, leaf)
                lengths[leaf.path] = min(ds.shape[0] for ds in (d.step, d.value, d.time) if ds is not None)
            self._lengths = lengths
        return self._lengths

    def _read_in(self, f: h5py.File, path: str, what: str, index: Any) -> np.ndarray | None:
        n = self.lengths(f)[path]
        d = leaf_data(f, self.path, self.schema[path])
        ds = getattr(d, what)
        if ds is None:
            return None
        _check_chunks_once(self.path, self._chunks_ok, ds, n, f"/{OBSERVABLES}/{path}/{what}")
        try:
            out = _read(ds, n, index)
        except _READ_ERRORS as exc:
            out = self._read_torn(ds, n, index)
            if out is None:
                raise JaxlogError(f"{self.path}: reading record {path!r} ({what}) failed: the file is damaged "
                                  f"({type(exc).__name__}: {exc})") from None
        if what == VALUE:
            out = decode(np.asarray(out), d.dtype_name)
        return out

    def _read_torn(self, ds: h5py.Dataset, n: int, index: Any) -> np.ndarray | None:
        """``values[:n][index]`` of a file whose writer was killed while it rewrote the last chunk
        (see ``h5safe.read_rows_unchecked``): every earlier chunk verified, that one read as it is.
        None where that does not explain the failure (the file was finished, an earlier chunk is
        damaged, the chunks are compressed)."""
        if not self._running or n <= 0 or ds.chunks is None:
            return None
        rows = ds.chunks[0]
        last = (ds.shape[0] - 1) // rows * rows  # the chunk the writer was rewriting
        if last >= n:
            return None
        try:
            head, tail = ds[:last], h5safe.read_rows_unchecked(ds, last, n)
        except _READ_ERRORS:
            return None
        if tail is None:
            return None
        whole = np.concatenate([head, tail])
        return whole if index is None else whole[index]


class PartsFrames(FrameSource):
    """Frames of a run over several processes, assembled from the blocks its part files hold
    (``parts.read_blocks``); times are step * dt."""

    def __init__(self, schema: Schema, parted: PartIndex):
        self.schema = schema
        self.parted = parted

    def read(self, path: str, what: str, index: Any) -> Any:
        return read_blocks(self.schema, self.parted, path, what, index)


class SystemFrames(FrameSource):
    """System ``system`` of a batched trajectory ``parent``: the parent's rows that hold its data,
    and in each, its entry along the leading axis (``take``: an index, or a ragged batch's slice)."""

    def __init__(self, parent: "Trajectory", system: int, take: dict[str, Any]):
        self.parent = parent
        self.system = system
        self.take = take
        self._rows_of: dict[str, np.ndarray] = {}

    def _rows(self, path: str) -> np.ndarray:
        """The parent's rows of leaf ``path`` that hold this system's data."""
        if path not in self._rows_of:
            keep = self.parent.live(path)[:, self.system]
            record = self.parent.schema[path].record
            flags = f"{WHEN}/{record.removeprefix(WHEN + '/')}"
            if flags in self.parent.schema:
                keep = keep & np.asarray(self.parent._values(flags, None), bool)[:, self.system]
            self._rows_of[path] = np.flatnonzero(keep)
        return self._rows_of[path]

    def read(self, path: str, what: str, index: Any) -> Any:
        first, rest = (index[0], index[1:]) if isinstance(index, tuple) else (index, ())
        rows = self._rows(path)
        sel = rows if first is None else rows[first]
        out = self.parent._source.read(path, what, sel)
        if what == VALUE:
            out = out[(slice(None),) * np.ndim(sel) + (self.take[path],)]
        return out[rest] if rest and out is not None else out


class Trajectory:
    """Recorded values, steps and times per record path, plus run status and provenance.

    ``traj["energy"]`` -> array [frames, ...]; ``traj["state"]`` (a prefix) -> nested dict;
    ``traj["x", 10:20]`` reads only frames 10..19. ``steps(name)``, ``time(name)``.
    """

    def __init__(self, schema: Schema, info: dict, *, path: Path | None = None, frames: Frames | None = None,
                 attachments: dict | None = None, source: "FrameSource | None" = None):
        self.schema = schema
        self._info = info
        self.path = path
        if source is None and frames is not None:
            source = MemoryFrames(frames)
        elif source is None:
            if path is None:
                raise JaxlogError("Trajectory(...): give the frames, or the path of the file they are read from")
            source = FileFrames(path, schema, info)
        self._source = source  # where the frames are read from (memory, a file, the parts of a run)
        self._attachments = attachments  # in memory; None for files
        self._attachment_impls: dict[str, dict[str, str]] = {}
        self._chunks_ok: set[tuple] = set()  # attachments whose chunk index was checked (file reads)

    # -- metadata ----------------------------------------------------------------------------
    @property
    def records(self) -> tuple[str, ...]:
        return self.schema.paths

    @property
    def status(self) -> str:
        return self._info.get(STATUS_ATTR, RUNNING)

    @property
    def steps_done(self) -> int:
        return int(self._info.get(STEPS_DONE_ATTR) or 0)

    @property
    def violation(self) -> dict | None:
        return self._info.get(VIOLATION_ATTR)

    @property
    def stop_reason(self) -> str | None:
        """Why the run stopped: ``until``, ``steps``, ``violation`` or ``interrupted`` (None for a
        file whose run did not say: a Recorder loop, a killed process, an older file)."""
        summary = self._info.get(SUMMARY_ATTR)
        return summary.get("stop_reason") if isinstance(summary, dict) else None

    @property
    def systems_done(self) -> np.ndarray | None:
        """Batched runs with ``until=``: the step at which each system finished."""
        summary = self._info.get(SUMMARY_ATTR)
        done = summary.get("systems_done") if isinstance(summary, dict) else None
        return None if done is None else np.asarray(done, dtype=np.int64)

    @property
    def finished_systems(self) -> dict | None:
        """Batched runs with ``until=``: what a finished system's rows hold after its stop, as the
        run wrote it: ``{"views": "frozen", "aux": "invalid", "step logs": "invalid", "invalid": {...}}``
        (views see the state at its stop; the step's aux and logs there are marked invalid: NaN
        for floats, the dtype's minimum or maximum for signed or unsigned ints, False for bools)."""
        summary = self._info.get(SUMMARY_ATTR)
        note = summary.get("finished_systems") if isinstance(summary, dict) else None
        return note if isinstance(note, dict) else None

    def live(self, name: str, index: Any = None) -> np.ndarray:
        """Whether each frame of record ``name`` holds each system's own data, ``[frames, systems]``:
        in a batched run with ``until=``, a system's rows at steps after its stop
        (``systems_done``) are not (see :attr:`finished_systems`); every row is otherwise."""
        steps = self.steps(name, index)
        done = self.systems_done
        if done is None:
            shape = self.schema[self.schema.resolve(name)[0]].shape
            n = self.schema.n_systems if self.schema.segments is not None else shape[0] if self.schema.batched else 1
            return np.ones((len(steps), n), bool)
        return np.asarray(steps)[:, None] <= done[None, :]

    @property
    def meta(self) -> dict:
        """The run's metadata, as ``jl.run(meta=...)`` gave it (``{}`` where none was given)."""
        return run_meta(self.description)

    @property
    def description(self) -> dict:
        """The run as its driver described it to the sinks (driver, steps, chunk, ...; its
        ``meta=`` under ``"run"``/``"meta"``), with the provenance."""
        return self._info.get(META_ATTR) or {}

    @property
    def provenance(self) -> dict:
        return self._info.get(PROVENANCE_ATTR) or self.description.get(PROVENANCE_ATTR) or {}

    @property
    def golden(self) -> dict:
        """What a golden file says of how it is checked (the comparison options ``check_golden``
        used) and the platform it was made on; empty for other files and older goldens."""
        return self._info.get(GOLDEN_ATTR) or {}

    @property
    def writer_error(self) -> str | None:
        return self._info.get(WRITER_ERROR_ATTR)

    @property
    def dt(self) -> float | None:
        return self.schema.dt

    def key_impl(self, name: str) -> str | None:
        """PRNG impl of a key-data record (``traj[name]`` holds uint32 key data), else None."""
        return self.schema[self._leaf(name)].key_impl

    def __contains__(self, name: str) -> bool:
        return any(p == name or p.startswith(name + "/") for p in self.schema.paths)

    def __len__(self) -> int:
        return len(self.schema.paths)

    def __iter__(self):
        return iter(self.schema.paths)

    def __repr__(self) -> str:
        where = str(self.path) if self.path is not None else "memory"
        return f"<Trajectory {where}: {len(self.records)} records, status={self.status}, steps_done={self.steps_done}>"

    # -- values ------------------------------------------------------------------------------
    def _leaf(self, name: str) -> str:
        paths = self.schema.resolve(name)
        if paths != (name,):
            raise JaxlogError(f"{name!r} is a group of records ({', '.join(paths)}); name one leaf")
        return name

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, tuple):
            if len(key) < 2 or not isinstance(key[0], str):
                raise JaxlogError("index a trajectory as traj[name] or traj[name, frames]")
            name, index = key[0], (key[1] if len(key) == 2 else key[1:])
        else:
            name, index = key, None
        if not isinstance(name, str):
            raise JaxlogError(f"record names are strings, got {name!r}")
        paths = self.schema.resolve(name)
        if paths == (name,):
            return self._values(name, index)
        return _nest({p: self._values(p, index) for p in paths}, name)

    def values(self, name: str, index: Any = None) -> Any:
        """``traj[name]``, or ``traj[name, index]``: ``index`` selects frames (positions in the
        record), not step numbers; :meth:`at` and :meth:`between` select by step."""
        return self[name] if index is None else self[name, index]

    def at(self, name: str, step: int) -> Any:
        """The value recorded at ``step``, with the record's own shape (a record taken once,
        ``jl.at(k)``, reads back as its value, not a stack of one frame)."""
        steps = self.steps(name)
        i = int(np.searchsorted(steps, step))
        if i >= len(steps) or steps[i] != step:
            raise JaxlogError(f"record {name!r} was not recorded at step {step} (recorded: {_steps_summary(steps)})")
        return self[name, i]

    def between(self, name: str, start: int, stop: int) -> Any:
        """The values recorded at steps ``start..stop`` (inclusive); their steps are
        ``traj.steps(name)`` in that range."""
        steps = self.steps(name)
        lo, hi = np.searchsorted(steps, start, side="left"), np.searchsorted(steps, stop, side="right")
        return self[name, slice(int(lo), int(hi))]

    def state(self, step: int, like: Any = None) -> Any:
        """The full state stored at ``step`` (a checkpoint, else a post-mortem state).

        With ``like`` (a state of the same structure, e.g. the kernel's initial state) it comes
        back as the kernel's own pytree: namedtuples, dataclasses (``flax.struct``/``chex``
        style included) and registered nodes, rebuilt from the stored key paths, with typed PRNG
        keys wrapped again; the types come from ``like``, never from the file (opening a file
        runs no code). Without ``like``: one array, or nested dicts of numpy arrays; a
        checkpointed state made of tuples and lists (and dicts, None) comes back as them, from the
        structure the checkpoint keeps (parsed, never evaluated).
        """
        for name in (CHECKPOINT, POSTMORTEM):  # one snapshot read, not every one stored
            snap = self.snapshot(name, step)
            if snap is not None:
                flat, impls = snap.arrays, snap.key_impls
                break
        else:
            stored = sorted(set(self.attachment_steps(CHECKPOINT)) | set(self.attachment_steps(POSTMORTEM)))
            raise JaxlogError(f"{self.path or 'trajectory'}: no state stored at step {step} "
                              f"(states stored at steps: {stored or 'none'})")
        meta = snap.arrays.get(CHECKPOINT_META)
        flat = {p: v for p, v in flat.items() if p == "state" or p.startswith("state/")}
        if like is None:
            like = _containers(meta)
        if like is None:
            return flat["state"] if "state" in flat else _nest(flat, "state")
        return _rebuild(flat, impls, like, where=f"the state at step {step}")

    def tree(self, name: str, like: Any) -> Any:
        """Record ``name`` as ``like``'s pytree (the view's output for one step: namedtuples,
        dataclasses, registered nodes, typed PRNG keys wrapped again), each leaf with a leading
        frame axis: a sampler's positions as the kernel's own type, as :meth:`state` rebuilds
        stored states. The types come from ``like``, never from the file."""
        paths = self.schema.resolve(name)
        flat = {p: self._values(p, None) for p in paths}
        impls = {p: self.schema[p].key_impl for p in paths if self.schema[p].key_impl is not None}
        return _rebuild(flat, impls, like, where=f"record {name!r}", prefix=name, frames=True)

    def system(self, i: int) -> "Trajectory":
        """System ``i``'s own trajectory in a batched run: every record's frames and steps where
        the row holds system ``i``'s data (``traj.system(i)["x"]``, ``.steps("x")``), without the
        system axis. Rows kept by a per-system ``when=`` for other systems only, and rows after
        system ``i`` stopped (``until=``), are not in it; a shared leaf is the same for every system.
        A ragged batch's (``segments=``): graph ``i``, a record of rows holding that graph's rows
        (``[frames, rows of graph i, ...]``), as the file's ``segments`` sizes say."""
        return SystemTrajectory(self, i)

    def steps(self, name: str, index: Any = None) -> np.ndarray:
        """Recorded step numbers of a record (for a group: its leaves must share them)."""
        paths = self.schema.resolve(name)
        out = self._steps(paths[0], index)
        for p in paths[1:]:
            other = self._steps(p, index)
            if not np.array_equal(other, out):
                raise JaxlogError(f"records under {name!r} have different steps; ask for one leaf")
        return out

    def time(self, name: str, index: Any = None) -> np.ndarray:
        """Times of a record's frames: step * dt, or the times they were given (``jl.from_arrays``)."""
        if self.schema.dt is None:
            raise JaxlogError(f"record {name!r} has no time: the run was not given dt=")
        paths = self.schema.resolve(name)
        times = self._source.read(paths[0], TIME, index)  # stored, or given (jl.from_arrays(time=...))
        if times is not None:
            return times
        return self.steps(name, index).astype(np.float64) * self.schema.dt

    def wrap_keys(self, name: str, index: Any = None):
        """A typed PRNG key array for a key record (imports jax)."""
        impl = self.key_impl(name)
        if impl is None:
            raise JaxlogError(f"record {name!r} is not a PRNG key record")
        return wrap_key_data(self._values(name, index), impl, f"{self.path or 'trajectory'}: record {name!r}")

    def _values(self, path: str, index: Any) -> np.ndarray:
        return self._source.read(path, VALUE, index)

    def _steps(self, path: str, index: Any) -> np.ndarray:
        return self._source.read(path, STEP, index)

    def _check_chunks(self, ds: h5py.Dataset, rows: int, where: str) -> None:
        _check_chunks_once(self.path, self._chunks_ok, ds, rows, where)

    # -- attachments -------------------------------------------------------------------------
    def attachment(self, name: str, *, skip_damaged: bool = False) -> dict[int, dict[str, np.ndarray]]:
        """Named snapshots: ``{step: {path: array}}`` (empty when none). ``skip_damaged``: leave out
        a snapshot that does not read (one a killed writer was writing) instead of raising."""
        return {snap.step: snap.arrays for snap in self.snapshots(name, skip_damaged=skip_damaged)}

    def snapshots(self, name: str, *, skip_damaged: bool = False) -> Iterator[Snapshot]:
        """Named snapshots one at a time, oldest first (the file opened once); ``skip_damaged``
        as in :meth:`attachment`."""
        if self._attachments is not None:
            for step in self.attachment_steps(name):
                yield self.snapshot(name, step)
            return
        with _reading(self.path) as f:
            root = _attachments_root(f, self.path, name)
            for step in [] if root is None else _steps_in(root, self.path, name):
                try:
                    snap = self._read_snapshot(root, name, step)
                except JaxlogError:
                    if not skip_damaged:
                        raise
                    continue
                yield snap

    def attachment_steps(self, name: str) -> list[int]:
        """The steps ``name`` has a snapshot at, oldest first (nothing of them is read)."""
        if self._attachments is not None:
            return sorted(self._attachments.get(name, {}))
        def read(f: h5py.File) -> list[int]:
            root = _attachments_root(f, self.path, name)
            return [] if root is None else _steps_in(root, self.path, name)

        return _committed_read(self.path, read)

    def snapshot(self, name: str, step: int) -> Snapshot | None:
        """The snapshot ``name`` at ``step`` (None when there is none), read and checked alone:
        a file of many checkpoints is not read whole to restore one."""
        if self._attachments is not None:
            arrays = self._attachments.get(name, {}).get(step)
            if arrays is None:
                return None
            impls = self._attachment_impls.get(name, {})
            return Snapshot(step, dict(arrays), {p: i for p, i in impls.items() if p in arrays})
        def read(f: h5py.File) -> Snapshot | None:
            root = _attachments_root(f, self.path, name)
            if root is None or str(step) not in root:
                return None
            return self._read_snapshot(root, name, step)

        return _committed_read(self.path, read)

    def _read_snapshot(self, root: Any, name: str, step: int) -> Snapshot:
        """One attachment group, read and checked."""
        where = f"/{JAXLOG}/{ATTACHMENTS}/{name}/{step}"
        try:
            g = h5safe.group(h5safe.child(root, str(step), self.path, where), self.path, where)
        except _READ_ERRORS as exc:
            raise JaxlogError(f"{self.path}: reading {where} failed: the file is damaged "
                              f"({type(exc).__name__}: {exc})") from None
        arrays: dict[str, np.ndarray] = {}
        impls: dict[str, str] = {}

        def visit(rel: str, ds: h5py.Dataset, where=where) -> None:
            dname = _attr_text(ds, DTYPE_ATTR, self.path, f"{where}/{rel}")
            impl = _attr_text(ds, KEY_IMPL_ATTR, self.path, f"{where}/{rel}")
            if impl is not None:
                impls[rel] = impl
            if ds.ndim:
                self._check_chunks(ds, ds.shape[0], f"{where}/{rel}")
            try:
                data = ds[()]
            except _READ_ERRORS as exc:
                raise JaxlogError(f"{self.path}: reading {where}/{rel} failed: the file is damaged "
                                  f"({type(exc).__name__}: {exc})") from None
            arrays[rel] = _decode_checked(np.asarray(data), dname, self.path, f"{where}/{rel}")

        try:
            h5safe.walk_datasets(g, self.path, where, visit)
        except _READ_ERRORS as exc:
            raise JaxlogError(f"{self.path}: reading {where} failed: the file is damaged "
                              f"({type(exc).__name__}: {exc})") from None
        return Snapshot(step, arrays, impls)

    def attachment_key_impls(self, name: str) -> dict[str, str]:
        """PRNG impl per attachment path whose array is key data, over all of ``name``'s snapshots."""
        if self._attachments is not None or self.path is None:
            return dict(self._attachment_impls.get(name, {}))
        return {p: impl for snap in self.snapshots(name) for p, impl in snap.key_impls.items()}

    @property
    def postmortem(self) -> dict[int, dict[str, np.ndarray]]:
        return self.attachment(POSTMORTEM)

    # -- conversions -------------------------------------------------------------------------
    def frames(self) -> Frames:
        """Everything as one ``Frames`` batch (reads the whole file)."""
        out = Frames()
        for path in self.records:
            out.add(path, self._steps(path, None), self._values(path, None))
        return out

    def save(self, path: str | os.PathLike, *, compression: str | None = "gzip", golden: dict | None = None,
             **writer_kwargs: Any) -> Path:
        """Write this trajectory as a new jaxlog HDF5 file (golden files); returns the path.

        Small files for version control: chunks sized to the data, and ``compression`` (gzip with
        shuffle by default; lossless, values read back bit for bit; None to store raw). ``golden``
        (JSON): how the file is checked as a golden, stored as ``/jaxlog`` attribute ``golden``.
        """
        frames = self.frames()
        writer_kwargs.setdefault("expected_frames", {p: len(s) for p, s in frames.steps.items()})
        writer = HDF5Writer(path, compression=compression, **writer_kwargs)
        meta = dict(self.description)
        meta.setdefault(PROVENANCE_ATTR, self.provenance)
        writer.open(self.schema, meta)
        try:
            writer.write(frames)
            names = {POSTMORTEM} if self._attachments is None else set(self._attachments)
            if self._attachments is None and self.path is not None:
                names = _committed_read(self.path, lambda f: _attachment_names(f, self.path))
            for name in sorted(names):
                for snap in self.snapshots(name):
                    writer.attach(name, snap.step, snap.arrays, key_impls=snap.key_impls)
        except BaseException:
            writer.close(FAILED, steps_done=self.steps_done)
            raise
        writer.close(self.status, steps_done=self.steps_done, violation=self.violation,
                     summary=self._info.get(SUMMARY_ATTR))
        if golden is not None:  # not covered by the checksum: a file written before it existed reads the same
            set_text_attr(Path(path), GOLDEN_ATTR, json_text(golden), durable=writer.durable)
        return Path(path)

    @classmethod
    def from_sink(cls, sink: Any) -> "Trajectory":
        """The in-memory trajectory of a ``MemorySink`` (a snapshot of what it holds now)."""
        if sink.schema is None:
            raise JaxlogError("MemorySink was never opened: nothing was recorded")
        meta = dict(sink.meta)
        info = {
            STATUS_ATTR: sink.status,
            STEPS_DONE_ATTR: sink.steps_done,
            VIOLATION_ATTR: sink.violation,
            SUMMARY_ATTR: sink.summary,
            META_ATTR: meta,
            PROVENANCE_ATTR: meta.get(PROVENANCE_ATTR),
        }
        traj = cls(sink.schema, info, frames=sink.frames(), attachments=dict(sink.attachments))
        traj._attachment_impls = {k: dict(v) for k, v in getattr(sink, "attachment_key_impls", {}).items()}
        return traj


def _open_checked(path: Path) -> h5py.File:
    """``_open`` with every failure (gone, replaced by junk, unreadable) as one JaxlogError."""
    try:
        return _open(path)
    except JaxlogError:
        raise
    except FileNotFoundError:
        raise JaxlogError(f"{path}: no such trajectory file") from None
    except (OSError, RuntimeError, ValueError) as exc:
        if "signature" in str(exc):
            raise JaxlogError(f"{path} is not a pytest-jaxlog trajectory: not an HDF5 file ({exc})") from None
        raise JaxlogError(f"{path}: cannot open the trajectory file ({exc})") from None


def _committed_read(path: Path, read: Callable[[h5py.File], _T]) -> _T:
    """``read(file)`` on the file as of one commit; again when a commit of a live writer started
    meanwhile (the journal's generation changed: what was read may mix two commits)."""
    for _ in range(_RACED_READS):
        before = journal.generation(path)
        try:
            with journal.reading(path), _reading(path) as f:
                out = read(f)
        except JaxlogError:
            if journal.generation(path) != before:
                continue
            raise
        if journal.generation(path) == before:
            return out
    raise JaxlogError(f"{path}: each of {_RACED_READS} reads overlapped a commit of its live writer; read it "
                      f"again later, or once its writer has closed it")


@contextlib.contextmanager
def _reading(path: Path):
    """The open file, with h5py's errors from reading a damaged one as one JaxlogError."""
    with _open_checked(path) as f:
        try:
            yield f
        except _READ_ERRORS as exc:
            raise JaxlogError(f"{path}: the file is damaged ({type(exc).__name__}: {exc})") from None


def _attachment_names(f: h5py.File, file: Path) -> set[str]:
    root = _attachments_root(f, file, None)
    return set(root) if root is not None else set()


def _steps_in(root: h5py.Group, file: Path, name: str) -> list[int]:
    """The steps of the snapshots under an attachment group (group names), sorted."""
    steps = []
    for step in root.keys():
        try:
            steps.append(int(step))
        except ValueError:
            raise JaxlogError(f"{file}: /jaxlog/attachments/{name}/{step}: attachment steps are integers, "
                              f"got {step!r}") from None
    return sorted(steps)


def _attachments_root(f: h5py.File, file: Path, name: str | None) -> h5py.Group | None:
    """/jaxlog/attachments (or its ``name`` group), through hard links; None when absent."""
    jl = h5safe.group(h5safe.child(f, JAXLOG, file, f"/{JAXLOG}"), file, f"/{JAXLOG}")
    root = h5safe.child(jl, ATTACHMENTS, file, f"/{JAXLOG}/{ATTACHMENTS}")
    if root is None:
        return None
    root = h5safe.group(root, file, f"/{JAXLOG}/{ATTACHMENTS}")
    if name is None:
        return root
    sub = h5safe.child(root, name, file, f"/{JAXLOG}/{ATTACHMENTS}/{name}")
    return None if sub is None else h5safe.group(sub, file, f"/{JAXLOG}/{ATTACHMENTS}/{name}")


def _decode_checked(stored: np.ndarray, dname: str | None, file: Path, where: str) -> np.ndarray:
    if stored.dtype.kind not in "biuf" and stored.dtype.kind != "c":
        raise JaxlogError(f"{file}: {where} holds {stored.dtype} data, not numbers")
    if dname is None:
        return stored
    try:
        dtype = check_leaf_dtype(where, dtype_from_name(dname))
    except JaxlogError as exc:
        raise JaxlogError(f"{file}: {where}: {exc}") from None
    if dtype.itemsize != stored.dtype.itemsize:
        raise JaxlogError(f"{file}: {where} is marked as {dname} but holds {stored.dtype} data")
    return stored.view(dtype)


def _schema_from_json(data: Any, file: Path) -> Schema:
    """The schema, after checking every field it is built from (the file may be hostile)."""
    where = f"{file}: /jaxlog attribute 'schema'"
    if not isinstance(data, dict) or not isinstance(data.get("leaves"), list):
        raise JaxlogError(f"{where} is not an object with a list of leaves")
    if not isinstance(data.get("batched", False), bool):
        raise JaxlogError(f"{where}: 'batched' must be true or false")
    dt = data.get("dt")
    if not is_dt(dt):
        raise JaxlogError(f"{where}: 'dt' must be a finite number or null, got {dt!r}")
    for i, leaf in enumerate(data["leaves"]):
        at = f"{where}, leaf {i}"
        if not isinstance(leaf, dict):
            raise JaxlogError(f"{at} is not an object")
        path, record = leaf.get("path"), leaf.get("record")
        if not is_record_path(path):
            raise JaxlogError(f"{at}: record path {path!r} is not a/b/c names")
        if not isinstance(record, str):
            raise JaxlogError(f"{at} ({path!r}): 'record' must be a string")
        shape = leaf.get("shape")
        if not isinstance(shape, list) or len(shape) >= MAX_RANK or not all(is_integer(n) and 0 <= n < MAX_SIZE for n in shape):
            raise JaxlogError(f"{at} ({path!r}): shape {shape!r} is not a list of sizes")
        dtype = leaf.get("dtype")
        if not isinstance(dtype, str):
            raise JaxlogError(f"{at} ({path!r}): dtype {dtype!r} is not a dtype name")
        try:
            check_leaf_dtype(path, dtype_from_name(dtype))
        except JaxlogError as exc:
            raise JaxlogError(f"{at}: {exc}") from None
        if leaf.get("key_impl") is not None and not isinstance(leaf.get("key_impl"), str):
            raise JaxlogError(f"{at} ({path!r}): 'key_impl' must be a string or null")
        try:
            schedule_from_json(leaf.get("schedule"))
        except JaxlogError as exc:
            raise JaxlogError(f"{at} ({path!r}): {exc}") from None
    try:
        return Schema.from_json(data)
    except JaxlogError as exc:
        raise JaxlogError(f"{where}: {exc}") from None
    except Exception as exc:  # noqa: BLE001  (checked above; anything left is still a bad file, said so)
        raise JaxlogError(f"{where} is malformed ({type(exc).__name__}: {exc})") from None


def _check_crc(jl: h5py.Group, texts: dict[str, str | None], file: Path) -> None:
    """The checksum of the JSON attributes (files from before it have none)."""
    try:
        if CRC_ATTR not in jl.attrs:
            return
        stored = jl.attrs[CRC_ATTR]
    except (*_READ_ERRORS, TypeError, ValueError) as exc:
        raise JaxlogError(f"{file}: cannot read attribute {CRC_ATTR!r} of /jaxlog ({exc})") from None
    stored = np.asarray(stored)
    if stored.shape != () or stored.dtype.kind not in "iu":
        raise JaxlogError(f"{file}: /jaxlog attribute {CRC_ATTR!r} is not a checksum")
    if int(stored) != json_crc32(texts):
        raise JaxlogError(f"{file}: the /jaxlog attributes do not match their checksum: the file is damaged or "
                          f"was edited")


def _read_info(jl: h5py.Group, file: Path) -> dict[str, Any]:
    """The /jaxlog attributes, decoded from JSON and checked for type."""
    info: dict[str, Any] = {}
    texts: dict[str, str | None] = {}
    missing = []
    for key in _REQUIRED + _OPTIONAL:
        if key == META_ATTR:  # holds the run's meta=, free text: bounded before it is read
            h5safe.check_attr_size(jl, key, READ_MAX_BYTES, file, f"/{JAXLOG}")
        raw = texts[key] = _attr_text(jl, key, file, f"/{JAXLOG}")
        if raw is None:
            if key in _REQUIRED:
                missing.append(key)
            continue
        try:
            info[key] = json.loads(raw)
        except (ValueError, RecursionError):
            raise JaxlogError(f"{file}: /jaxlog attribute {key!r} is not JSON") from None
    if missing:
        raise JaxlogError(f"{file} is not a pytest-jaxlog trajectory: /jaxlog lacks {', '.join(missing)}")
    version = info[FORMAT_VERSION_ATTR]
    if not is_integer(version) or version < 1:
        raise JaxlogError(f"{file}: /jaxlog attribute 'format_version' is {version!r}, not a version number")
    if version > FORMAT_VERSION:
        raise JaxlogError(
            f"{file} was written by a newer pytest-jaxlog (format version {version}; this version reads "
            f"<= {FORMAT_VERSION}): upgrade pytest-jaxlog to read it"
        )
    _check_crc(jl, texts, file)
    if info[STATUS_ATTR] not in STATUSES:
        raise JaxlogError(f"{file}: /jaxlog attribute 'status' is {info[STATUS_ATTR]!r}; expected one of "
                          f"{', '.join(STATUSES)}")
    if not is_integer(info[STEPS_DONE_ATTR]) or not 0 <= info[STEPS_DONE_ATTR] < 2**63:
        raise JaxlogError(f"{file}: /jaxlog attribute 'steps_done' is {info[STEPS_DONE_ATTR]!r}, not a step number")
    for key in (PROVENANCE_ATTR, META_ATTR, VIOLATION_ATTR, SUMMARY_ATTR, GOLDEN_ATTR):
        if info.get(key) is not None and not isinstance(info[key], dict):
            raise JaxlogError(f"{file}: /jaxlog attribute {key!r} must be an object or null")
    described = described_run(info.get(META_ATTR) or {}) or {}
    if not isinstance(described.get("meta", {}), dict):
        raise JaxlogError(f"{file}: /jaxlog attribute 'meta' holds the run's meta= as {type(described['meta']).__name__}, "
                          f"not an object")
    summary = info.get(SUMMARY_ATTR) or {}
    if summary.get("stop_reason") not in (None, "until", "steps", "violation", "interrupted"):
        raise JaxlogError(f"{file}: /jaxlog summary's stop_reason is {summary.get('stop_reason')!r}")
    done = summary.get("systems_done")
    if done is not None and not (isinstance(done, list) and all(is_integer(d) and d >= 0 for d in done)):
        raise JaxlogError(f"{file}: /jaxlog summary's systems_done is not a list of step numbers")
    if summary.get("finished_systems") is not None and not isinstance(summary["finished_systems"], dict):
        raise JaxlogError(f"{file}: /jaxlog summary's finished_systems must be an object or null")
    if info.get(WRITER_ERROR_ATTR) is not None and not isinstance(info[WRITER_ERROR_ATTR], str):
        raise JaxlogError(f"{file}: /jaxlog attribute 'writer_error' must be a string or null")
    return info


class PartedTrajectory(Trajectory):
    """One trajectory over the part files a multi-process index names (``parts.read_index``)."""

    def __init__(self, schema: Schema, info: dict, *, path: Path, parted: PartIndex):
        super().__init__(schema, info, path=path, source=PartsFrames(schema, parted))
        self.parts = parted.files


def load(path: str | os.PathLike, *, part_of: Path | None = None) -> Trajectory:
    """Open a pytest-jaxlog HDF5 trajectory (values are read lazily, on access).

    The file may be hostile: nothing outside it is read, and anything malformed is a
    ``JaxlogError`` naming the file and the problem. ``part_of``: the index of a run over several
    processes this file is a part of (a part that is an index itself is refused, not followed)."""
    path = Path(path)
    if not path.exists():
        raise JaxlogError(f"{path}: no such trajectory file")
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.h5"))[:5]
        hint = f" (trajectory files in it: {', '.join(inside)})" if inside else ""
        raise JaxlogError(f"{path} is a directory, not a trajectory file{hint}")
    return _committed_read(path, lambda f: _load_from(f, path, part_of))


def _load_from(f: h5py.File, path: Path, part_of: Path | None) -> Trajectory:
    """``load``'s reading of the open file (again if a live writer's commit overlapped it)."""
    try:
        jl = h5safe.child(f, JAXLOG, path, f"/{JAXLOG}")
        if jl is None:
            try:
                top = ", ".join(f.keys()) or "(none)"
            except (*_READ_ERRORS, ValueError):
                top = "unreadable"
            raise JaxlogError(f"{path} is not a pytest-jaxlog trajectory: it has no /jaxlog group "
                              f"(top-level groups: {top})")
        jl = h5safe.group(jl, path, f"/{JAXLOG}")
        info = _read_info(jl, path)
        schema = _schema_from_json(info[SCHEMA_ATTR], path)
        if info.get(PARTS_ATTR) is not None:  # the index of a run over several processes: data in the parts
            if part_of is not None:
                raise invalid_index(part_of, f"part file {path.name} is itself an index")
            parted = read_index(path, schema, info, load_part=lambda f: load(f, part_of=path))
            return PartedTrajectory(schema, info, path=path, parted=parted)
        obs = h5safe.child(f, OBSERVABLES, path, f"/{OBSERVABLES}")
        absent = [p for p in schema.paths if obs is None or h5safe.get(
            h5safe.group(obs, path, f"/{OBSERVABLES}"), p, path, f"/{OBSERVABLES}") is None]
        if absent:
            raise JaxlogError(f"{path}: records {absent} are in the schema but not under /observables")
        source = FileFrames(path, schema, info)
        source.lengths(f)  # every record's datasets, checked against the schema
        traj = Trajectory(schema, info, path=path, source=source)
    except _READ_ERRORS as exc:  # a damaged object header, heap or B-tree
        raise JaxlogError(f"{path}: the file is damaged ({type(exc).__name__}: {exc})") from None
    return traj

# One system of a batched trajectory, read as a trajectory of its own (``traj.system(i)``): a
# batched run records one row per step for all systems together; a row holds system ``i``'s data
# unless ``until=`` had stopped it before (``traj.live``) or a per-system ``when=`` kept the row for
# other systems only (its flags are recorded as ``"when/<record>"``). So a chain's accepted samples
# read back as that chain's own sequence. Reads stay lazy: only the rows of system ``i`` are read.


def _picked_shape(shape: tuple[int, ...], take: Any) -> tuple[int, ...]:
    """A leaf's per-frame shape once one system is taken along its leading axis (``take``: an
    index, or a slice of a ragged batch's rows)."""
    return tuple(shape[1:]) if not isinstance(take, slice) else (take.stop - take.start, *shape[1:])


class SystemTrajectory(Trajectory):
    """System ``system`` of ``parent``: its leaves without the system axis, its rows only. The
    stored states (checkpoints, post-mortem) are the whole batch's: read them from the parent."""

    def __init__(self, parent: Trajectory, system: int):
        n = parent.schema.n_systems
        if n is None:
            raise JaxlogError(f"{parent.path or 'the trajectory'} is not of a batched run: it has no systems "
                              f"(traj.system(i) reads one system of a run with batched=True)")
        if not is_integer(system) or not -n <= system < n:
            raise JaxlogError(f"traj.system({system!r}): the run has {n} systems (0..{n - 1})")
        self.parent, self.system_index = parent, int(system) % n
        take: dict[str, Any] = {leaf.path: self._axis_pick(leaf) for leaf in parent.schema.leaves}
        leaves = tuple(dataclasses.replace(leaf, shape=_picked_shape(leaf.shape, take[leaf.path]))
                       for leaf in parent.schema.leaves)
        super().__init__(Schema(leaves, batched=False, dt=parent.schema.dt), parent._info, path=parent.path,
                         attachments={}, source=SystemFrames(parent, self.system_index, take))

    def _axis_pick(self, leaf: Any) -> Any:
        """What this system is along ``leaf``'s leading axis: its index, or in a ragged batch's
        record of rows the slice of its graph's rows (graphs are stored in order, their sizes in
        the schema's ``segments``)."""
        schema = self.parent.schema
        if schema.segments is None or not schema.by_rows(leaf):
            return self.system_index
        start = sum(schema.segments[:self.system_index])
        return slice(start, start + schema.segments[self.system_index])

    @property
    def steps_done(self) -> int:
        done = self.parent.systems_done
        return int(done[self.system_index]) if done is not None else self.parent.steps_done

    def live(self, name: str, index: Any = None) -> np.ndarray:
        return np.ones((len(self.steps(name, index)), 1), bool)

    def __repr__(self) -> str:
        return f"<system {self.system_index} of {self.parent!r}>"


# ---------------------------------------------------------------------------------------------
# A trajectory as a ``.npz`` (``jaxlog export TRAJ.h5 --npz OUT.npz``): each record's values,
# steps and times as plain arrays, for tools that read numpy and not HDF5.
#
# Keys are the record paths in three namespaces, ``values/<path>``, ``steps/<path>`` and
# ``times/<path>`` (times only where the run has a dt), so no record's name can collide with
# another's steps: ``np.load(out)["values/energy"]`` is ``jl.load(traj)["energy"]``.

def npz_arrays(traj: Any, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """``{"values/<path>": ..., "steps/<path>": ..., "times/<path>": ...}`` for the leaf paths
    ``names`` stands for (leaves or prefixes; default every record), read from ``traj``."""
    paths = traj.records if not names else tuple(dict.fromkeys(p for n in names for p in traj.schema.resolve(n)))
    out: dict[str, np.ndarray] = {}
    for path in paths:
        out[f"values/{path}"] = np.asarray(traj[path])
        out[f"steps/{path}"] = np.asarray(traj.steps(path))
        if traj.dt is not None:
            out[f"times/{path}"] = np.asarray(traj.time(path))
    return out


def export_npz(traj: Any, out: str | os.PathLike, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Write :func:`npz_arrays` to ``out`` (exactly that name: numpy would add ``.npz`` to a
    name without it), whole or not at all: written beside it and renamed into place."""
    out = Path(out)
    if out.is_dir():
        raise JaxlogError(f"{out} is a directory; name the .npz file to write, e.g. {out / 'trajectory.npz'}")
    if not out.parent.is_dir():
        raise JaxlogError(f"cannot write {out}: directory {out.parent} does not exist")
    arrays = npz_arrays(traj, names)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise JaxlogError(f"writing {out} failed: {exc}") from None
    return arrays
