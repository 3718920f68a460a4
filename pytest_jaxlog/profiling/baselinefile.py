"""Saved benchmark runs: ``<storage>/<machine key>/NNNN_<name>.json``, one file per session that
saved (``--jaxlog-benchmark-save=NAME``), numbered in the order they were saved.

A file is readable JSON: the machine, when, and per test its benchmarks (each repeat's timings,
so a later session can compute an interval against them, not only compare two medians) and the
compiled costs it checked. One directory per machine (``Machine.key``): a comparison looks only
in this machine's directory, and a name found only in another's is an error that says so.
A file appears whole or not at all (written beside its name and linked into place, which also
keeps two sessions saving at once from taking the same number).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import JaxlogError
from .costfile import is_figure
from .machine import Machine

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
