"""Goldens from the test's side: the file a check uses, regenerating (``--jaxlog-regen``), creating
missing ones (``--jaxlog-create-goldens``), and explaining a missing golden. Sections: the policy
all compared products share (``decide``), trajectory goldens, ESS-rate goldens, cost goldens.

A golden's name comes from the test id, which pytest makes relative to its rootdir; started from
another directory, or without an ini file at the project root, the same test gets another id and
so another file name. When a golden is missing, the message therefore looks for a file under the
old name and says which rootdir would have produced it.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..errors import CostRegression, JaxlogAssertionError, JaxlogError, JaxlogRuntimeWarning
from .options import GOLDEN_DIR_INI, OPTIONS, lookup
from .session import GoldenNote, JaxlogSession, TestState

_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
CREATE_FLAG = OPTIONS["create_goldens"].flag_name
REGEN_FLAG = OPTIONS["regen"].flag_name
REVIEW_FLAG = OPTIONS["golden_review"].flag_name
_SCAN_LIMIT = 20000  # files looked at when searching for a golden under another name


# ---------------------------------------------------------------------------------------------
# The policy every compared product follows (trajectory, cost and ESS goldens): one verb per check
# (``decide``), as pytest-regressions' ``perform_regression_check``, so the three wings cannot drift
# apart on what a flag does or on the words that name the flag fixing a failure.
#
# What a check does with its stored file, by the session's flags and the comparison's outcome:
# ``--jaxlog-regen`` writes (without reading the stored file: it may be damaged or of another
# shape, which is what regenerating repairs), ``--jaxlog-create-goldens`` writes a missing one and
# compares the others, a missing one fails otherwise, and a difference fails with the flag that
# rewrites it. Under review (``--jaxlog-golden-review``, on where CI is set) a stored trajectory
# golden is never rewritten: a difference leaves the obtained one pending beside it, and the
# failure names the command that applies it. Cost and ESS goldens are one small readable file each,
# rewritten under ``--jaxlog-regen`` even under review (they have no pending files).
#
# Benchmark baselines do not go through it: their stored file is a whole session's named run,
# written by ``--jaxlog-benchmark-save=NAME`` beside the runs it compares with, never over them, and a
# benchmark the saved run lacks is noted, not failed; there is nothing to regenerate, create or
# review per test. Their failure message ends with the flag that fixes it as well
# (``compare.baseline.failure_message``).

# outcomes: what a check knows of its stored file when it asks
MISSING = "missing"  # no stored file (or no entry for this platform in it)
STORED = "stored"  # a stored file, not compared yet
SAME = "same"  # compared: within the tolerance
DIFFERS = "differs"  # compared: outside it
OUTCOMES = (MISSING, STORED, SAME, DIFFERS)

# actions: what the check does
COMPARE = "compare"  # compare with the stored file, then ask again with SAME or DIFFERS
CREATE = "create"  # write: missing, and creation allowed
REGENERATE = "regenerate"  # write: regenerating, whatever is stored
PASS = "pass"  # the same as stored: nothing written
FAIL = "fail"  # differs: the test fails, the hint names the flag that rewrites the file
PENDING = "pending"  # differs under review: the stored file is left, the obtained one is pending beside it
ABSENT = "absent"  # missing, and nothing allows writing it: the test fails, the hint names the flags
ACCEPT_ID = "<ID>"  # where the pending file's id goes in the hint of a PENDING decision


@dataclass(frozen=True)
class Product:
    """What the policy needs of a compared product: its name in messages, whether a difference
    under review leaves a pending file (``reviewable``) rather than a rewritten one, and the status
    a regeneration reports where nothing was stored (trajectory goldens have always said
    "regenerated", cost and ESS goldens "created": kept as users and summaries read them)."""

    noun: str
    reviewable: bool
    regenerated_missing: str


TRAJECTORY = Product(noun="golden trajectory", reviewable=True, regenerated_missing="regenerated")
COST = Product(noun="cost golden", reviewable=False, regenerated_missing="created")
ESS = Product(noun="ESS golden", reviewable=False, regenerated_missing="created")
PRODUCTS = (TRAJECTORY, COST, ESS)


@dataclass(frozen=True)
class Flags:
    """The session's flags the policy reads (``JaxlogSession``'s, resolved there)."""

    regen: bool = False
    create: bool = False
    review: bool = False

    @staticmethod
    def of(session: JaxlogSession) -> Flags:
        return Flags(regen=session.regen, create=session.create_goldens, review=session.golden_review)


@dataclass(frozen=True)
class Decision:
    """What a check does (``action``), the status it records and returns where it does not fail
    (ok|created|regenerated|pending; "" while it has still to compare, or when it fails), the
    option behind it (``flag``: the one that asked for a write, the one that fixes a failure, the
    review that kept the file) and a failure's last line (``hint``: names the flag, or for a
    pending file the command, that fixes it; "" where nothing fails)."""

    action: str
    status: str = ""
    flag: str = ""
    hint: str = ""

    @property
    def writes(self) -> bool:
        return self.action in (CREATE, REGENERATE)

    def accept_hint(self, pending_id: str) -> str:
        """A PENDING decision's hint for the pending file ``pending_id``."""
        return self.hint.replace(ACCEPT_ID, pending_id)


