"""A benchmark against the same benchmark saved by an earlier session on the same machine: the
ratio of their times per step with a confidence interval (``profiling.ratio``), the verdict, the
failure message, and the table of what moved that the terminal summary and ``jaxlog summary`` print.

What a failure means: with ``--jaxlog-benchmark-compare-fail=10`` a benchmark fails only when the
whole interval of its time ratio lies above 1.10, i.e. it takes more than 10% longer than the
saved run beyond the noise between the two sessions' repeats.

What is compared: where both sessions timed the benchmark against a reference (``reference=``,
interleaved with it), each repeat's time *relative to the reference* (kernel's fastest run over the
reference's): the machine's load in either session slowed both alike and cancels, so only a
change of the kernel against its reference shows. Without a reference on both sides, the times
per step themselves: the interval then knows only the spread of the repeats, and a session that
is uniformly slower as a whole (another job on the machine, throttling) shifts every repeat
alike, which only the percentage allows for; on a shared machine that can be a factor of 3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..errors import JaxlogError
from .baselinefile import DEFAULT_NAME
from .ratio import METHOD, ratio_interval
from .stats import Interval, median
from .timings import TimingAssertionError

COMPARE_FAIL_FLAG = "--jaxlog-benchmark-compare-fail"


class BenchmarkRegression(TimingAssertionError):
    """A benchmark is slower than its saved baseline beyond ``--jaxlog-benchmark-compare-fail``."""


@dataclass(frozen=True)
class Comparison:
    """One benchmark against its saved run: ``ratio`` is now's time per step over the saved one's
    (above 1: slower now), with its interval; ``limit`` the ratio a failure needs the interval to
    clear (None: compared, never failed)."""

    baseline: str
    saved_steps_per_s: float
    steps_per_s: float
    ratio: float
    interval: Interval
    repeats: int
    saved_repeats: int
    limit: float | None = None
    basis: str = "time per step"  # or: "time relative to its reference" (both sessions timed one beside it)

    @property
    def verdict(self) -> str:
        """slower | faster beyond the noise, or unchanged (the interval holds 1)."""
        if self.interval.lo > 1:
            return "slower"
        return "faster" if self.interval.hi < 1 else "unchanged"

    @property
    def failed(self) -> bool:
        return self.limit is not None and self.interval.lo > self.limit

    def describe(self) -> str:
        iv = self.interval
        return (f"{self.steps_per_s:,.1f} steps/s now vs {self.saved_steps_per_s:,.1f} saved in {self.baseline}: "
                f"{self.basis} x{self.ratio:.3f} ({iv.coverage:.1%} interval [{iv.lo:.3f}, {iv.hi:.3f}], "
                f"{self.repeats} vs {self.saved_repeats} repeats), {self.verdict}")

    def to_json(self) -> dict[str, Any]:
        iv = self.interval
        return {"baseline": self.baseline, "saved_steps_per_s": self.saved_steps_per_s,
                "steps_per_s": self.steps_per_s, "ratio": self.ratio, "interval": [iv.lo, iv.hi],
                "coverage": iv.coverage, "repeats": self.repeats, "saved_repeats": self.saved_repeats,
                "limit": self.limit, "verdict": self.verdict, "failed": self.failed, "basis": self.basis,
                "method": METHOD}


def steps_per_s(entry: dict) -> float:
    """A saved or new benchmark's steps per second: from the median of all its runs."""
    return int(entry["steps"]) / median([float(t) for rep in entry["samples"] for t in rep])


def _per_step(entry: dict) -> list[float]:
    """Each repeat's fastest run, per step (so runs of different lengths compare)."""
    steps = int(entry["steps"])
    return [min(float(t) for t in rep) / steps for rep in entry["samples"] if len(rep)]


def _relative(entry: dict) -> list[float]:
    """Each repeat's fastest run over its reference's fastest (timed beside it, under the same load)."""
    return [min(float(t) for t in a) / min(float(t) for t in b)
            for a, b in zip(entry["samples"], entry["reference_samples"]) if len(a) and len(b)]


def compare(now: dict, saved: dict, baseline: str, percent: float | None, confidence: float = 0.95) -> Comparison:
    """Compare benchmark entries ``now`` and ``saved`` (``steps``, ``samples``: seconds per run by
    repeat; ``reference_samples`` where a reference was timed beside it)."""
    relative = bool(now.get("reference_samples")) and bool(saved.get("reference_samples"))
    values = _relative if relative else _per_step
    try:
        found = ratio_interval(values(now), values(saved), confidence)
        saved_rate = steps_per_s(saved)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise JaxlogError(f"[jaxlog] saved run {baseline}: a benchmark entry is malformed ({e!r})") from None
    limit = None if percent is None else 1 + percent / 100
    return Comparison(baseline, saved_rate, steps_per_s(now), found.ratio, found.interval, len(now["samples"]),
                      len(saved["samples"]), limit, "time relative to its reference" if relative else "time per step")


