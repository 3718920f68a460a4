"""A statistical golden: two runs of a stochastic kernel agree when their observables' means and
variances agree within their standard errors, never bit for bit.

Why: under another key, another jax or another device, a Markov chain's trajectory is another
sample; a trajectory golden of it either fails for nothing or has a tolerance so wide it passes a
wrong sampler. What must stay is the distribution: the mean and variance of each observable. Their
standard errors come from the effective sample size (``check.ess``), so a slowly mixing chain gets
the wider error bars it deserves and is not failed for its autocorrelation.

The test statistic per observable and moment is ``z = (obtained - expected) / sqrt(se_o**2 +
se_e**2)``; it fails past ``sigmas`` (4 by default: with a handful of observables a false alarm is
rare, and a sampler wrong by a fifth of a standard deviation is caught by a few thousand effective
draws). The standard error of a variance is ``var * sqrt(2 / ESS)`` (normal draws; heavier tails
make it larger, and ``sigmas`` should then be too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import JaxlogAssertionError, JaxlogError
from .ess import ess

__all__ = ["EnsembleMismatch", "assert_statistically_close", "compare_ensembles"]

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
