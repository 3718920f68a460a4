"""A trajectory written by several processes (``jax.distributed``): one part file per process
beside the path, and an index at the path.

Each process writes, into ``<name>.p<i>``, the blocks of each record it owns (the run's layout
says which: a block held by several processes is written once, by the lowest; a replicated
record by process 0). A part is an ordinary trajectory file whose records are those blocks
(``x@<block>``; a record written whole keeps its name). Process 0 also writes the index at the
path: the run's schema, status and summary, and which block of which record each part holds.

``jl.load(path)`` reads the whole run through the index as one trajectory. What it follows is
only what the index names, checked: part files are plain names in the index's own directory
(no paths, no links), each must be a trajectory of the same run (its id) and process, and the
blocks must tile every record exactly. No HDF5 external link or virtual dataset is involved.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import secrets
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import h5py
import numpy as np

from ...errors import JaxlogError
from ...record.frames import FORMAT_VERSION, Block, Frames, Schema, Shards
from ..protocol import Sink
from .h5safe import row_numbers, select_frames
from .journal import durable_replace, sync_file
from .layout import (
    COMPLETE,
    CRC_ATTR,
    CRC_COVERS,
    CREATOR_NAME,
    FAILED,
    FORMAT_VERSION_ATTR,
    H5MD,
    H5MD_CREATOR,
    H5MD_VERSION,
    JAXLOG,
    LIBVER,
    META_ATTR,
    NAME_ATTR,
    PART_META,
    PARTS_ATTR,
    PROVENANCE_ATTR,
    RUNNING,
    SCHEMA_ATTR,
    STATUS_ATTR,
    STEP,
    STEPS_DONE_ATTR,
    SUMMARY_ATTR,
    TIME,
    VERSION_ATTR,
    VIOLATION_ATTR,
    WRITER_ERROR_ATTR,
    attr_text,
    json_crc32,
    json_text,
)



class PartTree(dict):
    """A snapshot as one process of a run over several stores it in its own part (the blocks of
    a sharded state it owns, with their description): every process writes its own, as it is."""


def part_name(index_name: str, process: int) -> str:
    return f"{index_name}.p{process}"


def processes_of(meta: dict | None) -> dict | None:
    """The run's ``processes`` entry (count, index, run_id, layout) when it spans several."""
    run = (meta or {}).get("run") or {}
    procs = run.get("processes")
    return procs if isinstance(procs, dict) and procs.get("count", 1) > 1 else None


def _writer_options(writer: Any) -> dict[str, Any]:
    """The user's writer's settings (compression, flushing, overwrite, ...), for the part file."""
    params = inspect.signature(type(writer).__init__).parameters
    return {name: getattr(writer, name) for name, p in params.items()
            if p.kind is p.KEYWORD_ONLY and name not in ("expected_frames", "particles") and hasattr(writer, name)}


def _local_path(path: str, block: int, n_blocks: int) -> str:
    return path if n_blocks == 1 else f"{path}@{block}"


