"""Tolerances from evidence: rerun a kernel under changes that must not change its physics, and
derive each record's golden tolerance from how far the reruns moved it.

Why: a golden's ``rtol`` is usually a guess. Too tight, and a jax upgrade that reorders a sum
fails CI for nothing (the Burgers golden made with jax 0.10.2 failed on 0.12 by 6e-6); too loose,
and it passes a real fault. The spread between runs that differ only in what a correct kernel is
indifferent to (how XLA fuses the loop, float32 against float64 arithmetic) is the noise floor a
tolerance must clear; ``safety`` times it is a tolerance with a stated margin. The spread is kept
beside each tolerance, so a reviewer sees what it rests on.

Perturbations (``perturb=``): ``"blocks"`` reruns with the device loop in blocks of other sizes
(``JAXLOG_BLOCK``: XLA compiles the step inside loops of other trip counts, fusing and contracting
differently); ``"x64"`` reruns in float64 (the floating leaves of the state widened, x64 enabled
for the rerun) and compares its records, rounded back, with the float32 run: the float32 rounding
error of the whole trajectory. Chunk sizes are not a perturbation: results are the same bits for
every chunk size, by design. Keys are not either: a stochastic kernel's trajectory under another
key is another sample, to be checked by statistics (``jl.aggregate``, ``jl.ess``), not by a
tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import JaxlogError
from .device import program

__all__ = ["Calibration", "calibrate"]

PERTURBATIONS = ("blocks", "x64")
SMALL = 1e-3  # elements below this fraction of a record's largest magnitude are judged by atol, not rtol


@dataclass(frozen=True)
class Calibration:
    """Per-record tolerances derived from reruns, and the spread they rest on.

    ``tolerances``: ``{record: {"rtol", "atol", "spread_rel", "spread_abs", "safety"}}`` for each
    floating leaf record; ``variants``: the reruns compared (``"blocks=8"``, ``"x64"``, ...);
    ``notes``: what could not be compared and why (a rerun that failed, a record that is not
    floating and differed). ``options()`` is what ``check_golden``/``assert_trajectory_close`` take."""

    tolerances: dict[str, dict[str, float]]
    variants: tuple[str, ...]
    safety: float
    notes: tuple[str, ...] = field(default_factory=tuple)

    def options(self) -> dict[str, Any]:
        return {"tolerances": {k: dict(v) for k, v in self.tolerances.items()}}

    def describe(self) -> str:
        lines = [f"[jaxlog] calibrated over {', '.join(self.variants) or 'no rerun'} (safety x{self.safety:g}):"]
        for record, t in self.tolerances.items():
            lines.append(f"  {record}: rtol={t['rtol']:.3g} (spread {t['spread_rel']:.3g}), "
                         f"atol={t['atol']:.3g} (spread {t['spread_abs']:.3g})")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def calibrate(step: Callable, state: Any, steps: int, *, record: Any, safety: float = 10.0,
              perturb: Sequence[str] = PERTURBATIONS, **run_kwargs: Any) -> Calibration:
    """Run ``jl.run(step, state, steps, record=record, **run_kwargs)`` as given and under each of
    ``perturb``, and derive each floating record's tolerances: ``rtol = safety x`` the largest
    relative difference seen (over elements of at least 1/1000 of the record's largest magnitude),
    ``atol = safety x`` the largest absolute difference of the smaller elements; each at least
    ``safety`` units of the record's dtype's rounding (a spread of 0 still gets a tolerance of a
    few ulps). Runs are in memory: ``sinks=`` and ``profile=`` are refused."""
    from .run import run

    if not (isinstance(safety, (int, float)) and np.isfinite(safety) and safety >= 1):
        raise JaxlogError(f"[jaxlog] calibrate: safety= must be a finite number >= 1, got {safety!r}")
    unknown = [p for p in perturb if p not in PERTURBATIONS]
    if unknown or isinstance(perturb, str):
        raise JaxlogError(f"[jaxlog] calibrate: perturb= takes a list of {', '.join(PERTURBATIONS)}; got {perturb!r}")
    refused = [k for k in ("sinks", "profile", "progress") if k in run_kwargs]
    if refused:
        raise JaxlogError(f"[jaxlog] calibrate: {', '.join(refused)}= not taken: the reruns are compared in memory")

    def once() -> Any:
        return run(step, state, steps, record=record, progress=False, **run_kwargs).trajectory

    reference = once()
    variants: dict[str, Any] = {}
    notes: list[str] = []
    if "blocks" in perturb:
        import jax

        home = program.block_for(jax.default_backend())
        for block in ((8, 32) if home == 1 else (1, 8)):
            with program.block_setting(block):
                variants[f"blocks={block}"] = once()
    if "x64" in perturb:
        try:
            variants["x64"] = _in_x64(step, state, steps, record, run_kwargs)
        except Exception as err:  # a kernel that does not run in float64: said, not fatal
            notes.append(f"x64: not compared, the kernel failed in float64: {type(err).__name__}: {str(err)[:200]}")
    tolerances = {}
    for path in reference.records:
        e = np.asarray(reference[path])
        if e.dtype.kind != "f":
            for name, v in variants.items():
                if not np.array_equal(np.asarray(v[path]), e):
                    notes.append(f"{path}: not floating, and {name} changed it (a tolerance cannot cover it)")
            continue
        spreads = [_spread(np.asarray(v[path], np.float64), e.astype(np.float64), name, path, reference, v)
                   for name, v in variants.items()]
        rel = max((s[0] for s in spreads), default=0.0)
        absolute = max((s[1] for s in spreads), default=0.0)
        scale = float(np.nanmax(np.abs(e))) if e.size else 0.0
        eps = float(np.finfo(e.dtype).eps)
        tolerances[path] = {"rtol": max(safety * rel, safety * eps), "atol": max(safety * absolute,
                                                                                  safety * eps * SMALL * scale),
                            "spread_rel": rel, "spread_abs": absolute, "safety": float(safety)}
    return Calibration(tolerances, tuple(variants), float(safety), tuple(notes))


def _spread(a: np.ndarray, e: np.ndarray, name: str, path: str, reference: Any, variant: Any) -> tuple[float, float]:
    """(largest relative difference of the large elements, largest absolute difference of the
    small ones) between a rerun and the reference, at the steps both recorded."""
    common, ai, ei = np.intersect1d(variant.steps(path), reference.steps(path), return_indices=True)
    if len(common) != len(reference.steps(path)):
        raise JaxlogError(f"[jaxlog] calibrate: record {path!r} under {name} was recorded at other steps "
                          f"({len(common)} of {len(reference.steps(path))} in common): the rerun did not run as "
                          f"the reference did (an until= stop that moved?)")
    a, e = a[ai], e[ei]
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(e))):
        where = name if not np.all(np.isfinite(a)) else "the reference"
        raise JaxlogError(f"[jaxlog] calibrate: record {path!r} is not finite under {where}; "
                          f"a tolerance cannot be derived from it")
    err, mag = np.abs(a - e), np.abs(e)
    big = mag >= SMALL * (float(mag.max()) if mag.size else 0.0)
    big &= mag > 0
    rel = float((err[big] / mag[big]).max()) if big.any() else 0.0
    absolute = float(err[~big].max()) if (~big).any() else 0.0
    return rel, absolute


def _in_x64(step: Callable, state: Any, steps: int, record: Any, run_kwargs: dict) -> Any:
    """The run in float64 (floating leaves of the state widened), x64 enabled for its length."""
    import jax
    import jax.numpy as jnp

    from .run import run

    was = bool(jax.config.read("jax_enable_x64"))
    jax.config.update("jax_enable_x64", True)
    try:
        wide = jax.tree_util.tree_map(
            lambda x: jnp.asarray(x, jnp.float64) if jnp.issubdtype(jnp.result_type(x), jnp.floating) else x, state)
        return run(step, wide, steps, record=record, progress=False, **run_kwargs).trajectory
    finally:
        jax.config.update("jax_enable_x64", was)

