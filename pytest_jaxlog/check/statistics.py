"""Statistical checks of samplers and steppers: effective sample size and split R-hat, ensembles
that agree within their standard errors, and the order of convergence of a stepper."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import JaxlogAssertionError, JaxlogError

__all__ = ['EffectiveSampleSize', 'EssRate', 'RateJudgement', 'ess', 'EnsembleMismatch', 'assert_statistically_close', 'compare_ensembles', 'ConvergenceOrder', 'convergence_order']

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

# ---------------------------------------------------------------------------------------------
# A statistical golden: two runs of a stochastic kernel agree when their observables' means and
# variances agree within their standard errors, never bit for bit.
#
# Why: under another key, another jax or another device, a Markov chain's trajectory is another
# sample; a trajectory golden of it either fails for nothing or has a tolerance so wide it passes a
# wrong sampler. What must stay is the distribution: the mean and variance of each observable. Their
# standard errors come from the effective sample size (``check.statistics``), so a slowly mixing chain gets
# the wider error bars it deserves and is not failed for its autocorrelation.
#
# The test statistic per observable and moment is ``z = (obtained - expected) / sqrt(se_o**2 +
# se_e**2)``; it fails past ``sigmas`` (4 by default: with a handful of observables a false alarm is
# rare, and a sampler wrong by a fifth of a standard deviation is caught by a few thousand effective
# draws). The standard error of a variance is ``var * sqrt(2 / ESS)`` (normal draws; heavier tails
# make it larger, and ``sigmas`` should then be too).

MOMENTS = ("mean", "var")


class EnsembleMismatch(JaxlogAssertionError):
    """Two runs' observables differ beyond their standard errors; ``.rows`` holds every comparison."""

    def __init__(self, message: str, rows: list["MomentCheck"]):
        super().__init__(message)
        self.rows = rows


@dataclass(frozen=True)
class MomentCheck:
    """One observable's moment (one element of a record) in both runs, with standard errors."""

    record: str
    index: tuple[int, ...]
    moment: str
    obtained: float
    obtained_se: float
    expected: float
    expected_se: float

    @property
    def z(self) -> float:
        se = math.hypot(self.obtained_se, self.expected_se)
        return (self.obtained - self.expected) / se if se > 0 else (0.0 if self.obtained == self.expected else math.inf)

    def describe(self) -> str:
        where = f"{self.record}{list(self.index) if self.index else ''}"
        return (f"{where} {self.moment}: obtained {self.obtained:.6g} ± {self.obtained_se:.2g}, expected "
                f"{self.expected:.6g} ± {self.expected_se:.2g} (z = {self.z:+.2f})")


def compare_ensembles(obtained: Any, expected: Any, records: Sequence[str], *, burn_in: int = 0,
                      moments: Sequence[str] = MOMENTS) -> list[MomentCheck]:
    """Each element of each record's ``moments`` in both runs (trajectories or runs; a batched run's
    systems are its chains), from the frames at or after step ``burn_in``."""
    if isinstance(records, str) or not records:
        raise JaxlogError(f"[jaxlog] compare_ensembles: records= takes a list of record names, got {records!r}")
    bad = [m for m in moments if m not in MOMENTS]
    if bad or isinstance(moments, str):
        raise JaxlogError(f"[jaxlog] compare_ensembles: moments= takes a list of {', '.join(MOMENTS)}, got {moments!r}")
    rows = []
    for record in records:
        o, e = _summary(obtained, record, burn_in, "obtained"), _summary(expected, record, burn_in, "expected")
        if o["mean"].shape != e["mean"].shape:
            raise JaxlogError(f"[jaxlog] compare_ensembles: record {record!r} holds {o['mean'].shape} per draw "
                              f"obtained but {e['mean'].shape} expected")
        for idx in np.ndindex(o["mean"].shape):
            for m in moments:
                rows.append(MomentCheck(record, tuple(int(i) for i in idx), m, float(o[m][idx]),
                                        float(o[m + "_se"][idx]), float(e[m][idx]), float(e[m + "_se"][idx])))
    return rows


def assert_statistically_close(obtained: Any, expected: Any, records: Sequence[str], *, burn_in: int = 0,
                               sigmas: float = 4.0, moments: Sequence[str] = MOMENTS) -> list[MomentCheck]:
    """Fail (``EnsembleMismatch``, an ``AssertionError``) where any observable's mean or variance
    differs between the runs by more than ``sigmas`` combined standard errors; returns the checks."""
    __tracebackhide__ = True
    if not (isinstance(sigmas, (int, float)) and math.isfinite(sigmas) and sigmas > 0):
        raise JaxlogError(f"[jaxlog] assert_statistically_close: sigmas= must be a positive number, got {sigmas!r}")
    rows = compare_ensembles(obtained, expected, records, burn_in=burn_in, moments=moments)
    bad = [r for r in rows if not abs(r.z) <= sigmas]
    if bad:
        worst = max(bad, key=lambda r: abs(r.z))
        lines = [f"[jaxlog] ensembles differ: {worst.describe()}, beyond {sigmas:g} standard errors"]
        lines += [f"  - {r.describe()}" for r in bad if r is not worst][:10]
        lines.append(f"  {len(bad)} of {len(rows)} moments differ; standard errors from each run's effective "
                     f"sample size (burn_in={burn_in})")
        raise EnsembleMismatch("\n".join(lines), rows)
    return rows