class PartsWriter(Sink):
    """The sink an ``HDF5Writer`` becomes in a run over several processes: this process's part
    file (written by an HDF5Writer with the same options) and, in process 0, the index."""

    takes_shards = True

    def __init__(self, writer: Any):  # an HDF5Writer (which imports this module)
        if getattr(writer, "particles", None):
            raise JaxlogError(f"HDF5Writer({writer.path}): particles= maps whole records, which a run over several "
                              "processes splits between part files; leave it out")
        self.writer = writer
        self.path = Path(writer.path)
        self.part: Any = None  # this process's HDF5Writer, made alike ``writer``
        self.me = 0
        self._index: dict | None = None
        self._info: dict = {}

    # -- sink protocol ----------------------------------------------------------------------
    def open(self, schema: Schema, meta: dict) -> None:
        procs = processes_of(meta)
        if procs is None:
            raise JaxlogError("PartsWriter is for runs over several processes (meta has no processes)")
        self.me, count, run_id = int(procs["index"]), int(procs["count"]), str(procs["run_id"])
        layout = {p: tuple(Block.from_json(b) for b in blocks) for p, blocks in (procs.get("layout") or {}).items()}
        if self.path.exists() and not self.writer.overwrite and self.me == 0:
            raise JaxlogError(f"{self.path} exists and HDF5Writer(overwrite=False)")
        leaves, records = [], {}
        for leaf in schema.leaves:
            blocks = layout.get(leaf.path) or (Block(tuple((0, n) for n in leaf.shape), 0),)
            records[leaf.path] = []
            for b, blk in enumerate(blocks):
                local = _local_path(leaf.path, b, len(blocks))
                records[leaf.path].append({"file": blk.owner, "leaf": local, "index": [list(ab) for ab in blk.index]})
                if blk.owner == self.me:
                    leaves.append(dataclasses.replace(leaf, path=local, shape=blk.shape))
        self._records = records
        self._schema = schema
        names = [part_name(self.path.name, i) for i in range(count)]
        part_meta = {**meta, PART_META: {"run_id": run_id, "process": self.me, "index": self.path.name}}
        expected = self.writer.expected_frames
        if expected is not None:
            expected = {r["leaf"]: n for p, n in expected.items() for r in records.get(p, ())}
        self.part = type(self.writer)(self.path.with_name(names[self.me]), expected_frames=expected,
                               **_writer_options(self.writer))
        self.part.open(Schema(tuple(leaves), batched=schema.batched, dt=schema.dt, segments=schema.segments), part_meta)
        if self.me == 0:
            self._index = {"run_id": run_id, "files": names, "records": records}
            self._info = {PROVENANCE_ATTR: meta.get(PROVENANCE_ATTR), META_ATTR: meta, STATUS_ATTR: RUNNING,
                          STEPS_DONE_ATTR: 0, VIOLATION_ATTR: None, WRITER_ERROR_ATTR: None}
            self._write_index()

    def set_timeline(self, timeline: Any) -> None:
        if self.part is not None:
            self.part.set_timeline(timeline)

    def write(self, frames: Frames) -> None:
        out = Frames()
        for path in frames:
            values, steps = frames.values[path], frames.steps[path]
            entries = self._records.get(path)
            if entries is None:
                raise JaxlogError(f"record {path!r} is not in the run's schema")
            for b, entry in enumerate(entries):
                if entry["file"] != self.me:
                    continue
                if isinstance(values, Shards):
                    block = values.local.get(b)
                    if block is None:
                        raise JaxlogError(f"record {path!r}: block {b} is written by process {self.me}, which does "
                                          f"not hold it")
                else:
                    index = tuple(slice(a, z) for a, z in entry["index"])
                    block = values if len(entries) == 1 else values[(slice(None), *index)]
                out.add(entry["leaf"], steps, np.ascontiguousarray(block))
        self.part.write(out)

    def write_part(self, frames: Frames) -> None:
        """Frames of this process's blocks, by their names in its part (a resumed part's copy of
        the old one)."""
        self.part.write(frames)

    def attach(self, name: str, step: int, tree: dict, *, key_impls: dict | None = None) -> None:
        """A ``PartTree`` (this process's blocks of a sharded state) goes into this process's part;
        of any other snapshot, which holds whole values, process 0 stores those."""
        if isinstance(tree, PartTree):
            self.part.attach(name, step, dict(tree), key_impls=key_impls)
        elif self.me == 0:
            whole = {p: v for p, v in tree.items() if not isinstance(v, Shards)}
            self.part.attach(name, step, whole, key_impls=key_impls)

    def flush(self) -> None:
        if self.part is not None:
            self.part.flush()

    def close(self, status: str = COMPLETE, *, steps_done: int | None = None, violation: dict | None = None,
              summary: dict | None = None) -> None:
        try:
            if self.part is not None:
                self.part.close(status, steps_done=steps_done, violation=violation, summary=summary)
        finally:
            if self.me == 0 and self._index is not None:
                err = getattr(self.part, "_error", None)
                self._info.update({STATUS_ATTR: FAILED if err is not None else status,
                                   STEPS_DONE_ATTR: int(steps_done or 0), VIOLATION_ATTR: violation,
                                   WRITER_ERROR_ATTR: None if err is None else str(err)})
                if summary is not None:
                    self._info[SUMMARY_ATTR] = summary
                self._write_index()

    @property
    def artifacts(self) -> dict[str, Path]:
        out = {"trajectory": self.path}
        if self.part is not None:
            out["trajectory_part"] = self.part.path
        return out

    @property
    def committed_step(self) -> int | None:
        return None if self.part is None else self.part.committed_step

    # -- the index ------------------------------------------------------------------------------
    def _write_index(self) -> None:
        """The index, written beside the path and renamed over it: a reader sees the old one or
        the new one, never half of one, and after a power loss too when the writer is durable
        (its bytes synced before the rename, the new name after it)."""
        from ...version import __version__

        tmp = self.path.with_name(f".{self.path.name}.index-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            with h5py.File(tmp, "w-", libver=LIBVER) as f:  # a new file: never through a planted link
                h5md = f.create_group(H5MD)
                h5md.attrs[VERSION_ATTR] = np.array(H5MD_VERSION, dtype=np.int32)
                creator = f.create_group(H5MD_CREATOR)
                creator.attrs[NAME_ATTR] = CREATOR_NAME
                creator.attrs[VERSION_ATTR] = __version__
                jl = f.create_group(JAXLOG)
                # the writer's own JSON and attribute form (fixed-length: in the checksummed object header)
                texts = {FORMAT_VERSION_ATTR: json_text(FORMAT_VERSION), SCHEMA_ATTR: json_text(self._schema.to_json()),
                         **{key: json_text(value) for key, value in self._info.items()},
                         PARTS_ATTR: json_text(self._index)}
                for key, text in texts.items():
                    jl.attrs[key] = attr_text(text)
                jl.attrs[CRC_ATTR] = np.uint32(json_crc32({k: texts.get(k) for k in CRC_COVERS}))
            if self.writer.durable:
                sync_file(tmp)
            durable_replace(tmp, self.path, durable=self.writer.durable)
        except BaseException:
            try:
                if not tmp.is_symlink():
                    tmp.unlink()
            except OSError:
                pass  # never created: nothing to remove
            raise

    def __repr__(self) -> str:
        return f"PartsWriter({str(self.path)!r}, process {self.me})"


# ---------------------------------------------------------------------------------------------
# reading


def invalid_index(path: Path, why: str) -> JaxlogError:
    return JaxlogError(f"{path}: not a valid multi-process trajectory index: {why}")


def _part_file(index_path: Path, name: Any) -> Path:
    """A part named in the index: a plain file name in the index's own directory, a regular file."""
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name
            or "\x00" in name or Path(name).name != name):
        raise invalid_index(index_path, f"part file name {name!r} is not a plain file name")
    if name == index_path.name:
        raise invalid_index(index_path, "it names itself as a part")
    p = index_path.parent / name
    if p.is_symlink():
        raise invalid_index(index_path, f"part file {name} is a symbolic link (parts are read only from the index's own "
                               "directory)")
    if not p.exists():
        raise JaxlogError(f"{index_path}: part file {name} is missing (every process of the run writes one "
                          f"beside the index)")
    if not p.is_file():
        raise invalid_index(index_path, f"part file {name} is not a regular file")
    return p


