"""Adaptive repeats: when a benchmark looks at its interval, and when it stops repeating.

Why adaptive: a fixed number of repeats is too many on a quiet machine and too few under load,
where the interval comes out too wide to decide anything. As criterion.rs sizes its samples to
the noise it meets, a benchmark here times ``repeats`` repeats, looks at the interval, and while
the interval cannot decide against its threshold it times another ``repeats`` and looks again,
up to ``max_repeats`` or until its time budget would be spent by the next batch.

Why at most a few looks, fixed in advance: each look is one more chance for noise to produce an
interval wholly above the threshold. The looks are planned before timing and share the error
(``verdict.look_confidence``: each interval has coverage ``1 - (1 - confidence) / looks``), so
the chance that any look misleads stays within ``1 - confidence`` however the stopping went.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import JaxlogError
from .stats import min_repeats
from .verdict import look_confidence

MAX_LOOKS = 4  # the default: up to 4 x repeats, each interval at 1 - (1 - confidence) / 4

FIXED = "fixed"  # nothing to decide (no reference, no comparison): the given repeats only
DECIDED = "decided"  # the interval decided: slower or not slower
MOST_REPEATS = "max_repeats"  # still cannot tell after max_repeats
BUDGET = "budget"  # still cannot tell, and the next batch would have spent the time budget
STOP_REASONS = (FIXED, DECIDED, MOST_REPEATS, BUDGET)


@dataclass(frozen=True)
class Looks:
    """When to look: after ``at[i]`` repeats; each look's interval with coverage ``confidence``."""

    at: tuple[int, ...]
    confidence: float

    @property
    def count(self) -> int:
        return len(self.at)


@dataclass(frozen=True)
class Next:
    """After a look that could not decide: the repeats to reach before looking again (``at``), or
    None and why the repeating stops (``stop_reason``)."""

    at: int | None
    stop_reason: str | None = None


def plan(repeats: int, max_repeats: int | None, confidence: float, adaptive: bool) -> Looks:
    """The looks for ``repeats`` at a time up to ``max_repeats`` (None: as many as ``MAX_LOOKS`` allow
    with each look's interval still computable from ``repeats`` values; fewer where it is not)."""
    if not adaptive:
        return Looks((repeats,), confidence)
    if max_repeats is None:
        looks = MAX_LOOKS
        while looks > 1 and repeats < min_repeats(look_confidence(confidence, looks)):
            looks -= 1
        max_repeats = repeats * looks
    if isinstance(max_repeats, bool) or not isinstance(max_repeats, int) or max_repeats < repeats:
        raise JaxlogError(f"jl.benchmark: max_repeats must be an integer >= repeats ({repeats}), got {max_repeats!r}")
    at = tuple(range(repeats, max_repeats, repeats)) + (max_repeats,)
    each = look_confidence(confidence, len(at))
    if len(at) > 1 and repeats < min_repeats(each):  # one look: the interval itself says what it needs
        raise JaxlogError(f"jl.benchmark: up to {len(at)} looks (repeats={repeats} at a time up to max_repeats="
                          f"{max_repeats}) need each interval at {each:.2%} coverage, which takes at least "
                          f"{min_repeats(each)} repeats: raise repeats= or lower max_repeats=")
    return Looks(at, each)


def next_look(looks: Looks, done: int, elapsed_s: float, budget_s: float | None) -> Next:
    """What follows a look after ``done`` repeats that took ``elapsed_s`` and could not decide."""
    later = [n for n in looks.at if n > done]
    if not later:
        return Next(None, MOST_REPEATS)
    if budget_s is not None and elapsed_s + elapsed_s / max(done, 1) * (later[0] - done) > budget_s:
        return Next(None, BUDGET)
    return Next(later[0])


def check_budget(budget_s: object) -> float | None:
    if budget_s is None:
        return None
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not (budget_s >= 0) \
            or math.isnan(budget_s):
        raise JaxlogError(f"jl.benchmark: budget_s must be seconds >= 0 (or None: no limit but max_repeats), "
                          f"got {budget_s!r}")
    return float(budget_s)
