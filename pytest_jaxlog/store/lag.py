"""How far a writer's disk is behind the frames its caller handed over, in seconds, bounded.

Why a bound in time and not only in bytes: the queue's byte budget bounds memory, but a queue of
small frames (scalars every step) holds thousands of steps, so under load the file could trail
the run by many seconds of steps that a progress bar, a callback or a dashboard had already
shown. A user who kills a run on the bar's word would lose checkpoints the bar had passed. So a
frame handed over must be committed (on disk, surviving a kill) within ``flush_every_s`` plus
the writer's own time for two commits; when the oldest uncommitted frame is older than that,
the caller waits for the writer (backpressure on the run) instead of running further ahead.

The caller counts the frame batches it hands over, the writer counts those it takes, in the
same order (the queue is first in, first out), so neither needs the other's items; ints are
written by one thread each and read by the other.
"""

from __future__ import annotations

import collections
import time
from typing import NamedTuple

__all__ = ["CommitLedger", "MIN_COMMIT_S"]

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
