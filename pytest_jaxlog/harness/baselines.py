"""Benchmark baselines across sessions, from the test's side: ``--jaxlog-benchmark-save=NAME``
keeps every ``jaxlog.benchmark(...)`` of the session in a file of this machine's,
``--jaxlog-benchmark-compare=NAME|last|NNNN`` compares each with the same test's saved one, and
``--jaxlog-benchmark-compare-fail=PERCENT`` fails the test whose benchmark is slower beyond it.
Every verdict is one of three: slower, not slower, or cannot tell at this noise; a benchmark that
is compared repeats until the comparison can tell (or its repeats or time budget run out), and
``--jaxlog-benchmark-inconclusive=fail`` makes a "cannot tell" fail where a gate was asked for
(``assert_not_slower``, ``--jaxlog-benchmark-compare-fail``).

Where the figures travel: each benchmark becomes part of its test's manifest entry (with the
machine it ran on), so under xdist the workers' figures reach the controller with the teardown
reports, as the rest of the manifest does, and only the controller writes the saved file. A test
whose benchmark the saved run lacks (new, renamed, or deselected then) is not compared: a note
says so in its report section, the manifest and the summary. Imports pytest's side and the
standard library at load; jax only inside the test that benchmarks.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

import pytest

from ..errors import JaxlogError, JaxlogRuntimeWarning
from .options import Option, lookup, parse_choice, what
from .options import add_options as _add_options

INCONCLUSIVE = ("pass", "fail")  # as profiling.speed.INCONCLUSIVE_CHOICES (not imported at load)
DEFAULT_STORAGE = "jaxlog-benchmarks"  # under pytest's cache directory (.pytest_cache/d/)
OPTIONS: dict[str, Option] = {
    o.key: o
    for o in (
        Option("benchmark_save", "none", "save every jaxlog.benchmark of the session as run NAME of this machine "
               "(<storage>/<machine>/NNNN_NAME.json)", metavar="NAME", ini=False),
        Option("benchmark_compare", "none", "compare every jaxlog.benchmark with the same test's in saved run NAME, NNNN "
               "or last of this machine", metavar="NAME", ini=False),
        Option("benchmark_compare_fail", "none", "fail a test whose benchmark takes more than PERCENT longer than in the "
               "compared run (relative to its reference where both timed one), beyond the ratio's confidence interval", metavar="PERCENT", ini=False),
        Option("benchmark_inconclusive", "pass", "what a benchmark verdict 'cannot tell' (the interval holds the "
               "threshold: too noisy to decide) does: pass (shown in the terminal, report, manifest and JUnit) or "
               "fail (in assert_not_slower of jaxlog.benchmark's results and under --jaxlog-benchmark-compare-fail)",
               choices=INCONCLUSIVE),
        Option("benchmark_storage", "none", "directory of saved benchmark runs (default: jaxlog-benchmarks in pytest's "
               "cache directory)", metavar="DIR"),
    )
}
_COST_PROPERTIES = ("flops", "transcendentals", "bytes_accessed", "temp_bytes", "argument_bytes", "output_bytes",
                    "kernels")


def add_options(parser: pytest.Parser) -> None:
    _add_options(parser, OPTIONS.values())


def _flag(key: str) -> str:
    return OPTIONS[key].flag_name


def _lookup(config: pytest.Config, key: str) -> Any:
    return lookup(config, OPTIONS[key])


class Baselines:
    """One per session (``JaxlogSession.baselines``): the options, the saved run compared with
    (read on first use, in the process that runs the test), and the file saved at the end."""

    def __init__(self, config: pytest.Config, worker: Any):
        from ..compare.baseline import check_name  # lazy: the plugin imports no package layer at load

        self.worker = worker
        save, compare, fail = (_lookup(config, k) for k in ("benchmark_save", "benchmark_compare",
                                                           "benchmark_compare_fail"))
        self.save_name = check_name(_given(save.value), what("benchmark_save", save)) if _given(save.value) else None
        self.compare_to = _given(compare.value) or None
        self.percent = _percent(fail.value, what("benchmark_compare_fail", fail)) if _given(fail.value) else None
        if self.percent is not None and self.compare_to is None:
            raise JaxlogError(f"{what('benchmark_compare_fail', fail)}: fails benchmarks slower than a saved run; "
                              f"name the run with {_flag('benchmark_compare')}=NAME (or last)")
        inconclusive = _lookup(config, "benchmark_inconclusive")
        self.inconclusive = parse_choice(str(inconclusive.value).strip().lower(), INCONCLUSIVE,
                                         what("benchmark_inconclusive", inconclusive))
        self.inconclusive_source = inconclusive.label if inconclusive.origin != "default" else None
        self.root = self._storage(config) if (self.save_name or self.compare_to) else None
        self._baseline: Any = None
        self.saved: list[Path] = []
        self.problems: list[str] = []

    @staticmethod
    def _storage(config: pytest.Config) -> Path:
        src = _lookup(config, "benchmark_storage")
        if _given(src.value):
            where = Path(config.invocation_params.dir) if src.origin in ("cli", "env") else Path(config.rootpath)
            return (where / os.path.expanduser(str(src.value))).resolve()
        cache = getattr(config, "cache", None)
        if cache is None:
            raise JaxlogError(f"{_flag('benchmark_save')} / {_flag('benchmark_compare')} keep runs in pytest's cache "
                              f"directory, which is off here (-p no:cacheprovider): give "
                              f"{_flag('benchmark_storage')}=DIR")
        return Path(cache.mkdir(DEFAULT_STORAGE))

    # -- in the test ---------------------------------------------------------------------------
    @staticmethod
    def name_for(state: Any, name: str | None) -> str:
        """The name a test's next benchmark is saved and compared under (checked before it is timed)."""
        from ..compare.baseline import check_name

        return _unique(state, check_name(name, "jaxlog.benchmark(name=...)") if name is not None else None)

    def decider(self, state: Any, name: str) -> Any:
        """What keeps the test's next benchmark repeating while it is compared: a callable that holds
        once the comparison with the saved run can tell (None: not compared, or not in the saved run).
        The saved run is read here, before any timing, so a missing one fails at once."""
        if self.compare_to is None:
            return None
        baseline = self._load()
        saved = baseline.benchmark(state.nodeid, name)
        if saved is None:
            return None

        def decided(result: Any) -> bool:
            from ..compare.baseline import compare
            from ..profiling.speed import CANNOT_TELL

            entry = benchmark_entry(name, result, {})
            if _timer(saved) != entry["timer"]:
                return True  # not comparable: nothing to wait for
            try:
                return compare(entry, saved, baseline.label, self.percent, result.confidence).verdict != CANNOT_TELL
            except JaxlogError:
                return True  # said by note() once the benchmark is done
        return decided

    def settle(self, result: Any) -> Any:
        """The benchmark as the test gets it: ``assert_not_slower`` fails on "cannot tell" where the
        session asks (``--jaxlog-benchmark-inconclusive=fail``), naming where that was set."""
        from dataclasses import replace

        if self.inconclusive_source is None:
            return result
        return replace(result, inconclusive=self.inconclusive, inconclusive_source=self.inconclusive_source)

    def note(self, state: Any, name: str, result: Any) -> dict:
        """A benchmark the test made (``name`` from ``name_for``): into its manifest entry, compared
        with the saved run when asked (``BenchmarkRegression`` when slower beyond the allowed
        percentage, or when it cannot tell and the session fails those)."""
        from ..compare.baseline import BenchmarkRegression, compare, failure_message, this_machine

        __tracebackhide__ = True
        entry = benchmark_entry(name, result, this_machine().to_json())
        state.benchmarks.append(entry)
        if self.compare_to is None:
            return entry
        baseline = self._load()
        saved = baseline.benchmark(state.nodeid, name)
        if saved is None:
            entry["compare"] = {"baseline": baseline.label, "missing": True}
            state.notes.append(f"benchmark {name!r}: not in saved run {baseline.label}: not compared")
            return entry
        if _timer(saved) != entry["timer"]:
            entry["compare"] = {"baseline": baseline.label, "other_timer": _timer(saved)}
            state.notes.append(f"benchmark {name!r}: timed by {_timer(saved)} time in saved run {baseline.label}, by "
                               f"{entry['timer']} time now: not compared")
            return entry
        found = compare(entry, saved, baseline.label, self.percent, result.confidence,
                        fail_inconclusive=self.inconclusive == "fail")
        entry["compare"] = found.to_json()
        state.notes.append(f"benchmark {name!r} against the saved run: {found.describe()}")
        if found.failed:
            raise BenchmarkRegression(failure_message(state.nodeid, name, found, self.percent or 0.0))
        return entry

    def _load(self) -> Any:
        """The saved run compared with, found once per process; not found: the same error in every test."""
        from ..compare.baseline import find, this_machine

        if self._baseline is None:
            try:
                self._baseline = find(self.root, this_machine(), str(self.compare_to))  # type: ignore[arg-type]
            except JaxlogError as e:
                self._baseline = e
        if isinstance(self._baseline, JaxlogError):
            raise JaxlogError(str(self._baseline))
        return self._baseline

    # -- at teardown and the end -----------------------------------------------------------------
    @staticmethod
    def entry_fields(state: Any) -> dict:
        return {"benchmarks": list(state.benchmarks), "costs": list(state.costs)}

    @staticmethod
    def properties(state: Any) -> list[tuple[str, str]]:
        """JUnit XML properties of a test's benchmarks and checked costs (``[name]`` after all but the default's)."""
        from ..compare.baseline import DEFAULT_NAME

        props: list[tuple[str, str]] = []
        for b in state.benchmarks:
            tag = "" if b["name"] == DEFAULT_NAME else f"[{b['name']}]"
            props += [(f"jaxlog.steps_per_s{tag}", f"{b['steps_per_s']:.6g}"), (f"jaxlog.repeats{tag}", str(b["repeats"]))]
            if b.get("ratio") is not None:
                props += [(f"jaxlog.ratio{tag}", f"{b['ratio']:.6g}"), (f"jaxlog.ratio_interval{tag}", _pair(b["interval"]))]
                if b.get("verdict") is not None:
                    props += [(f"jaxlog.verdict{tag}", str(b["verdict"])),
                              (f"jaxlog.detectable{tag}", _number(b.get("detectable")))]
            c = b.get("compare") or {}
            if c.get("ratio") is not None:
                props += [(f"jaxlog.baseline{tag}", c["baseline"]), (f"jaxlog.baseline_ratio{tag}", f"{c['ratio']:.6g}"),
                          (f"jaxlog.baseline_interval{tag}", _pair(c["interval"])),
                          (f"jaxlog.baseline_verdict{tag}", str(c.get("verdict"))),
                          (f"jaxlog.baseline_detectable{tag}", _number(c.get("detectable")))]
        for cost in state.costs:
            tag = "" if cost.get("name") is None else f"[{cost['name']}]"
            props += [(f"jaxlog.{m}{tag}", f"{cost['metrics'][m]:.6g}") for m in _COST_PROPERTIES
                      if isinstance(cost["metrics"].get(m), (int, float))]
        return props

    @staticmethod
    def section_lines(state: Any) -> list[str]:
        """The costs a test checked, for its report section (its benchmarks are in its notes)."""
        lines = []
        for cost in state.costs:
            shown = ", ".join(f"{m}={cost['metrics'][m]:.6g}" for m in _COST_PROPERTIES
                              if isinstance(cost["metrics"].get(m), (int, float)))
            label = "cost" if cost.get("name") is None else f"cost {cost['name']!r}"
            lines.append(f"{label} per step ({cost['platform']}): {shown}")
        return lines

    def save(self, entries: Iterable[dict]) -> None:
        """The controller (or a session without workers) writes one file per machine that benchmarked."""
        from ..compare.baseline import Machine, save, saved_tests

        if self.worker is not None or self.save_name is None or self.root is None:
            return
        by_machine: dict[Any, list[dict]] = {}
        for e in entries:
            for b in e.get("benchmarks") or ():
                machine = Machine.from_json(b.get("machine"))
                if machine is not None:
                    by_machine.setdefault(machine, []).append({**e, "benchmarks": [b]})
        for machine, part in by_machine.items():
            merged: dict[str, dict] = {}
            for e in part:  # one entry per test again, its benchmarks together
                merged.setdefault(e["nodeid"], {**e, "benchmarks": []})["benchmarks"] += e["benchmarks"]
            try:
                self.saved.append(save(self.root, machine, self.save_name, saved_tests(merged.values())))
            except (OSError, JaxlogError) as err:
                self.problems.append(f"could not save benchmarks in {self.root}: {err}")
                warnings.warn(JaxlogRuntimeWarning(f"[jaxlog] {self.problems[-1]}"), stacklevel=1)

    def summary_lines(self, entries: Iterable[dict], display: Callable[[Path], str]) -> list[str]:
        """The terminal summary's lines: what was saved, and the table of what moved."""
        from ..compare.baseline import compared_lines

        entries = list(entries)
        lines = list(self.problems)
        count = sum(len(e.get("benchmarks") or ()) for e in entries)
        if self.save_name is not None and self.worker is None:
            if self.saved:
                lines += [f"saved {count} benchmarks as {display(p)}" for p in self.saved]
            elif not self.problems:
                lines.append(f"no benchmark ran: nothing saved as {self.save_name!r}")
        return lines + verdict_lines(entries) + compared_lines(entries, limit=self.percent)


