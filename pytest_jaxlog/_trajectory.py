"""Reading trajectories: one interface for files (``jl.load``) and memory (``run.trajectory``).

File reads are lazy: ``traj["x", 10:20]`` reads those 10 frames from disk, nothing else.
The file is opened per read (no handle kept), so a trajectory object never pins a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ._dtypes import DTYPE_ATTR, KEY_IMPL_ATTR, decode
from ._errors import JaxlogError
from ._frames import FORMAT_VERSION, Frames, Schema

_REQUIRED = ("format_version", "schema", "status", "steps_done")


def _open(path: Path) -> h5py.File:
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
    """``values[:n][index]`` with numpy's semantics, reading only the frames ``index`` selects.

    The frame-axis part of ``index`` (an int, a slice, an int/bool array) is read from disk as a
    block; the whole index is then applied to that block with the frame part remapped into it,
    so trailing indices (``traj["x", 2:4, 1]``), several advanced indices broadcasting together,
    and out-of-range errors behave exactly as on the in-memory array. Anything else on the frame
    axis (``...``, ``None``) reads the ``n`` frames and lets numpy index them."""
    if index is None:
        return ds[:n] if n else ds[:0]
    if isinstance(index, tuple):
        first, rest = (index[0], index[1:]) if index else (slice(None), ())
    else:
        first, rest = index, ()
    if 0 in ds.shape[1:]:  # h5py cannot select in zero-size dataspaces; nothing to read anyway
        return np.empty((n, *ds.shape[1:]), dtype=ds.dtype)[index]
    if first is Ellipsis or first is None:
        return (ds[:n] if n else ds[:0])[index]
    if isinstance(first, (int, np.integer)) and not isinstance(first, (bool, np.bool_)):
        i = int(first)
        if not -n <= i < n:
            raise IndexError(f"frame index {i} out of range for {n} frames")
        block, local = ds[i % n : i % n + 1], 0
    elif isinstance(first, slice):
        start, stop, step = first.indices(n)
        if step > 0:
            block = ds[start:stop:step] if stop > start else ds[0:0]
        else:
            idx = np.arange(start, stop, step)
            block = ds[idx[::-1]][::-1] if len(idx) else ds[0:0]
        local = slice(None)
    else:
        arr = np.asarray(first)
        if arr.dtype == np.bool_:
            if arr.ndim != 1:  # a multi-axis mask spans more than the frame axis: let numpy do it
                return (ds[:n] if n else ds[:0])[index]
            if len(arr) != n:
                raise IndexError(f"boolean frame index of length {len(arr)} for {n} frames")
            arr = np.flatnonzero(arr)
        idx = np.arange(n)[arr]  # IndexError for out-of-range entries, like numpy
        uniq, inverse = np.unique(idx, return_inverse=True)
        block = ds[uniq] if len(uniq) else ds[0:0]
        local = inverse.reshape(idx.shape)
    return np.asarray(block)[(local, *rest)]


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


class Trajectory:
    """Recorded values, steps and times per record path, plus run status and provenance.

    ``traj["energy"]`` -> array [frames, ...]; ``traj["state"]`` (a prefix) -> nested dict;
    ``traj["x", 10:20]`` reads only frames 10..19. ``steps(name)``, ``time(name)``.
    """

    def __init__(self, schema: Schema, info: dict, *, path: Path | None = None, frames: Frames | None = None,
                 attachments: dict | None = None):
        self.schema = schema
        self._info = info
        self.path = path
        self._frames = frames  # in memory; None for files
        self._attachments = attachments  # in memory; None for files
        self._lengths: dict[str, int] | None = None
        self._attachment_impls: dict[str, dict[str, str]] = {}

    # -- metadata ----------------------------------------------------------------------------
    @property
    def records(self) -> tuple[str, ...]:
        return self.schema.paths

    @property
    def status(self) -> str:
        return self._info.get("status", "running")

    @property
    def steps_done(self) -> int:
        return int(self._info.get("steps_done") or 0)

    @property
    def violation(self) -> dict | None:
        return self._info.get("violation")

    @property
    def meta(self) -> dict:
        return self._info.get("meta") or {}

    @property
    def provenance(self) -> dict:
        return self._info.get("provenance") or self.meta.get("provenance") or {}

    @property
    def writer_error(self) -> str | None:
        return self._info.get("writer_error")

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
        return self[name] if index is None else self[name, index]

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
        """Times of a record's frames (step * dt)."""
        if self.schema.dt is None:
            raise JaxlogError(f"record {name!r} has no time: the run was not given dt=")
        paths = self.schema.resolve(name)
        if self._frames is None:
            times = self._file_read(paths[0], "time", index)
            if times is not None:
                return times
        return self.steps(name, index).astype(np.float64) * self.schema.dt

    def wrap_keys(self, name: str, index: Any = None):
        """A typed PRNG key array for a key record (imports jax)."""
        impl = self.key_impl(name)
        if impl is None:
            raise JaxlogError(f"record {name!r} is not a PRNG key record")
        import jax

        return jax.random.wrap_key_data(self._values(name, index), impl=impl)

    def _values(self, path: str, index: Any) -> np.ndarray:
        if self._frames is not None:
            values = self._frames.values[path]
            return values if index is None else values[index]
        return self._file_read(path, "value", index)

    def _steps(self, path: str, index: Any) -> np.ndarray:
        if self._frames is not None:
            steps = self._frames.steps[path]
            return steps if index is None else steps[index]
        return self._file_read(path, "step", index)

    def _file_lengths(self, f: h5py.File) -> dict[str, int]:
        """Frames per record: the shortest of step/value(/time), so a killed writer's half-appended batch
        is not shown."""
        if self._lengths is None or self.status == "running":
            lengths = {}
            for path in self.schema.paths:
                g = f["observables"][path]
                lengths[path] = min(g[k].shape[0] for k in ("step", "value", "time") if k in g)
            self._lengths = lengths
        return self._lengths

    def _file_read(self, path: str, what: str, index: Any) -> np.ndarray | None:
        with _open(self.path) as f:
            n = self._file_lengths(f)[path]
            g = f["observables"][path]
            if what not in g:
                return None
            ds = g[what]
            out = _read(ds, n, index)
            if what == "value":
                out = decode(np.asarray(out), ds.attrs.get(DTYPE_ATTR))
            return out

    # -- attachments -------------------------------------------------------------------------
    def attachment(self, name: str) -> dict[int, dict[str, np.ndarray]]:
        """Named snapshots: ``{step: {path: array}}`` (empty when none)."""
        if self._attachments is not None:
            return {k: dict(v) for k, v in self._attachments.get(name, {}).items()}
        out: dict[int, dict[str, np.ndarray]] = {}
        with _open(self.path) as f:
            root = f.get("jaxlog/attachments")
            if root is None or name not in root:
                return out
            for step, g in root[name].items():
                arrays: dict[str, np.ndarray] = {}

                def visit(rel: str, obj: Any) -> None:
                    if isinstance(obj, h5py.Dataset):
                        arrays[rel] = decode(obj[()], obj.attrs.get(DTYPE_ATTR))

                g.visititems(visit)
                out[int(step)] = arrays
        return dict(sorted(out.items()))

    def attachment_key_impls(self, name: str) -> dict[str, str]:
        """PRNG impl per attachment path whose array is key data."""
        if self._attachments is not None or self.path is None:
            return dict(self._attachment_impls.get(name, {}))
        out: dict[str, str] = {}
        with _open(self.path) as f:
            root = f.get(f"jaxlog/attachments/{name}")
            if root is None:
                return out
            for g in root.values():
                g.visititems(lambda rel, obj: out.__setitem__(rel, obj.attrs[KEY_IMPL_ATTR])
                             if isinstance(obj, h5py.Dataset) and KEY_IMPL_ATTR in obj.attrs else None)
        return out

    @property
    def postmortem(self) -> dict[int, dict[str, np.ndarray]]:
        return self.attachment("postmortem")

    # -- conversions -------------------------------------------------------------------------
    def frames(self) -> Frames:
        """Everything as one ``Frames`` batch (reads the whole file)."""
        out = Frames()
        for path in self.records:
            out.add(path, self._steps(path, None), self._values(path, None))
        return out

    def save(self, path: str | os.PathLike, *, compression: str | None = "gzip", **writer_kwargs: Any) -> Path:
        """Write this trajectory as a new jaxlog HDF5 file (golden files); returns the path.

        Small files for version control: chunks sized to the data, and ``compression`` (gzip with
        shuffle by default; lossless, values read back bit for bit; None to store raw).
        """
        from ._hdf5 import HDF5Writer

        frames = self.frames()
        writer_kwargs.setdefault("expected_frames", {p: len(s) for p, s in frames.steps.items()})
        writer = HDF5Writer(path, compression=compression, **writer_kwargs)
        meta = dict(self.meta)
        meta.setdefault("provenance", self.provenance)
        writer.open(self.schema, meta)
        try:
            writer.write(frames)
            names = {"postmortem"} if self._attachments is None else set(self._attachments)
            if self._attachments is None and self.path is not None:
                with _open(self.path) as f:
                    root = f.get("jaxlog/attachments")
                    names = set(root) if root is not None else set()
            for name in sorted(names):
                impls = self.attachment_key_impls(name)
                for step, tree in self.attachment(name).items():
                    writer.attach(name, step, tree, key_impls=impls)
        except BaseException:
            writer.close("failed", steps_done=self.steps_done)
            raise
        writer.close(self.status, steps_done=self.steps_done, violation=self.violation)
        return Path(path)

    @classmethod
    def from_sink(cls, sink: Any) -> "Trajectory":
        """The in-memory trajectory of a ``MemorySink`` (a snapshot of what it holds now)."""
        if sink.schema is None:
            raise JaxlogError("MemorySink was never opened: nothing was recorded")
        meta = dict(sink.meta)
        info = {
            "status": sink.status,
            "steps_done": sink.steps_done,
            "violation": sink.violation,
            "meta": meta,
            "provenance": meta.get("provenance"),
        }
        traj = cls(sink.schema, info, frames=sink.frames(), attachments=dict(sink.attachments))
        traj._attachment_impls = {k: dict(v) for k, v in getattr(sink, "attachment_key_impls", {}).items()}
        return traj


