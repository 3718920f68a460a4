"""What a speed gate decides with: the median and a distribution-free interval of timings, the
ratio of two sessions' timings, the verdict (*slower*, *not slower*, *cannot tell*), adaptive
repeats, and whether a reference shares the kernel's program (useless as a yardstick)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..errors import JaxlogError

__all__ = ['shared_program', 'operations']

MIN_SHARED = 4
_INLINED = {"jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr",
            "checkpoint", "remat", "remat2", "custom_lin"}
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+|0x[0-9a-fA-F]{6,}")


def operations(fn: Callable, *args: Any) -> list[str]:
    """``fn(*args)`` as the sequence of its operations (module doc); raises whatever tracing raises."""
    import jax

    return _flatten(jax.make_jaxpr(fn)(*args).jaxpr)


def _flatten(jaxpr: Any) -> list[str]:
    from jax.extend.core import jaxprs_in_params

    out: list[str] = []
    for eqn in jaxpr.eqns:
        subs = list(jaxprs_in_params(eqn.params))
        name = eqn.primitive.name
        if subs and name in _INLINED:
            for sub in subs:
                out += _flatten(sub)
            continue
        text = f"{name}[{_params(eqn.params)}]({_operands(eqn.invars)})->({_operands(eqn.outvars)})"
        if not subs:
            out.append(text)
            continue
        out.append(text + "{")
        for sub in subs:
            out += _flatten(sub)
            out.append("|")
        out.append("}")
    return out


def _params(params: dict) -> str:
    from jax.extend.core import ClosedJaxpr, Jaxpr

    def plain(v: Any) -> bool:
        if isinstance(v, (ClosedJaxpr, Jaxpr)):
            return False
        return not (isinstance(v, (tuple, list)) and any(isinstance(x, (ClosedJaxpr, Jaxpr)) for x in v))

    return ",".join(f"{k}={_ADDRESS.sub('', str(v))}" for k, v in sorted(params.items()) if plain(v))


def _operands(vs: Sequence[Any]) -> str:
    from jax.extend.core import Literal

    return ",".join(f"{v.aval}={v.val!r}" if isinstance(v, Literal) else str(v.aval) for v in vs)


def _holds(big: list[str], small: list[str]) -> bool:
    """Whether ``small`` occurs in ``big`` in a row (Knuth-Morris-Pratt: linear in their lengths)."""
    if not small or len(small) > len(big):
        return False
    fail = [0] * len(small)
    k = 0
    for i in range(1, len(small)):
        while k and small[i] != small[k]:
            k = fail[k - 1]
        if small[i] == small[k]:
            k += 1
        fail[i] = k
    k = 0
    for x in big:
        while k and x != small[k]:
            k = fail[k - 1]
        if x == small[k]:
            k += 1
            if k == len(small):
                return True
    return False


def shared_program(kernel: Callable[[], list[str]], reference: Callable[[], list[str]]) -> str | None:
    """Why the reference is not independent of the kernel (a sentence), or None: independent, or
    not known (either could not be traced). ``kernel``/``reference`` give their operations."""
    try:
        mine, theirs = kernel(), reference()
    except Exception:  # not traceable as a JAX function: nothing to judge
        return None
    work = [op for op in mine if op not in ("|", "}")]
    if not work:
        return None
    if mine == theirs:
        return "the reference runs the same program as the kernel's step"
    if len(work) >= MIN_SHARED and _holds(theirs, mine):
        return f"the reference runs the kernel's whole step inside it ({len(work)} operations)"
    ref_work = [op for op in theirs if op not in ("|", "}")]
    if len(ref_work) >= MIN_SHARED and _holds(mine, theirs):
        return f"the kernel's step runs the reference's whole program inside it ({len(ref_work)} operations)"
    return None

# ---------------------------------------------------------------------------------------------
# The statistics a benchmark asserts on: the median and a distribution-free confidence interval
# for it, from order statistics.
#
# Timings on a shared machine are not normal: they are skewed, with heavy tails from preemption
# and frequency changes, and a benchmark has few repeats (5 to 20). A bootstrap interval is poorly
# calibrated at such sizes (it is never wider than the sample's range and under-covers), and a
# t-interval assumes a shape the data do not have. The order-statistic interval needs only that
# the repeats are independent with the same median: the number of repeats below the true median is
# then Binomial(n, 1/2), so ``[x_(k), x_(n-k+1)]`` covers the median with probability
# ``1 - 2 P(B <= k-1)`` exactly, whatever the distribution.

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

# ---------------------------------------------------------------------------------------------
# What a speed gate may say: *slower*, *not slower*, or *cannot tell at this noise*, and what
# slow-down the measurement could have seen.
#
# Why three answers: a gate with two ("slower" / "unchanged") calls a measurement too noisy to see
# anything "unchanged", and a kernel doing twice the work then passes on a loaded machine. The
# interval of a time ratio says which answer the data allow against a threshold ``than``:
#
# - ``"slower"``: the whole interval lies above ``than``;
# - ``"not slower"``: the whole interval lies at or below ``than``;
# - ``"cannot tell"``: the interval holds ``than``: the noise hides whether it is above.
#
# ``detectable`` is the power of the measurement, as a ratio: the smallest time ratio that would
# have come out "slower" had the interval been as wide as it is. On a log scale the interval is the
# estimate plus a spread below it (``ratio / lo``) and above it; a true ratio ``x`` gives, under the
# same noise, an interval whose low end is about ``x * lo / ratio``, above ``than`` exactly when
# ``x > than * ratio / lo``. So ``detectable = than * ratio / lo``: at most ``than`` times the
# interval's lower spread. A measurement with ``detectable`` 1.12 at ``than`` 1.05 would have caught
# a kernel 1.12x its reference (or its saved run); one with 1.9 could not have caught 1.5x.

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

# ---------------------------------------------------------------------------------------------
# Adaptive repeats: when a benchmark looks at its interval, and when it stops repeating.
#
# Why adaptive: a fixed number of repeats is too many on a quiet machine and too few under load,
# where the interval comes out too wide to decide anything. As criterion.rs sizes its samples to
# the noise it meets, a benchmark here times ``repeats`` repeats, looks at the interval, and while
# the interval cannot decide against its threshold it times another ``repeats`` and looks again,
# up to ``max_repeats`` or until its time budget would be spent by the next batch.
#
# Why at most a few looks, fixed in advance: each look is one more chance for noise to produce an
# interval wholly above the threshold. The looks are planned before timing and share the error
# (``verdict.look_confidence``: each interval has coverage ``1 - (1 - confidence) / looks``), so
# the chance that any look misleads stays within ``1 - confidence`` however the stopping went.

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

# ---------------------------------------------------------------------------------------------
# The ratio of two sessions' timings with a distribution-free confidence interval: how much
# slower (above 1) or faster the timings ``now`` are than the timings ``saved`` in another session.
#
# The two sessions' repeats are not paired (no reference ran beside each of them), so the per-
# repeat ratios of ``jl.benchmark`` do not apply. What does: on a log scale a uniform slow-down is a
# shift, and the Hodges-Lehmann estimate of a shift between two independent samples (the median of
# every difference ``log now_i - log saved_j``) has an exact distribution-free confidence interval
# from the Mann-Whitney statistic (Moses' interval): ``[d_(k), d_(nm-k+1)]`` of the sorted
# differences covers the shift with probability ``1 - 2 P(U <= k-1)``, whatever the timings'
# distribution, given only that a change scales every repeat's time alike. Exact counts, no tables:
# the null distribution of ``U`` is the coefficient list of a Gaussian binomial.

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