def benchmark_entry(name: str, result: Any, machine: dict) -> dict:
    """A ``jl.Benchmark`` as its test's manifest entry keeps it (and a saved run, but ``compare``)."""
    entry: dict[str, Any] = {
        "name": name, "steps": int(result.steps), "samples": [list(rep) for rep in result.samples],
        "steps_per_s": float(result.steps_per_s), "repeats": len(result.samples),
        "runs_per_repeat": max((len(rep) for rep in result.samples), default=0),
        "ratio": None, "interval": None, "machine": machine, "timer": result.timer, "looks": result.looks,
        "stop_reason": result.stop_reason,
    }
    if result.interval is not None:
        iv = result.interval
        entry.update(ratio=float(result.ratio), interval=[iv.lo, iv.hi], coverage=iv.coverage,
                     reference_steps_per_s=result.reference_steps_per_s,
                     reference_samples=[list(rep) for rep in result.reference_samples],
                     than=result.than, verdict=result.verdict, detectable=_finite(result.detectable),
                     reference_shares=result.reference_shares)
    return entry


def verdict_lines(entries: Iterable[dict]) -> list[str]:
    """The terminal summary's count of the session's benchmark verdicts against their references,
    and each that could not tell (those must not pass unseen)."""
    found = [(e["nodeid"], b) for e in entries for b in e.get("benchmarks") or ()
             if isinstance(b, dict) and b.get("verdict") is not None]
    if not found:
        return []
    verdicts = [b["verdict"] for _, b in found]
    lines = [f"benchmark verdicts against their references: {verdicts.count('slower')} slower, "
             f"{verdicts.count('not slower')} not slower, {verdicts.count('cannot tell')} cannot tell at this noise"]
    for nodeid, b in found:
        if b["verdict"] == "cannot tell":
            label = nodeid if b.get("name") == "benchmark" else f"{nodeid} [{b.get('name')}]"
            lines.append(f"  cannot tell: {label}: ratio {b['ratio']:.3f}, interval {_bracket(b['interval'])} holds "
                         f"{b['than']:g}; could detect x{_number(b.get('detectable'))} ({b['repeats']} repeats, "
                         f"{b.get('stop_reason')})")
    return lines


