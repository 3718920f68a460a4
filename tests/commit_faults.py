"""Faults for the commit tests: a disk that loses power at a chosen system call (what was not
synced is dropped, written in part or in full, as SQLite's crash tests do), a disk that SIGKILLs
its own process at a chosen system call, and the writer scenario both interrupt.

No jax here: the kill campaign forks a process per kill, which a process with jax's threads
must not do.
"""

from __future__ import annotations

import os
import random
import signal
import struct
import zlib
from pathlib import Path

import numpy as np

from pytest_jaxlog.record.frames import Frames, LeafSpec, Schema
from pytest_jaxlog.record.schedule import every
from pytest_jaxlog.store.hdf5 import journal
from pytest_jaxlog.store.hdf5.writer import HDF5Writer

SECTOR = 512
SCHEMA = Schema((LeafSpec("x", "x", (64,), np.dtype("float64"), every(1)),
                 LeafSpec("e", "e", (), np.dtype("float32"), every(2))))
STEPS_PER_BATCH = 6
CHECKPOINT_EVERY = 3  # batches


class PowerLoss(OSError):
    """The power went off: this and every later system call of the process fail."""


def values(path: str, steps: np.ndarray, run: int) -> np.ndarray:
    """What run number ``run`` writes at ``steps`` (so a reader can check every value it finds,
    and tell which run's file it holds)."""
    s = np.asarray(steps, np.float64)
    if path == "x":
        return (s[:, None] * 1000.0 + np.arange(64) + run * 1e7).astype(np.float64)
    return (s * 0.5 + run).astype(np.float32)


def frames(lo: int, hi: int, run: int) -> Frames:
    fr = Frames()
    for leaf in SCHEMA.leaves:
        steps = leaf.schedule.steps_between(lo, hi - 1)
        fr.add(leaf.path, steps, values(leaf.path, steps, run))
    return fr


def state_at(step: int, run: int) -> np.ndarray:
    return values("x", np.array([step]), run)[0]


def scenario(path: Path, *, run: int, batches: int, replace_at: int | None, ack, phase) -> None:
    """A run's writes: batches of frames, a flush after each (``ack("flush", step)`` once it
    returned: those frames must survive), a checkpoint every few batches (``ack("checkpoint",
    step)``), the close (``ack("close", last)``). ``replace_at``: the writer takes the path only at
    a checkpoint at that step (``jl.resume``'s writer); acks before it are of the new file.
    ``phase(name)`` says what the run is doing next (where a kill lands)."""
    phase("open")
    w = HDF5Writer(path, flush_every_s=1e9, replace_at_checkpoint=replace_at)
    w.open(SCHEMA, {"provenance": {}, "scenario_run": run})
    last = -1
    for b in range(batches):
        lo = b * STEPS_PER_BATCH
        phase("write")
        w.write(frames(lo, lo + STEPS_PER_BATCH, run))
        last = lo + STEPS_PER_BATCH - 1
        phase("flush")
        w.flush()
        ack("flush", last)
        if (b + 1) % CHECKPOINT_EVERY == 0:
            phase("checkpoint")
            w.attach("checkpoint", last, {"state/x": state_at(last, run)})
            w.flush()
            ack("checkpoint", last)
    phase("close")
    w.close("complete", steps_done=last)
    ack("close", last)


class CountingDisk(journal.Disk):
    """Counts the system calls of commits (``ops``) with the phase each happened in; ``hit(k)``
    runs at the ``k``-th (to stop the process there)."""

    def __init__(self, at: int | None = None):
        self.ops: list[str] = []
        self.at = at
        self.phase = "open"

    def count(self, what: str) -> None:
        self.ops.append(f"{self.phase}:{what}")
        if self.at is not None and len(self.ops) == self.at:
            self.hit(len(self.ops))

    def hit(self, k: int) -> None:  # pragma: no cover (overridden)
        pass

    def pwrite(self, fd, data, offset):
        self.count("write")
        super().pwrite(fd, data, offset)

    def ftruncate(self, fd, size):
        self.count("truncate")
        super().ftruncate(fd, size)

    def fsync(self, fd):
        self.count("sync")
        super().fsync(fd)

    def rename(self, src, dst):
        self.count("rename")
        super().rename(src, dst)

    def unlink(self, path):
        self.count("unlink")
        super().unlink(path)


