"""The ratio of two sessions' timings with a distribution-free confidence interval: how much
slower (above 1) or faster the timings ``now`` are than the timings ``saved`` in another session.

The two sessions' repeats are not paired (no reference ran beside each of them), so the per-
repeat ratios of ``jl.benchmark`` do not apply. What does: on a log scale a uniform slow-down is a
shift, and the Hodges-Lehmann estimate of a shift between two independent samples (the median of
every difference ``log now_i - log saved_j``) has an exact distribution-free confidence interval
from the Mann-Whitney statistic (Moses' interval): ``[d_(k), d_(nm-k+1)]`` of the sorted
differences covers the shift with probability ``1 - 2 P(U <= k-1)``, whatever the timings'
distribution, given only that a change scales every repeat's time alike. Exact counts, no tables:
the null distribution of ``U`` is the coefficient list of a Gaussian binomial.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..errors import JaxlogError
from .stats import Interval, median

METHOD = "Hodges-Lehmann ratio between the two sessions' repeats, Moses' distribution-free interval"


@dataclass(frozen=True)
class RatioEstimate:
    """``ratio``: now over saved (above 1: slower now); ``interval`` its confidence interval."""

    ratio: float
    interval: Interval


def mann_whitney_counts(n: int, m: int) -> list[int]:
    """How many of the ``C(n+m, n)`` orderings of two samples of sizes ``n``, ``m`` give ``U = u``,
    for u = 0..nm: the coefficients of the Gaussian binomial ``prod_{i=1..n} (1-q^(m+i)) / (1-q^i)``."""
    poly = [1]
    for i in range(1, n + 1):  # poly: the Gaussian binomial [m+i choose i], of degree i*m
        times = poly + [0] * (m + i)
        for d, c in enumerate(poly):
            times[d + m + i] -= c
        for d in range(i, len(times)):  # divided by (1 - q^i), exactly
            times[d] += times[d - i]
        poly = times[: i * m + 1]
    return poly


def ratio_interval(now: Sequence[float], saved: Sequence[float], confidence: float = 0.95) -> RatioEstimate:
    """The ratio ``now / saved`` of two independent samples of positive timings and its interval:
    the narrowest symmetric Moses interval whose exact coverage is at least ``confidence``."""
    if not 0 < confidence < 1:
        raise JaxlogError(f"confidence must be between 0 and 1, got {confidence!r}")
    n, m = len(now), len(saved)
    if min(n, m) < 1 or any(not (t > 0 and math.isfinite(t)) for t in (*now, *saved)):
        raise JaxlogError(f"a ratio of timings needs positive finite timings on both sides, got {n} and {m}")
    counts = mann_whitney_counts(n, m)
    total = math.comb(n + m, n)
    if 2 * counts[0] / total > 1 - confidence:
        raise JaxlogError(f"a {confidence:.0%} interval for the ratio of two sessions' timings needs more repeats: "
                          f"got {n} now and {m} saved (4 and 4 suffice for 95%)")
    diffs = sorted(math.log(a) - math.log(b) for a in now for b in saved)
    k, below = 1, counts[0]  # below = P(U <= k-1) * total
    while k + 1 <= n * m - k and 1 - 2 * (below + counts[k]) / total >= confidence:
        below += counts[k]
        k += 1
    lo, hi = diffs[k - 1], diffs[n * m - k]
    return RatioEstimate(math.exp(median(diffs)), Interval(math.exp(lo), math.exp(hi), 1 - 2 * below / total))