def _summary(run: Any, record: str, burn_in: int, which: str) -> dict[str, np.ndarray]:
    traj = getattr(run, "trajectory", run)
    if not (hasattr(traj, "values") and hasattr(traj, "schema")):
        raise JaxlogError(f"[jaxlog] compare_ensembles: the {which} run is not a run or trajectory: {run!r:.80}")
    if record not in traj.records:
        raise JaxlogError(f"[jaxlog] compare_ensembles: record {record!r} is not in the {which} run "
                          f"(records: {', '.join(traj.records)})")
    values = np.asarray(traj.values(record), np.float64)
    keep = np.asarray(traj.steps(record)) >= burn_in
    draws = values[keep]
    chains = bool(traj.schema.batched)
    quality = ess(draws, record, chain_axis=1 if chains else None)
    flat = draws.reshape(-1, *draws.shape[2:]) if chains else draws
    mean, var = flat.mean(axis=0), flat.var(axis=0, ddof=1)
    n_eff = np.maximum(np.asarray(quality.pooled, np.float64), 1.0)
    return {"mean": mean, "mean_se": np.sqrt(var / n_eff), "var": var, "var_se": var * np.sqrt(2.0 / n_eff)}

# ---------------------------------------------------------------------------------------------
# The order of convergence of a stepper, from its errors at several step sizes, with a confidence
# interval.
#
# Why: an ODE or PDE stepper that silently drops from fourth to second order (a stage's coefficient
# mistyped, a boundary term lost) still converges, and its results at one step size may still pass
# a tolerance. The slope of log(error) against log(step size) is the figure that says so, and with
# a handful of step sizes it is uncertain: the gate judges the interval, not the point estimate, and
# says "cannot tell" where the points scatter too much to decide.

@dataclass(frozen=True)
class ConvergenceOrder:
    """The fitted order (the slope of log error against log step size), its ``confidence``
    interval ``[lo, hi]`` (Student's t on the least-squares slope), and the points it came from."""

    order: float
    lo: float
    hi: float
    confidence: float
    step_sizes: tuple[float, ...]
    errors: tuple[float, ...]

    def assert_order(self, expected: float, *, within: float = 0.25) -> None:
        """Fail unless the whole interval lies within ``within`` of ``expected``: a lower or higher
        order is named as such, an interval too wide to decide as "cannot tell" (more or better
        spread step sizes, or step sizes where the error is not dominated by round-off)."""
        __tracebackhide__ = True
        lo_ok, hi_ok = expected - within, expected + within
        if lo_ok <= self.lo and self.hi <= hi_ok:
            return
        if self.hi < lo_ok or self.lo > hi_ok:
            what = "lower" if self.hi < lo_ok else "higher"
        else:
            what = "cannot tell"
        raise JaxlogError(f"[jaxlog] order of convergence {self.order:.3f}, {self.confidence:.0%} interval "
                          f"[{self.lo:.3f}, {self.hi:.3f}] from {len(self.errors)} step sizes: "
                          f"{what + ' than' if what != 'cannot tell' else 'cannot tell whether it is'} "
                          f"{expected:g} ± {within:g}{self._points()}")

    def _points(self) -> str:
        pts = ", ".join(f"h={h:.4g}: {e:.3e}" for h, e in zip(self.step_sizes, self.errors))
        return f" (errors {pts})"


def convergence_order(step_sizes: Sequence[float], errors: Sequence[float], *,
                      confidence: float = 0.95) -> ConvergenceOrder:
    """Fit ``error = C * h**order`` to errors measured at step sizes ``h`` (at least three)."""
    h = np.asarray(step_sizes, dtype=np.float64).ravel()
    e = np.asarray(errors, dtype=np.float64).ravel()
    if h.shape != e.shape:
        raise JaxlogError(f"[jaxlog] convergence_order: {h.size} step sizes but {e.size} errors")
    if h.size < 3:
        raise JaxlogError(f"[jaxlog] convergence_order: {h.size} points give no interval; measure at least three "
                          f"step sizes")
    for name, v in (("step size", h), ("error", e)):
        bad = np.flatnonzero(~(np.isfinite(v) & (v > 0)))
        if bad.size:
            raise JaxlogError(f"[jaxlog] convergence_order: {name} {int(bad[0])} is {float(v[bad[0]])!r}; each must be a "
                              f"positive finite number (an error of 0 is round-off's floor: use larger steps)")
    if np.unique(h).size < h.size:
        raise JaxlogError("[jaxlog] convergence_order: the step sizes repeat; each point needs its own")
    if not 0 < confidence < 1:
        raise JaxlogError(f"[jaxlog] convergence_order: confidence must be between 0 and 1, got {confidence!r}")
    x, y = np.log(h), np.log(e)
    xm = x - x.mean()
    slope = float(xm @ (y - y.mean()) / (xm @ xm))
    resid = y - y.mean() - slope * xm
    dof = h.size - 2
    se = math.sqrt(float(resid @ resid) / dof / float(xm @ xm))
    from scipy import stats  # type: ignore[import-untyped]  # a dependency of jax

    t = float(stats.t.ppf(0.5 + confidence / 2, dof))
    return ConvergenceOrder(order=slope, lo=slope - t * se, hi=slope + t * se, confidence=confidence,
                            step_sizes=tuple(float(v) for v in h), errors=tuple(float(v) for v in e))