class KillingDisk(CountingDisk):
    """SIGKILLs its own process at the ``at``-th system call, before making it."""

    def __init__(self, at: int, report):
        super().__init__(at)
        self.report = report

    def hit(self, k: int) -> None:
        self.report(self.ops[-1])
        os.kill(os.getpid(), signal.SIGKILL)


class LossyDisk(CountingDisk):
    """The machine loses power at the ``at``-th system call: that call and every later one fail,
    and ``crash`` then leaves each file as a disk may after a power loss: its bytes at its last
    sync, plus any subset of the writes and truncations made since, a write possibly in part
    (whole sectors of it)."""

    def __init__(self, at: int, rng: random.Random):
        super().__init__(at)
        self.rng = rng
        self.off = False
        self.synced: dict[int, bytes] = {}  # inode -> bytes at its last sync
        self.since: dict[int, list] = {}  # inode -> writes and truncations after it

    def hit(self, k: int) -> None:
        self.off = True

    def _file(self, fd: int) -> int:
        ino = os.fstat(fd).st_ino
        if ino not in self.synced:  # first seen: what it holds now was synced before
            self.synced[ino] = _whole(fd)
            self.since[ino] = []
        return ino

    def count(self, what: str) -> None:
        super().count(what)
        if self.off:  # this call (the ``at``-th) and every later one fail, before they act
            raise PowerLoss(5, "the power is off")

    def pwrite(self, fd, data, offset):
        ino = self._file(fd)
        super().pwrite(fd, data, offset)
        self.since[ino].append(("write", offset, bytes(data)))

    def ftruncate(self, fd, size):
        ino = self._file(fd)
        super().ftruncate(fd, size)
        self.since[ino].append(("truncate", size, b""))

    def fsync(self, fd):
        ino = None if _is_dir(fd) else self._file(fd)
        super().fsync(fd)
        if ino is not None:
            self.synced[ino] = _whole(fd)
            self.since[ino] = []

    def crash(self, directory: Path) -> int:
        """Rewrite every file this disk saw, in ``directory``, as the power loss left it; returns
        how many unsynced operations were kept."""
        kept = 0
        by_ino = {p.stat().st_ino: p for p in directory.iterdir() if p.is_file()}
        for ino, base in self.synced.items():
            p = by_ino.get(ino)
            if p is None:
                continue  # removed since (a temporary file renamed over, a journal removed)
            image = bytearray(base)
            for kind, arg, data in self.since[ino]:
                if self.rng.random() < 0.5:
                    continue
                kept += 1
                if kind == "truncate":
                    del image[arg:]
                    image.extend(bytes(max(0, arg - len(image))))
                    continue
                if len(data) > SECTOR and self.rng.random() < 0.5:  # torn: whole sectors of it
                    data = data[:SECTOR * self.rng.randrange(1, -(-len(data) // SECTOR))]
                end = arg + len(data)
                if end > len(image):
                    image.extend(bytes(end - len(image)))
                image[arg:end] = data
            fd = os.open(p, os.O_RDWR)
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, bytes(image), 0)
            finally:
                os.close(fd)
        return kept


def _is_dir(fd: int) -> bool:
    import stat

    return stat.S_ISDIR(os.fstat(fd).st_mode)


def _whole(fd: int) -> bytes:
    return os.pread(fd, os.fstat(fd).st_size, 0)


class Acks:
    """What a run acknowledged (calls that returned): the newest flushed step, the newest
    checkpoint, whether it closed; ``in_place``: whether its file had the path then."""

    def __init__(self, run: int, replace_at: int | None = None) -> None:
        self.run = run
        self.replace_at = replace_at
        self.flushed = -1
        self.checkpoint = -1
        self.closed = False

    def __call__(self, kind: str, step: int) -> None:
        if kind == "flush":
            self.flushed = step
        elif kind == "checkpoint":
            self.checkpoint = step
        else:
            self.closed = True
            self.flushed = step

    @property
    def in_place(self) -> bool:
        return self.flushed >= 0 and (self.replace_at is None or self.checkpoint >= self.replace_at)


def run_of(path: Path) -> int | None:
    """Which run's file ``path`` holds (None: it does not load)."""
    from pytest_jaxlog.errors import JaxlogError
    from pytest_jaxlog.store.hdf5.trajectory import load

    try:
        return int(load(path).description["scenario_run"])
    except (JaxlogError, KeyError, TypeError, ValueError):
        return None


def check_file(path: Path, acks: "Acks | None") -> str | None:
    """None when ``path`` loads, every value it holds is that of the run it came from, and it
    holds every frame and checkpoint ``acks`` acknowledged (None: nothing to hold); else what is
    wrong."""
    from pytest_jaxlog.errors import JaxlogError
    from pytest_jaxlog.store.hdf5.trajectory import load

    try:
        traj = load(path)
        run = run_of(path)
        for leaf in SCHEMA.leaves:
            steps = np.asarray(traj.steps(leaf.path))
            vals = np.asarray(traj.values(leaf.path))
            k = min(len(steps), len(vals))  # a live file: the second read may hold more rows
            if run is not None and not (np.array_equal(vals[:k], values(leaf.path, steps[:k], run))
                                        and np.array_equal(steps[:k], leaf.schedule.steps_between(0, 2 * k + 2)[:k])):
                return f"wrong values in {leaf.path}"
            if acks is None or acks.flushed < 0:
                continue
            want = leaf.schedule.steps_between(0, acks.flushed)
            if run != acks.run or not np.isin(want, steps).all():
                return (f"lost acknowledged frames of {leaf.path} (run {acks.run} up to step {acks.flushed}): "
                        f"the file holds run {run}'s, {len(steps)} frames")
        if acks is not None and acks.checkpoint >= 0 and run == acks.run:
            snap = traj.snapshot("checkpoint", acks.checkpoint)
            if snap is None or not np.array_equal(snap.arrays["state/x"], state_at(acks.checkpoint, run)):
                return f"lost the acknowledged checkpoint at step {acks.checkpoint}"
        if acks is not None and acks.closed and traj.status != "complete":
            return f"closed, but the status is {traj.status}"
    except JaxlogError as exc:
        return f"does not load: {exc}"
    return None


def old_journal(path: Path, entries: list[tuple[int, bytes]], *, committed: int | None = None,
                declared: int | None = None, count: int | None = None) -> bytes:
    """A hot rollback journal as pytest-jaxlog wrote beside a file before it kept them inside
    (``.<name>.jaxlog-journal``, format version 1), naming the inode of ``path`` (or another file
    planted there: a stale one, or a hostile one declaring ``declared`` payload bytes or ``count``
    entries). No version applies one any more; a reader must ignore it, never blocking."""
    st = os.stat(path)
    payload = b"".join(struct.pack("<QI", off, len(data)) + data for off, data in entries)
    committed = st.st_size if committed is None else committed
    head = struct.Struct("<8sIIQQQQIQI")
    n = len(entries) if count is None else count
    size = len(payload) if declared is None else declared
    raw = head.pack(b"JAXLOGJ1", 1, 1, 7, st.st_dev, st.st_ino, committed, n, size, 0)
    crc = zlib.crc32(payload, zlib.crc32(raw[:-4]))
    return raw[:-4] + struct.pack("<I", crc) + payload