def failure_message(nodeid: str, name: str, c: Comparison, percent: float) -> str:
    iv = c.interval
    return (f"[jaxlog] benchmark {name!r} of {nodeid} is slower than saved run {c.baseline}: "
            f"{c.steps_per_s:,.1f} steps/s now vs {c.saved_steps_per_s:,.1f} steps/s saved; {c.basis} "
            f"x{c.ratio:.3f} the saved ({iv.coverage:.1%} interval [{iv.lo:.3f}, {iv.hi:.3f}]; {METHOD}, "
            f"{c.repeats} repeats now, {c.saved_repeats} saved), which lies wholly above the {c.limit:.3f} allowed "
            f"({COMPARE_FAIL_FLAG}={percent:g}). If the slow-down is intended, save a new baseline: "
            f"--jaxlog-benchmark-save=NAME")


@dataclass(frozen=True)
class Row:
    """One benchmark of one test in a table of what moved."""

    test: str
    comparison: dict  # Comparison.to_json()


def rows(entries: Iterable[dict]) -> list[Row]:
    """The compared benchmarks of manifest entries (``entry["benchmarks"][i]["compare"]``)."""
    out = []
    for e in entries:
        for b in e.get("benchmarks") or ():
            c = b.get("compare") if isinstance(b, dict) else None
            if isinstance(c, dict) and isinstance(c.get("ratio"), (int, float)):
                label = e["nodeid"] if b.get("name") == DEFAULT_NAME else f"{e['nodeid']} [{b.get('name')}]"
                out.append(Row(label, c))
    return out



def moved_table(found: Sequence[Row], markdown: bool = False, everything: bool = False,
                columns: tuple[str, str] = ("saved", "now")) -> list[str]:
    """The benchmarks that moved beyond the noise (``everything``: all), slowest first, as lines;
    ``columns`` names the two runs in the head."""
    shown = [r for r in found if everything or r.comparison.get("verdict") != "unchanged"]
    shown.sort(key=lambda r: -float(r.comparison["ratio"]))
    head = ["test", f"{columns[0]} steps/s", f"{columns[1]} steps/s", "time ratio", "interval", "verdict"]
    body = [[r.test, _num(r.comparison.get("saved_steps_per_s")), _num(r.comparison.get("steps_per_s")),
             f"x{float(r.comparison['ratio']):.3f}", _interval(r.comparison),
             str(r.comparison.get("verdict")) + (" FAILED" if r.comparison.get("failed") else "")] for r in shown]
    if not body:
        return []
    if markdown:
        return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + \
               ["| " + " | ".join(f"`{c}`" if i == 0 else c for i, c in enumerate(line)) + " |" for line in body]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))).rstrip()
            for line in [head, *body]]


def compared_lines(entries: Iterable[dict], markdown: bool = False, limit: float | None = None) -> list[str]:
    """What the manifest entries' benchmarks did against the saved run they were compared with:
    counts by verdict, then the table of those that moved (nothing when none was compared)."""
    entries = list(entries)
    found = rows(entries)
    missing = sum(1 for e in entries for b in e.get("benchmarks") or ()
                  if isinstance(b, dict) and (b.get("compare") or {}).get("missing"))
    if not found and not missing:
        return []
    baselines = sorted({str(r.comparison.get("baseline")) for r in found} | {
        str(b["compare"].get("baseline")) for e in entries for b in e.get("benchmarks") or ()
        if isinstance(b, dict) and isinstance(b.get("compare"), dict)})
    verdicts = [r.comparison.get("verdict") for r in found]
    failing = "" if limit is None else f", failing beyond {limit:g}% slower"
    lines = [f"benchmarks compared with saved run {', '.join(baselines)}{failing}: {verdicts.count('slower')} slower, "
             f"{verdicts.count('faster')} faster, {verdicts.count('unchanged')} unchanged (interval holds 1); "
             f"{missing} not in the saved run (not compared)"]
    table = moved_table(found, markdown)
    return lines + ([""] if markdown and table else []) + [line if markdown else f"  {line}" for line in table]


def _num(v: Any) -> str:
    return f"{v:,.1f}" if isinstance(v, (int, float)) and math.isfinite(v) else "?"


def _interval(c: dict) -> str:
    iv = c.get("interval")
    if not (isinstance(iv, list) and len(iv) == 2):
        return "?"
    return f"[{float(iv[0]):.3f}, {float(iv[1]):.3f}]"
