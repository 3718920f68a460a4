"""The hand-over between a writer's caller and its background thread: bounded in bytes
(``ByteQueue``), bounded in time (``CommitLedger``), and a plain writer thread for sinks whose
work is to take a payload and write it."""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, NamedTuple

from ..errors import WriterError

__all__ = ['CommitLedger', 'MIN_COMMIT_S']

_POLL_S = 0.05  # how often a blocked caller re-checks the writer's health


class Item(NamedTuple):
    kind: str  # "frames" | "attach" | "flush" | "close"
    payload: Any
    nbytes: int


class Stalled(Exception):
    """The writer thread finished nothing for ``stall_s`` while the caller waited on it."""

    def __init__(self, waited_s: float):
        super().__init__(f"no progress for {waited_s:.0f} s")
        self.waited_s = waited_s


class ByteQueue:
    def __init__(self, budget: int, stall_s: float):
        self.budget = int(budget)
        self.stall_s = float(stall_s)
        self._items: collections.deque[Item] = collections.deque()
        self._bytes = 0  # queued plus the item the writer is working on
        # re-entrant: a signal handler may call close() while the main thread waits in put()
        self._cond = threading.Condition(threading.RLock())
        self.ticks = 0  # the writer thread's progress: items finished and datasets written
        self.max_bytes = 0

    @property
    def bytes(self) -> int:
        return self._bytes

    def put(self, item: Item, alive: Callable[[], bool], check: Callable[[], None] | None = None,
            force: bool = False) -> float:
        """Enqueue, waiting for room (not when ``force``); returns the seconds waited. Gives up
        (returns -1) if the writer thread is dead; ``check`` may raise a pending writer error."""
        t0 = None
        with self._cond:
            progress = None
            while not force and not self.room(item.nbytes):
                if t0 is None:
                    t0 = time.monotonic()
                    progress = (self.ticks, t0)
                if check is not None:
                    check()
                if not alive():
                    return -1.0
                progress = self._wait_watching(progress)
            self._items.append(item)
            self._bytes += item.nbytes
            self.max_bytes = max(self.max_bytes, self._bytes)
            self._cond.notify_all()
        return 0.0 if t0 is None else time.monotonic() - t0

    def room(self, nbytes: int) -> bool:
        """Whether an item of ``nbytes`` goes in now (one larger than the budget: into an empty queue)."""
        return not self._bytes or self._bytes + nbytes <= self.budget

    def get(self, timeout: float | None) -> Item | None:
        """The next item (writer thread); None after ``timeout`` seconds without one."""
        with self._cond:
            if not self._items:
                self._cond.wait(timeout)
                if not self._items:
                    return None
            return self._items.popleft()

    def done(self, item: Item) -> None:
        """The writer thread finished ``item``: its bytes are free."""
        with self._cond:
            self._bytes -= item.nbytes
            self.ticks += 1
            self._cond.notify_all()

    def tick(self) -> None:
        """The writer thread made progress inside a long item (one dataset written)."""
        self.ticks += 1  # written by the writer thread only

    def wait_for(self, predicate: Callable[[], bool], alive: Callable[[], bool]) -> bool:
        """Wait until ``predicate()`` (True) or the writer thread is dead (False); ``Stalled`` when
        it finishes nothing for ``stall_s`` meanwhile."""
        with self._cond:
            progress = (self.ticks, time.monotonic())
            while not predicate():
                if not alive():
                    return predicate()
                progress = self._wait_watching(progress)
            return True

    def _wait_watching(self, progress: tuple[int, float]) -> tuple[int, float]:
        """One poll's wait (the condition held); ``progress`` is ``(ticks, since when)`` of the
        writer's last progress: updated, or ``Stalled`` when there was none for ``stall_s``."""
        mark, since = progress
        self._cond.wait(_POLL_S)
        now = time.monotonic()
        if self.ticks != mark:
            return self.ticks, now
        if now - since > self.stall_s:
            raise Stalled(now - since)
        return mark, since

