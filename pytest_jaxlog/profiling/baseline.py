"""A benchmark against the same benchmark saved by an earlier session on the same machine: the
ratio of their times per step with a confidence interval (``profiling.ratio``), the verdict, the
failure message, and the table of what moved that the terminal summary and ``jaxlog summary`` print.

What a verdict means: against a threshold ``than`` (``1 + PERCENT/100`` of
``--jaxlog-benchmark-compare-fail``, else 1.10) the interval of the time ratio says *slower* (it
lies wholly above), *not slower* (wholly at or below) or *cannot tell* (it holds ``than``: the
noise between the two sessions' repeats hides the answer), with ``detectable``, the slow-down that
interval could have shown (``profiling.verdict``). With ``--jaxlog-benchmark-compare-fail=10`` a
benchmark fails when it is slower, i.e. takes more than 10% longer than the saved run beyond the
noise; a "cannot tell" fails too only under ``--jaxlog-benchmark-inconclusive=fail``.

What is compared: where both sessions timed the benchmark against a reference (``reference=``,
interleaved with it), each repeat's time *relative to the reference* (kernel's fastest run over the
reference's): the machine's load in either session slowed both alike and cancels, so only a
change of the kernel against its reference shows. Without a reference on both sides, the times
per step themselves: the interval then knows only the spread of the repeats, and a session that
is uniformly slower as a whole (another job on the machine, throttling) shifts every repeat
alike, which only the percentage allows for; on a shared machine that can be a factor of 3. A
reference that runs the kernel's own program (``reference_shares`` in the entry) is not compared
relative to: a regression of the kernel slows it alike and would cancel; the times per step are
compared instead, and the basis says why.
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
from .verdict import CANNOT_TELL, DEFAULT_THAN, INCONCLUSIVE_FLAG, NOT_SLOWER, SLOWER, decide

COMPARE_FAIL_FLAG = "--jaxlog-benchmark-compare-fail"
RELATIVE = "time relative to its reference"
PER_STEP = "time per step"


class BenchmarkRegression(TimingAssertionError):
    """A benchmark is slower than its saved baseline beyond ``--jaxlog-benchmark-compare-fail`` (or,
    under ``--jaxlog-benchmark-inconclusive=fail``, cannot tell whether it is)."""


@dataclass(frozen=True)
class Comparison:
    """One benchmark against its saved run: ``ratio`` is now's time per step over the saved one's
    (above 1: slower now), with its interval; ``than`` the threshold its verdict is decided at;
    ``limit`` the ratio a failure needs the interval to clear (None: compared, never failed)."""

    baseline: str
    saved_steps_per_s: float
    steps_per_s: float
    ratio: float
    interval: Interval
    repeats: int
    saved_repeats: int
    limit: float | None = None
    basis: str = PER_STEP  # or RELATIVE (both sessions timed an independent reference beside it)
    than: float = DEFAULT_THAN
    fail_inconclusive: bool = False  # a "cannot tell" fails too (--jaxlog-benchmark-inconclusive=fail)

    @property
    def verdict(self) -> str:
        """slower | not slower | cannot tell, at ``than``."""
        return decide(self.ratio, self.interval, self.than).verdict

    @property
    def detectable(self) -> float:
        """The smallest time ratio the interval's width could have shown above ``than``."""
        return decide(self.ratio, self.interval, self.than).detectable

    @property
    def faster(self) -> bool:
        """Faster than the saved run beyond the noise (the whole interval below 1)."""
        return self.interval.hi < 1

    @property
    def failed(self) -> bool:
        if self.limit is None:
            return False
        return self.verdict == SLOWER or (self.fail_inconclusive and self.verdict == CANNOT_TELL)

    def describe(self) -> str:
        iv = self.interval
        return (f"{self.steps_per_s:,.1f} steps/s now vs {self.saved_steps_per_s:,.1f} saved in {self.baseline}: "
                f"{self.basis} x{self.ratio:.3f} ({iv.coverage:.1%} interval [{iv.lo:.3f}, {iv.hi:.3f}], "
                f"{self.repeats} vs {self.saved_repeats} repeats): {self.verdict} at x{self.than:.3f}"
                f"{', faster' if self.faster else ''} (could detect x{self.detectable:.3f})")

    def to_json(self) -> dict[str, Any]:
        iv = self.interval
        return {"baseline": self.baseline, "saved_steps_per_s": self.saved_steps_per_s,
                "steps_per_s": self.steps_per_s, "ratio": self.ratio, "interval": [iv.lo, iv.hi],
                "coverage": iv.coverage, "repeats": self.repeats, "saved_repeats": self.saved_repeats,
                "limit": self.limit, "than": self.than, "verdict": self.verdict,
                "detectable": self.detectable if math.isfinite(self.detectable) else None,
                "faster": self.faster, "failed": self.failed, "basis": self.basis, "method": METHOD}


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


def basis(now: dict, saved: dict) -> str:
    """What is compared: times relative to the reference where both sessions timed one beside the
    kernel and now's is independent of it; else times per step (saying why not relative)."""
    if not (now.get("reference_samples") and saved.get("reference_samples")):
        return PER_STEP
    shares = now.get("reference_shares")
    if shares:
        return f"{PER_STEP} (not relative to its reference, which would cancel the kernel's own regressions: {shares})"
    return RELATIVE