MISSING_HINT = f"to create it, run pytest with {CREATE_FLAG} (missing goldens only) or {REGEN_FLAG}"
REGEN_HINT = f"run pytest with {REGEN_FLAG}"  # a wing says why before it: "if the change is intended, ..."
ACCEPT_HINT = (f"to apply it: python -m pytest_jaxlog golden accept {ACCEPT_ID} (reject: drop it; --all: every "
               "pending golden)")


def decide(product: Product, flags: Flags, outcome: str) -> Decision:
    """What a check of ``product`` does with its stored file under ``flags``, given ``outcome``
    (``MISSING``, ``STORED`` before comparing, ``SAME`` or ``DIFFERS`` after): the one place the
    regenerate / create / review policy and the words of its hints are written."""
    if outcome not in OUTCOMES:
        raise JaxlogError(f"[jaxlog] decide(outcome={outcome!r}): one of {list(OUTCOMES)}")
    if outcome == MISSING:
        if flags.regen:
            return Decision(action=REGENERATE, status=product.regenerated_missing, flag=REGEN_FLAG)
        if flags.create:
            return Decision(action=CREATE, status="created", flag=CREATE_FLAG)
        return Decision(action=ABSENT, flag=CREATE_FLAG, hint=MISSING_HINT)
    reviewed = flags.review and product.reviewable
    if flags.regen and not reviewed:
        return Decision(action=REGENERATE, status="regenerated", flag=REGEN_FLAG)
    if outcome == STORED:
        return Decision(action=COMPARE)
    if outcome == SAME:
        return Decision(action=PASS, status="ok")
    if reviewed:
        return Decision(action=PENDING, status="pending", flag=REVIEW_FLAG, hint=ACCEPT_HINT)
    return Decision(action=FAIL, flag=REGEN_FLAG, hint=REGEN_HINT)


def golden_path(session: JaxlogSession, nodeid: str, name: str | None) -> Path:
    from ..paths import golden_name

    return session.golden_dir / golden_name(nodeid, name=name)


def check(session: JaxlogSession, state: TestState, checked: set[Path], run: Any, name: str | None,
          options: dict[str, Any]) -> str:
    """The fixture's ``check_golden``: compare, regenerate or create; returns ok|regenerated|created."""
    from ..compare.golden import diff_trajectories, regenerate

    __tracebackhide__ = True
    if name is not None and (not _NAME.fullmatch(str(name)) or str(name).startswith(".")):
        raise JaxlogError(f"check_golden(name={name!r}): use letters, digits, '_', '-', '.' (it names a file)")
    try:
        inspect.signature(diff_trajectories).bind(run, None, **options)
    except TypeError as e:
        raise JaxlogError(f"check_golden: {e} (options: those of jl.assert_trajectory_close)") from None
    path = golden_path(session, state.nodeid, name)
    if path in checked:  # else --jaxlog-regen keeps the last run's and the first run then fails
        raise JaxlogError(
            f"check_golden(name={name!r}): this test already checked golden {session.display(path)}; "
            "give each checked run its own name= (e.g. name=\"second\")"
        )
    checked.add(path)
    written = path
    flags = Flags.of(session)
    decision = decide(TRAJECTORY, flags, STORED if path.exists() else MISSING)
    if decision.action == ABSENT:
        raise JaxlogAssertionError(missing_message(session, state.nodeid, path))
    if decision.action == REGENERATE:
        written = regenerate(run, path, **options)
    elif decision.action == CREATE:
        regenerate(run, path, **options)
    else:
        decision = _compare(session, state, flags, run, path, name, options)
    status = decision.status
    state.goldens.append(GoldenNote(written, status))
    if decision.action == REGENERATE:
        warnings.warn(JaxlogRuntimeWarning(
            f"[jaxlog] regenerated golden {session.display(written)} ({decision.flag}){_status_note(run)}"),
            stacklevel=3)
    elif decision.action == CREATE:
        found = find_elsewhere(session, state.nodeid, path)
        other = f"; note: {found[0].explain(session)}" if found else ""
        warnings.warn(JaxlogRuntimeWarning(
            f"[jaxlog] created missing golden {session.display(path)} ({decision.flag}){_status_note(run)}{other}"),
            stacklevel=3)
    return status