# ---------------------------------------------------------------------------------------------
# How far a writer's disk is behind the frames its caller handed over, in seconds, bounded.
#
# Why a bound in time and not only in bytes: the queue's byte budget bounds memory, but a queue of
# small frames (scalars every step) holds thousands of steps, so under load the file could trail
# the run by many seconds of steps that a progress bar, a callback or a dashboard had already
# shown. A user who kills a run on the bar's word would lose checkpoints the bar had passed. So a
# frame handed over must be committed (on disk, surviving a kill) within ``flush_every_s`` plus
# the writer's own time for two commits; when the oldest uncommitted frame is older than that,
# the caller waits for the writer (backpressure on the run) instead of running further ahead.
#
# The caller counts the frame batches it hands over, the writer counts those it takes, in the
# same order (the queue is first in, first out), so neither needs the other's items; ints are
# written by one thread each and read by the other.

MIN_COMMIT_S = 0.01  # the commit time assumed before one is measured (a commit is at least a few syscalls)


class HandOver(NamedTuple):
    seq: int  # the batch's number among those handed over (1, 2, ...)
    at: float  # time.monotonic() of the hand-over
    step: int  # the batch's last step


class CommitLedger:
    """Hand-overs (caller thread) against commits (writer thread)."""

    def __init__(self, flush_every_s: float):
        self.flush_every_s = float(flush_every_s)
        self._handed: collections.deque[HandOver] = collections.deque()
        self._seq = 0  # caller: batches handed over
        self.taken = 0  # writer: batches taken from the queue (written, or dropped after an error)
        self.committed = 0  # writer: every batch up to this number is in a commit
        self.committed_step = -1  # writer: the last step of the committed batches
        self.longest_commit_s = 0.0  # writer: the longest commit measured
        # caller: how often and how long the run waited for the disk; the oldest uncommitted
        # frame's age when the run went on (after any wait: at most bound_s)
        self.waits = 0
        self.waited_s = 0.0
        self.max_lag_s = 0.0

    # -- caller thread ----------------------------------------------------------------------
    def handed(self, step: int) -> None:
        """A batch of frames up to ``step`` went into the queue."""
        self._seq += 1
        self._handed.append(HandOver(self._seq, time.monotonic(), int(step)))

    @property
    def bound_s(self) -> float:
        """How old a handed-over frame may get before the run waits for its commit."""
        return self.flush_every_s + 2 * max(self.longest_commit_s, MIN_COMMIT_S)

    def overdue(self) -> int | None:
        """The number of the newest batch older than the bound and not committed yet (the run
        waits until ``committed`` reaches it); None when every uncommitted batch is younger."""
        handed = self._uncommitted()
        now = time.monotonic()
        late = now - self.bound_s
        due = None
        for h in handed:
            if h.at > late:
                break
            due = h.seq
        if due is None and handed:  # what the run goes on with: the oldest frame not on disk yet
            self.max_lag_s = max(self.max_lag_s, now - handed[0].at)
        return due

    def _uncommitted(self) -> collections.deque[HandOver]:
        handed, committed = self._handed, self.committed
        while handed and handed[0].seq <= committed:
            handed.popleft()
        return handed

    def waited(self, seconds: float) -> None:
        self.waits += 1
        self.waited_s += seconds

    # -- writer thread ----------------------------------------------------------------------
    def took(self) -> None:
        """The writer took the next batch of frames from the queue."""
        self.taken += 1

    def commit_done(self, started: float, step: int) -> None:
        """A commit that began at ``started`` (time.monotonic()) holds every batch taken so far."""
        self.longest_commit_s = max(self.longest_commit_s, time.monotonic() - started)
        self.committed = self.taken
        self.committed_step = max(self.committed_step, int(step))

    def stats(self) -> dict[str, float | int]:
        return {"lag_bound_s": self.bound_s, "max_lag_s": self.max_lag_s, "lag_waits": self.waits,
                "lag_waited_s": self.waited_s, "longest_commit_s": self.longest_commit_s}

