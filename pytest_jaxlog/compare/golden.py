"""Golden trajectories: one comparison engine (``diff_trajectories``) behind the assertion,
``check_golden`` (used by the pytest plugin) and ``python -m pytest_jaxlog diff``.

The engine returns a structured ``Diff`` rather than raising, so each caller words the outcome
for its audience (a ``jl.TrajectoryMismatch`` with the regen hint, or a CLI report with an exit
code). The comparison options are declared once, by ``diff_trajectories``; the assertion and
``check_golden`` show them in their own signatures and pass every one through.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..record import values as args
from ..check.plots import new_figure, point_style, save_figure, step_axis
from ..errors import JaxlogAssertionError, JaxlogError
from ..paths import golden_name as golden_name  # re-exported: tests and users name it here
from ..paths import shown
from ..record.schedule import check_step
from ..store.hdf5.layout import provenance
from . import golden_files as golden_entries
from . import golden_files as golden_info

REGEN_FLAG = "--jaxlog-regen"  # owned by the options table (harness/options.py, a layer above): a test keeps them equal


class TrajectoryMismatch(JaxlogAssertionError):
    """Two trajectories differ (or the golden to compare with is missing). ``diff`` is the full
    comparison (``jl.golden.Diff``: every differing record, with statistics), None when the golden
    file is missing."""

    def __init__(self, message: str, diff: "Diff | None" = None):
        super().__init__(message)
        self.diff = diff


# --------------------------------------------------------------------------- inputs


def as_trajectory(obj: Any):
    """A Trajectory from a ``jl.Run`` (``.trajectory``), a Trajectory, or a path (loaded)."""
    if isinstance(obj, (str, os.PathLike)):
        path = Path(obj)
        if not path.exists():
            raise JaxlogError(f"trajectory file {display_path(path)} does not exist")
        from ..store.hdf5.trajectory import load

        return load(path)
    if hasattr(obj, "records") and hasattr(obj, "steps"):
        return obj
    traj = getattr(obj, "trajectory", None)
    if traj is not None:
        return traj
    raise JaxlogError(f"cannot compare a {type(obj).__name__}: pass a jl.Run, a Trajectory or a path to a trajectory file")


def display_path(path: str | os.PathLike | None) -> str:
    """``path`` as the rest of the package shows paths (``paths.shown``): relative inside the project."""
    if path is None:
        return "(in memory)"
    return shown(path)


def select_records(names: Sequence[str] | str | None, *trajs) -> tuple[str, ...] | None:
    """Leaf paths named by ``names`` (a leaf or a prefix) in any of ``trajs``; unknown -> JaxlogError."""
    if names is None:
        return None
    given = names
    try:
        names = [names] if isinstance(names, str) else list(names)
    except TypeError:  # not iterable: reported below with what was given
        names = [given]
    if not all(isinstance(n, str) and n for n in names):
        raise JaxlogError(f"records= takes a record name or a list of them (leaf paths or prefixes), got {given!r}")
    available: list[str] = []
    for traj in trajs:
        available += [p for p in traj.records if p not in available]
    out: list[str] = []
    for name in names:
        name = name.strip("/")
        hits = [p for p in available if p == name or p.startswith(name + "/")]
        if not hits:
            raise JaxlogError(f"record {name!r} is not recorded; recorded: {', '.join(available) or '(none)'}")
        out += [p for p in hits if p not in out]
    return tuple(out)


def _step_mask(steps: np.ndarray, select: Any) -> np.ndarray:
    """Which of ``steps`` the ``steps=`` argument keeps: a slice of step numbers
    (``slice(100, None, 10)``), a range, step numbers, or a schedule (``jl.every``)."""
    if select is None:
        return np.ones(len(steps), bool)
    if isinstance(select, slice):
        lo = 0 if select.start is None else check_step(select.start, "steps=slice(start, ...)")
        keep = steps >= lo
        if select.stop is not None:
            keep &= steps < check_step(select.stop, "steps=slice(..., stop)")
        if select.step is not None:
            stride = check_step(select.step, "steps=slice(..., ..., stride)")
            if stride == 0:
                raise JaxlogError(f"steps=slice(...) needs a positive stride, got {select.step}")
            keep &= (steps - lo) % stride == 0
        return keep
    if hasattr(select, "mask"):  # a jl schedule
        return np.asarray(select.mask(steps), bool)
    if isinstance(select, (int, np.integer)):
        return steps == check_step(select, "steps=")
    try:
        wanted = np.asarray(select if isinstance(select, np.ndarray) else list(select))
    except (TypeError, ValueError):
        wanted = None
    if wanted is None or wanted.ndim != 1 or (wanted.size and wanted.dtype.kind not in "iu"):
        raise JaxlogError(
            f"steps= takes a slice, a range, step numbers (ints) or a schedule; got {select!r:.80}"
        )
    if wanted.size and wanted.min() < 0:
        check_step(int(wanted.min()), "steps=: each step number")
    return np.isin(steps, wanted.astype(np.int64))


# --------------------------------------------------------------------------- result


@dataclass
class RecordDiff:
    """How one leaf record differs. ``kind``: missing | extra | steps | shape | dtype | values."""

    path: str
    kind: str
    detail: str
    step: int | None = None  # first divergent step (values; steps: first differing step)
    index: tuple[int, ...] | None = None  # index within the frame
    obtained: Any = None
    expected: Any = None
    max_abs: float | None = None
    max_rel: float | None = None
    n_diff: int = 0
    n_total: int = 0
    n_nan: int = 0  # differing elements with a NaN on either side
    frames: tuple[int, int] | None = None  # steps: (obtained, expected) frame counts
    last: tuple[int | None, int | None] | None = None  # steps: (obtained, expected) last recorded step

    def summary(self) -> str:
        """One line: what a person reads first."""
        if self.kind != "values":
            return f"record {self.path!r}: {self.detail}"
        where = f"step {self.step}"
        if self.index:
            where += f", index {self.index}"
        return f"record {self.path!r} first differs at {where}: obtained {_fmt(self.obtained)}, expected {_fmt(self.expected)}"

    def stats(self) -> str:
        if self.kind != "values":
            return ""
        parts = []
        if self.max_abs is not None:
            parts.append(f"max abs error {self.max_abs:.4g}")
        if self.max_rel is not None:
            parts.append(f"max rel error {self.max_rel:.4g}")
        parts.append(f"{self.n_diff} of {self.n_total} elements differ")
        if self.n_nan:
            parts.append(f"{self.n_nan} of them NaN")
        return ", ".join(parts)


@dataclass
class Diff:
    """Everything the engine found; ``ok`` when nothing differs. ``notes`` explain (provenance)."""

    actual_path: str | None
    expected_path: str | None
    rtol: float
    atol: float
    equal_nan: bool
    records: tuple[str, ...]  # leaf paths compared
    differences: list[RecordDiff] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    n_elements: int = 0
    ends: tuple[str | None, str | None] = (None, None)  # how each run ended, where either stopped early
    # per-record tolerances (``tolerances=``), resolved per leaf path: {path: (rtol, atol)}
    per_record: dict[str, tuple[float, float]] = field(default_factory=dict)

    def tol_for(self, path: str) -> tuple[float, float]:
        """(rtol, atol) a record is compared with: its own where ``tolerances=`` names it."""
        return self.per_record.get(path, (self.rtol, self.atol))

    def tol_text(self, path: str | None = None) -> str:
        rtol, atol = self.tol_for(path) if path is not None else (self.rtol, self.atol)
        own = " (this record's)" if path in self.per_record else ""
        return f"rtol={rtol:g}, atol={atol:g}{own}"

    @property
    def ok(self) -> bool:
        return not self.differences

    @property
    def first(self) -> RecordDiff | None:
        """The difference to show first: structural ones, then the earliest divergent step."""
        if not self.differences:
            return None
        structural = [d for d in self.differences if d.kind != "values"]
        if structural:
            return structural[0]
        return min(self.differences, key=lambda d: (d.step if d.step is not None else -1))

    def lead(self) -> RecordDiff | None:
        """What the message says first: a frame-count difference (a run that stopped at another
        step explains every later difference), else ``first``."""
        counts = [d for d in self.differences if d.kind == "steps" and d.frames and d.frames[0] != d.frames[1]]
        return counts[0] if counts else self.first

    def report(self, hint: str | None = None, expected: str = "expected") -> str:
        """The multi-line message: headline, per-record summaries, notes, then ``hint``. ``expected``
        names the reference in the lines about runs ("golden" for a golden check)."""
        tol = f"rtol={self.rtol:g}, atol={self.atol:g}"
        if self.ok:
            return (
                f"[jaxlog] trajectories match ({len(self.records)} records, {self.n_elements} elements, {tol})"
            )
        first = self.lead()
        assert first is not None
        lines = [f"[jaxlog] trajectories differ: {first.summary()}"]
        shown = [first]
        if first.kind == "values":
            lines.append(f"  {first.stats()} ({self.tol_text(first.path)})")
        else:
            lines += self._after_structural(first, expected, tol, shown)
        others = [d for d in self.differences if all(d is not s for s in shown)]
        if others:
            lines.append(f"  {len(others)} other difference{'s' if len(others) > 1 else ''}:")
            for d in others:
                line = f"    - {d.summary()}"
                if d.kind == "values":
                    line += f"; {d.stats()}" + (f" ({self.tol_text(d.path)})" if d.path in self.per_record else "")
                lines.append(line)
        if self.actual_path or self.expected_path:
            lines.append(
                f"  obtained: {display_path(self.actual_path)}; expected: {display_path(self.expected_path)}"
            )
        for note in self.notes:
            lines.append(f"  note: {note}")
        if hint:
            lines.append(hint)
        return "\n".join(lines)

    def _after_structural(self, lead: RecordDiff, expected: str, tol: str, shown: list[RecordDiff]) -> list[str]:
        """After a steps difference: the frame counts and how each run ended, then the first
        divergence of the values at the common steps (or that they agree)."""
        if lead.kind != "steps":
            return []
        lines = []
        if lead.frames and lead.last:
            (na, ne), (la, le) = lead.frames, lead.last
            ends = "".join(f"; {who} {end}" for who, end in zip(("obtained", expected), self.ends) if end)
            lines.append(f"  obtained {na} frames to step {la}, {expected} {ne} frames to step {le}{ends}")
        values = [d for d in self.differences if d.kind == "values"]
        if values:
            div = min(values, key=lambda d: (d.step if d.step is not None else -1))
            shown.append(div)
            lines.append(f"  first divergence: {div.summary()}; {div.stats()} ({self.tol_text(div.path)})")
        elif not any(d.kind in ("missing", "extra", "shape", "dtype") for d in self.differences):
            lines.append(f"  the values agree at the steps both have ({tol})")
        return lines


def _fmt(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    return str(value)


# --------------------------------------------------------------------------- engine


def _comparable(values: np.ndarray) -> np.ndarray:
    """Values in a dtype numpy can subtract: bfloat16/float16 -> float32 (exact)."""
    if values.dtype.kind == "V" or values.dtype.name in ("bfloat16", "float16") or "float8" in values.dtype.name:
        return values.astype(np.float32)
    return values


def _compare_values(path: str, steps: np.ndarray, a: np.ndarray, e: np.ndarray, *, rtol, atol, equal_nan, batched):
    """Elementwise comparison of aligned frames (same steps, same shape)."""
    a, e = _comparable(np.asarray(a)), _comparable(np.asarray(e))
    inexact = a.dtype.kind in "fc" or e.dtype.kind in "fc"
    if inexact:
        a64 = a.astype(np.complex128 if "c" in (a.dtype.kind, e.dtype.kind) else np.float64)
        e64 = e.astype(a64.dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            err = np.abs(a64 - e64)
            # infinities match only themselves (inf - inf is NaN; inf <= inf would pass anything)
            close = (a64 == e64) | ((err <= atol + rtol * np.abs(e64)) & np.isfinite(a64) & np.isfinite(e64))
        nan_a, nan_e = np.isnan(a64), np.isnan(e64)
        close &= ~(nan_a | nan_e)
        if equal_nan:
            close |= nan_a & nan_e
        bad = ~close
        nan_bad = bad & (nan_a | nan_e)
    else:  # integers, bools, PRNG key data: exact
        bad = a != e
        nan_bad = np.zeros_like(bad)
        err = None
    n_diff = int(bad.sum())
    if not n_diff:
        return None
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    frame, index = first[0], first[1:]
    out = RecordDiff(
        path,
        "values",
        "values differ",
        step=int(steps[frame]),
        index=index,
        obtained=a[first],
        expected=e[first],
        n_diff=n_diff,
        n_total=int(bad.size),
        n_nan=int(nan_bad.sum()),
    )
    if inexact:
        num_bad = bad & ~nan_bad
        finite = num_bad & np.isfinite(err)
        if finite.any():
            errs = err[finite]
            out.max_abs = float(errs.max())
            out.max_rel = _max_rel(errs, np.abs(e64[finite]))
        elif num_bad.any():
            out.max_abs = float("inf")
    else:
        d = np.abs(a[bad].astype(np.float64) - e[bad].astype(np.float64))
        out.max_abs = float(d.max())
    if batched and index:
        out.detail = f"values differ (system {index[0]})"
    return out


def _max_rel(errs: np.ndarray, denom: np.ndarray) -> float:
    """Largest ``errs / denom``; inf where ``denom`` is 0, or where the quotient exceeds float64
    (a huge error over a subnormal expected value): divides only where ``denom > 0``, so no
    divide-by-zero or overflow warning reaches the user's test run."""
    rel = np.full(errs.shape, np.inf)
    with np.errstate(over="ignore"):
        np.divide(errs, denom, out=rel, where=denom > 0)
    return float(rel.max())