def _compare(session: JaxlogSession, state: TestState, flags: Flags, run: Any, path: Path, name: str | None,
             options: dict[str, Any]) -> Decision:
    """Compare with this platform's entry (else the reference); a difference fails the test, and
    under review writes the obtained golden beside the entry as a pending file first."""
    from ..compare.golden import TrajectoryMismatch, compare_golden, plot_mismatch
    from .report import failure_plot

    __tracebackhide__ = True
    result = compare_golden(run, path, **options)
    decision = decide(TRAJECTORY, flags, SAME if result.ok else DIFFERS)
    if decision.action == PASS:
        return decision
    if decision.action == PENDING:
        hint = _review(session, state, run, result, options, decision)
    else:
        hint = result.hint(decision.hint)
    exc = TrajectoryMismatch(result.message(hint), result.diff)
    label = "golden" if name is None else f"golden--{name}"
    failure_plot(session, state, label, f"{label}-diff.png", "golden mismatch",
                 lambda file: plot_mismatch(run, result.entry.path, result.diff, file), exc)
    raise exc


def _review(session: JaxlogSession, state: TestState, run: Any, result: Any, options: dict[str, Any],
            decision: Decision) -> str:
    """Write the pending golden of a mismatch (the golden itself untouched); the message's last lines."""
    from ..compare import golden_files as golden_pending
    from ..compare.golden import write_golden

    jax_range = result.choice.mine.platform.jax_range if result.choice.mine is not None else None
    summary = "\n".join([result.provenance_line(), *result.diff.report().splitlines()[:2]])
    pending = golden_pending.write(lambda tmp: write_golden(run, tmp, jax_range, **options), result.target,
                                   session.golden_dir, test=state.nodeid, summary=summary)
    state.goldens.append(GoldenNote(result.target, decision.status, pending.data, pending.id))
    source = lookup(session.config, "golden_review")
    why = "CI is set" if source.origin == "default" else f"{source.label} is on"
    return (f"golden left as it is (review: {why}); the obtained one is pending as {session.display(pending.data)}"
            f"\n{decision.accept_hint(pending.id)}")


def _status_note(run: Any) -> str:
    """A reference made from a broken run deserves a second look: say how the run ended."""
    traj = getattr(run, "trajectory", run)
    status = getattr(traj, "status", None)
    if status in (None, "complete"):
        return ""
    v = getattr(traj, "violation", None)
    inv = v.get("invariant") if isinstance(v, dict) else None
    return f"; note: the run's status is {status!r}" + (f" ({inv} violated at step {v.get('step')})" if inv else "")


def missing_message(session: JaxlogSession, nodeid: str, path: Path) -> str:
    lines = [f"[jaxlog] golden trajectory {session.display(path)} does not exist"]
    found = find_elsewhere(session, nodeid, path)
    for f in found[:3]:
        lines.append(f"  {f.explain(session)}")
    if found:
        lines.append("  pytest names goldens after test ids relative to its rootdir: run pytest where the goldens "
                     "were made, or put an ini file (pytest.ini, or pyproject.toml with [tool.pytest.ini_options]) "
                     "at the project root so the rootdir does not depend on where pytest starts")
    lines.append(decide(TRAJECTORY, Flags(), MISSING).hint)
    return "\n".join(lines)


