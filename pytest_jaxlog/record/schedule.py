"""When a record is taken: schedules are pure functions of the step number.

Being pure (no counters) is what makes trajectories independent of the chunk size and lets a
run resume: the driver asks "which steps in [lo, hi] are scheduled?" for each chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import JaxlogError
from .values import LARGEST_STORED_STEP, check_count, check_step, is_stored_step  # noqa: F401  (drivers import these from here)


@dataclass(frozen=True)
class Progression:
    """The steps ``start, start + n, ...`` up to ``stop`` inclusive (None: for ever): the form in
    which device code can decide a step with two comparisons and a remainder."""

    start: int
    n: int
    stop: int | None


class Schedule:
    """Base class of schedules. Subclasses implement ``steps_between``, ``mask``, ``max_in_span``
    and ``to_json``, and should override ``contains`` and ``count_between``: the drivers ask them
    per log call and per file, and the generic versions build arrays.

    ``first_step``/``last_step`` are what a window needs to know when it is complete; the base
    cannot know them, so it raises (a schedule is never taken as "starts at 0, never ends").
    ``progression``/``table`` are the closed forms the run's device code is built from; a
    schedule with neither (the default) is decided on the host, per chunk, from ``mask``. A
    subclass of ``Every``, ``At`` or ``Window`` that changes which steps are scheduled overrides
    these four too."""

    def first_step(self) -> int:
        """The first step this schedule names."""
        raise JaxlogError(f"schedule {self!r} ({type(self).__qualname__}) does not say its first step: "
                          f"implement first_step() and last_step() to use it here")

    def last_step(self) -> int | None:
        """The last step this schedule names; None when it goes on for ever."""
        raise JaxlogError(f"schedule {self!r} ({type(self).__qualname__}) does not say its last step: "
                          f"implement first_step() and last_step() to use it here")

    def progression(self) -> Progression | None:
        """This schedule as an arithmetic progression, when it is one."""
        return None

    def table(self) -> np.ndarray | None:
        """This schedule's steps, ascending int64, when it is a finite list of them."""
        return None

    def steps_between(self, lo: int, hi: int) -> np.ndarray:
        """Scheduled steps k with lo <= k <= hi, ascending, as int64."""
        raise NotImplementedError

    def mask(self, steps: np.ndarray) -> np.ndarray:
        """Boolean mask: which of ``steps`` are scheduled."""
        raise NotImplementedError

    def max_in_span(self, length: int) -> int:
        """Most scheduled steps in any ``length`` consecutive steps (sizes device buffers)."""
        raise NotImplementedError

    def to_json(self) -> dict:
        raise NotImplementedError

    def contains(self, step: int) -> bool:
        """Whether ``step`` is scheduled."""
        return bool(self.mask(np.asarray([step], dtype=np.int64))[0])

    def count_between(self, lo: int, hi: int) -> int:
        """``len(steps_between(lo, hi))``; subclasses answer without building the array (a run may
        span 2**31 steps)."""
        return len(self.steps_between(lo, hi))

    @property
    def is_every_step(self) -> bool:
        return False

    def __contains__(self, step: int) -> bool:
        return self.contains(step)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(repr(self))