def _fmt_steps(steps: np.ndarray) -> str:
    if len(steps) == 0:
        return "no frames"
    return f"{len(steps)} frames, steps {int(steps[0])}..{int(steps[-1])}"


def diff_trajectories(
    actual: Any,
    expected: Any,
    rtol: float = 1e-7,
    atol: float = 0.0,
    records: Sequence[str] | str | None = None,
    steps: Any = None,
    equal_nan: bool = True,
    tolerances: Mapping[str, Mapping[str, float]] | None = None,
) -> Diff:
    """Compare two trajectories record by record; returns a ``Diff`` (never raises on a difference).

    Checks, per leaf record: present on both sides, same steps, same per-frame shape, same dtype,
    then values with ``|a - e| <= atol + rtol * |e|``. Floating records honour the tolerances and
    the NaN policy (``equal_nan=True``: NaN matches NaN at the same position only); integer, bool
    and PRNG-key records compare exactly. Values are still compared at the common steps when the
    step sets differ, so the first divergence is reported either way. ``tolerances``: per-record
    ``{"rtol": ..., "atol": ...}`` by record (a leaf path or a prefix of leaf paths; the longest
    match wins), over ``rtol``/``atol`` (``jl.calibrate`` derives them from the spread of runs that
    should agree; other numeric fields of an entry, such as that spread, are kept and checked).
    """
    a_traj, e_traj = as_trajectory(actual), as_trajectory(expected)
    rtol, atol, chosen, equal_nan = _checked_options(rtol, atol, records, steps, equal_nan, a_traj, e_traj)
    own = record_tolerances(tolerances, rtol, atol, a_traj, e_traj)
    a_recs, e_recs = tuple(a_traj.records), tuple(e_traj.records)
    if chosen is None:
        paths = list(e_recs) + [p for p in a_recs if p not in e_recs]
    else:
        paths = list(chosen)
    batched = bool(getattr(getattr(e_traj, "schema", None), "batched", False))
    diff = Diff(
        actual_path=_path_of(a_traj),
        expected_path=_path_of(e_traj),
        rtol=float(rtol),
        atol=float(atol),
        equal_nan=equal_nan,
        records=tuple(paths),
        per_record={p: t for p in paths if (t := own(p)) is not None},
    )
    for path in paths:
        if path not in a_recs:
            diff.differences.append(RecordDiff(path, "missing", "missing from the obtained trajectory"))
            continue
        if path not in e_recs:
            diff.differences.append(RecordDiff(path, "extra", "not in the expected trajectory (extra record)"))
            continue
        a_steps = np.asarray(a_traj.steps(path), np.int64)
        e_steps = np.asarray(e_traj.steps(path), np.int64)
        a_keep, e_keep = _step_mask(a_steps, steps), _step_mask(e_steps, steps)
        a_steps, e_steps = a_steps[a_keep], e_steps[e_keep]
        if not np.array_equal(a_steps, e_steps):
            only_a = np.setdiff1d(a_steps, e_steps)
            only_e = np.setdiff1d(e_steps, a_steps)
            first = min([int(x[0]) for x in (only_a, only_e) if len(x)])
            what = []
            if len(only_e):
                what.append(f"{len(only_e)} expected steps missing (first {int(only_e[0])})")
            if len(only_a):
                what.append(f"{len(only_a)} unexpected steps (first {int(only_a[0])})")
            diff.differences.append(
                RecordDiff(
                    path,
                    "steps",
                    f"steps differ: obtained {_fmt_steps(a_steps)}, expected {_fmt_steps(e_steps)}; " + ", ".join(what),
                    step=first,
                    frames=(len(a_steps), len(e_steps)),
                    last=(_last(a_steps), _last(e_steps)),
                )
            )
        a_vals = np.asarray(a_traj[path])
        e_vals = np.asarray(e_traj[path])
        a_vals, e_vals = a_vals[a_keep], e_vals[e_keep]
        if a_vals.shape[1:] != e_vals.shape[1:]:
            diff.differences.append(
                RecordDiff(path, "shape", f"shape differs: obtained {a_vals.shape[1:]}, expected {e_vals.shape[1:]} per frame")
            )
            continue
        if a_vals.dtype != e_vals.dtype:
            diff.differences.append(
                RecordDiff(path, "dtype", f"dtype differs: obtained {a_vals.dtype.name}, expected {e_vals.dtype.name}")
            )
        common, ai, ei = np.intersect1d(a_steps, e_steps, assume_unique=True, return_indices=True)
        diff.n_elements += int(np.prod(e_vals.shape[1:], dtype=np.int64)) * len(common)
        r_tol, a_tol = diff.tol_for(path)
        vd = _compare_values(
            path, common, a_vals[ai], e_vals[ei], rtol=r_tol, atol=a_tol, equal_nan=equal_nan, batched=batched
        )
        if vd is not None:
            diff.differences.append(vd)
    if diff.differences:
        diff.notes += provenance_notes(a_traj, e_traj)
        diff.ends = run_ends(a_traj, e_traj)
    return diff