@dataclass(frozen=True)
class Found:
    """A golden for the same test under another name or in another golden directory."""

    path: Path
    name: str  # the name this session computes
    nodeid: str
    rootdir: Path  # this session's
    other_rootdir: Path | None  # the rootdir that would give the found name, when it can be told
    prefix: str  # path components by which the two test ids differ ("tests/"), or ""
    found_longer: bool  # the found name has the extra components

    def explain(self, session: JaxlogSession) -> str:
        where = session.display(self.path)
        if not self.prefix:
            return (f"found {where}: the same file name in another golden directory; this session's is "
                    f"{session.display(session.golden_dir)} ({GOLDEN_DIR_INI} relative to rootdir {self.rootdir})")
        if self.found_longer:
            why = (f"its test id starts with {self.prefix!r}, this session's ({self.nodeid}) does not: "
                   f"pytest's rootdir is {self.rootdir} here")
        else:
            why = (f"this session's test id ({self.nodeid}) starts with {self.prefix!r}, the file's does not: "
                   f"pytest's rootdir is {self.rootdir} here")
        made = f", it was made with rootdir {self.other_rootdir}" if self.other_rootdir is not None else ""
        return f"found {where} for the same test under another name: {why}{made}"


def find_elsewhere(session: JaxlogSession, nodeid: str, path: Path) -> list[Found]:
    """Goldens that look like this test's under another rootdir or golden directory: the same name in
    another golden directory, or a name that differs by leading path components of the test id."""
    target = path.name
    out: list[Found] = []
    seen: set[Path] = set()
    for directory in _golden_dirs(session, nodeid):
        for f in _files(directory):
            if f in seen or f == path:
                continue
            seen.add(f)
            fname = f.name
            if fname == target:
                out.append(Found(f, target, nodeid, session.rootdir, None, "", False))
            elif fname.endswith("." + target):
                prefix = fname[: -len(target) - 1]
                out.append(Found(f, target, nodeid, session.rootdir, _shorter(session.rootdir, prefix),
                                 prefix.replace(".", "/") + "/", True))
            elif target.endswith("." + fname):
                prefix = target[: -len(fname) - 1]
                out.append(Found(f, target, nodeid, session.rootdir, session.rootdir.joinpath(*prefix.split(".")),
                                 prefix.replace(".", "/") + "/", False))
    return sorted(out, key=lambda x: (len(x.prefix), str(x.path)))


def _shorter(rootdir: Path, prefix: str) -> Path | None:
    """The rootdir whose test ids have ``prefix`` in front of ours: ours minus those trailing folders."""
    parts = prefix.split(".")
    if len(parts) < len(rootdir.parts) and list(rootdir.parts[-len(parts):]) == parts:
        return rootdir.parents[len(parts) - 1]
    return None


def _golden_dirs(session: JaxlogSession, nodeid: str) -> list[Path]:
    """This session's golden directory, and the ones the ini key would give from the invocation
    directory, from a few folders above the rootdir and from the folders between the rootdir and
    the test file (each a rootdir the test could have had)."""
    dirs = [session.golden_dir]
    rel = Path(os.path.expanduser(str(session.config.getini(GOLDEN_DIR_INI))))
    if not rel.is_absolute():
        folders = [p for p in nodeid.split("::")[0].replace("\\", "/").split("/")[:-1] if p not in ("", ".", "..")]
        below = [session.rootdir.joinpath(*folders[:i]) for i in range(1, len(folders) + 1)]
        for base in (session.invocation_dir, *list(session.rootdir.parents)[:3], *below):
            d = base / rel
            if d not in dirs:
                dirs.append(d)
    return [d for d in dirs if d.is_dir()]


def _files(directory: Path) -> list[Path]:
    from ..compare.golden_files import PLATFORMS

    out: list[Path] = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.endswith(PLATFORMS)]  # other platforms' entries of a golden
        for name in files:
            if name.endswith(".h5"):
                out.append(Path(root) / name)
            if len(out) >= _SCAN_LIMIT:
                return out
    return out

# ---------------------------------------------------------------------------------------------
# ESS-rate goldens from the test's side: ``jaxlog.check_ess`` keeps a sampler's effective sample
# size per unit of cost (gradient evaluations, seconds) and its standard error in
# ``<jaxlog_golden_dir>/<test id>[--name].ess.json``, beside the trajectory and cost goldens and
# named the same way, and fails a later run whose rate is significantly below it.
#
# Why a stored rate: a sampler that mixes worse still returns the right mean, so every check on
# its values passes; only its quality per unit of work shows it, and that figure is only known
# after a first run. Why a standard error stored with it: the rate of a fixed-seed run is one draw
# of a noisy estimate, so the gate compares through both errors (``EssRate.judge``) and says
# "cannot tell" where they are too large for any slow-down to show, rather than pass.
#
# One figure per file, not per platform as cost goldens: a rate per gradient evaluation is a
# property of the sampler, the same on every backend within its error. ``--jaxlog-regen`` rewrites
# it, ``--jaxlog-create-goldens`` writes it when missing (``decide``), under CI as well, as
# for cost goldens. A stored file whose figures are not finite or not positive would pass or fail
# anything, so it is refused when read, naming the field and the element.

