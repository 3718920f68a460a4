"""What a speed gate may say: *slower*, *not slower*, or *cannot tell at this noise*, and what
slow-down the measurement could have seen.

Why three answers: a gate with two ("slower" / "unchanged") calls a measurement too noisy to see
anything "unchanged", and a kernel doing twice the work then passes on a loaded machine. The
interval of a time ratio says which answer the data allow against a threshold ``than``:

- ``"slower"``: the whole interval lies above ``than``;
- ``"not slower"``: the whole interval lies at or below ``than``;
- ``"cannot tell"``: the interval holds ``than``: the noise hides whether it is above.

``detectable`` is the power of the measurement, as a ratio: the smallest time ratio that would
have come out "slower" had the interval been as wide as it is. On a log scale the interval is the
estimate plus a spread below it (``ratio / lo``) and above it; a true ratio ``x`` gives, under the
same noise, an interval whose low end is about ``x * lo / ratio``, above ``than`` exactly when
``x > than * ratio / lo``. So ``detectable = than * ratio / lo``: at most ``than`` times the
interval's lower spread. A measurement with ``detectable`` 1.12 at ``than`` 1.05 would have caught
a kernel 1.12x its reference (or its saved run); one with 1.9 could not have caught 1.5x.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import JaxlogError
from .stats import Interval

SLOWER = "slower"
NOT_SLOWER = "not slower"
CANNOT_TELL = "cannot tell"
VERDICTS = (SLOWER, NOT_SLOWER, CANNOT_TELL)
DEFAULT_THAN = 1.10  # the threshold of a verdict nobody asked a threshold for (assert_not_slower's default)
INCONCLUSIVE_CHOICES = ("pass", "fail")  # what a "cannot tell" does to a gate
INCONCLUSIVE_FLAG = "--jaxlog-benchmark-inconclusive"  # the plugin's option that sets it for a session


@dataclass(frozen=True)
class Decision:
    """A time ratio's interval judged against ``than``: the ``verdict`` and the ``detectable`` ratio."""

    verdict: str
    than: float
    detectable: float


def check_than(than: object, what: str) -> float:
    """``than`` as a float, or a ``JaxlogError`` naming ``what`` (a ratio must be a number > 0)."""
    if isinstance(than, bool) or not isinstance(than, (int, float)) or not (than > 0 and math.isfinite(than)):
        raise JaxlogError(f"{what} must be a number > 0 (a ratio such as 1.10), got {than!r}")
    return float(than)


def verdict(interval: Interval, than: float) -> str:
    """slower | not slower | cannot tell: where the interval lies against ``than``."""
    if interval.lo > than:
        return SLOWER
    if interval.hi <= than:
        return NOT_SLOWER
    return CANNOT_TELL


def detectable(ratio: float, interval: Interval, than: float) -> float:
    """The smallest ratio the interval's width could have shown to be above ``than`` (module doc);
    infinite where the interval reaches down to 0 (nothing could have been shown)."""
    if not interval.lo > 0:
        return math.inf
    return than * max(ratio, interval.lo) / interval.lo


def decide(ratio: float, interval: Interval, than: float) -> Decision:
    return Decision(verdict(interval, than), than, detectable(ratio, interval, than))


def look_confidence(confidence: float, looks: int) -> float:
    """The coverage each of ``looks`` intervals needs so that all of them cover together with at
    least ``confidence`` (Bonferroni): a measurement that looks again whenever the last look could
    not tell, and stops at the first that can, would otherwise say "slower" by chance more often
    than its interval's coverage promises."""
    if not 0 < confidence < 1:
        raise JaxlogError(f"confidence must be between 0 and 1, got {confidence!r}")
    return 1 - (1 - confidence) / max(1, looks)
