"""ESS-rate goldens from the test's side: ``jaxlog.check_ess`` keeps a sampler's effective sample
size per unit of cost (gradient evaluations, seconds) and its standard error in
``<jaxlog_golden_dir>/<test id>[--name].ess.json``, beside the trajectory and cost goldens and
named the same way, and fails a later run whose rate is significantly below it.

Why a stored rate: a sampler that mixes worse still returns the right mean, so every check on
its values passes; only its quality per unit of work shows it, and that figure is only known
after a first run. Why a standard error stored with it: the rate of a fixed-seed run is one draw
of a noisy estimate, so the gate compares through both errors (``EssRate.judge``) and says
"cannot tell" where they are too large for any slow-down to show, rather than pass.

One figure per file, not per platform as cost goldens: a rate per gradient evaluation is a
property of the sampler, the same on every backend within its error. ``--jaxlog-regen`` rewrites
it, ``--jaxlog-create-goldens`` writes it when missing (``goldens.rewrite``), under CI as well, as
for cost goldens. A stored file whose figures are not finite or not positive would pass or fail
anything, so it is refused when read, naming the field and the element.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import JaxlogAssertionError, JaxlogError, JaxlogRuntimeWarning
from .goldens import _NAME, CREATE_FLAG, REGEN_FLAG, rewrite
from .session import GoldenNote, JaxlogSession, TestState

SUFFIX = ".ess.json"
FORMAT = "jaxlog-ess/1"
INCONCLUSIVE = ("fail", "pass")
DEFAULT_UNIT = "grad"


@dataclass(frozen=True)
class StoredRate:
    """An ESS-rate golden as read: the record and unit it was stored for, the element shape, and
    the rate and its standard error per element (flat, in C order)."""

    record: str | None
    unit: str
    shape: tuple[int, ...]
    value: tuple[float, ...]
    se: tuple[float, ...]


def ess_path(session: JaxlogSession, nodeid: str, name: str | None) -> Path:
    from ..names import golden_name

    return session.golden_dir / golden_name(nodeid, SUFFIX, name=name)


def check_ess(session: JaxlogSession, state: TestState, checked: set[Path], values: Any, record: str | None,
              per: Any, unit: str | None, name: str | None, sigmas: float, chain_axis: int | None,
              inconclusive: str) -> str:
    """The fixture's ``check_ess``; returns ok|regenerated|created (or "cannot tell" where
    ``inconclusive="pass"`` let one through)."""
    __tracebackhide__ = True
    if name is not None and (not _NAME.fullmatch(str(name)) or str(name).startswith(".")):
        raise JaxlogError(f"check_ess(name={name!r}): use letters, digits, '_', '-', '.' (it names a file)")
    if inconclusive not in INCONCLUSIVE:
        raise JaxlogError(f"check_ess(inconclusive={inconclusive!r}): one of {list(INCONCLUSIVE)}")
    rate = _rate_of(values, record, per, unit, chain_axis)
    _check_sigmas(sigmas)
    path = ess_path(session, state.nodeid, name)
    if path in checked:
        raise JaxlogError(f"check_ess(name={name!r}): this test already checked ESS golden {session.display(path)}; "
                          "give each checked rate its own name=")
    checked.add(path)
    shown = session.display(path)
    write = rewrite(session, path.exists())
    if write is not None:
        _write(path, rate, state.nodeid)
        warnings.warn(JaxlogRuntimeWarning(f"[jaxlog] {write.status} ESS golden {shown} "
                                           f"({_figures(rate.value, rate.se, rate.unit)}) ({write.flag})"),
                      stacklevel=3)
        state.goldens.append(GoldenNote(path, write.status))
        return write.status
    if not path.exists():
        raise JaxlogAssertionError(f"[jaxlog] ESS golden {shown} does not exist: the rate a sampler reaches is known "
                                   f"only after a first run\nto create it, run pytest with {CREATE_FLAG} (missing "
                                   f"goldens only) or {REGEN_FLAG}")
    status = _compare(state, read(path, shown), rate, shown, sigmas, inconclusive)
    state.goldens.append(GoldenNote(path, status))
    return status


def _check_sigmas(sigmas: Any) -> None:
    if isinstance(sigmas, bool) or not isinstance(sigmas, (int, float)) or not (math.isfinite(sigmas) and sigmas > 0):
        raise JaxlogError(f"check_ess: sigmas must be a finite number > 0, got {sigmas!r}")


def _rate_of(values: Any, record: str | None, per: Any, unit: str | None, chain_axis: int | None) -> Any:
    """The ``EssRate`` to check: given, from an ``EffectiveSampleSize`` and ``per``, or from draws
    (a run, a trajectory and ``record``, or an array with ``chain_axis``) and ``per``."""
    from ..check.ess import EffectiveSampleSize, EssRate, ess

    if isinstance(values, EssRate):
        if per is not None:
            raise JaxlogError("check_ess: an EssRate is already per unit of cost; leave per= out")
        if unit is not None and unit != values.unit:
            raise JaxlogError(f"check_ess(unit={unit!r}): the EssRate given is per {values.unit!r}")
        return values
    if per is None:
        raise JaxlogError("check_ess: per= is the cost the draws took, e.g. the gradient evaluations a run made "
                          "(the sum of an HMC kernel's num_integration_steps) with unit='grad', or seconds with "
                          "unit='s'")
    unit = DEFAULT_UNIT if unit is None else unit
    if not isinstance(unit, str) or not unit.strip():
        raise JaxlogError(f"check_ess(unit={unit!r}): name the unit of per= ('grad', 's', ...)")
    if not isinstance(values, EffectiveSampleSize):
        if hasattr(values, "trajectory") and hasattr(values, "steps_done"):  # a run's result
            values = values.trajectory
        values = ess(values, record, chain_axis=chain_axis)
    return values.per(per, unit)


def _compare(state: TestState, stored: StoredRate, rate: Any, shown: str, sigmas: float, inconclusive: str) -> str:
    """Judge each element against the stored rate; fail on any below it (or one that cannot tell,
    unless ``inconclusive="pass"``), note a rate clearly above it (a regression back to the stored
    figure would pass: worth storing)."""
    import numpy as np

    from ..check.ess import BELOW, CANNOT_TELL, EssRate

    __tracebackhide__ = True
    what = "the draws" if rate.record is None else f"record {rate.record!r}"
    shape = tuple(int(n) for n in np.shape(rate.value))
    if stored.unit != rate.unit or stored.shape != shape:
        field, was, now = ("unit", stored.unit, rate.unit) if stored.unit != rate.unit else \
            ("shape", list(stored.shape), list(shape))
        raise JaxlogAssertionError(f"[jaxlog] ESS golden {shown} holds a rate of {field} {was!r}, {what} gives "
                                   f"{field} {now!r}: they cannot be compared\nif the check changed on purpose, run "
                                   f"pytest with {REGEN_FLAG}")
    values, ses = np.ravel(rate.value), np.ravel(rate.se)
    found = []
    for i, (v, s, g, gs) in enumerate(zip(values, ses, stored.value, stored.se)):
        one = EssRate(rate.record, rate.unit, np.asarray(v), np.asarray(s))
        found.append((_element(i, shape), one.judge(g, gs, sigmas=sigmas)))
    bad = [(at, j) for at, j in found if j.verdict != "not below"]
    lines = [f"  {at or 'rate'}: {j.describe(rate.unit)}" for at, j in (bad or found)]
    if any(j.verdict == BELOW for _, j in bad):
        raise JaxlogAssertionError("\n".join([f"[jaxlog] ESS rate of {what} fell below ESS golden {shown}:", *lines,
                                              f"if the sampler was made slower on purpose, run pytest with "
                                              f"{REGEN_FLAG}"]))
    if bad:
        head = f"[jaxlog] ESS rate of {what} against ESS golden {shown}: cannot tell"
        if inconclusive == "fail":
            raise JaxlogAssertionError("\n".join([f"{head}:", *lines, "measure with more or longer chains (and the "
                                                  f"golden the same way: run pytest with {REGEN_FLAG})"]))
        state.notes.append(f"{head} (inconclusive='pass')")
        warnings.warn(JaxlogRuntimeWarning("\n".join([f"{head}; passed (inconclusive='pass'):", *lines])),
                      stacklevel=3)
        return CANNOT_TELL
    state.notes.append(f"ESS rate of {what} against {shown}: not below; " + "; ".join(
        f"{at + ': ' if at else ''}{j.value:.4g} ± {j.se:.2g} per {rate.unit} (golden {j.golden:.4g}, a drop of "
        f"{j.detectable:.0%} would show)" for at, j in found))
    above = [at or "rate" for at, j in found if j.value > j.golden + sigmas * math.hypot(j.se, j.golden_se)]
    if above:
        warnings.warn(JaxlogRuntimeWarning(
            f"[jaxlog] ESS rate of {what} is above ESS golden {shown} by more than {sigmas:g} standard errors "
            f"({', '.join(above)}): if the sampler was made faster on purpose, store the new rate so a regression "
            f"back is caught: run pytest with {REGEN_FLAG}"), stacklevel=3)
    return "ok"


def _element(i: int, shape: tuple[int, ...]) -> str:
    if not shape:
        return ""
    import numpy as np

    return f"element {[int(j) for j in np.unravel_index(i, shape)]}"


def _figures(value: Any, se: Any, unit: str) -> str:
    import numpy as np

    return ", ".join(f"{v:.4g} ± {s:.2g}" for v, s in zip(np.ravel(value), np.ravel(se))) + f" per {unit}"


def read(path: Path, shown: str | None = None) -> StoredRate:
    """The stored rate, every field checked: the unit a string, the shape a list of sizes, each
    rate a finite number > 0 and each standard error a finite number >= 0, as many as the shape
    holds. One ``JaxlogError`` names the file, the field and the element otherwise."""
    where = f"[jaxlog] ESS golden {shown or path}"
    fix = f"; regenerate it with {REGEN_FLAG}"
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise JaxlogError(f"{where}: not readable JSON ({e}){fix}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise JaxlogError(f"{where}: not a {FORMAT} file (expected {{'format': {FORMAT!r}, ...}}){fix}")
    record, unit, shape = doc.get("record"), doc.get("unit"), doc.get("shape")
    if record is not None and not isinstance(record, str):
        raise JaxlogError(f"{where}: field 'record' is {record!r:.60}, expected a string or null{fix}")
    if not isinstance(unit, str) or not unit:
        raise JaxlogError(f"{where}: field 'unit' is {unit!r:.60}, expected a string such as 'grad'{fix}")
    if not (isinstance(shape, list) and all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                                            for n in shape)):
        raise JaxlogError(f"{where}: field 'shape' is {shape!r:.60}, expected a list of sizes > 0 ([] for one "
                          f"figure){fix}")
    size = math.prod(shape)
    figures = {}
    for field, least in (("value", "> 0"), ("se", ">= 0")):
        flat = doc.get(field)
        if not (isinstance(flat, list) and len(flat) == size):
            raise JaxlogError(f"{where}: field {field!r} is {flat!r:.60}, expected a list of {size} number(s) "
                              f"(one per element, flat){fix}")
        for i, v in enumerate(flat):
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and \
                (v > 0 if least == "> 0" else v >= 0)
            if not ok:
                at = f" {_element(i, tuple(shape))}" if shape else ""
                raise JaxlogError(f"{where}: field {field!r}{at} is {v!r:.60}, expected a finite number {least}{fix}")
        figures[field] = tuple(float(v) for v in flat)
    return StoredRate(record, unit, tuple(shape), figures["value"], figures["se"])


def _write(path: Path, rate: Any, test: str) -> None:
    """Store ``rate`` (atomic replace); refuses a rate that could not be read back as a golden."""
    import numpy as np

    value = [float(v) for v in np.ravel(rate.value)]
    se = [float(s) for s in np.ravel(rate.se)]
    bad = [i for i, (v, s) in enumerate(zip(value, se)) if not (math.isfinite(v) and v > 0 and math.isfinite(s)
                                                                  and s >= 0)]
    shape = [int(n) for n in np.shape(rate.value)]
    if bad:
        at = _element(bad[0], tuple(shape))
        raise JaxlogError(f"[jaxlog] ESS golden {path}: the rate {at + ' ' if at else ''}is {value[bad[0]]!r} ± "
                          f"{se[bad[0]]!r}, not a finite rate > 0 with a finite error (one chain too short for "
                          f"its quarters to give an error?): nothing stored")
    doc = {"format": FORMAT, "test": test, "record": rate.record, "unit": rate.unit, "shape": shape,
           "value": value, "se": se}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)
