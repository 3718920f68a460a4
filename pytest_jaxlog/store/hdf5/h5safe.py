"""Reading a file that may be hostile: only what is inside the file is read.

HDF5 silently follows external links into other files, reads a dataset's raw data from other
files (external storage) and assembles virtual datasets from other files' data, all on plain
access: a crafted ``.h5`` from a CI artifact could hand back ``/etc/passwd`` as record values.
So the reader reaches every object through hard links only (a soft link may lead through an
external one), and takes only datasets whose data lives in the file (contiguous, chunked or
compact layout, no external storage). Anything else is a ``JaxlogError`` naming the object.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, NamedTuple

import h5py
import numpy as np

from ...errors import JaxlogError

_MAX_DEPTH = 64  # nested groups walked under an attachment (a file could nest without end)


def _link_kind(group: h5py.Group, name: str) -> int | None:
    try:
        return group.id.links.get_info(name.encode()).type
    except (KeyError, RuntimeError):  # h5py: "name doesn't exist"
        return None


def _describe_link(group: h5py.Group, name: str) -> str:
    try:
        link = group.get(name, getlink=True)
    except Exception:  # noqa: BLE001  (only for the message: an unreadable link is described as such)
        return "a link of an unknown type"
    if isinstance(link, h5py.ExternalLink):
        return f"an external link to {link.path!r} in file {link.filename!r}"
    if isinstance(link, h5py.SoftLink):
        return f"a soft link to {link.path!r}"
    return "a user-defined link"


def child(group: h5py.Group, name: str, file: Path, where: str) -> Any | None:
    """``group[name]`` (one path component) through a hard link only; None if there is no such link."""
    if not name or name in (".", "..") or "/" in name:
        raise JaxlogError(f"{file}: {where}: {name!r} is not a valid object name")
    kind = _link_kind(group, name)
    if kind is None:
        return None
    if kind != h5py.h5l.TYPE_HARD:
        raise JaxlogError(f"{file}: {where} is {_describe_link(group, name)}; pytest-jaxlog reads nothing "
                          f"outside the file and follows hard links only")
    try:
        return group[name]
    except (KeyError, OSError, RuntimeError, ValueError) as exc:
        raise JaxlogError(f"{file}: cannot open {where} ({exc})") from None


def get(group: h5py.Group, path: str, file: Path, where: str) -> Any | None:
    """``group[path]`` for a relative ``a/b/c`` path, each step through a hard link."""
    obj = group
    done = where.rstrip("/")
    for part in path.split("/"):
        done = f"{done}/{part}"
        if not isinstance(obj, h5py.Group):
            raise JaxlogError(f"{file}: {done.rsplit('/', 1)[0]} is a dataset where a group was expected")
        obj = child(obj, part, file, done)
        if obj is None:
            return None
    return obj


def group(obj: Any, file: Path, where: str) -> h5py.Group:
    if not isinstance(obj, h5py.Group):
        raise JaxlogError(f"{file}: {where} is {'missing' if obj is None else 'not a group'}")
    return obj


def dataset(obj: Any, file: Path, where: str) -> h5py.Dataset:
    """A dataset whose data is inside the file."""
    if not isinstance(obj, h5py.Dataset):
        raise JaxlogError(f"{file}: {where} is {'missing' if obj is None else 'not a dataset'}")
    try:
        dcpl = obj.id.get_create_plist()
        layout = dcpl.get_layout()
        external = dcpl.get_external_count()
    except (OSError, RuntimeError, ValueError) as exc:
        raise JaxlogError(f"{file}: cannot read the layout of {where} ({exc})") from None
    if layout == h5py.h5d.VIRTUAL:
        raise JaxlogError(f"{file}: {where} is a virtual dataset (its data comes from other files); "
                          f"pytest-jaxlog reads nothing outside the file")
    if external:
        try:
            target = dcpl.get_external(0)[0].decode(errors="replace")
        except Exception:  # noqa: BLE001  (only for the message)
            target = "?"
        raise JaxlogError(f"{file}: {where} keeps its data in external file {target!r}; pytest-jaxlog reads "
                          f"nothing outside the file")
    if layout not in (h5py.h5d.COMPACT, h5py.h5d.CONTIGUOUS, h5py.h5d.CHUNKED):
        raise JaxlogError(f"{file}: {where} has an unknown storage layout ({layout})")
    if obj.shape is None:
        raise JaxlogError(f"{file}: {where} has an empty (null) dataspace")
    return obj


def walk_datasets(root: h5py.Group, file: Path, where: str, visit: Callable[[str, h5py.Dataset], None]) -> None:
    """``visit(relative path, dataset)`` for every dataset under ``root``, through hard links,
    each object once (hard links may form cycles), in name order."""
    seen: set[tuple[int, int]] = set()

    def walk(g: h5py.Group, rel: str, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise JaxlogError(f"{file}: {where}/{rel} nests groups more than {_MAX_DEPTH} deep")
        try:
            info = h5py.h5o.get_info(g.id)
            names = sorted(g.keys())
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            raise JaxlogError(f"{file}: cannot read {where}/{rel} ({exc})") from None
        key = (info.fileno, info.addr)
        if key in seen:
            return
        seen.add(key)
        for name in names:
            sub = f"{rel}/{name}" if rel else name
            obj = child(g, name, file, f"{where}/{sub}")
            if isinstance(obj, h5py.Group):
                walk(obj, sub, depth + 1)
            elif obj is not None:
                visit(sub, dataset(obj, file, f"{where}/{sub}"))

    walk(root, "", 0)


def _check_contiguous(ds: h5py.Dataset, rows: int, file: Path, where: str) -> None:
    """Rows ``[0, rows)`` of an unchunked dataset are stored in the file: a dataset declaring
    more rows than it stores (nothing allocated, say a billion of them) would otherwise read as
    fill values, an allocation as large as it declares."""
    row_bytes = int(np.prod(ds.shape[1:], dtype=np.int64)) * ds.dtype.itemsize
    try:
        stored = ds.id.get_storage_size()
        end = ds.file.id.get_filesize()
    except (OSError, RuntimeError, ValueError) as exc:
        raise JaxlogError(f"{file}: cannot read the storage of {where} ({exc})") from None
    if stored < rows * row_bytes or stored > end:
        raise JaxlogError(f"{file}: {where} declares {rows} frames ({rows * row_bytes} bytes) but stores "
                          f"{stored} bytes in a file of {end}; the file is damaged")


def check_chunks(ds: h5py.Dataset, rows: int, file: Path, where: str) -> None:
    """The chunk index of ``ds`` agrees with its shape for rows ``[0, rows)``: each chunk there is
    present once, on the chunk grid, with all its filters applied.

    Why: files of this format index chunks with version 1 B-trees, which carry no checksum. A
    damaged key can mark a chunk's filters as skipped (its Fletcher-32 checksum is then not
    verified and compressed bytes come back as values) or move a chunk to another position."""
    chunks = ds.chunks
    shape = ds.shape
    if rows <= 0 or 0 in shape[1:]:
        return
    if chunks is None:
        _check_contiguous(ds, rows, file, where)
        return
    found: list = []
    try:
        ds.id.chunk_iter(found.append)
    except (OSError, RuntimeError, ValueError) as exc:
        raise JaxlogError(f"{file}: cannot read the chunk index of {where} ({exc})") from None
    per_row = 1
    for n, c in zip(shape[1:], chunks[1:]):
        per_row *= -(-n // c)
    try:
        end = ds.file.id.get_filesize()
        dcpl = ds.id.get_create_plist()
        filters = [dcpl.get_filter(i) for i in range(dcpl.get_nfilters())]
    except (OSError, RuntimeError, ValueError) as exc:
        raise JaxlogError(f"{file}: cannot read the size or filters of {where} ({exc})") from None
    # A compression filter may be skipped for a chunk it would not shrink (HDF5 then stores it
    # raw); a checksum or any required filter never is.
    may_skip = 0
    raw = int(np.prod(chunks, dtype=np.int64)) * ds.dtype.itemsize
    for i, (code, flags, _, _) in enumerate(filters):
        if code == h5py.h5z.FILTER_FLETCHER32:
            raw += 4
        elif flags & h5py.h5z.FLAG_OPTIONAL:
            may_skip |= 1 << i
    seen = set()
    for info in found:
        off = tuple(info.chunk_offset)
        if info.filter_mask & ~may_skip or info.filter_mask and info.size != raw:
            raise JaxlogError(f"{file}: {where}: the chunk at {off} is marked as skipping filters; the file is damaged")
        if not 0 < info.size or info.byte_offset + info.size > end:
            raise JaxlogError(f"{file}: {where}: the chunk at {off} lies outside the file ({info.size} bytes at "
                              f"{info.byte_offset}, the file has {end}); the file is damaged")
        if len(off) != len(shape) or any(o % c or not 0 <= o < max(s, 1) for o, c, s in zip(off, chunks, shape)) \
                or off in seen:
            raise JaxlogError(f"{file}: {where}: the chunk index lists a chunk at {off}, which does not fit the "
                              f"dataset's shape {shape} and chunks {chunks}; the file is damaged")
        seen.add(off)
    need = -(-rows // chunks[0]) * per_row
    have = sum(1 for off in seen if off[0] < rows)
    if have != need:
        raise JaxlogError(f"{file}: {where}: {need - have} of the chunks holding its {rows} frames are missing "
                          f"from the chunk index; the file is damaged")


def read_rows_unchecked(ds: h5py.Dataset, start: int, stop: int) -> np.ndarray | None:
    """Rows ``[start, stop)`` of the row block of chunks that begins at ``start``, read from the
    stored chunks without verifying their Fletcher-32 checksums; None where the chunks hold more
    than the values and their checksum (another filter) or are missing.

    Why: the writer rewrites the partly filled last chunk at each flush. A process killed inside
    that write leaves the chunk torn: the rows it held before were rewritten with the same bytes,
    but its checksum no longer matches. Only that chunk of a file whose writer never finished is
    read this way (see ``Trajectory``)."""
    chunks, shape = ds.chunks, ds.shape
    dcpl = ds.id.get_create_plist()
    if [dcpl.get_filter(i)[0] for i in range(dcpl.get_nfilters())] != [h5py.h5z.FILTER_FLETCHER32]:
        return None
    out = np.empty((stop - start, *shape[1:]), dtype=ds.dtype)
    size = int(np.prod(chunks, dtype=np.int64)) * ds.dtype.itemsize
    for corner in np.ndindex(*(-(-n // c) for n, c in zip(shape[1:], chunks[1:]))):
        offset = (start, *(i * c for i, c in zip(corner, chunks[1:])))
        try:
            mask, raw = ds.id.read_direct_chunk(offset)
        except (OSError, RuntimeError, ValueError, KeyError):
            return None
        if mask or len(raw) != size + 4:
            return None
        block = np.frombuffer(raw[:size], dtype=ds.dtype).reshape(chunks)
        where = tuple(slice(o, min(o + c, n)) for o, c, n in zip(offset[1:], chunks[1:], shape[1:]))
        out[(slice(None), *where)] = block[(slice(0, stop - start), *(slice(0, w.stop - w.start) for w in where))]
    return out


def check_attr_size(obj: Any, key: str, limit: int, file: Path, where: str) -> None:
    """Refuse, before reading it, an attribute whose declared size passes ``limit`` bytes: a
    crafted header can declare a string of any length, and reading it allocates that much. A
    variable-length string's text lives in the file's heap, no larger than the file."""
    try:
        if key not in obj.attrs:
            return
        aid = obj.attrs.get_id(key)
        declared = int(aid.dtype.itemsize) * int(aid.get_space().get_simple_extent_npoints())
    except Exception as exc:  # noqa: BLE001  (a header that cannot be described is a bad file, said so)
        raise JaxlogError(f"{file}: cannot read attribute {key!r} of {where} ({type(exc).__name__}: {exc})") from None
    if declared > limit:
        raise JaxlogError(f"{file}: attribute {key!r} of {where} declares {declared} bytes, more than the {limit} "
                          f"this reader takes: the file is damaged or hostile")

# ---------------------------------------------------------------------------------------------
# Which frames an index into a record selects, so that only those are read from disk.
#
# ``traj[name, index]`` has numpy's semantics on the record's ``[frames, *shape]`` array. A file
# holds up to millions of frames, so the frame-axis part of the index (an int, a slice, an int or
# bool array) is turned into the frames to read, in increasing order (what h5py and the part
# files read), and the index that, applied to those frames alone, gives ``values[index]``:
# trailing indices (``traj["x", 2:4, 1]``), advanced indices broadcasting together and
# out-of-range errors behave exactly as on the whole array. Anything else on the frame axis
# (``...``, ``None``, a mask over several axes) selects every frame and lets numpy index them.

class FrameSelection(NamedTuple):
    """``rows``: the frames to read (a slice with a positive step, an increasing index array, or
    None for all of them); ``index``: what to apply to the array of those frames."""

    rows: slice | np.ndarray | None
    index: Any


def select_frames(index: Any, n: int) -> FrameSelection:
    """The frames ``index`` selects among ``n``, and the index into them (``()`` for none)."""
    if index is None:
        return FrameSelection(None, ())
    if isinstance(index, tuple):
        first, rest = (index[0], index[1:]) if index else (slice(None), ())
    else:
        first, rest = index, ()
    if first is Ellipsis or first is None:
        return FrameSelection(None, index)
    if isinstance(first, (int, np.integer)) and not isinstance(first, (bool, np.bool_)):
        i = int(first)
        if not -n <= i < n:
            raise IndexError(f"frame index {i} out of range for {n} frames")
        return FrameSelection(slice(i % n, i % n + 1), (0, *rest))
    if isinstance(first, slice):
        start, stop, step = first.indices(n)
        if step > 0:
            return FrameSelection(slice(start, stop, step) if stop > start else slice(0, 0), (slice(None), *rest))
        return FrameSelection(np.arange(start, stop, step)[::-1], (slice(None, None, -1), *rest))
    arr = np.asarray(first)
    if arr.dtype == np.bool_:
        if arr.ndim != 1:  # a mask over more than the frame axis: numpy applies it to every frame
            return FrameSelection(None, index)
        if len(arr) != n:
            raise IndexError(f"boolean frame index of length {len(arr)} for {n} frames")
        arr = np.flatnonzero(arr)
    idx = np.arange(n)[arr]  # IndexError for out-of-range entries, like numpy
    rows, inverse = np.unique(idx, return_inverse=True)
    return FrameSelection(rows, (inverse.reshape(idx.shape), *rest))


def row_numbers(rows: slice | np.ndarray | None, n: int) -> np.ndarray:
    """A selection's frames as an index array."""
    if rows is None:
        return np.arange(n)
    if isinstance(rows, slice):
        return np.arange(n)[rows]
    return rows