def record_tolerances(tolerances: Any, rtol: float, atol: float, *trajs: Any) -> Callable[[str], tuple | None]:
    """Validate ``tolerances=`` and return the lookup of a leaf path's (rtol, atol), None where no
    entry names it: each key must name records of the trajectories, each entry be a mapping of
    finite numbers >= 0."""
    if tolerances is None:
        return lambda path: None
    if not isinstance(tolerances, Mapping):
        raise JaxlogError(f"tolerances= takes {{record: {{'rtol': ..., 'atol': ...}}}}, got {tolerances!r:.80}")
    table: dict[str, tuple[float, float]] = {}
    for key, entry in tolerances.items():
        if not isinstance(key, str) or not isinstance(entry, Mapping):
            raise JaxlogError(f"tolerances[{key!r}]: takes a record name and {{'rtol': ..., 'atol': ...}}, "
                              f"got {entry!r:.80}")
        select_records([key], *trajs)  # a record neither trajectory has is an error, as for records=
        for name, value in entry.items():
            args.tolerance(value, f"tolerances[{key!r}][{name!r}]")
        table[key] = (float(entry.get("rtol", rtol)), float(entry.get("atol", atol)))

    def lookup(path: str) -> tuple | None:
        hits = [k for k in table if path == k or path.startswith(k + "/")]
        return table[max(hits, key=len)] if hits else None
    return lookup


