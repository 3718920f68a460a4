"""Chunks in flight: the record buffers they write, when the host pulls them, and the frames.

Why consecutive chunks share one set of buffers (a *fill*): the chunk program writes into record
buffers it is given (donated) from where the previous chunk left off, so a run of short chunks
(``chunk=1``, profile-window steps) needs one set of buffers for ``C`` steps, not one per chunk,
and the host pulls them together. A chunk that does not fit starts a new set; the full one is
pulled while the new chunk runs (a long chunk fills a set by itself: it is pulled while the next
one runs, as before).

Why the host does not pull after every short chunk: a short chunk costs the device
microseconds, and a pull (transfer, frames, invariants, a hand-over to the writer thread) costs
the host much more. The set being filled is closed (the next chunk starts a new one, and the
closed one is pulled while that chunk runs) when ``FEED_INTERVAL_S`` has passed since the last
pull (the progress bar, ``until=`` and the invariants stay responsive), or when the chunks written
into it hold, with the chunk-start states kept for a post-mortem, the memory budget, or number
``MAX_WAITING``.

Why buffers are reused: a pulled set goes back to the pool for a later fill, so a run allocates
two or three sets, and a few spare sets are kept between runs (up to ``POOL_BYTES``): a test that
runs the same kernel again allocates nothing. On the CPU the pulled rows are copied out through
DLPack (the copy releases the buffer, which can then be donated again: a zero-copy numpy view
would pin it), except from a set of ``VIEW_BYTES`` or more: its frames are views of it and it is
not reused (a copy would hold its records twice, in a memory the device buffers share); on
accelerators a full set comes to the host whole (its transfer started as soon as it is full), a
partly filled one as the rows used.

Why one set in flight for records of ``ONE_SET_BYTES`` or more a step on the CPU: there the
device's sets are host memory, and two of them (the one the running chunk fills, the one read)
cost two sets of the budget, at least three records each (a chunk runs at least 2 steps, and the
initial frame has its row), six records or more a step. Pulled before the next chunk is
dispatched into a fresh set, a set is freed with its frames once the sinks have them (the HDF5
writer copies them into its queue), and a run holds one set and what its sinks keep. The device
waits for the host meanwhile: what that costs is the sinks' hand-over, small beside stepping and
writing such records; smaller records keep the overlap.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple

import jax
import numpy as np

from ...record.frames import Frames, concat_values
from ...record.schedule import Schedule
from ...record.schedule import every as every_step
from ...store.hdf5.writer import FRAME_CHUNK_BYTES, QUEUE_BYTES
from ..prepare.config import DEFAULT_BUDGET
from ..prepare.identity import Cache, register
from . import program
from .plan import capacity_for, step_bytes
from .program import Control, Plan, block_for, control

__all__ = ['Segment', 'segments', 'Bound', 'bound', 'set_bytes', 'SETS_IN_FLIGHT', 'HDF5_CHUNK', 'ONE_SET_BYTES']

MAX_WAITING = 256  # chunks written into the set being filled, at most, before it is pulled
FEED_INTERVAL_S = 0.05  # pull at least this often (progress, until=, invariants)
POOL_BYTES = 64 * 2**20  # spare record buffers kept between runs
VIEW_BYTES = 8 * 2**20  # the CPU: a set this large is handed to the frames as it is, not copied and reused
ONE_SET_BYTES = VIEW_BYTES  # the CPU: records this large a step run with one set in flight
_SHORT = 4  # accelerators: a set holding less than 1/_SHORT of its rows transfers only the rows used



@dataclass
class Chunk:
    """One dispatch: work steps ``k0 .. k0+length-1``."""

    k0: int
    length: int
    start_state: Any  # the chunk-start state (None when donated)
    start_stopped: Any  # until=: where the run (each system) stopped, -1 while going on, at the chunk start
    t_dispatched: int

    @property
    def end(self) -> int:
        return self.k0 + self.length


class RowBuffer(NamedTuple):
    """One row buffer as the reader sees it: shared (a column per scalar leaf) or one leaf's."""

    key: str
    shared: bool
    leaves: tuple[tuple[str, bool], ...]  # (path, whether row 0 holds its initial frame), in column order