def load(path: str | os.PathLike) -> Trajectory:
    """Open a pytest-jaxlog HDF5 trajectory (values are read lazily, on access)."""
    path = Path(path)
    if not path.exists():
        raise JaxlogError(f"{path}: no such trajectory file")
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.h5"))[:5]
        hint = f" (trajectory files in it: {', '.join(inside)})" if inside else ""
        raise JaxlogError(f"{path} is a directory, not a trajectory file{hint}")
    try:
        f = _open(path)
    except OSError as exc:
        if "signature" in str(exc):
            raise JaxlogError(f"{path} is not a pytest-jaxlog trajectory: not an HDF5 file ({exc})") from None
        raise JaxlogError(f"{path}: cannot open the trajectory file ({exc})") from None
    with f:
        if "jaxlog" not in f:
            raise JaxlogError(
                f"{path} is not a pytest-jaxlog trajectory: it has no /jaxlog group "
                f"(top-level groups: {', '.join(f.keys()) or '(none)'})"
            )
        attrs = f["jaxlog"].attrs
        missing = [k for k in _REQUIRED if k not in attrs]
        if missing:
            raise JaxlogError(f"{path} is not a pytest-jaxlog trajectory: /jaxlog lacks {', '.join(missing)}")
        info: dict[str, Any] = {}
        for key, raw in attrs.items():
            if isinstance(raw, bytes):
                raw = raw.decode()
            try:
                info[key] = json.loads(raw) if isinstance(raw, str) else raw
            except ValueError:
                raise JaxlogError(f"{path}: /jaxlog attribute {key!r} is not JSON") from None
        version = info["format_version"]
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise JaxlogError(
                f"{path} was written by a newer pytest-jaxlog (format version {version}; this version reads "
                f"<= {FORMAT_VERSION}): upgrade pytest-jaxlog to read it"
            )
        schema = Schema.from_json(info["schema"])
        if "observables" not in f or any(p not in f["observables"] for p in schema.paths):
            absent = [p for p in schema.paths if "observables" not in f or p not in f["observables"]]
            raise JaxlogError(f"{path}: records {absent} are in the schema but not under /observables")
    return Trajectory(schema, info, path=path)
