"""How a run's work steps are cut into dispatches of the chunk program: chunks of the run's
chunk size, a profile window's steps one at a time, a chunk ending at every checkpoint step."""

from __future__ import annotations

from typing import Any, Iterator, NamedTuple

from ..record.schedule import Schedule

__all__ = ["Segment", "segments"]


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