def _timer(entry: dict) -> str:
    """The timer a benchmark entry was timed by (saved runs before there was a choice: wall)."""
    return str(entry.get("timer") or "wall")


def _finite(x: Any) -> float | None:
    """A figure for JSON (which has no infinity): None where it is not finite."""
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _number(x: Any) -> str:
    return f"{float(x):.6g}" if isinstance(x, (int, float)) else "inf"


def _bracket(iv: Any) -> str:
    return f"[{float(iv[0]):.3f}, {float(iv[1]):.3f}]"


def _unique(state: Any, name: str | None) -> str:
    from ..compare.baseline import DEFAULT_NAME

    taken = {b["name"] for b in state.benchmarks}
    if name is not None:
        if name in taken:
            raise JaxlogError(f"jaxlog.benchmark(name={name!r}): this test made a benchmark of that name already; "
                              "give each its own name=")
        return name
    name, n = DEFAULT_NAME, 1
    while name in taken:
        name, n = f"{DEFAULT_NAME}-{n}", n + 1
    return name


def _given(value: Any) -> str:
    """An option's text, or "" where it is unset (``none``, ``off``: the default)."""
    text = str(value or "").strip()
    return "" if text.lower() in ("none", "off") else text


def _percent(value: Any, source: str) -> float:
    try:
        p = float(str(value).strip().rstrip("%"))
    except ValueError:
        p = math.nan
    if not (math.isfinite(p) and p >= 0):
        raise JaxlogError(f"{source}: expected a percentage >= 0 (e.g. 10: fail when more than 10% slower), "
                          f"got {value!r}")
    return p


def _pair(iv: Any) -> str:
    return f"{float(iv[0]):.6g}..{float(iv[1]):.6g}"