class Every(Schedule):
    def __init__(self, n: int, start: int = 0):
        self.n = check_count(n, "every(n)", minimum=1, expected="needs an integer n >= 1", below=LARGEST_STORED_STEP)
        self.start = check_step(start, "every(start=...)")

    def steps_between(self, lo: int, hi: int) -> np.ndarray:
        lo = max(lo, self.start)
        if hi < lo:
            return np.zeros(0, dtype=np.int64)
        first = self.start + math.ceil((lo - self.start) / self.n) * self.n
        return np.arange(first, hi + 1, self.n, dtype=np.int64)

    def mask(self, steps: np.ndarray) -> np.ndarray:
        steps = np.asarray(steps, dtype=np.int64)
        return (steps >= self.start) & ((steps - self.start) % self.n == 0)

    def max_in_span(self, length: int) -> int:
        return min(length, math.ceil(length / self.n)) if length > 0 else 0

    def contains(self, step: int) -> bool:
        return step >= self.start and (step - self.start) % self.n == 0

    def count_between(self, lo: int, hi: int) -> int:
        lo = max(lo, self.start)
        first = self.start + -(-(lo - self.start) // self.n) * self.n
        return 0 if first > hi else (hi - first) // self.n + 1

    @property
    def is_every_step(self) -> bool:
        return self.n == 1 and self.start == 0

    def first_step(self) -> int:
        return self.start

    def last_step(self) -> None:
        return None

    def progression(self) -> Progression:
        return Progression(start=self.start, n=self.n, stop=None)

    def to_json(self) -> dict:
        return {"kind": "every", "n": self.n, "start": self.start}

    def __repr__(self) -> str:
        return f"every({self.n})" if self.start == 0 else f"every({self.n}, start={self.start})"


class At(Schedule):
    def __init__(self, *steps: int):
        if len(steps) == 1 and isinstance(steps[0], (list, tuple, np.ndarray, range)):
            steps = tuple(steps[0])
        if not steps:
            raise JaxlogError("at() needs at least one step")
        checked = [check_step(s, "at(...)") for s in steps]
        self.steps = np.unique(np.asarray(checked, dtype=np.int64))
        self._set = frozenset(int(s) for s in self.steps)

    def contains(self, step: int) -> bool:
        return step in self._set

    def count_between(self, lo: int, hi: int) -> int:
        if hi < lo:
            return 0
        return int(np.searchsorted(self.steps, hi, side="right") - np.searchsorted(self.steps, lo, side="left"))

    def steps_between(self, lo: int, hi: int) -> np.ndarray:
        return self.steps[(self.steps >= lo) & (self.steps <= hi)]

    def mask(self, steps: np.ndarray) -> np.ndarray:
        return np.isin(np.asarray(steps, dtype=np.int64), self.steps)

    def max_in_span(self, length: int) -> int:
        if length <= 0:
            return 0
        # Sliding window over the sorted steps: most steps within `length` consecutive ones.
        ends = np.searchsorted(self.steps, self.steps + length, side="left")
        return int((ends - np.arange(len(self.steps))).max())

    def first_step(self) -> int:
        return int(self.steps[0])

    def last_step(self) -> int:
        return int(self.steps[-1])

    def table(self) -> np.ndarray:
        return self.steps

    def to_json(self) -> dict:
        return {"kind": "at", "steps": [int(s) for s in self.steps]}

    def __repr__(self) -> str:
        return f"at({', '.join(str(int(s)) for s in self.steps)})"


class Window(Schedule):
    def __init__(self, start: int, stop: int, every: int = 1):
        self.start = check_step(start, "window(start)")
        self.stop = check_step(stop, "window(stop)")
        if self.stop < self.start:
            raise JaxlogError(f"window(start={start}, stop={stop}): stop must be >= start")
        self._every = Every(every, start=self.start)

    @property
    def every(self) -> int:
        return self._every.n

    def steps_between(self, lo: int, hi: int) -> np.ndarray:
        return self._every.steps_between(lo, min(hi, self.stop))

    def mask(self, steps: np.ndarray) -> np.ndarray:
        steps = np.asarray(steps, dtype=np.int64)
        return self._every.mask(steps) & (steps <= self.stop)

    def max_in_span(self, length: int) -> int:
        return min(self._every.max_in_span(length), self.count_between(self.start, self.stop))

    def contains(self, step: int) -> bool:
        return step <= self.stop and self._every.contains(step)

    def count_between(self, lo: int, hi: int) -> int:
        return self._every.count_between(lo, min(hi, self.stop))

    def first_step(self) -> int:
        return self.start

    def last_step(self) -> int:
        return self.stop

    def progression(self) -> Progression:
        return Progression(start=self.start, n=self.every, stop=self.stop)

    def to_json(self) -> dict:
        return {"kind": "window", "start": self.start, "stop": self.stop, "every": self.every}

    def __repr__(self) -> str:
        extra = f", every={self.every}" if self.every != 1 else ""
        return f"window({self.start}, {self.stop}{extra})"


def every(n: int, start: int = 0) -> Every:
    """Every ``n`` steps from ``start`` (inclusive)."""
    return Every(n, start)


def at(*steps: int) -> At:
    """Exactly these steps."""
    return At(*steps)


def window(start: int, stop: int, every: int = 1) -> Window:
    """Steps ``start..stop`` inclusive, every ``every``."""
    return Window(start, stop, every)


def as_schedule(value: Any, what: str) -> Schedule:
    """An int n means every(n); a Schedule passes through."""
    if value is None:
        return Every(1)
    if isinstance(value, Schedule):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return Every(int(value))
    raise JaxlogError(f"{what}: a schedule must be an int or jl.every/at/window, got {value!r}")



def schedule_from_json(data: Any) -> Schedule:
    """A schedule as a file stores it. The file may be hostile: anything else than what
    ``to_json`` writes is one JaxlogError (the constructors check each field; steps are capped
    so that step arithmetic stays within int64)."""
    if not isinstance(data, dict):
        raise JaxlogError(f"a schedule is an object, got {type(data).__name__}")
    kind = data.get("kind")
    fields = {"every": ("n", "start"), "at": (), "window": ("start", "stop", "every")}.get(kind) \
        if isinstance(kind, str) else None
    if fields is None:
        raise JaxlogError(f"unknown schedule kind {kind!r}")
    for key in fields:
        if key in data and not is_stored_step(data[key]):
            raise JaxlogError(f"schedule {kind} field {key!r} must be an integer >= 0, got {data[key]!r}")
    try:
        if kind == "every":
            return Every(data["n"], data.get("start", 0))
        if kind == "window":
            return Window(data["start"], data["stop"], data.get("every", 1))
    except KeyError as exc:
        raise JaxlogError(f"schedule {kind} has no field {exc}") from None
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps or not all(is_stored_step(k) for k in steps):
        raise JaxlogError("schedule at needs a list of integer steps >= 0")
    return At(*steps)