class Slot(NamedTuple):
    """Where a chunk writes: the set's buffers, its first row (the set's rows follow the steps)
    and the compact lanes' next slots (counted on the device: ``when=`` decides them)."""

    bufs: dict | None
    row0: int
    counts: tuple


@dataclass
class Fill:
    """The chunks that wrote into one set of buffers, in step order; ``out`` is the newest one's
    outputs (the buffers, the compact lanes' counts, where ``until=`` stopped the run)."""

    k0: int  # row r of the set is step k0 + r
    flags: int  # the first chunk's flags (whether row 0 / the first slots hold the initial frame)
    chunks: list[Chunk] = field(default_factory=list)
    out: dict | None = None
    rows: int = 0  # steps dispatched into it (rows 1..rows, if every chunk ran all its steps)
    closed: bool = False  # no more chunks go into it (it ends at a checkpoint step)
    ran: int | None = None  # steps that ran: known once pulled
    stopped_at: np.ndarray | None = None  # until=: where the run (each system) stopped, -1 if not, once pulled
    slots: int = 0  # loop slots its chunks ran, once pulled: ``slots - ran`` were masked (see program.blocks)
    frames: dict = field(default_factory=dict)  # path -> (steps, values), once pulled

    @property
    def end(self) -> int:
        """The last step written, once pulled (before: the last step dispatched)."""
        return self.k0 + (self.rows if self.ran is None else self.ran)

    @property
    def stopped_early(self) -> bool:
        """``until=`` stopped the run inside this set (known once pulled)."""
        return self.ran is not None and self.ran < self.rows