ESS_SUFFIX = ".ess.json"
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
    from ..paths import golden_name

    return session.golden_dir / golden_name(nodeid, ESS_SUFFIX, name=name)


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
    flags = Flags.of(session)
    decision = decide(ESS, flags, STORED if path.exists() else MISSING)
    if decision.writes:
        _write(path, rate, state.nodeid)
        warnings.warn(JaxlogRuntimeWarning(f"[jaxlog] {decision.status} ESS golden {shown} "
                                           f"({_figures(rate.value, rate.se, rate.unit)}) ({decision.flag})"),
                      stacklevel=3)
        state.goldens.append(GoldenNote(path, decision.status))
        return decision.status
    if decision.action == ABSENT:
        raise JaxlogAssertionError(f"[jaxlog] ESS golden {shown} does not exist: the rate a sampler reaches is known "
                                   f"only after a first run\n{decision.hint}")
    status = _compare_ess(state, flags, read(path, shown), rate, shown, sigmas, inconclusive)
    state.goldens.append(GoldenNote(path, status))
    return status


def _check_sigmas(sigmas: Any) -> None:
    if isinstance(sigmas, bool) or not isinstance(sigmas, (int, float)) or not (math.isfinite(sigmas) and sigmas > 0):
        raise JaxlogError(f"check_ess: sigmas must be a finite number > 0, got {sigmas!r}")


def _rate_of(values: Any, record: str | None, per: Any, unit: str | None, chain_axis: int | None) -> Any:
    """The ``EssRate`` to check: given, from an ``EffectiveSampleSize`` and ``per``, or from draws
    (a run, a trajectory and ``record``, or an array with ``chain_axis``) and ``per``."""
    from ..check.statistics import EffectiveSampleSize, EssRate, ess

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


def _compare_ess(state: TestState, flags: Flags, stored: StoredRate, rate: Any, shown: str, sigmas: float, inconclusive: str) -> str:
    """Judge each element against the stored rate; fail on any below it (or one that cannot tell,
    unless ``inconclusive="pass"``), note a rate clearly above it (a regression back to the stored
    figure would pass: worth storing)."""
    import numpy as np

    from ..check.statistics import BELOW, CANNOT_TELL, EssRate

    __tracebackhide__ = True
    what = "the draws" if rate.record is None else f"record {rate.record!r}"
    fix = decide(ESS, flags, DIFFERS).hint  # every failure below: the stored rate no longer stands
    shape = tuple(int(n) for n in np.shape(rate.value))
    if stored.unit != rate.unit or stored.shape != shape:
        field, was, now = ("unit", stored.unit, rate.unit) if stored.unit != rate.unit else \
            ("shape", list(stored.shape), list(shape))
        raise JaxlogAssertionError(f"[jaxlog] ESS golden {shown} holds a rate of {field} {was!r}, {what} gives "
                                   f"{field} {now!r}: they cannot be compared\nif the check changed on purpose, {fix}")
    values, ses = np.ravel(rate.value), np.ravel(rate.se)
    found = []
    for i, (v, s, g, gs) in enumerate(zip(values, ses, stored.value, stored.se)):
        one = EssRate(rate.record, rate.unit, np.asarray(v), np.asarray(s))
        found.append((_element(i, shape), one.judge(g, gs, sigmas=sigmas)))
    bad = [(at, j) for at, j in found if j.verdict != "not below"]
    lines = [f"  {at or 'rate'}: {j.describe(rate.unit)}" for at, j in (bad or found)]
    if any(j.verdict == BELOW for _, j in bad):
        raise JaxlogAssertionError("\n".join([f"[jaxlog] ESS rate of {what} fell below ESS golden {shown}:", *lines,
                                              f"if the sampler was made slower on purpose, {fix}"]))
    if bad:
        head = f"[jaxlog] ESS rate of {what} against ESS golden {shown}: cannot tell"
        if inconclusive == "fail":
            raise JaxlogAssertionError("\n".join([f"{head}:", *lines, "measure with more or longer chains (and the "
                                                  f"golden the same way: {fix})"]))
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
            f"back is caught: {fix}"), stacklevel=3)
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