def compare(now: dict, saved: dict, baseline: str, percent: float | None, confidence: float = 0.95,
            fail_inconclusive: bool = False) -> Comparison:
    """Compare benchmark entries ``now`` and ``saved`` (``steps``, ``samples``: seconds per run by
    repeat; ``reference_samples`` where a reference was timed beside it; ``reference_shares`` where
    now's reference runs the kernel's program)."""
    how = basis(now, saved)
    values = _relative if how == RELATIVE else _per_step
    try:
        found = ratio_interval(values(now), values(saved), confidence)
        saved_rate = steps_per_s(saved)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise JaxlogError(f"[jaxlog] saved run {baseline}: a benchmark entry is malformed ({e!r})") from None
    limit = None if percent is None else 1 + percent / 100
    return Comparison(baseline, saved_rate, steps_per_s(now), found.ratio, found.interval, len(now["samples"]),
                      len(saved["samples"]), limit, how, DEFAULT_THAN if limit is None else limit,
                      fail_inconclusive and limit is not None)


def failure_message(nodeid: str, name: str, c: Comparison, percent: float) -> str:
    """Why the comparison failed: slower beyond the allowed percentage, or (under
    ``--jaxlog-benchmark-inconclusive=fail``) too noisy to tell."""
    iv = c.interval
    figures = (f"{c.steps_per_s:,.1f} steps/s now vs {c.saved_steps_per_s:,.1f} steps/s saved; {c.basis} "
               f"x{c.ratio:.3f} the saved ({iv.coverage:.1%} interval [{iv.lo:.3f}, {iv.hi:.3f}]; {METHOD}, "
               f"{c.repeats} repeats now, {c.saved_repeats} saved)")
    allowed = f"the {c.limit:.3f} allowed ({COMPARE_FAIL_FLAG}={percent:g})"
    if c.verdict == CANNOT_TELL:
        return (f"[jaxlog] cannot tell whether benchmark {name!r} of {nodeid} is slower than saved run {c.baseline} "
                f"at this noise: {figures}, which holds {allowed}; the comparison could only have detected "
                f"x{c.detectable:.3f} or more. More repeats, longer runs or a quieter machine narrow it; \"cannot "
                f"tell\" fails because of {INCONCLUSIVE_FLAG}=fail: {INCONCLUSIVE_FLAG}=pass")
    return (f"[jaxlog] benchmark {name!r} of {nodeid} is slower than saved run {c.baseline}: {figures}, which lies "
            f"wholly above {allowed}. If the slow-down is intended, save a new baseline: --jaxlog-benchmark-save=NAME")


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


def _moved(c: dict) -> bool:
    """Worth a row in the table of what moved: slower, cannot tell, or faster beyond the noise."""
    return c.get("verdict") != NOT_SLOWER or bool(c.get("faster"))


def moved_table(found: Sequence[Row], markdown: bool = False, everything: bool = False,
                columns: tuple[str, str] = ("saved", "now")) -> list[str]:
    """The benchmarks that moved beyond the noise or could not tell (``everything``: all), slowest
    first, as lines; ``columns`` names the two runs in the head."""
    shown = [r for r in found if everything or _moved(r.comparison)]
    shown.sort(key=lambda r: -float(r.comparison["ratio"]))
    head = ["test", f"{columns[0]} steps/s", f"{columns[1]} steps/s", "time ratio", "interval", "verdict",
            "could detect"]
    body = [[r.test, _num(r.comparison.get("saved_steps_per_s")), _num(r.comparison.get("steps_per_s")),
             f"x{float(r.comparison['ratio']):.3f}", _interval(r.comparison), _verdict(r.comparison),
             _detectable(r.comparison)] for r in shown]
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
    counts by verdict, then the table of those that moved or could not tell (nothing when none was
    compared)."""
    entries = list(entries)
    found = rows(entries)
    notes = [b["compare"] for e in entries for b in e.get("benchmarks") or ()
             if isinstance(b, dict) and isinstance(b.get("compare"), dict)]
    missing = sum(1 for c in notes if c.get("missing"))
    other_timer = sum(1 for c in notes if c.get("other_timer"))
    if not found and not missing and not other_timer:
        return []
    baselines = sorted({str(r.comparison.get("baseline")) for r in found} | {str(c.get("baseline")) for c in notes})
    verdicts = [r.comparison.get("verdict") for r in found]
    faster = sum(1 for r in found if r.comparison.get("verdict") == NOT_SLOWER and r.comparison.get("faster"))
    thresholds = sorted({float(r.comparison["than"]) for r in found if isinstance(r.comparison.get("than"), (int, float))})
    at = f" at x{', x'.join(f'{t:.3f}' for t in thresholds)}" if thresholds else ""
    failing = "" if limit is None else f", failing beyond {limit:g}% slower"
    timers = f"; {other_timer} timed by another timer then (not compared)" if other_timer else ""
    lines = [f"benchmarks compared with saved run {', '.join(baselines)}{failing}: {verdicts.count(SLOWER)} slower, "
             f"{verdicts.count(NOT_SLOWER)} not slower ({faster} of them faster), {verdicts.count(CANNOT_TELL)} "
             f"cannot tell{at}; {missing} not in the saved run (not compared){timers}"]
    table = moved_table(found, markdown)
    return lines + ([""] if markdown and table else []) + [line if markdown else f"  {line}" for line in table]


def _verdict(c: dict) -> str:
    text = str(c.get("verdict"))
    if c.get("faster"):
        text += ", faster"
    return text + (" FAILED" if c.get("failed") else "")


def _detectable(c: dict) -> str:
    d = c.get("detectable")
    return f"x{float(d):.3f}" if isinstance(d, (int, float)) and math.isfinite(d) else "?"


def _num(v: Any) -> str:
    return f"{v:,.1f}" if isinstance(v, (int, float)) and math.isfinite(v) else "?"


def _interval(c: dict) -> str:
    iv = c.get("interval")
    if not (isinstance(iv, list) and len(iv) == 2):
        return "?"
    return f"[{float(iv[0]):.3f}, {float(iv[1]):.3f}]"