class Fills:
    """The sets of buffers of one run: the one being filled, those full and not pulled yet."""

    def __init__(self, plan: Plan, shapes: tuple[dict, ...], device: Any, budget: int, state_bytes: int,
                 close_at: Any = None, placement: Any = None, sharded: bool = False, each_chunk: bool = False,
                 one_set: bool = False):
        self.plan, self.shapes, self.device = plan, shapes, device
        self.one_set = one_set  # a set is pulled before the next chunk is dispatched (see ``ahead``)
        # a set closed after each dispatch, not by time (FEED_INTERVAL_S): over several processes
        # every process must pull (and stop, and judge) after the same dispatches
        self.each_chunk = each_chunk
        self.capacity = plan.length
        # a sharded state: a fresh set is made by the program itself (``None``), laid out as XLA
        # places the views, so no buffer ever moves between devices
        self.sharded = sharded
        layout_key, self.set_bytes = _layout_of(plan, shapes)
        self.key = (layout_key, placement)
        self.budget = budget
        self.state_bytes = state_bytes  # device memory each waiting chunk holds (its kept start state)
        self.close_at = close_at  # a schedule: a set ends at these steps (checkpoints follow its frames)
        self.free: list[dict] = []
        self.current: Fill | None = None
        self.full: list[Fill] = []
        self.last_pull = time.perf_counter()

    def next(self, k0: int, length: int, flags: int) -> Slot:
        """Where a chunk of ``length`` steps from ``k0`` writes: on from where the set being
        filled left off, or into a fresh set when the chunk does not fit."""
        cur = self.current
        if cur is not None and (cur.closed or cur.rows + length > self.capacity):  # pulled after this chunk is dispatched
            self.full.append(cur)
            cur = self.current = None
        if cur is None:
            cur = self.current = Fill(k0, flags)
            return Slot(self._take(), 0, program.empty_counts(self.plan))
        return Slot(cur.out.pop("bufs"), k0 - cur.k0, cur.out["counts"])

    def dispatched(self, chunk: Chunk, out: dict, reader: "Reader") -> None:
        cur = self.current
        cur.chunks.append(chunk)
        cur.rows += chunk.length
        cur.out = out
        if cur.rows >= self.capacity:  # full: the next chunk starts another set, and this one is pulled then
            reader.start_copy(cur)
        if self.close_at is not None and self.close_at.contains(chunk.end):
            cur.closed = True

    def due(self) -> list[Fill]:
        """The sets to pull now: those closed before the newest chunk was dispatched (so the
        device goes on with it while the host reads them). The set being filled is closed (and
        pulled after the next dispatch) when it is time, or it holds too many chunks. With one
        set in flight, none: :meth:`ahead` gives them."""
        if self.one_set:
            return []
        out, self.full = self.full, []
        cur = self.current
        now = time.perf_counter()
        if cur is not None and self._closing(cur, now):
            self.full.append(cur)
            self.current = None
            self.last_pull = now
        if out:
            self.last_pull = now
        return out

    def ahead(self, length: int) -> list[Fill]:
        """One set in flight: the set to pull before a chunk of ``length`` steps is dispatched,
        the one being filled when the chunk would not go into it, or it is closed or due (as
        in :meth:`due`); nothing otherwise, and always nothing with sets overlapping."""
        if not self.one_set:
            return []
        out, self.full = self.full, []
        cur = self.current
        now = time.perf_counter()
        if cur is not None and (cur.closed or cur.rows + length > self.capacity or self._closing(cur, now)):
            out.append(cur)
            self.current = None
        if out:
            self.last_pull = now
        return out

    def _closing(self, cur: Fill, now: float) -> bool:
        """Whether the set being filled is pulled now: it is time, or it holds too many chunks
        (or their kept start states hold the budget)."""
        return (self.each_chunk or now - self.last_pull >= FEED_INTERVAL_S or len(cur.chunks) >= MAX_WAITING
                or len(cur.chunks) * self.state_bytes >= self.budget)

    def rest(self) -> list[Fill]:
        """Every set not pulled yet (the run's end)."""
        out, self.full = self.full, []
        if self.current is not None:
            out.append(self.current)
            self.current = None
        return out

    def drop(self) -> None:
        """Forget the sets not pulled (a run stopped by ``until=`` or a violation)."""
        self.full, self.current = [], None

    def give(self, bufs: dict) -> None:
        self.free.append(bufs)

    def spare(self) -> dict | None:
        """A set of buffers outside the fills (the post-mortem replay)."""
        return self._take()

    def _take(self) -> dict:
        if self.free:
            return self.free.pop()
        bufs = _SPARE.take(self.key, self.set_bytes)
        if bufs is not None:
            return bufs
        return None if self.sharded else program.buffers(self.plan, self.shapes, self.device)

    def close(self) -> None:
        """Keep up to two sets for the next run of this layout (within ``POOL_BYTES`` in all)."""
        keep = [b for b in self.free[:2] if not any_deleted(b)]
        self.free = []
        if not keep or self.set_bytes * len(keep) > POOL_BYTES:
            return
        _SPARE.keep(self.key, keep, self.set_bytes)


def one_set_in_flight(plan: Plan, shapes: tuple[dict, ...], platform: str) -> bool:
    """Whether a run keeps one set of buffers in flight (see the module's docstring): on the CPU,
    when a step records ``ONE_SET_BYTES`` or more (every record's frame)."""
    if platform != "cpu":
        return False
    frame = sum(int(np.prod(sd.shape, dtype=np.int64)) * np.dtype(sd.dtype).itemsize
                for lane in shapes for sd in lane.values())
    return frame >= ONE_SET_BYTES


def any_deleted(tree: Any) -> bool:
    """Whether an array of ``tree`` was donated (or deleted) already."""
    return any(x.is_deleted() for x in jax.tree_util.tree_leaves(tree) if isinstance(x, jax.Array))


