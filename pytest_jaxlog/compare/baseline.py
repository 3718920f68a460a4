"""The baseline wing: benchmark runs saved per machine, a benchmark compared with the same one of an
earlier session (the ratio with an interval, the verdict, the message), and ``jaxlog
benchmarks``' tables and plots."""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..errors import JaxlogError
from ..profiling.speed import (
    CANNOT_TELL,
    DEFAULT_THAN,
    INCONCLUSIVE_FLAG,
    METHOD,
    NOT_SLOWER,
    SLOWER,
    Interval,
    decide,
    median,
    ratio_interval,
)
from ..profiling.timings import TimingAssertionError
from .cost import is_figure

__all__ = ['Machine', 'this_machine', 'cpu_model']

@dataclass(frozen=True)
class Machine:
    """What makes two sessions' timings comparable (nothing else: not the host name, so CI runners
    of one kind share their baselines)."""

    cpu: str
    backend: str
    device_kind: str
    jax: str

    @property
    def key(self) -> str:
        """The directory name: readable where it can be, with a hash of every field (the CPU model
        included) so that two machines never share a directory."""
        digest = hashlib.sha256("\n".join(asdict(self).values()).encode()).hexdigest()[:10]
        kind = re.sub(r"[^A-Za-z0-9.]+", "_", self.device_kind).strip("_")[:40] or "device"
        return f"{self.backend}-{kind}-jax{self.jax}-{digest}"

    def describe(self) -> str:
        return f"{self.cpu}; {self.backend} {self.device_kind}; jax {self.jax}"

    def to_json(self) -> dict:
        return {**asdict(self), "key": self.key}

    @classmethod
    def from_json(cls, doc: object) -> "Machine | None":
        if not isinstance(doc, dict):
            return None
        fields = [doc.get(k) for k in ("cpu", "backend", "device_kind", "jax")]
        return cls(*fields) if all(isinstance(f, str) for f in fields) else None  # type: ignore[arg-type]


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip().lower() in ("model name", "hardware", "cpu model") and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def this_machine() -> Machine:
    """This process's machine: its CPU and jax's default backend and first device."""
    import jax

    device = jax.devices()[0]
    return Machine(cpu_model(), jax.default_backend(), str(getattr(device, "device_kind", device.platform)),
                   jax.__version__)

# ---------------------------------------------------------------------------------------------
# Saved benchmark runs: ``<storage>/<machine key>/NNNN_<name>.json``, one file per session that
# saved (``--jaxlog-benchmark-save=NAME``), numbered in the order they were saved.
#
# A file is readable JSON: the machine, when, and per test its benchmarks (each repeat's timings,
# so a later session can compute an interval against them, not only compare two medians) and the
# compiled costs it checked. One directory per machine (``Machine.key``): a comparison looks only
# in this machine's directory, and a name found only in another's is an error that says so.
# A file appears whole or not at all (written beside its name and linked into place, which also
# keeps two sessions saving at once from taking the same number).

FORMAT = "jaxlog-benchmarks"
VERSION = 1
NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_FILE = re.compile(r"(\d{4,})_(.+)\.json")
SAVE_FLAG = "--jaxlog-benchmark-save"
DEFAULT_NAME = "benchmark"  # a test's benchmark made without name= (then benchmark-1, ...)


@dataclass(frozen=True)
class SavedRun:
    """One saved file: ``tests`` by node id, each ``{"benchmarks": [...], "costs": [...]}``."""

    path: Path
    number: int
    name: str
    saved: float
    machine: Machine | None
    tests: dict[str, dict] = field(default_factory=dict, hash=False)

    @property
    def label(self) -> str:
        """``0003_main``: how listings and messages name it."""
        return f"{self.number:04d}_{self.name}"

    def benchmark(self, nodeid: str, name: str) -> dict | None:
        """The saved benchmark ``name`` of test ``nodeid`` (None: not in this run)."""
        for b in self.tests.get(nodeid, {}).get("benchmarks", ()):
            if isinstance(b, dict) and b.get("name") == name:
                return b
        return None

    @property
    def count(self) -> int:
        return sum(len(t.get("benchmarks", ())) for t in self.tests.values())


def check_name(name: str, what: str) -> str:
    if not NAME.fullmatch(name) or name.startswith("."):
        raise JaxlogError(f"{what}: {name!r}: use letters, digits, '_', '-', '.' (it names a file)")
    return name