# ---------------------------------------------------------------------------------------------
# Cost goldens from the test's side: ``jaxlog.check_cost`` compares a run's (or a function's)
# ``jl.Cost`` with the entry for this platform in ``<jaxlog_golden_dir>/<test id>[--name].cost.json``,
# beside the trajectory goldens and named the same way; ``--jaxlog-regen`` (re)writes this
# platform's entry, ``--jaxlog-create-goldens`` writes it when missing.

COST_SUFFIX = ".cost.json"


def cost_path(session: JaxlogSession, nodeid: str, name: str | None) -> Path:
    from ..paths import golden_name

    return session.golden_dir / golden_name(nodeid, COST_SUFFIX, name=name)


def check_cost(session: JaxlogSession, state: TestState, checked: set[Path], run: Any, rtol: float,
               metrics: Iterable[str] | None, name: str | None) -> str:
    """The fixture's ``check_cost``; returns ok|regenerated|created."""
    from ..compare import cost as costfile

    __tracebackhide__ = True
    if name is not None and (not _NAME.fullmatch(str(name)) or str(name).startswith(".")):
        raise JaxlogError(f"check_cost(name={name!r}): use letters, digits, '_', '-', '.' (it names a file)")
    cost = _cost_of(run)
    path = cost_path(session, state.nodeid, name)
    if path in checked:
        raise JaxlogError(f"check_cost(name={name!r}): this test already checked cost golden {session.display(path)}; "
                          "give each checked cost its own name=")
    checked.add(path)
    key = cost.platform_key()
    state.costs.append({"name": name, "platform": key, "metrics": cost.metrics()})
    entries = costfile.read(path)
    shown = session.display(path)
    flags = Flags.of(session)
    decision = decide(COST, flags, STORED if key in entries else MISSING)
    if decision.writes:
        costfile.write(path, cost, state.nodeid)
        warnings.warn(JaxlogRuntimeWarning(f"[jaxlog] {decision.status} cost golden {shown} entry {key!r} "
                                           f"({decision.flag})"), stacklevel=3)
    elif decision.action == ABSENT:
        what = f"has no entry for {key!r} (it has {sorted(entries)})" if entries else "does not exist"
        raise JaxlogAssertionError(f"[jaxlog] cost golden {shown} {what}: XLA's figures depend on the backend and "
                                   f"jax version\n{decision.hint}")
    else:
        stored = entries[key].get("metrics", {})
        moved = costfile.compare(stored, cost.metrics(), rtol, metrics, where=f"cost golden {shown} entry {key!r}")
        decision = decide(COST, flags, DIFFERS if moved else SAME)
        if decision.action == FAIL:
            _cost_failed(session, state, decision, shown, key, stored, cost.metrics(), rtol, metrics, moved, name)
    state.goldens.append(GoldenNote(path, decision.status))
    return decision.status


def _cost_failed(session: JaxlogSession, state: TestState, decision: Decision, shown: str, key: str, stored: dict,
                 obtained: dict, rtol: float, metrics: Iterable[str] | None, moved: list, name: str | None) -> None:
    """Raise the cost wing's failure, its picture attached."""
    from ..compare.cost import failure_message, plot_regression
    from .report import failure_plot

    __tracebackhide__ = True
    exc = CostRegression(failure_message(shown, key, moved, rtol, decision.hint), tuple(moved))
    label = "cost" if name is None else f"cost--{name}"
    title = f"{state.nodeid}: cost against {shown} [{key}]"
    failure_plot(session, state, label, f"{label}.png", "cost regression",
                 lambda file: plot_regression(stored, obtained, rtol, metrics, moved, title, file), exc)
    raise exc


def _cost_of(run: Any) -> Any:
    from ..profiling.cost import Cost

    cost = run if isinstance(run, Cost) else getattr(run, "cost", None)
    if not isinstance(cost, Cost):
        raise JaxlogError(f"check_cost: expected a jl.run result or a jl.Cost, got {type(run).__name__}"
                          + (" (a run that dispatched no step has no cost)" if hasattr(run, "steps_done") else ""))
    return cost