class WorkerThread(threading.Thread):
    """A daemon thread whose life its callers read from a flag it sets itself on its way out.

    Why not ``Thread.is_alive``: on Python 3.11 and 3.12, a KeyboardInterrupt that lands inside
    ``is_alive`` or ``join`` marks a running thread stopped (their clean-up for an interrupted
    wait releases the lock the running thread holds). A writer whose caller is interrupted while
    it polls its thread (Ctrl-C during a run) then took the thread for dead and finished the file
    on the caller's thread while the thread still wrote to it."""

    def __init__(self, target: Callable[[], None], name: str):
        super().__init__(target=target, name=name, daemon=True)
        self.ended = False

    def run(self) -> None:
        try:
            super().run()
        finally:
            self.ended = True

    def alive(self) -> bool:
        """Started (``ident`` is set before ``start`` returns) and not ended."""
        return self.ident is not None and not self.ended


# ---------------------------------------------------------------------------------------------
# A writer thread for sinks whose work is plain: take a payload, write it, in order.
#
# Why: encoding and writing must not cost the run's thread (the driver hands a batch over and
# dispatches the next chunk), yet a failure must surface on the caller's thread at its next
# ``put`` or at ``close``, never as a hang or a silent loss. The hand-over is a ``ByteQueue``, so
# the memory held is bounded and a stuck disk gives an error after ``stall_s``.

QUEUE_BYTES = 32 << 20
STALL_S = 60.0
_ITEM_BYTES = 256


class Background:
    """``handle(payload)`` runs on a daemon thread for each ``put``; ``finish()`` runs there last."""

    def __init__(self, name: str, handle: Callable[[Any], None], finish: Callable[[], None], *,
                 queue_bytes: int = QUEUE_BYTES, stall_s: float = STALL_S):
        self.name = name
        self._handle, self._finish = handle, finish
        self._queue = ByteQueue(queue_bytes, stall_s)
        self._error: BaseException | None = None
        self._raised = False
        self._finished = threading.Event()
        self._thread = WorkerThread(self._run, f"jaxlog-{name}")
        self._thread.start()

    def put(self, payload: Any, nbytes: int) -> None:
        """Hand a payload over (waits while the queue is full); raises a pending writer error."""
        self.raise_pending()
        try:
            waited = self._queue.put(Item("frames", payload, nbytes + _ITEM_BYTES), self._thread.alive,
                                     self.raise_pending)
        except Stalled as exc:
            raise WriterError(f"{self.name}: the writer thread wrote nothing for {exc.waited_s:.0f} s") from None
        if waited < 0:
            self.raise_pending()
            raise WriterError(f"{self.name}: the writer thread died")

    def close(self) -> None:
        """Write everything handed over, run ``finish``, and raise a writer error not raised yet."""
        if self._thread.alive():
            self._queue.put(Item("close", None, 0), self._thread.alive, force=True)
            try:
                self._queue.wait_for(self._finished.is_set, self._thread.alive)
            except Stalled as exc:
                raise WriterError(f"{self.name}: closing: the writer thread wrote nothing for "
                                  f"{exc.waited_s:.0f} s") from None
            self._thread.join(1.0)
        self.raise_pending()

    def raise_pending(self) -> None:
        if self._error is not None and not self._raised:
            self._raised = True
            raise self._error

    def _run(self) -> None:
        while True:
            item = self._queue.get(None)
            if item is None:
                continue
            try:
                if item.kind == "close":
                    self._finish()
                elif self._error is None:
                    self._handle(item.payload)
            except BaseException as exc:  # noqa: BLE001  (raised on the caller's thread)
                if self._error is None:
                    self._error = WriterError(f"{self.name}: {type(exc).__name__}: {exc}")
                    self._error.__cause__ = exc
            finally:
                if item.kind == "close":
                    self._finished.set()  # before done(): done() wakes the waiting caller
                self._queue.done(item)
            if item.kind == "close":
                return