class _SparePool:
    """Spare record buffers kept between runs, per buffer layout, oldest layout dropped first past
    ``POOL_BYTES``; one lock, as runs in several threads take and give back sets."""

    def __init__(self):
        self.sets: "OrderedDict[tuple, list[dict]]" = OrderedDict()  # buffer layout -> spare sets, oldest first
        self.nbytes = 0
        self.lock = threading.Lock()

    def take(self, key: tuple, set_bytes: int) -> dict | None:
        """A live spare set of layout ``key``, or None."""
        while True:
            with self.lock:
                spare = self.sets.get(key)
                if not spare:
                    return None
                bufs = spare.pop()
                self.nbytes -= set_bytes
                if not spare:
                    del self.sets[key]
            if not any_deleted(bufs):
                return bufs

    def keep(self, key: tuple, keep: list[dict], set_bytes: int) -> None:
        """Keep up to two sets of layout ``key`` (the newest)."""
        with self.lock:
            spare = self.sets.pop(key, [])
            self.nbytes -= set_bytes * len(spare)
            spare = (spare + keep)[-2:]
            self.sets[key] = spare
            self.nbytes += set_bytes * len(spare)
            while self.nbytes > POOL_BYTES and self.sets:
                _, old = self.sets.popitem(last=False)
                self.nbytes -= sum(x.nbytes for x in jax.tree_util.tree_leaves(old))

    def clear(self) -> None:
        with self.lock:
            self.sets.clear()
            self.nbytes = 0


_SPARE = register(_SparePool())


_LAYOUTS = Cache("buffer layouts")  # (plan, id(shapes)) -> (shapes, layout key, bytes of a set)


def _layout_of(plan: Plan, shapes: tuple[dict, ...]) -> tuple[tuple, int]:
    """The pool key of ``plan``'s buffer sets (equal for equal layouts) and the bytes of one set."""
    def make():
        specs = program.buffer_specs(plan, shapes)
        leaves, tree = jax.tree_util.tree_flatten(specs)
        return shapes, (tree, tuple((tuple(sd.shape), str(sd.dtype)) for sd in leaves)), program.buffer_bytes(specs)

    _, key, nbytes = _LAYOUTS.memo((plan, id(shapes)), make)
    return key, nbytes


_READERS = Cache("readers")  # (plan, id(shapes), platform) -> (shapes, Reader)