def _volume(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


MAX_BLOCKS = 1 << 16  # blocks an index may declare for one record
MAX_GRID_CELLS = 1 << 22  # cells of the grid the blocks' edges cut a record into


def _check_tiling(index_path: Path, path: str, shape: tuple[int, ...], blocks: list[tuple]) -> None:
    """The blocks tile the record's shape exactly: each inside it, their volumes adding up to it,
    no two overlapping. Linear in the blocks (a pairwise check took seconds for thousands):
    the blocks' edges cut the shape into a grid of cells, each block is counted on the cells it
    covers, and every cell must be counted once."""
    if len(blocks) > MAX_BLOCKS:
        raise invalid_index(index_path, f"record {path!r}: {len(blocks)} blocks, more than the {MAX_BLOCKS} an "
                                        f"index may declare")
    for idx in blocks:
        if len(idx) != len(shape) or any(not (0 <= a <= z <= n) for (a, z), n in zip(idx, shape)):
            raise invalid_index(index_path, f"record {path!r}: block {idx} does not fit its shape {shape}")
    if sum(_volume([z - a for a, z in idx]) for idx in blocks) != _volume(shape):
        raise invalid_index(index_path, f"record {path!r}: its blocks do not add up to its shape {shape}")
    if _volume(shape) == 0:
        return  # nothing to overlap
    cuts = [np.unique([e for idx in blocks for e in idx[axis]]) for axis in range(len(shape))]
    cells = _volume([len(c) - 1 for c in cuts])
    if cells > MAX_GRID_CELLS:
        raise invalid_index(index_path, f"record {path!r}: its {len(blocks)} blocks cut it into {cells} cells, more "
                                        f"than the {MAX_GRID_CELLS} an index may declare")
    spans = [tuple(slice(int(np.searchsorted(c, a)), int(np.searchsorted(c, z))) for c, (a, z) in zip(cuts, idx))
             for idx in blocks]
    covered = sum(_volume([w.stop - w.start for w in where]) for where in spans)
    if covered != cells:  # checked before counting: counting then costs one pass over the cells
        raise invalid_index(index_path, f"record {path!r}: its blocks overlap (they cover {covered} cells of the "
                                        f"{cells} their edges make)")
    count = np.zeros([len(c) - 1 for c in cuts], dtype=np.int64)
    for where in spans:
        count[where] += 1
    if count.size and count.max() > 1:
        cell = np.unravel_index(int(np.argmax(count)), count.shape)
        at = tuple(int(c[i]) for c, i in zip(cuts, cell))
        raise invalid_index(index_path, f"record {path!r}: {int(count.max())} blocks overlap at {at}")


class PartIndex(NamedTuple):
    """A validated index: the part files, each opened as a trajectory, and per record the blocks
    that tile it (part number, the block's record in that part, its index in the whole)."""

    files: tuple[Path, ...]
    parts: tuple[Any, ...]
    blocks: dict[str, list[tuple[int, str, tuple]]]


def read_index(path: Path, schema: Schema, info: dict, load_part: Callable[[Path], Any]) -> PartIndex:
    """The index of a run over several processes, validated. ``load_part(file)``: the reader's
    own loader for a part file (the reader calls this module, never the other way round)."""
    index = info.get(PARTS_ATTR)
    if not isinstance(index, dict) or not isinstance(index.get("files"), list) or not isinstance(
            index.get("records"), dict) or not isinstance(index.get("run_id"), str):
        raise invalid_index(path, "the parts attribute lacks run_id, files or records")
    files = [_part_file(path, name) for name in index["files"]]
    parts = []
    for i, f in enumerate(files):
        part = load_part(f)  # opened and read as any file; one that is an index is refused there
        mine = part.description.get(PART_META) if isinstance(part.description, dict) else None
        if not isinstance(mine, dict) or mine.get("run_id") != index["run_id"] or mine.get("process") != i:
            raise JaxlogError(f"{path}: part file {f.name} is not process {i}'s part of this run (a file left by "
                              f"another run?): its part entry is {mine!r}")
        parts.append(part)
    blocks: dict[str, list[tuple[int, str, tuple]]] = {}
    for leaf in schema.leaves:
        entries = index["records"].get(leaf.path)
        if not isinstance(entries, list) or not entries:
            raise invalid_index(path, f"record {leaf.path!r} has no blocks")
        got = []
        for e in entries:
            try:
                fi, local = int(e["file"]), str(e["leaf"])
                idx = tuple((int(a), int(z)) for a, z in e["index"])
            except (KeyError, TypeError, ValueError):
                raise invalid_index(path, f"record {leaf.path!r}: block entry {e!r} is malformed") from None
            if not 0 <= fi < len(parts):
                raise invalid_index(path, f"record {leaf.path!r}: block in part {fi}, of {len(parts)}")
            if local not in parts[fi].schema:
                raise invalid_index(path, f"record {leaf.path!r}: part {files[fi].name} has no record {local!r}")
            spec = parts[fi].schema[local]
            if tuple(spec.shape) != tuple(z - a for a, z in idx) or np.dtype(spec.dtype) != np.dtype(leaf.dtype):
                raise invalid_index(path, f"record {leaf.path!r}: {files[fi].name}:{local} is {spec.dtype}{list(spec.shape)}, "
                                 f"the block {idx} of {leaf.dtype}{list(leaf.shape)}")
            got.append((fi, local, idx))
        _check_tiling(path, leaf.path, tuple(leaf.shape), [g[2] for g in got])
        blocks[leaf.path] = got
    return PartIndex(files=tuple(files), parts=tuple(parts), blocks=blocks)


def _frames(parts: Sequence, entries: list, name: str) -> tuple[int, np.ndarray]:
    """Frames every block of a record has (a process killed mid-run holds fewer), and their steps."""
    steps = [parts[fi].steps(local) for fi, local, _ in entries]
    n = min(len(s) for s in steps)
    for (fi, local, _), s in zip(entries[1:], steps[1:]):
        if not np.array_equal(s[:n], steps[0][:n]):
            raise JaxlogError(f"record {name!r}: the parts disagree on its steps ({local} in part {fi})")
    return n, steps[0][:n]


def read_blocks(schema: Schema, parted: PartIndex, name: str, what: str, index: Any) -> np.ndarray | None:
    """``traj[name, index]`` (``what=VALUE``) or its steps, assembled from the blocks: only
    the frames ``index`` selects are read, and the index then applies as on the whole array."""
    parts, entries = parted.parts, parted.blocks[name]
    if what == TIME:
        return None  # step * dt
    n, steps = _frames(parts, entries, name)
    if what == STEP:
        return steps if index is None else steps[index]
    selected, local = select_frames(index, n)
    rows = row_numbers(selected, n)
    leaf = schema[name]
    out = None
    for fi, part_leaf, idx in entries:
        block = parts[fi].values(part_leaf, rows)
        if out is None:
            out = np.empty((len(rows), *leaf.shape), dtype=block.dtype)
        out[(slice(None), *(slice(a, z) for a, z in idx))] = block
    return out[local]
