"""The invariants of one run, checked batch by batch in step order."""

from __future__ import annotations

from typing import Any

from ..check.invariants import InvariantViolation, bind_all, check_all, finish_all, restore_all, save_all
from ..record.frames import Frames, Schema


class Watch:
    """``on_violation="raise"``: every invariant on every batch; the earliest violation stops the
    run. ``"warn"``/``"record"``: the run goes on, and each invariant is checked until its own
    first violation. ``first`` is the run's earliest violation (batches arrive in step order, so
    it is the first one found)."""

    def __init__(self, invariants: Any, schema: Schema, mode: str):
        self.mode = mode
        self.checkers = bind_all(invariants, schema)
        self.first: Any = None
        self._active = list(self.checkers)

    def __bool__(self) -> bool:
        return bool(self.checkers)

    @property
    def watching(self) -> bool:
        """Whether a later batch can still produce a new violation."""
        return bool(self._active) and not (self.mode == "raise" and self.first is not None)

    def check(self, frames: Frames) -> list:
        """New violations in this batch, earliest first (ties: the invariant listed first)."""
        return self._judge(lambda checkers: check_all(checkers, frames))

    def finish(self) -> list:
        """The run ended: the violations only the end decides (an aggregate whose window the run
        ended before), earliest first."""
        return self._judge(finish_all)

    def _judge(self, judge) -> list:
        """``judge(checkers)``: the earliest violation among them, or None. With ``raise`` the
        run stops at the first, so all are judged together; otherwise each invariant is judged on
        its own and leaves the watch at its first violation."""
        if not self.watching:
            return []
        if self.mode == "raise":
            v = judge(self._active)
            new = [] if v is None else [v]
        else:
            new = []
            for c in list(self._active):
                v = judge((c,))
                if v is not None:
                    new.append(v)
                    self._active.remove(c)
            new.sort(key=lambda v: v.step)  # stable: ties keep the listed order
        if new and self.first is None:
            self.first = new[0]
        return new

    def save(self) -> dict:
        """The running state of every invariant, which are still checked, and the first violation
        (a checkpoint's share of the invariants), as JSON."""
        return {"invariants": save_all(self.checkers), "active": [self.checkers.index(c) for c in self._active],
                "violation": None if self.first is None else self.first.to_json()}

    def restore(self, saved: dict) -> None:
        """Continue from :meth:`save` of a run with the same invariants."""
        restore_all(self.checkers, saved["invariants"])
        self._active = [self.checkers[i] for i in saved["active"]]
        self.first = None if saved["violation"] is None else InvariantViolation.from_json(saved["violation"])

    def frames_to_write(self, frames: Frames, new: list) -> Frames:
        """``raise`` stops at the violating step: the sinks get frames up to and including it."""
        if new and self.mode == "raise":
            return frames.until(new[0].step)
        return frames