def _last(steps: np.ndarray) -> int | None:
    return int(steps[-1]) if len(steps) else None


def run_ends(actual: Any, expected: Any) -> tuple[str | None, str | None]:
    """How each run ended ("stopped by until at step 12"), for both where either did not simply
    run all its steps or the two ran to different steps; (None, None) otherwise."""
    def end(traj: Any) -> tuple[str | None, Any]:
        reason, done, status = (getattr(traj, a, None) for a in ("stop_reason", "steps_done", "status"))
        if status in ("failed", "stopped"):
            return f"{status} at step {done}", done
        if reason not in (None, "steps"):
            return f"stopped by {reason} at step {done}", done
        return (f"ran to step {done}" if done is not None else None), done

    (a, da), (e, de) = end(actual), end(expected)
    plain = all(x is None or x.startswith("ran to") for x in (a, e))
    return (None, None) if plain and da == de else (a, e)


def _checked_options(rtol: Any, atol: Any, records: Any, steps: Any, equal_nan: Any, *trajs) -> tuple:
    """(rtol, atol, leaf paths chosen, equal_nan), each validated; a bad one is a JaxlogError."""
    _step_mask(np.zeros(0, np.int64), steps)
    return (args.tolerance(rtol, "rtol"), args.tolerance(atol, "atol"), select_records(records, *trajs),
            args.flag(equal_nan, "equal_nan"))


def _path_of(traj) -> str | None:
    p = getattr(traj, "path", None)
    return None if p is None else str(p)


def provenance_notes(actual, expected) -> list[str]:
    """Why two trajectories may legitimately differ: another backend, x64, or an unfinished run."""
    notes = []
    pa = getattr(actual, "provenance", None) or {}
    pe = getattr(expected, "provenance", None) or {}
    ba, be = pa.get("backend"), pe.get("backend")
    if ba and be and ba != be:
        notes.append(
            f"the expected trajectory was made on backend {be!r}, this one on {ba!r}: results differ across "
            "backends; regenerate it on this backend or loosen rtol/atol"
        )
    xa, xe = pa.get("x64"), pe.get("x64")
    if xa is not None and xe is not None and bool(xa) != bool(xe):
        notes.append(
            f"the expected trajectory was made with x64={'on' if xe else 'off'} (jax_enable_x64), "
            f"this one with x64={'on' if xa else 'off'}"
        )
    sa, se = getattr(actual, "status", None), getattr(expected, "status", None)
    if sa and se and sa != se:
        notes.append(f"status: obtained {sa!r}, expected {se!r}")
    return notes


# --------------------------------------------------------------------------- public API


_DIFF = inspect.signature(diff_trajectories)
COMPARISON_OPTIONS = tuple(_DIFF.parameters)[2:]  # rtol, atol, records, steps, equal_nan