class Reader:
    """Turns a set's rows into ``{path: (steps, values)}`` on the host."""

    def __init__(self, plan: Plan, shapes: tuple[dict, ...], platform: str, layout: Any = None):
        self.cpu = platform == "cpu"
        self.until = plan.until is not None
        self.layout = layout  # a run over several processes: each pulls the blocks it writes
        has_initial = {p: i in plan.initial for i in plan.dense for p in shapes[i]}
        # per row buffer: its key, and per leaf (a column of a shared buffer) its path and whether
        # row 0 holds the initial state's frame when a set records it
        self.dense = tuple(RowBuffer(key, key.startswith(program.PACKED), tuple((p, has_initial[p]) for p in paths))
                           for key, paths in plan.row_buffers)
        self.compact = tuple(tuple(shapes[i]) for i, _ in plan.compact)
        # per compact lane whose steps the program does not keep: its schedule, and whether a
        # set that records the initial state's frame has it in its first slot
        self.schedules = tuple(None if program.keeps_steps(plan.lanes[i])
                               else (plan.lanes[i].schedule, i in plan.initial) for i, _ in plan.compact)

    @classmethod
    def of(cls, plan: Plan, shapes: tuple[dict, ...], platform: str, layout: Any = None) -> "Reader":
        """The reader of ``plan``'s sets: one per plan and platform (it keeps nothing of a run),
        except over several processes, where each run has its layout."""
        if layout is not None:
            return cls(plan, shapes, platform, layout)
        return _READERS.memo((plan, id(shapes), platform), lambda: (shapes, cls(plan, shapes, platform)))[1]

    def start_copy(self, f: Fill) -> None:
        """Accelerators: start the transfer of a full set while the next chunk runs."""
        if self.cpu:
            return
        for leaf in jax.tree_util.tree_leaves((f.out["bufs"], f.out["counts"])):
            leaf.copy_to_host_async()

    def pull(self, f: Fill, reuse: bool = True) -> dict | None:
        """Read ``f``'s rows (blocks until its last chunk ran); sets ``f.ran`` and ``f.frames``.
        Returns the buffers, free for another set, or None on the CPU when not ``reuse``: then
        the frames are views of the buffers (no copy; the set is freed with the frames, and a
        later fill takes a fresh one), which keeps a large set from being held twice."""
        f.ran = ran = self._ran(f)
        f.slots = int(np.asarray(f.out["counts"][-1]))
        bufs = f.out.pop("bufs")
        copy = reuse or not self.cpu
        first = bool(f.flags & program.RECORD_INITIAL)
        frames = {}
        steps_from: dict[int, np.ndarray] = {}  # one step array per first row, shared by the records
        for buf in self.dense:
            lo0 = 0 if first and any(h for _, h in buf.leaves) else 1  # the buffer's first row read
            if ran + 1 - lo0 <= 0:
                continue
            rows = self._rows(bufs["dense"][buf.key], lo0, ran + 1, None if buf.shared else buf.key, copy)
            for column, (path, has_initial) in enumerate(buf.leaves):
                lo = 0 if first and has_initial else 1
                if ran + 1 - lo > 0:
                    steps = steps_from.get(lo)
                    if steps is None:
                        steps = steps_from[lo] = np.arange(f.k0 + lo, f.k0 + ran + 1, dtype=np.int64)
                    frames[path] = (steps, np.ascontiguousarray(rows[lo - lo0:, column]) if buf.shared else rows)
        for paths, (vals, steps), count, scheduled in zip(self.compact, bufs["compact"], f.out["counts"],
                                                          self.schedules):
            if scheduled is None:  # when= decided on the device: its count and steps come from there
                count = int(np.asarray(count))
                st = self._rows(steps, 0, count).astype(np.int64) if count else None
            else:  # the schedule alone decides: the host knows the steps (the device's count is not read)
                st = _scheduled_steps(*scheduled, f.k0, ran, first)
                count = len(st)
            if count:
                for p in paths:
                    frames[p] = (st, self._rows(vals[p], 0, count, p, copy))
        f.frames = frames
        return bufs if copy else None

    def _ran(self, f: Fill) -> int:
        """The steps that ran into ``f``: every step dispatched, unless ``until=`` stopped the
        run (every system, in batched runs) at a step before the set's end, recording that step
        and no later one (the chunks dispatched after it run no step)."""
        if not self.until:
            return f.rows
        at = f.stopped_at = np.asarray(f.out["stopped"])  # transferred once: the driver reads it too
        if at.size and bool(np.all(at >= 0)):
            return max(0, min(f.rows, int(at.max()) - f.k0))
        return f.rows

    def _rows(self, arr: Any, lo: int, hi: int, path: str | None = None, copy: bool = True) -> Any:
        """Rows ``lo:hi`` of a device buffer as a host array of their own (the buffer stays free
        to be donated to a later chunk), or on the CPU without ``copy`` a read-only view of them
        (the buffer is never given to a chunk again); over several processes, record ``path``'s
        blocks this process writes (``Shards``)."""
        if self.layout is not None and path is not None:
            return self.layout.pull(path, arr)[lo:hi]
        if len(arr.sharding.device_set) > 1:  # a sharded buffer: its shards copied into one host array
            return np.asarray(arr)[lo:hi]
        if self.cpu:
            try:
                view = np.from_dlpack(arr)
            except (BufferError, RuntimeError, TypeError, ValueError):  # a dtype DLPack cannot carry (bfloat16):
                # a numpy view pins the buffer, so a later chunk given it copies it instead of writing in place
                # (copied even from a set not reused: a sink keeping such a view would keep the whole set)
                return np.array(np.asarray(arr)[lo:hi])
            return np.array(view[lo:hi]) if copy else view[lo:hi]
        if (hi - lo) * _SHORT < arr.shape[0]:  # a set mostly empty: slice on the device, transfer the rows
            return np.asarray(arr[lo:hi])
        return np.asarray(arr)[lo:hi]


