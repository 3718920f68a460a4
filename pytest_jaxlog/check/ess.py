"""Effective sample size and split R-hat: how many independent draws a correlated chain is worth.

Why a test needs it: a sampler that still returns the right mean but mixes ten times worse passes
every check on its values, and costs its users ten times the compute for the same error bars.
ESS per second (or per gradient evaluation) is the figure that catches it, and R-hat says whether
several chains agree on one distribution at all.

The estimator is Stan's (and ArviZ's ``ess_bulk`` before its rank normalisation): the chains'
autocorrelations combined with their between-chain variance, summed in pairs up to the first
negative pair and kept monotone (Geyer's initial monotone sequence), so a slowly mixing chain is
not credited with its noise. R-hat is split R-hat: each chain cut in halves, so a chain that
drifts disagrees with itself. Both follow Vehtari et al. (2021), "Rank-normalization, folding,
and localization: an improved R-hat", without the rank normalisation: the values are taken as
they are, which is what a regression gate on a fixed kernel compares.

The uncertainty of an ESS comes from the chains themselves: the spread of the per-chain ESS
(``per_chain``) over chains, or, for one chain, over its quarters; ``pooled_se`` is that spread's
standard error scaled to the pooled figure. A gate compares through it, never on the point value
alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import JaxlogError

__all__ = ["EffectiveSampleSize", "EssRate", "RateJudgement", "ess"]

MIN_DRAWS = 8  # fewer draws per chain tell nothing about autocorrelation (a split half needs 4)
BELOW, NOT_BELOW, CANNOT_TELL = "below", "not below", "cannot tell"  # what a rate gate may say


@dataclass(frozen=True)
class EffectiveSampleSize:
    """The ESS of one record (per element where the record holds an array per draw).

    ``per_chain``: each chain's own ESS, shape ``(chains, *element)``; ``pooled``: the ESS of all
    chains together (Stan's multi-chain estimate: chains that disagree lower it); ``rhat``: split
    R-hat (1.0 for chains from one distribution; above 1.01 they disagree); ``pooled_se``: the
    standard error of ``pooled`` from the spread of the per-chain figures (over the quarters of a
    lone chain)."""

    record: str | None
    draws: int  # per chain
    chains: int
    per_chain: np.ndarray
    pooled: np.ndarray
    rhat: np.ndarray
    pooled_se: np.ndarray

    def per(self, cost: float, unit: str = "s") -> "EssRate":
        """ESS per unit of ``cost`` (seconds, gradient evaluations, ...), with its standard error."""
        if isinstance(cost, (np.generic, np.ndarray)) and np.ndim(cost) == 0 and cost.dtype.kind in "iuf":
            cost = float(cost)  # a count summed with numpy (gradient evaluations) is a cost too
        if isinstance(cost, bool) or not (isinstance(cost, (int, float)) and math.isfinite(cost) and cost > 0):
            raise JaxlogError(f"ess({self.record!r}).per: cost must be a positive finite number, got {cost!r}")
        return EssRate(record=self.record, unit=unit, value=self.pooled / cost, se=self.pooled_se / cost)

    def assert_at_least(self, n: float, *, rhat_below: float = 1.01) -> None:
        """Fail (``JaxlogError``) where the pooled ESS is below ``n`` or the chains disagree
        (split R-hat at or above ``rhat_below``), naming the element and the figures."""
        __tracebackhide__ = True
        what = "the draws" if self.record is None else f"record {self.record!r}"
        bad = np.argwhere(~(np.atleast_1d(self.rhat) < rhat_below))
        if bad.size:  # chains that disagree make any ESS meaningless: said first
            i = tuple(bad[0])
            raise JaxlogError(f"[jaxlog] {what}{_at(i, self.rhat)}: split R-hat {np.atleast_1d(self.rhat)[i]:.4f} "
                              f">= {rhat_below:g}: the {self.chains} chain(s) do not agree on one distribution")
        low = np.argwhere(np.atleast_1d(self.pooled) < n)
        if low.size:
            i = tuple(low[0])
            raise JaxlogError(f"[jaxlog] {what}{_at(i, self.pooled)}: effective sample size "
                              f"{np.atleast_1d(self.pooled)[i]:.1f} < {n:g} from {self.chains} chain(s) of "
                              f"{self.draws} draws (split R-hat {np.atleast_1d(self.rhat)[i]:.4f})")


@dataclass(frozen=True)
class EssRate:
    """An ESS per unit of cost and its standard error: what a sampler's speed gate compares."""

    record: str | None
    unit: str
    value: np.ndarray
    se: np.ndarray

    def judge(self, golden: float, golden_se: float = 0.0, *, sigmas: float = 3.0,
              than: float = 1.0) -> "RateJudgement":
        """This (one-figure) rate against ``than`` x ``golden``: below it by more than ``sigmas``
        combined standard errors, not below, or "cannot tell" where a figure is not finite or the
        combined error is so large that even a rate of 0 would not count as below: a gate that
        could catch nothing must not pass as one that found nothing."""
        if np.ndim(self.value):
            raise JaxlogError(f"[jaxlog] ess rate of {self.record!r}: one figure per element; "
                              f"compare element by element")
        for what, v in (("sigmas", sigmas), ("than", than)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise JaxlogError(f"[jaxlog] ess rate of {self.record!r}: {what} must be a finite number > 0, "
                                  f"got {v!r}")
        value, se, golden, golden_se = float(self.value), float(self.se), float(golden), float(golden_se)
        if not all(math.isfinite(v) for v in (value, se, golden, golden_se)):
            return RateJudgement(CANNOT_TELL, value, se, golden, golden_se, sigmas, than, math.nan, math.inf)
        target = than * golden
        floor = target - sigmas * math.hypot(se, than * golden_se)
        # the drop (a fraction of the target) below which a rate would not have counted as below
        detectable = 1.0 - floor / target if target > 0 else math.inf
        verdict = BELOW if value < floor else (NOT_BELOW if floor > 0 else CANNOT_TELL)
        return RateJudgement(verdict, value, se, golden, golden_se, sigmas, than, floor, detectable)

    def assert_not_below(self, golden: float, golden_se: float = 0.0, *, sigmas: float = 3.0,
                         than: float = 1.0) -> None:
        """Fail where this rate is below ``than`` x ``golden`` by more than ``sigmas`` combined
        standard errors (this one's and the golden's): a slower sampler, not the estimate's noise.
        Where that cannot be told (a figure not finite, or errors so large that a rate of 0 would
        pass) it fails too, saying "cannot tell"."""
        __tracebackhide__ = True
        found = self.judge(golden, golden_se, sigmas=sigmas, than=than)
        if found.verdict != NOT_BELOW:
            raise JaxlogError(f"[jaxlog] ess rate of {self.record!r}: {found.describe(self.unit)}")


@dataclass(frozen=True)
class RateJudgement:
    """A rate judged against a golden (``EssRate.judge``): the ``verdict`` (below | not below |
    cannot tell), the figures, the ``floor`` a rate had to reach and the smallest drop, as a
    fraction of the golden, that the comparison could have caught (``detectable``; inf: none)."""

    verdict: str
    value: float
    se: float
    golden: float
    golden_se: float
    sigmas: float
    than: float
    floor: float
    detectable: float

    def describe(self, unit: str) -> str:
        figures = (f"{self.value:.4g} ± {self.se:.2g} per {unit}, golden {self.golden:.4g} ± "
                   f"{self.golden_se:.2g}" + (f" (x{self.than:g})" if self.than != 1 else ""))
        if self.verdict == BELOW:
            return (f"{self.value:.4g} ± {self.se:.2g} per {unit}, below the golden {self.golden:.4g} ± "
                    f"{self.golden_se:.2g}" + (f" (x{self.than:g})" if self.than != 1 else "")
                    + f" by more than {self.sigmas:g} standard errors (floor {self.floor:.4g})")
        if self.verdict == NOT_BELOW:
            return f"{figures}: not below (a drop of {self.detectable:.0%} or more would have been caught)"
        if not math.isfinite(self.floor):
            return f"cannot tell ({figures}: not finite)"
        return (f"cannot tell ({figures}): {self.sigmas:g} combined standard errors reach below 0, so no drop "
                f"could have been caught; measure with more or longer chains")


def _at(i: tuple, arr: Any) -> str:
    return "" if np.ndim(arr) == 0 else f" element {[int(j) for j in i]}"


def ess(values: Any, record: str | None = None, *, chain_axis: int | None = None) -> EffectiveSampleSize:
    """The effective sample size and split R-hat of a record's draws.

    ``values``: a trajectory (``jl.load(...)``, ``run.trajectory``) and the ``record`` to read, its
    systems the chains where the run was batched; or an array of draws along axis 0, with
    ``chain_axis`` naming the chains' axis (None: one chain). A batched run whose systems stopped
    at different steps (``until=``) is refused: a stopped system's frozen rows would read as a
    perfectly correlated chain."""
    draws, name = _draws(values, record, chain_axis)
    n, m = draws.shape[:2]
    if n < MIN_DRAWS:
        raise JaxlogError(f"[jaxlog] ess({name!r}): {n} draws per chain; an effective sample size needs at "
                          f"least {MIN_DRAWS}")
    if not np.all(np.isfinite(draws)):
        bad = np.argwhere(~np.isfinite(draws))[0]
        raise JaxlogError(f"[jaxlog] ess({name!r}): draw {int(bad[0])} of chain {int(bad[1])} is not finite "
                          f"({float(draws[tuple(bad)])!r})")
    per_chain = np.stack([_ess(draws[:, j:j + 1]) for j in range(m)])
    pooled = _ess(draws)
    half = n // 2
    rhat = _rhat(np.concatenate([draws[:half], draws[n - half:]], axis=1))
    if m > 1:
        spread = per_chain.std(axis=0, ddof=1) / math.sqrt(m) * m  # the sum of m chains' ESS, its SE
    else:
        q = n // 4
        quarters = np.stack([_ess(draws[i * q:(i + 1) * q]) for i in range(4)]) if q >= MIN_DRAWS else None
        spread = (quarters.std(axis=0, ddof=1) / math.sqrt(4) * 4 if quarters is not None
                  else np.full(pooled.shape, np.nan))
    scale = np.divide(pooled, per_chain.sum(axis=0), out=np.ones_like(pooled), where=per_chain.sum(axis=0) > 0)
    return EffectiveSampleSize(record=name, draws=n, chains=m, per_chain=per_chain, pooled=pooled,
                               rhat=rhat, pooled_se=spread * scale)


def _draws(values: Any, record: str | None, chain_axis: int | None) -> tuple[np.ndarray, str | None]:
    """Draws as ``(draws, chains, elements)`` float64, and the name to give in messages."""
    if hasattr(values, "values") and hasattr(values, "schema"):  # a trajectory
        if record is None:
            raise JaxlogError("[jaxlog] ess(trajectory): name the record, e.g. ess(traj, 'log_prob')")
        arr = np.asarray(values.values(record), dtype=np.float64)
        if values.schema.batched:
            live = values.live(record)
            if not live.all():
                stopped = sorted({int(j) for j in np.argwhere(~live)[:, 1]})
                raise JaxlogError(f"[jaxlog] ess({record!r}): systems {stopped} stopped before the run's end "
                                  f"(until=): their frozen rows are not draws; read the chains that ran to the "
                                  f"end, e.g. ess(traj.values({record!r})[:, kept], chain_axis=1)")
            chain_axis = 1
        else:
            chain_axis = None
    else:
        arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 0:
        raise JaxlogError(f"[jaxlog] ess({record!r}): one value is not a chain of draws")
    if chain_axis is None:
        arr = arr[:, None]
    else:
        if not 1 <= chain_axis < arr.ndim:
            raise JaxlogError(f"[jaxlog] ess({record!r}): chain_axis={chain_axis} must name an axis after the "
                              f"draws' (axis 0) of an array of shape {arr.shape}")
        arr = np.moveaxis(arr, chain_axis, 1)
    return arr, record


def _autocov(x: np.ndarray) -> np.ndarray:
    """Biased autocovariance along axis 0 of each chain (by FFT, padded against wrap-around)."""
    n = x.shape[0]
    x = x - x.mean(axis=0)
    size = 1 << (2 * n - 1).bit_length()
    f = np.fft.rfft(x, n=size, axis=0)
    return np.fft.irfft(f * np.conj(f), n=size, axis=0)[:n] / n


def _ess(draws: np.ndarray) -> np.ndarray:
    """Stan's multi-chain ESS of ``draws`` shaped ``(n, chains, *element)``."""
    n, m = draws.shape[:2]
    acov = _autocov(draws)  # (n, m, ...)
    chain_var = acov[0] * n / (n - 1)
    w = chain_var.mean(axis=0)
    var_plus = w * (n - 1) / n
    if m > 1:
        var_plus = var_plus + draws.mean(axis=0).var(axis=0, ddof=1)
    constant = var_plus <= 0
    safe = np.where(constant, 1.0, var_plus)
    rho = 1.0 - (w - acov.mean(axis=1)) / safe  # (n, ...)
    rho[0] = 1.0
    tau = _geyer(rho)
    out = np.where(constant, float(n * m), n * m / tau)
    return np.asarray(out)


def _geyer(rho: np.ndarray) -> np.ndarray:
    """The integrated autocorrelation time from autocorrelations ``rho`` (axis 0 the lag): pairs
    summed up to the first negative pair, kept monotone decreasing."""
    n = rho.shape[0]
    pairs = rho[: n - n % 2].reshape(n // 2, 2, *rho.shape[1:]).sum(axis=1)  # P_k = rho_2k + rho_2k+1
    positive = np.cumprod(pairs > 0, axis=0).astype(bool)  # up to the first non-positive pair
    monotone = np.minimum.accumulate(np.where(positive, pairs, np.inf), axis=0)
    total = np.where(positive, monotone, 0.0).sum(axis=0)
    tau = -1.0 + 2.0 * total
    return np.maximum(tau, 1.0 / math.log10(max(n, 10)))  # Stan's floor against antithetic chains


def _rhat(halves: np.ndarray) -> np.ndarray:
    """Split R-hat of chains already cut in halves, ``(n, 2m, *element)``."""
    n = halves.shape[0]
    w = halves.var(axis=0, ddof=1).mean(axis=0)
    b_over_n = halves.mean(axis=0).var(axis=0, ddof=1)
    var_plus = w * (n - 1) / n + b_over_n
    return np.asarray(np.sqrt(np.divide(var_plus, w, out=np.ones_like(w), where=w > 0)))
