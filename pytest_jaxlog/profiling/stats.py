"""The statistics a benchmark asserts on: the median and a distribution-free confidence interval
for it, from order statistics.

Timings on a shared machine are not normal: they are skewed, with heavy tails from preemption
and frequency changes, and a benchmark has few repeats (5 to 20). A bootstrap interval is poorly
calibrated at such sizes (it is never wider than the sample's range and under-covers), and a
t-interval assumes a shape the data do not have. The order-statistic interval needs only that
the repeats are independent with the same median: the number of repeats below the true median is
then Binomial(n, 1/2), so ``[x_(k), x_(n-k+1)]`` covers the median with probability
``1 - 2 P(B <= k-1)`` exactly, whatever the distribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..errors import JaxlogError


@dataclass(frozen=True)
class Interval:
    """A confidence interval for a median: ``lo``, ``hi`` and the coverage it really has."""

    lo: float
    hi: float
    coverage: float


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    if not s:
        raise JaxlogError("median of no values")
    m = len(s) // 2
    return s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])


def _binomial_cdf(k: int, n: int) -> float:
    """P(B <= k) for B ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


def min_repeats(confidence: float) -> int:
    """The fewest values for which the widest interval, the sample's range, reaches ``confidence``."""
    n = 1
    while 1 - 2 * 0.5**n < confidence:
        n += 1
    return n


def median_interval(xs: Sequence[float], confidence: float = 0.95) -> Interval:
    """The narrowest symmetric order-statistic interval for the median of ``xs`` whose coverage
    is at least ``confidence``."""
    if not 0 < confidence < 1:
        raise JaxlogError(f"confidence must be between 0 and 1, got {confidence!r}")
    s = sorted(xs)
    n = len(s)
    if n < min_repeats(confidence):
        raise JaxlogError(f"a {confidence:.0%} interval for a median needs at least {min_repeats(confidence)} "
                          f"values, got {n}: use more repeats")
    k = 1  # 1-based rank of the lower end; widen inwards while coverage stays
    while k + 1 <= n - k and 1 - 2 * _binomial_cdf(k, n) >= confidence:
        k += 1
    return Interval(s[k - 1], s[n - k], 1 - 2 * _binomial_cdf(k - 1, n))