def read(path: Path) -> SavedRun:
    """One saved file; anything but what ``save`` writes is one ``JaxlogError`` naming it."""
    path = Path(path)
    m = _FILE.fullmatch(path.name)
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise JaxlogError(f"[jaxlog] cannot read saved benchmarks {path}: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("tests"), dict):
        raise JaxlogError(f"[jaxlog] {path} is not a file of saved jaxlog benchmarks (format {FORMAT!r})")
    number = doc.get("number") if isinstance(doc.get("number"), int) else int(m.group(1)) if m else 0
    name = str(doc.get("name") or (m.group(2) if m else path.stem))
    saved = doc.get("saved") if isinstance(doc.get("saved"), (int, float)) else 0.0
    tests = {str(k): v for k, v in doc["tests"].items() if isinstance(v, dict)}
    for nodeid, saved_test in tests.items():
        _check_test(path, nodeid, saved_test)
    return SavedRun(path, number, name, float(saved), Machine.from_json(doc.get("machine")), tests)


def _check_test(path: Path, nodeid: str, saved: dict) -> None:
    """A saved test's benchmarks and costs hold what ``save`` writes: a positive step count, and
    timings and figures that are finite numbers (timings > 0, figures >= 0). A baseline of NaN
    timings would make every comparison "cannot tell" and pass; refused when read, naming the
    file, the benchmark and the field."""

    for b in saved.get("benchmarks") or ():
        label = b.get("name") if isinstance(b, dict) else b
        where = f"[jaxlog] saved benchmarks {path}: test {nodeid} benchmark {label!r}"
        if not isinstance(b, dict):
            raise JaxlogError(f"{where}: not an object")
        steps = b.get("steps")
        if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
            raise JaxlogError(f"{where}: field 'steps' is {steps!r:.60}, expected a positive integer")
        for key in ("samples", "reference_samples"):
            reps = b.get(key)
            if reps is None and key == "reference_samples":
                continue
            ok = isinstance(reps, list) and all(isinstance(rep, list) and all(is_figure(t) and t > 0 for t in rep)
                                                for rep in reps)
            if not ok:
                raise JaxlogError(f"{where}: field {key!r} is {reps!r:.80}, expected lists of run times in "
                                  "seconds (finite numbers > 0)")
    for c in saved.get("costs") or ():
        metrics = c.get("metrics") if isinstance(c, dict) else None
        bad = [(k, v) for k, v in metrics.items() if v is not None and not is_figure(v)] if isinstance(metrics, dict) \
            else [("metrics", metrics)]
        if bad:
            label = c.get("name") if isinstance(c, dict) else c
            raise JaxlogError(f"[jaxlog] saved benchmarks {path}: test {nodeid} cost {label!r}: field "
                              f"{bad[0][0]!r} is {bad[0][1]!r:.60}, expected a finite number >= 0")


def runs_in(directory: Path) -> list[SavedRun]:
    """The saved runs of one machine's directory, oldest first (unreadable files left out)."""
    out = []
    for p in sorted(Path(directory).glob("[0-9]*_*.json")):
        if _FILE.fullmatch(p.name):
            try:
                out.append(read(p))
            except JaxlogError:
                continue
    return sorted(out, key=lambda r: r.number)


def all_runs(root: Path) -> list[SavedRun]:
    """Every machine's saved runs under ``root`` (or the runs of ``root`` itself, one machine's directory)."""
    root = Path(root)
    found = runs_in(root)
    for d in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else ():
        found += runs_in(d)
    return found


def find(root: Path, machine: Machine, which: str) -> SavedRun:
    """The saved run ``which`` (a name: its newest run; ``NNNN``: that number; ``last``: the newest)
    of this machine; one that exists only for other machines is an error naming them."""
    mine = runs_in(Path(root) / machine.key)
    hits = [r for r in mine if _matches(r, which)]
    if hits:
        return hits[-1]
    others = [r for r in all_runs(root) if _matches(r, which) and r.machine != machine]
    wanted = "any saved run" if which == "last" else f"saved run {which!r}"
    here = f"this machine ({machine.key}: {machine.describe()})"
    if others:
        theirs = sorted({f"{r.path.parent.name} ({r.machine.describe() if r.machine else 'unknown machine'})"
                         for r in others})
        raise JaxlogError(f"[jaxlog] benchmark compare: {wanted} exists in {root} only for other machines: "
                          f"{'; '.join(theirs)}; {here} has none, and timings are never compared across machines. "
                          f"Save a baseline on this machine first: {SAVE_FLAG}=NAME")
    have = ", ".join(r.label for r in mine) or "none"
    raise JaxlogError(f"[jaxlog] benchmark compare: no {wanted} for {here} in {root} (saved here: {have}); "
                      f"save one with {SAVE_FLAG}=NAME")


def _matches(run: SavedRun, which: str) -> bool:
    if which == "last":
        return True
    if which.isdigit():
        return run.number == int(which)
    return run.name == which or run.label == which


def save(root: Path, machine: Machine, name: str, tests: dict[str, dict]) -> Path:
    """Write ``NNNN_<name>.json`` into this machine's directory under ``root``, NNNN one more than
    the newest there; returns its path."""
    directory = Path(root) / machine.key
    directory.mkdir(parents=True, exist_ok=True)
    numbers = [int(m.group(1)) for p in directory.iterdir() if (m := _FILE.fullmatch(p.name))]
    number = max(numbers, default=0) + 1
    tmp = directory / f".saving-{os.getpid()}-{secrets.token_hex(4)}.json"
    try:
        for _ in range(100):
            doc = {"format": FORMAT, "version": VERSION, "name": name, "number": number, "saved": time.time(),
                   "machine": machine.to_json(), "tests": tests}
            tmp.write_text(json.dumps(doc, indent=1, sort_keys=False))
            path = directory / f"{number:04d}_{name}.json"
            try:
                os.link(tmp, path)  # fails where another session took the number: take the next one
                return path
            except FileExistsError:
                number += 1
        raise JaxlogError(f"[jaxlog] cannot save benchmarks in {directory}: every number tried is taken")
    finally:
        tmp.unlink(missing_ok=True)


def saved_tests(entries: Any) -> dict[str, dict]:
    """What a saved file keeps of manifest entries: per test with benchmarks, their timings (no
    comparison) and the costs the test checked."""
    out: dict[str, dict] = {}
    for e in entries:
        benches = [{k: v for k, v in b.items() if k != "compare"} for b in e.get("benchmarks") or ()]
        if benches:
            out[e["nodeid"]] = {"benchmarks": benches, "costs": list(e.get("costs") or ())}
    return dict(sorted(out.items()))

# ---------------------------------------------------------------------------------------------
# A benchmark against the same benchmark saved by an earlier session on the same machine: the
# ratio of their times per step with a confidence interval (``profiling.speed``), the verdict, the
# failure message, and the table of what moved that the terminal summary and ``jaxlog summary`` print.
#
# What a verdict means: against a threshold ``than`` (``1 + PERCENT/100`` of
# ``--jaxlog-benchmark-compare-fail``, else 1.10) the interval of the time ratio says *slower* (it
# lies wholly above), *not slower* (wholly at or below) or *cannot tell* (it holds ``than``: the
# noise between the two sessions' repeats hides the answer), with ``detectable``, the slow-down that
# interval could have shown (``profiling.speed``). With ``--jaxlog-benchmark-compare-fail=10`` a
# benchmark fails when it is slower, i.e. takes more than 10% longer than the saved run beyond the
# noise; a "cannot tell" fails too only under ``--jaxlog-benchmark-inconclusive=fail``.
#
# What is compared: where both sessions timed the benchmark against a reference (``reference=``,
# interleaved with it), each repeat's time *relative to the reference* (kernel's fastest run over the
# reference's): the machine's load in either session slowed both alike and cancels, so only a
# change of the kernel against its reference shows. Without a reference on both sides, the times
# per step themselves: the interval then knows only the spread of the repeats, and a session that
# is uniformly slower as a whole (another job on the machine, throttling) shifts every repeat
# alike, which only the percentage allows for; on a shared machine that can be a factor of 3. A
# reference that runs the kernel's own program (``reference_shares`` in the entry) is not compared
# relative to: a regression of the kernel slows it alike and would cancel; the times per step are
# compared instead, and the basis says why.

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

# ---------------------------------------------------------------------------------------------
# ``jaxlog benchmarks DIR``: the saved benchmark runs of a storage directory, per machine; two of
# them compared test by test (``--compare A B``, only runs of one machine); and a plot of steps/s
# (and of flops per step, where the tests checked a cost) across the saved runs, one column per
# machine, since timings of two machines are never on one axis.

def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t)) if t else "?"