def _scheduled_steps(schedule: Any, initial: bool, k0: int, ran: int, first: bool) -> np.ndarray:
    """The steps a compact lane without ``when=`` recorded into a set from step ``k0`` whose
    ``ran`` steps ran: every scheduled one, after the initial state's where the set has it."""
    ks = schedule.steps_between(k0 + 1, k0 + ran)
    return np.concatenate([np.array([k0], np.int64), ks]) if first and initial else ks


def merge(fills: list[Fill]) -> Frames:
    """One batch of frames from pulled sets, in step order. The sets let go of their frames
    (the batch holds them now): a set kept as the run's last one pins no record's rows."""
    frames = Frames()
    parts: dict[str, list] = {}
    for f in fills:
        for p, sv in f.frames.items():
            parts.setdefault(p, []).append(sv)
        f.frames = {}
    for p, svs in parts.items():
        if len(svs) == 1:
            frames.add(p, *svs[0])
        else:
            values = svs[0][1]
            for _, v in svs[1:]:
                values = concat_values(values, v)
            frames.add(p, np.concatenate([s for s, _ in svs]), values)
    return frames

# ---------------------------------------------------------------------------------------------
# The small host values a dispatch passes (step numbers, lengths, offsets, flags), kept on the device.
#
# Why: every numpy argument of a jitted call is a host-to-device transfer on every call, several
# microseconds each on the CPU (more through a GPU's driver), and a chunk's dispatch passes six or
# more: half the cost of dispatching a one-step chunk, which a ``chunk=1`` run, a profile window's
# steps and a post-mortem replay pay per step. The values repeat (chunk lengths, offsets into a set of
# buffers, flags, zero counts, and the step numbers of every run of the same length), so each is
# transferred once per placement and reused. The programs never donate them (only the state and
# the buffers), so a kept copy stays valid.

KEEP = 4096  # values kept per placement; past it the older half is dropped
_SMALL = 64  # elements: larger host arrays (per-system masks of a long chunk) are transferred, not kept


class Scalars:
    """Device copies of small host values for one placement (``put`` places a host value)."""

    __slots__ = ("_put", "_kept", "_controls")

    def __init__(self, put: Callable[[np.ndarray], Any]):
        self._put = put
        self._kept: dict[tuple, Any] = {}
        self._controls: dict[tuple, Control] = {}

    def control(self, k0: int, n: int, row0: int, flags: int) -> Control:
        """:func:`~.program.control` with its values on the device, the whole tuple kept."""
        key = (k0, n, row0, flags)
        found = self._controls.get(key)
        if found is None:
            _make_room(self._controls)
            found = self._controls[key] = Control(*map(self.one, control(k0, n, row0, flags)))
        return found

    def __call__(self, values: tuple) -> tuple:
        """``values`` with every host value on the device; device arrays (counts chained from the
        previous chunk) pass through."""
        return tuple(map(self.one, values))

    def one(self, x: Any) -> Any:
        if isinstance(x, jax.Array):
            return x
        x = np.asarray(x)
        if x.size > _SMALL:
            return self._put(x)
        key = (x.dtype.str, x.shape, x.tobytes())
        kept = self._kept.get(key)
        if kept is None:
            _make_room(self._kept)
            kept = self._kept[key] = self._put(x)
        return kept