def _share_options(kind: Any):
    """Show ``diff_trajectories``' options in a wrapper's signature (``help``, IDEs), as ``kind``
    (positional-or-keyword, or keyword-only): one declaration, so none can be dropped."""

    def share(fn):
        own = [p for p in inspect.signature(fn).parameters.values()
               if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
        options = [_DIFF.parameters[name].replace(kind=kind) for name in COMPARISON_OPTIONS]
        head = [p for p in own if p.kind is not inspect.Parameter.KEYWORD_ONLY]
        tail = [p for p in own if p.kind is inspect.Parameter.KEYWORD_ONLY]
        if kind is inspect.Parameter.KEYWORD_ONLY:
            params = head + tail + options
        else:
            params = head + options + tail
        fn.__signature__ = inspect.signature(fn).replace(parameters=params)
        return fn

    return share


def comparison_options(caller: str, options: tuple = (), kw: dict | None = None) -> dict:
    """The comparison options given to ``caller`` (positional ones in declaration order) by name;
    a misspelt or extra one is a JaxlogError listing the options."""
    kw = dict(kw or {})
    if len(options) > len(COMPARISON_OPTIONS):
        raise JaxlogError(f"{caller}: takes at most {len(COMPARISON_OPTIONS)} comparison options "
                          f"({', '.join(COMPARISON_OPTIONS)}), got {len(options)} positional ones")
    for name, value in zip(COMPARISON_OPTIONS, options):
        if name in kw:
            raise JaxlogError(f"{caller}: option {name!r} given twice (by position and by name)")
        kw[name] = value
    unknown = [k for k in kw if k not in COMPARISON_OPTIONS]
    if unknown:
        raise JaxlogError(f"{caller}: unknown option{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(map(repr, unknown))}; the options are {', '.join(COMPARISON_OPTIONS)}")
    return kw


@_share_options(inspect.Parameter.POSITIONAL_OR_KEYWORD)
def assert_trajectory_close(actual: Any, expected: Any, *options: Any, hint: str | None = None, **kw: Any) -> None:
    """Assert two trajectories (runs, Trajectories or paths) match record by record.

    Takes ``diff_trajectories``' options, the one place they are declared: ``rtol=1e-7, atol=0.0,
    records=None, steps=None, equal_nan=True`` (``records`` restricts the comparison to these
    records, leaf paths or prefixes; ``steps`` to a slice/range/list of step numbers or a schedule).
    Raises ``jl.TrajectoryMismatch`` (a ``jl.JaxlogError`` and an ``AssertionError``) naming the
    first divergent record, step and index, the error statistics and, as last line, ``hint``; a
    bad option or an unknown record is a ``jl.JaxlogError``.
    """
    __tracebackhide__ = True
    diff = diff_trajectories(actual, expected, **comparison_options("assert_trajectory_close", options, kw))
    if not diff.ok:
        raise TrajectoryMismatch(diff.report(hint=hint), diff)


def stored_options(expected: Any) -> dict[str, Any]:
    """The comparison options a golden file stores (those ``check_golden`` checked it with when it
    was made); empty for an older golden or any other trajectory. A stored option that is not
    valid (a NaN tolerance) is a JaxlogError naming the file and the field."""
    traj = as_trajectory(expected)
    return golden_info.options(getattr(traj, "golden", None) or {}, where=f"golden {display_path(_path_of(traj))}")


def platform_difference(expected: Any) -> str | None:
    """Where a golden was made, when that is not this platform (backend, device kind, jax, x64);
    None when the same, or when the golden does not say."""
    traj = as_trajectory(expected)
    made = golden_info.stored_platform(getattr(traj, "golden", None) or {}, f"golden {display_path(_path_of(traj))}")
    if made is None:
        return None
    here = golden_info.platform(provenance())
    if all(made.get(k) == here[k] for k in golden_info.PLATFORM_KEYS):
        return None
    return f"made on {golden_info.platform_line(made)}; this platform: {golden_info.platform_line(here)}"


def golden_options(expected: Any, given: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The comparison options for a check against ``expected``: ``given`` over those the golden
    stores; and notes saying which came from the golden and where it was made, if elsewhere."""
    stored = {k: v for k, v in stored_options(expected).items() if k not in given}
    notes = []
    if stored:
        shown = ", ".join(f"{k}={v!r}" if k in ("records", "steps") else f"{k}={v:g}" if k in ("rtol", "atol")
                          else f"{k}={v}" for k, v in stored.items())
        notes.append(f"compared with the options the golden stores: {shown} (options given override them)")
    elsewhere = platform_difference(expected)
    if elsewhere:
        notes.append(f"the golden was {elsewhere}")
    return {**stored, **given}, notes


def regen_hint(golden_path: str | os.PathLike, create: bool = False) -> str:
    verb = "create" if create else "regenerate"
    return f"run pytest with {REGEN_FLAG} to {verb} {display_path(golden_path)}"


@dataclass(frozen=True)
class GoldenComparison:
    """A check of a golden with per-platform entries: ``choice`` the entries found, ``entry`` the
    one compared with, ``here`` this platform, ``target`` the entry a regeneration here writes
    (this platform's, or a new one beside the reference), ``diff`` the comparison."""

    golden: Path
    choice: golden_entries.Choice
    entry: golden_entries.Entry
    here: dict
    target: Path
    diff: Diff

    @property
    def ok(self) -> bool:
        return self.diff.ok

    @property
    def fallback(self) -> bool:
        """No entry for this platform: compared with the reference at its stored tolerance."""
        return self.choice.mine is None

    def provenance_line(self) -> str:
        """What a failure says first: which entry, where it was made, where this run was."""
        here = golden_info.platform_line(self.here)
        made = golden_info.platform_line(self.entry.made)
        shown = display_path(self.entry.path)
        if not self.fallback:
            where = f"this platform ({here})" if made == here else f"{made}; this platform: {here}"
            return f"[jaxlog] golden {shown} (this platform's entry) made on {where}"
        tol = f"rtol={self.diff.rtol:g}, atol={self.diff.atol:g}"
        return (f"[jaxlog] golden {shown} has no entry for this platform: compared with its reference entry, made "
                f"on {made}, at the tolerance it stores ({tol}); this platform: {here}")

    def hint(self, fix: str = f"run pytest with {REGEN_FLAG}") -> str:
        """The flag that fixes it: regenerate this platform's entry, or add one (never another's).
        ``fix``: the words naming the flag (the pytest side's, which owns the flags)."""
        if not self.fallback:
            kept = "; other platforms' entries are kept" if len(self.choice.entries) > 1 else ""
            return f"{fix} to regenerate {display_path(self.target)} (this platform's entry{kept})"
        return (f"{fix} to add this platform's entry {display_path(self.target)} "
                f"(the reference entry {display_path(self.golden)} is kept)")

    def message(self, hint: str | None = None) -> str:
        report = self.diff.report(hint=self.hint() if hint is None else hint, expected="golden")
        return f"{self.provenance_line()}\n{report}"


def here_platform(actual: Any) -> dict:
    """The platform the obtained run was made on: its provenance, this process's where it says
    nothing (a trajectory made from arrays)."""
    made = golden_info.platform(getattr(as_trajectory(actual), "provenance", None) or {})
    return {k: v if v is not None else golden_info.platform(provenance())[k] for k, v in made.items()}


def compare_golden(actual: Any, golden_path: str | os.PathLike, **options: Any) -> GoldenComparison:
    """Compare ``actual`` with the entry of golden ``golden_path`` for its platform, else with the
    reference entry at the tolerance the reference stores (``rtol``, ``atol`` over those given);
    never raises on a difference. The golden must exist."""
    golden_path = Path(golden_path)
    options = comparison_options("compare_golden", (), options)
    here = here_platform(actual)
    choice = golden_entries.choose(golden_path, here)
    entry = choice.entry
    if entry is None:
        raise JaxlogError(f"[jaxlog] golden trajectory {display_path(golden_path)} does not exist; "
                          + regen_hint(golden_path, create=True))
    if choice.mine is None:
        stored = entry.stored
        options = {**options, **{k: stored[k] for k in ("rtol", "atol") if k in stored}}
    diff = diff_trajectories(actual, entry.path, **options)
    target = entry.path if choice.mine is not None else golden_entries.entry_path(
        golden_path, golden_entries.Platform.of(here, None))
    return GoldenComparison(golden_path, choice, entry, here, target, diff)


def write_golden(actual: Any, path: str | os.PathLike, jax_range: dict | None = None, **options: Any) -> Path:
    """Write ``actual`` as the golden entry ``path`` with the comparison ``options`` it is checked
    with (validated against the run first) and the jax versions it stands for. With ``records=``
    or ``steps=`` the file keeps only those records and steps (what is compared): goldens stay
    small. Atomic: written beside, then renamed."""
    path = Path(path)
    traj = as_trajectory(actual)
    given = _DIFF.bind(traj, traj, **comparison_options("write_golden", (), options))
    given.apply_defaults()  # validated now (records against this run), not at the next check
    chosen = {name: given.arguments[name] for name in COMPARISON_OPTIONS}
    rtol, atol, *_ = _checked_options(*(chosen[k] for k in ("rtol", "atol", "records", "steps", "equal_nan")), traj)
    record_tolerances(chosen["tolerances"], rtol, atol, traj)
    info = golden_info.describe(chosen, here_platform(traj), jax_range)
    kept = _kept(traj, chosen["records"], chosen["steps"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix or '.h5'}")
    try:
        kept.save(tmp, golden=info)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def _kept(traj: Any, records: Any, steps: Any) -> Any:
    """``traj`` with only the ``records`` and ``steps`` a golden is compared on (itself when both are None)."""
    if records is None and steps is None:
        return traj
    from ..record.frames import Frames, Schema
    from ..store.hdf5.trajectory import Trajectory

    paths = select_records(records, traj) or traj.records
    frames = Frames()
    for name in paths:
        s = np.asarray(traj.steps(name), np.int64)
        keep = _step_mask(s, steps)
        frames.add(name, s[keep], np.asarray(traj[name])[keep])
    schema = Schema(tuple(leaf for leaf in traj.schema.leaves if leaf.path in paths), traj.schema.batched,
                    traj.schema.dt, segments=traj.schema.segments)
    # the summary says where each system of a batched run stopped: without it, traj.system(i)
    # would read a finished system's frozen rows as its own
    info = {"status": traj.status, "steps_done": traj.steps_done, "violation": traj.violation,
            "meta": traj.description, "provenance": traj.provenance, "summary": traj._info.get("summary")}
    return Trajectory(schema, info, frames=frames, attachments={})


def regenerate(actual: Any, golden_path: str | os.PathLike, **options: Any) -> Path:
    """Write this platform's entry of golden ``golden_path`` (its jax range kept), the reference
    when the golden has none yet, else a new entry beside it; never another platform's. Returns
    the file written."""
    target, jax_range = golden_entries.target(Path(golden_path), here_platform(actual))
    return write_golden(actual, target, jax_range, **options)


@_share_options(inspect.Parameter.KEYWORD_ONLY)
def check_golden(actual: Any, golden_path: str | os.PathLike, *, regen: bool, **options: Any) -> str:
    """Compare ``actual`` with the golden file, or (``regen=True``) write it. Returns "ok" | "regenerated".
    ``options``: every option of ``assert_trajectory_close`` (rtol, atol, records, steps, equal_nan),
    passed through unchanged.

    A golden holds entries per platform (``jl.store.golden_entries``): the check compares with the
    entry for the run's platform, else with the reference entry (``golden_path``) at the tolerance
    it stores, and a failure leads with where the entry was made. Regeneration writes only this
    platform's entry (the reference when the golden has none yet, a new entry beside it when the
    reference is another platform's), unconditionally (every golden a session touches, not only
    failing ones) and atomically (written beside, then renamed), so parallel workers never see
    half a file. A misspelt option or unknown record fails on regeneration too, not at the next check.
    """
    __tracebackhide__ = True
    if not isinstance(golden_path, (str, os.PathLike)):
        raise JaxlogError(f"check_golden: the golden path must be a str or a path, got {golden_path!r}")
    golden_path = Path(golden_path)
    options = comparison_options("check_golden", (), options)
    if args.flag(regen, "check_golden(regen=...)"):
        regenerate(actual, golden_path, **options)
        return "regenerated"
    if not golden_path.exists():
        raise TrajectoryMismatch(
            f"[jaxlog] golden trajectory {display_path(golden_path)} does not exist; "
            + regen_hint(golden_path, create=True)
        )
    result = compare_golden(actual, golden_path, **options)
    if not result.ok:
        raise TrajectoryMismatch(result.message(), result.diff)
    return "ok"

# ---------------------------------------------------------------------------------------------
# A picture of a golden mismatch: the obtained trajectory drawn over the golden one, with the
# error against the tolerance beside it and the first difference marked.
#
# Why: a message says where the trajectories first part; the picture says how, whether they drift
# apart slowly (a changed integrator order, float32 against float64) or jump at one step (a
# changed branch), which tells a person whether to loosen a tolerance or look for a bug. Batched
# runs draw the system that differs first. The figure takes the comparison's result (a
# ``jl.golden.Diff``) as it is, so the picture shows exactly what the message reports.
#
# A record that is a field (a profile along one axis, an image on two) is drawn as a field: element
# 0 against the step would show nothing of where the error sits. Its row shows the obtained and
# golden field at the first differing step, their difference there against the tolerance, and the
# worst error over the field, as a fraction of its tolerance, at every step.

MAX_RECORDS = 3  # differing records drawn at most (the first ones the comparison reports)
FIELD_MIN = (8, 4)  # a frame (a system's, in batched runs) is a field: a 1-D profile of at least 8
# points, or an image of at least 4 x 4 (not an (atoms, 3) array of positions)
DRAWN = ("values", "steps")  # kinds of difference that have two series to draw


def plot_mismatch(obtained: Any, golden: str | os.PathLike, diff: Any, path: str | os.PathLike) -> Path | None:
    """The picture of a failed check against golden file ``golden``: ``obtained`` (a run or a
    trajectory) drawn over it, batched as the golden is; None when nothing has values to draw."""
    mine, theirs = as_trajectory(obtained), as_trajectory(golden)
    batched = bool(getattr(getattr(theirs, "schema", None), "batched", False))
    return plot_golden_diff(mine, theirs, diff, path, batched=batched)


def plot_golden_diff(obtained: Any, golden: Any, diff: Any, path: str | os.PathLike, *,
                     batched: bool = False) -> Path | None:
    """Draw ``diff`` (``jl.golden.diff_trajectories(obtained, golden)``) into ``path``; None when no
    difference has values to draw (a record missing, another shape or dtype)."""
    fig = draw_golden_diff(obtained, golden, diff, batched=batched)
    return None if fig is None else save_figure(fig, path)


def drawn_differences(obtained: Any, golden: Any, diff: Any) -> list[Any]:
    """The differences a figure shows: value and step differences of records on both sides, the
    comparison's first difference leading."""
    both = set(obtained.records) & set(golden.records)
    first = diff.first
    ordered = ([first] if first is not None else []) + [d for d in diff.differences if d is not first]
    return [d for d in ordered if d.kind in DRAWN and d.path in both][:MAX_RECORDS]


def draw_golden_diff(obtained: Any, golden: Any, diff: Any, *, batched: bool = False) -> Any:
    """The figure (matplotlib ``Figure`` on an Agg canvas), or None when nothing can be drawn: one row
    per differing record, obtained over golden on the left, ``|obtained - golden|`` against the
    tolerance ``atol + rtol * |golden|`` on the right, the first differing step marked on both."""
    shown = drawn_differences(obtained, golden, diff)
    if not shown:
        return None
    fields = [field_rank(golden[d.path], batched) for d in shown]
    columns = max([2, *(2 + r for r in fields if r)])  # 1-D: 3 panels; 2-D: 4
    fig = new_figure(5.5 * columns, 3.2 * len(shown) + 0.4, "the golden mismatch")
    axes = fig.subplots(len(shown), columns, squeeze=False)
    for row, d, rank in zip(axes, shown, fields):
        if rank:
            used = _draw_field(list(row), obtained, golden, d, diff, batched, rank)
        else:
            _draw_record(row[0], row[1], obtained, golden, d, diff, batched)
            used = 2
        for ax in row[used:]:
            ax.set_visible(False)
    fig.suptitle(_title(diff), fontsize=9)
    fig.tight_layout()
    return fig


def element_label(path: str, index: tuple | None, batched: bool) -> str:
    """``energy (system 3)`` in a batched run, ``x[0, 2]`` for an element, else the record."""
    if not index:
        return path
    if batched:
        rest = "" if len(index) == 1 else "[" + ", ".join(map(str, index[1:])) + "]"
        return f"{path}{rest} (system {index[0]})"
    return path + "[" + ", ".join(map(str, index)) + "]"


def series(values: Any, index: tuple | None) -> np.ndarray:
    """One element's values per frame as float64: the element at ``index``, else the first one
    (complex values as their modulus)."""
    values = np.asarray(values)
    if index:
        values = values[(slice(None), *index)]
    flat = values.reshape(len(values), -1)
    return _floats(flat[:, 0] if flat.shape[1] else np.full(len(flat), np.nan))


def _draw_record(left: Any, right: Any, obtained: Any, golden: Any, d: Any, diff: Any, batched: bool) -> None:
    index = tuple(d.index) if d.index else None
    a_steps, e_steps = np.asarray(obtained.steps(d.path)), np.asarray(golden.steps(d.path))
    a, e = series(obtained[d.path], index), series(golden[d.path], index)
    label = element_label(d.path, index, batched)
    left.plot(e_steps, e, color="0.45", lw=2.2, label="golden", **point_style(len(e_steps)))
    left.plot(a_steps, a, color="tab:blue", lw=1.0, label="obtained", **point_style(len(a_steps)))
    common, ai, ei = np.intersect1d(a_steps, e_steps, return_indices=True)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a[ai] - e[ei])
        rtol, atol = diff.tol_for(d.path)
        tol = atol + rtol * np.abs(e[ei])
    right.plot(common, err, color="tab:red", lw=1.0, label="|obtained - golden|", **point_style(len(common)))
    right.plot(common, tol, color="tab:green", lw=1.0, ls=":", label="tolerance")
    if np.nanmax(np.where(np.isfinite(err), err, np.nan), initial=0.0) > 0:
        right.set_yscale("symlog", linthresh=max(float(np.nanmin(np.where(err > 0, err, np.inf))), 1e-300))
    for ax in (left, right):
        if d.step is not None:
            ax.axvline(d.step, color="tab:red", ls="--", lw=1, label=f"first difference, step {d.step}")
        ax.set_xlabel("step")
        step_axis(ax, [*a_steps, *e_steps])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    left.set_ylabel(label, fontsize=8)
    right.set_ylabel("error", fontsize=8)
    left.set_title(d.summary()[:110], fontsize=8)


def field_rank(values: Any, batched: bool) -> int:
    """1 or 2 where each frame (each system's) of ``values`` is a profile or an image, else 0."""
    shape = np.shape(values)[2 if batched else 1:]
    if len(shape) == 1 and shape[0] >= FIELD_MIN[0]:
        return 1
    if len(shape) == 2 and min(shape) >= FIELD_MIN[1]:
        return 2
    return 0


def _draw_field(axes: list[Any], obtained: Any, golden: Any, d: Any, diff: Any, batched: bool, rank: int) -> int:
    """One field record's row; returns the axes used."""
    system: tuple[int, ...] = (int(d.index[0]),) if batched and d.index else ((0,) if batched else ())
    a_steps, e_steps = np.asarray(obtained.steps(d.path)), np.asarray(golden.steps(d.path))
    common, ai, ei = np.intersect1d(a_steps, e_steps, return_indices=True)
    pick: tuple[Any, ...] = (slice(None), *system)
    a_all = _floats(np.asarray(obtained[d.path])[ai][pick])
    e_all = _floats(np.asarray(golden[d.path])[ei][pick])
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        err = np.abs(a_all - e_all)
        rtol, atol = diff.tol_for(d.path)
        tol = atol + rtol * np.abs(e_all)
        ratio = np.where(err == 0, 0.0, err / tol)
    at = int(np.searchsorted(common, d.step)) if d.step is not None and d.step in common else 0
    a, e = a_all[at], e_all[at]
    step = int(common[at]) if len(common) else None
    name = d.path + (f" (system {system[0]})" if batched else "")
    if rank == 1:
        x = np.arange(a.shape[0])
        axes[0].plot(x, e, color="0.45", lw=2.2, label="golden")
        axes[0].plot(x, a, color="tab:blue", lw=1.0, label="obtained")
        axes[0].set_ylabel(name, fontsize=8)
        axes[1].plot(x, a - e, color="tab:red", lw=1.0, label="obtained - golden")
        axes[1].fill_between(x, -tol[at], tol[at], color="tab:green", alpha=0.2, label="tolerance")
        for ax in axes[:2]:
            ax.set_xlabel("index")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="best")
        axes[0].set_title(f"{d.path} at step {step}", fontsize=8)
        axes[1].set_title("difference at that step", fontsize=8)
        over = axes[2]
    else:
        lo, hi = np.nanmin([a.min(), e.min()]), np.nanmax([a.max(), e.max()])
        for ax, img, what in ((axes[0], e, "golden"), (axes[1], a, "obtained")):
            ax.imshow(img, vmin=lo, vmax=hi, cmap="viridis", label=what)
            ax.set_title(f"{what}: {name} at step {step}", fontsize=8)
        worst = float(np.nanmax(np.abs(a - e), initial=0.0)) or 1.0
        axes[2].imshow(a - e, vmin=-worst, vmax=worst, cmap="RdBu_r", label="obtained - golden")
        axes[2].set_title("obtained - golden", fontsize=8)
        over = axes[3]
    worst_ratio = ratio.reshape(len(common), -1).max(axis=1) if len(common) else np.zeros(0)
    over.plot(common, worst_ratio, color="tab:red", lw=1.0, label="worst |error| / tolerance over the field",
              **point_style(len(common)))
    over.axhline(1.0, color="tab:green", ls=":", lw=1, label="tolerance")
    if step is not None:
        over.axvline(step, color="tab:red", ls="--", lw=1, label=f"first difference, step {step}")
    over.set_xlabel("step")
    step_axis(over, [*a_steps, *e_steps])
    over.grid(alpha=0.3)
    over.legend(fontsize=7, loc="best")
    if np.any(worst_ratio > 0):
        over.set_yscale("symlog", linthresh=min(1.0, float(np.min(worst_ratio[worst_ratio > 0]))))
    return 3 if rank == 1 else 4


def _floats(values: np.ndarray) -> np.ndarray:
    """float64 for drawing: low floats widened, complex values as their modulus."""
    if values.dtype.kind == "V" or values.dtype.name in ("bfloat16", "float16") or "float8" in values.dtype.name:
        values = values.astype(np.float32)
    if np.iscomplexobj(values):
        values = np.abs(values)
    return values.astype(np.float64)


def _title(diff: Any) -> str:
    where = f": {Path(diff.expected_path).name}" if diff.expected_path else ""
    own = f"; {len(diff.per_record)} records at their own tolerances" if diff.per_record else ""
    return f"obtained against golden{where} (rtol={diff.rtol:g}, atol={diff.atol:g}{own})"