def listing(root: Path) -> list[str]:
    """One block per machine: its description, then each saved run (number_name, date, tests, benchmarks)."""
    runs = all_runs(root)
    if not runs:
        return [f"[jaxlog] no saved benchmark runs in {root} (save some with pytest --jaxlog-benchmark-save=NAME)"]
    lines: list[str] = []
    for key in sorted({r.path.parent.name for r in runs}):
        mine = [r for r in runs if r.path.parent.name == key]
        machine = mine[-1].machine
        lines.append(f"{key}: {machine.describe() if machine else 'unknown machine'}")
        width = max(len(r.label) for r in mine)
        lines += [f"  {r.label.ljust(width)}  {_when(r.saved)}  {len(r.tests)} tests, {r.count} benchmarks"
                  for r in mine]
    return lines


def pick(root: Path, which: str) -> SavedRun:
    """A saved run named by its file, its ``NNNN_name``/``NNNN``/name (the newest of that name) or
    ``<machine key>/<that>``; one that several machines have must be told apart."""
    path = Path(which)
    if path.is_file():
        return read(path)
    key, _, label = which.rpartition("/")
    hits = [r for r in all_runs(root) if (not key or r.path.parent.name == key)
            and (r.label == label or r.name == label or (label.isdigit() and r.number == int(label)))]
    if not hits:
        raise JaxlogError(f"[jaxlog] no saved benchmark run {which!r} in {root}")
    machines = sorted({r.path.parent.name for r in hits})
    if len(machines) > 1:
        raise JaxlogError(f"[jaxlog] saved run {which!r} exists for several machines ({', '.join(machines)}): "
                          f"name it as MACHINE/{label}")
    return max(hits, key=lambda r: r.number)