def _make_room(kept: dict) -> None:
    """Past ``KEEP`` entries, the older half goes (another thread may be dropping them too)."""
    if len(kept) >= KEEP:
        for old in list(kept)[:KEEP // 2]:
            kept.pop(old, None)


_PLACEMENTS: dict[Any, Scalars] = {}


def scalars_on(device: Any, committed: bool, sharding: Any = None) -> Scalars:
    """The kept values of one placement, as a dispatch's other arguments are placed: replicated
    on ``sharding`` (a sharded state's mesh), committed to ``device``, or uncommitted on the
    default device (a committed value there would make jit compile the program again for a mix
    of committed and uncommitted arguments)."""
    if sharding is not None:
        key: tuple = ("sharded", sharding)
        put: Callable = lambda x: jax.device_put(x, sharding)  # noqa: E731
    elif committed:
        key, put = ("committed", device), (lambda x: jax.device_put(x, device))
    else:  # where jax puts an uncommitted value depends on the default device in force
        key, put = ("uncommitted", device, jax.config.jax_default_device), jax.device_put
    found = _PLACEMENTS.get(key)
    if found is None:
        found = _PLACEMENTS[key] = Scalars(put)
    return found

# ---------------------------------------------------------------------------------------------
# How a run's work steps are cut into dispatches of the chunk program: chunks of the run's
# chunk size, a profile window's steps one at a time, a chunk ending at every checkpoint step.

class Segment(NamedTuple):
    """One dispatch of the chunk program: ``length`` work steps from ``k0``, inside profile
    ``window`` (its steps go one at a time) or not (None)."""

    k0: int
    length: int
    window: Any


def segments(start: int, end: int, chunk: int, windows, checkpoint: Schedule | None = None) -> Iterator[Segment]:
    """The dispatches covering work steps start..end-1, made as the run goes (a ``chunk=1`` run
    of a million steps holds no list of a million); a chunk ends at every checkpoint step (the
    state there is a chunk's output)."""
    for seg in _chunks(start, end, chunk, windows):
        if checkpoint is None:
            yield seg
            continue
        k0, n = seg.k0, seg.length
        for c in checkpoint.steps_between(k0 + 1, k0 + n - 1):
            yield Segment(k0, int(c) - k0, seg.window)
            n -= int(c) - k0
            k0 = int(c)
        yield Segment(k0, n, seg.window)


def _chunks(start: int, end: int, chunk: int, windows) -> Iterator[Segment]:
    k = start
    for w in windows:
        lo, hi = max(w.start, start), min(w.stop, end - 1)
        if hi < lo:
            continue
        while k < lo:
            n = min(chunk, lo - k)
            yield Segment(k, n, None)
            k += n
        for j in range(lo, hi + 1):
            yield Segment(j, 1, w)
        k = hi + 1
    while k < end:
        n = min(chunk, end - k)
        yield Segment(k, n, None)
        k += n


# ---------------------------------------------------------------------------------------------
# What a ``jl.run`` recording large arrays holds in memory, at most: the bound that
# ``docs/memory.md`` states, ``benchmarks/memory.py`` prints beside what it measures and
# ``tests/test_memory_bound.py`` holds the driver to.
#
# Why a formula and not a number: what a run holds is its record buffers (a *set* per chunk in
# flight, sized by the chunk budget) and what the sinks keep (the HDF5 writer's queue, bounded in
# bytes), and each of those follows from the record's size, the budget and the queue's bound. The
# kernel's own memory (its state, what XLA needs to compute a step) is not counted: it is the
# same without recording anything.
#
# - One set: every-step records take ``C + 1`` rows (row 0 holds the initial frame of the run's
#   first set), and a row more where the device loop steps in blocks of several slots (a GPU's:
#   a masked slot past a full set's end writes it, ``program.Plan.rows``),
#   ``C = max(2, min(10,000, budget // bytes recorded per step))``; a record kept every ``k``
#   steps takes ``ceil(C / k) + 2`` slots.
# - On an accelerator: at most ``SETS_IN_FLIGHT`` sets on the device (the one being filled by the
#   running chunk, the one the host is reading); on the host the set being read, once transferred
#   whole, plus what the sink holds; a frame the HDF5 writer has queued is a view of its set's host
#   copy and keeps it alive, up to 3 times the frame (a sparse record's set has 2 slots more than
#   its frames).
# - On the CPU backend the device's memory is the host's. A step recording ``ONE_SET_BYTES`` or
#   more keeps one set in flight (``drive.device.chunks``: a set is pulled, its frames handed to the sinks
#   and the set freed, before the next chunk runs in a fresh one): the set plus what the sink
#   holds. Smaller records keep two in flight, and one more set (the host reads a set of
#   ``drive.device.chunks.VIEW_BYTES`` or more through views, and it is freed with its frames: JAX's CPU
#   client may free it only once the next set exists), plus what the sink holds.
# - The HDF5 writer holds at most ``max(queue_bytes, one step's record)`` of frames handed over and
#   not yet written (``store.handover``; a batch read through views of the buffers is copied,
#   ``store.protocol``, once the queue has room for it); writing a chunk of its file takes HDF5 two
#   buffers of the chunk's size (the checksum filter's copy and its output), and a chunk holds at
#   most ``store.hdf5.writer.FRAME_CHUNK_BYTES`` (a larger frame is cut into several). A sink that keeps
#   nothing holds nothing; ``jl.MemorySink`` keeps every frame (no bound: it grows with the run).

SETS_IN_FLIGHT = 2  # the set the running chunk fills and the one the host reads (one: large records on the CPU)
HDF5_CHUNK = FRAME_CHUNK_BYTES  # the HDF5 writer's chunks are no larger than this


class Bound(NamedTuple):
    """Bytes a run holds beyond its kernel's own, at most (None: grows with the run)."""

    set_bytes: int  # one set of record buffers
    device: int  # on the device
    host: int | None  # on the host (on the CPU backend: the device's share included)


def set_bytes(record_bytes: int, every: int = 1, budget: int = DEFAULT_BUDGET, platform: str = "cpu") -> int:
    """Bytes of one set of record buffers for a single record of ``record_bytes`` a frame, kept
    every ``every`` steps, under a chunk budget of ``budget`` bytes, on ``platform``."""
    capacity = capacity_for(step_bytes(record_bytes, every_step(every)), budget)
    if every == 1:
        return (capacity + (1 if block_for(platform) == 1 else 2)) * record_bytes
    return (math.ceil(capacity / every) + 2) * record_bytes


def bound(record_bytes: int, *, every: int = 1, sink: str = "drop", platform: str = "cpu",
          budget: int = DEFAULT_BUDGET, queue_bytes: int = QUEUE_BYTES) -> Bound:
    """The most a run recording one array of ``record_bytes`` every ``every`` steps into ``sink``
    (``"drop"``: a sink keeping nothing, ``"hdf5"``, ``"memory"``) holds, on ``platform``'s device
    and on the host."""
    one = set_bytes(record_bytes, every, budget, platform)
    if platform == "cpu":
        device = one if record_bytes >= ONE_SET_BYTES else SETS_IN_FLIGHT * one
    else:
        device = SETS_IN_FLIGHT * one
    if sink == "memory":
        return Bound(one, device, None)
    held = 0 if sink == "drop" else max(queue_bytes, record_bytes) + 2 * HDF5_CHUNK
    if platform == "cpu":
        late = 0 if record_bytes >= ONE_SET_BYTES else one  # two sets in flight, and one freed late
        return Bound(one, device, device + late + held)
    # an accelerator's set comes to the host whole, and a queued frame keeps that copy alive: up
    # to 3 slots a frame (a sparse record's set: the initial frame's slot and a spare)
    pinned = 0 if sink == "drop" else 2 * max(queue_bytes, record_bytes)
    return Bound(one, device, one + held + pinned)
