"""The hand-over between a writer's caller and its background thread, bounded by bytes.

Why bytes and not a count of batches: a batch is one chunk of a run and may hold a few bytes or
a gigabyte, so a count bounds nothing. An item's bytes count until the writer thread has
finished with it (``done``), so what a writer holds in memory is the budget, not the budget
plus the batch being written. An item larger than the whole budget waits for an empty queue
and then goes alone.

Why waits poll and watch progress: a writer thread stuck on a hung disk must not hang its
caller forever (nor a Ctrl-C, nor ``close``). A wait gives up with ``Stalled`` once the thread
has finished nothing for ``stall_s``; a slow disk that makes progress is waited for.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, NamedTuple

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