def comparison(root: Path, a: str, b: str, markdown: bool = False) -> list[str]:
    """Run ``b`` against run ``a``, benchmark by benchmark: the time ratio b/a and its interval."""
    old, new = pick(root, a), pick(root, b)
    if old.machine != new.machine:
        raise JaxlogError(f"[jaxlog] {old.label} and {new.label} were saved on different machines "
                          f"({old.path.parent.name}, {new.path.parent.name}): timings are never compared across "
                          "machines")
    found, only = [], []
    for nodeid, test in sorted(new.tests.items()):
        for bench in test.get("benchmarks", ()):
            label = nodeid if bench.get("name") == DEFAULT_NAME else f"{nodeid} [{bench.get('name')}]"
            saved = old.benchmark(nodeid, bench.get("name"))
            if saved is None:
                only.append(f"  only in {new.label}: {label} ({steps_per_s(bench):,.1f} steps/s)")
                continue
            found.append(Row(label, compare(bench, saved, old.label, None).to_json()))
    gone = [f"  only in {old.label}: {n}" for n in sorted(set(old.tests) - set(new.tests))]
    head = f"{new.label} against {old.label} ({new.path.parent.name}): time per step of {new.label} over {old.label}"
    return [head, *(f"  {line}" for line in moved_table(found, markdown, everything=True, columns=(old.label, new.label))), *only, *gone]


def plot(root: Path, out: Path) -> str:
    """Steps/s per benchmark across the saved runs (and flops per step of the checked costs) into ``out``."""
    runs = all_runs(root)
    if not runs:
        raise JaxlogError(f"[jaxlog] no saved benchmark runs in {root} to plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({r.path.parent.name for r in runs})
    flops = any(_flops(r) for r in runs)
    fig, axes = plt.subplots(2 if flops else 1, len(keys), figsize=(7 * len(keys), 6 if flops else 3.5),
                             squeeze=False)
    for col, key in enumerate(keys):
        mine = [r for r in runs if r.path.parent.name == key]
        _lines(axes[0, col], mine, _rates, "steps/s")
        axes[0, col].set_title(key, fontsize="small")
        if flops:
            _lines(axes[1, col], mine, _flops, "flops per step")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return f"wrote {out} ({len(runs)} saved runs, {len(keys)} machine{'s' if len(keys) != 1 else ''})"


def _rates(run: SavedRun) -> dict[str, float]:
    out = {}
    for nodeid, test in run.tests.items():
        for b in test.get("benchmarks", ()):
            try:
                out[nodeid if b.get("name") == DEFAULT_NAME else f"{nodeid} [{b.get('name')}]"] = steps_per_s(b)
            except (KeyError, TypeError, ValueError, JaxlogError):
                continue
    return out


def _flops(run: SavedRun) -> dict[str, float]:
    return {nodeid if c.get("name") is None else f"{nodeid} [{c['name']}]": float(c["metrics"]["flops"])
            for nodeid, test in run.tests.items() for c in test.get("costs", ())
            if isinstance(c, dict) and isinstance((c.get("metrics") or {}).get("flops"), (int, float))}


def _lines(ax: Any, runs: list[SavedRun], values: Any, ylabel: str) -> None:
    per_run = [values(r) for r in runs]
    for label in sorted({k for v in per_run for k in v}):
        xs = [i for i, v in enumerate(per_run) if label in v]
        ax.plot(xs, [per_run[i][label] for i in xs], marker="o", lw=1, label=label)
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels([r.label for r in runs], rotation=30, ha="right", fontsize="x-small")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small")
