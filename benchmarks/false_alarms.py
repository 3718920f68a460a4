"""How often ``jl.benchmark``'s verdict is "slower" when it should not be (A/A: the same work), how
often it catches a real slow-down (A/B), and how often it cannot tell, for each timer (wall time,
the process's CPU time), on a quiet machine and beside two CPU-burning processes.

    .venv/bin/python benchmarks/false_alarms.py            # the campaign (about 15 minutes on 2 cores)
    .venv/bin/python benchmarks/false_alarms.py --quick    # smoke run (a few sessions, targets not judged)

The kernel: the LJ-64 step (``examples/kernels/lj.py``) applied ``k`` times per call in a
``fori_loop``, timed with ``jl.benchmark`` against a reference applying it ``base`` times per
call (default 20), built separately: ``k = base`` is the same work (a "slower" is a false alarm),
``k = 1.10 * base`` and ``k = 1.25 * base`` are 1.10x and 1.25x the work (a "slower" is a
detection; the measured time ratio is a little less than the work's, as the loop around the
calls is not multiplied). Each session builds both anew, compiles them with the driver's and
JAX's caches cleared, and runs one ``jl.benchmark`` per timer (the order alternating between
sessions), with the defaults but ``number`` and a time budget: repeats of 15 looked at up to 4
times (each interval at 98.75%), until the verdict at ``than`` is decided or the budget is spent.
Sessions of the cases alternate, one at a time; the loaded phase starts two processes that burn
a core each beside them (on a 2-core machine: the benchmark shares its cores with both).

Printed: per load, timer and case, the sessions' verdicts, the median time ratio, the median
``detectable`` (the smallest ratio the interval could have shown above ``than``) and the median
number of repeats; then the targets (false alarms <= 1% over the A/A sessions, 1.25x detected in
>= 95% of sessions under load, 1.10x in >= 95% on a quiet machine), each with its measured
figure, per timer.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {"A/A": 1.0, "1.10x": 1.10, "1.25x": 1.25}
TIMERS = ("wall", "cpu")

WORKER = """
import json, sys, warnings
import jax
import pytest_jaxlog as jl
from pytest_jaxlog.drive.prepare.identity import clear_caches
from examples.kernels.lj import make_lj

def calls(k):
    step, state, _ = make_lj(4)
    return (lambda s: jax.lax.fori_loop(0, k, lambda i, c: step(c), s)), state

specs, options = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for spec in specs:
    clear_caches()
    jax.clear_caches()
    kernel, state = calls(spec["k"])
    ref, ref_state = calls(spec["base"])
    out = dict(spec, results={})
    for timer in spec["timers"]:
        with warnings.catch_warnings():  # the reference runs the kernel's step on purpose: known work ratios
            warnings.simplefilter("ignore", jl.JaxlogRuntimeWarning)
            b = jl.benchmark(kernel, state, spec["steps"], reference=(ref, ref_state), timer=timer, **options)
        out["results"][timer] = {"verdict": b.verdict, "ratio": b.ratio, "lo": b.interval.lo, "hi": b.interval.hi,
                                 "detectable": b.detectable, "repeats": len(b.samples), "stop": b.stop_reason}
    print(json.dumps(out), flush=True)
"""


@dataclass(frozen=True)
class Phase:
    """One load condition: its name and the sessions of each case."""

    load: str
    sessions: dict[str, int]


def _plan(args: argparse.Namespace) -> list[Phase]:
    if args.quick:
        return [Phase("quiet", {"A/A": 2, "1.10x": 2, "1.25x": 1}), Phase("2 burners", {"A/A": 2, "1.25x": 2})]
    quiet = {"A/A": args.aa, "1.10x": args.ab} | ({"1.25x": args.ab} if args.all_cells else {})
    loaded = {"A/A": args.aa, "1.25x": args.ab} | ({"1.10x": args.ab} if args.all_cells else {})
    phases = [Phase("quiet", quiet), Phase("2 burners", loaded)]
    return [ph for ph in phases if ("quiet" if ph.load == "quiet" else "loaded") in args.phases]


def _specs(phase: Phase, args: argparse.Namespace) -> list[dict]:
    """The phase's sessions, the cases interleaved (a change of the machine's load over the phase
    falls on all of them alike), the timers' order alternating."""
    left = dict(phase.sessions)
    out: list[dict] = []
    while any(left.values()):
        for case in CASES:
            if left.get(case, 0) > 0:
                left[case] -= 1
                timers = TIMERS if len(out) % 2 == 0 else TIMERS[::-1]
                out.append({"case": case, "k": round(args.base * CASES[case]), "base": args.base,
                            "steps": args.steps, "timers": list(timers), "load": phase.load})
    return out


def _run_sessions(specs: list[dict], options: dict, batch: int) -> list[dict]:
    env = {"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/")}
    found: list[dict] = []
    for i in range(0, len(specs), batch):
        cmd = [sys.executable, "-c", WORKER, json.dumps(specs[i:i + batch]), json.dumps(options)]
        out = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
        found += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return found


def _burners(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])


def _table(found: list[dict], phases: list[Phase]) -> list[str]:
    head = ["load", "timer", "case", "sessions", "slower", "not slower", "cannot tell", "median ratio",
            "median detectable", "median repeats"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for phase in phases:
        for timer in TIMERS:
            for case in CASES:
                rs = [r["results"][timer] for r in found if r["load"] == phase.load and r["case"] == case]
                if not rs:
                    continue
                count = {v: sum(r["verdict"] == v for r in rs) for v in ("slower", "not slower", "cannot tell")}
                lines.append(f"| {phase.load} | {timer} | {case} | {len(rs)} | {count['slower']} | "
                             f"{count['not slower']} | {count['cannot tell']} | {_median([r['ratio'] for r in rs]):.3f} | "
                             f"{_median([r['detectable'] for r in rs]):.3f} | {_median([r['repeats'] for r in rs]):g} |")
    return lines


def _targets(found: list[dict], judge: bool) -> list[str]:
    out = []
    for timer in TIMERS:
        aa = [r["results"][timer] for r in found if r["case"] == "A/A"]
        loaded = [r["results"][timer] for r in found if r["case"] == "1.25x" and r["load"] != "quiet"]
        quiet = [r["results"][timer] for r in found if r["case"] == "1.10x" and r["load"] == "quiet"]
        checks = [("false alarms (A/A 'slower')", aa, "slower", lambda f: f <= 0.01, "<= 1%"),
                  ("1.25x detected under load", loaded, "slower", lambda f: f >= 0.95, ">= 95%"),
                  ("1.10x detected on a quiet machine", quiet, "slower", lambda f: f >= 0.95, ">= 95%")]
        for what, rs, verdict, ok, target in checks:
            if not rs:
                continue
            hits = sum(r["verdict"] == verdict for r in rs)
            undecided = sum(r["verdict"] == "cannot tell" for r in rs)
            frac = hits / len(rs)
            judged = ("met" if ok(frac) else "MISSED") if judge else "not judged (--quick)"
            out.append(f"{timer:4}: {what}: {hits} of {len(rs)} ({frac:.1%}; target {target}: {judged}); "
                       f"cannot tell in {undecided}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--aa", type=int, default=50, help="A/A sessions per load (default 50: 100 in all)")
    p.add_argument("--ab", type=int, default=20, help="sessions of each A/B cell (default 20)")
    p.add_argument("--all-cells", action="store_true", help="also 1.25x quiet and 1.10x under load")
    p.add_argument("--base", type=int, default=20, help="LJ steps per call of the reference")
    p.add_argument("--steps", type=int, default=5, help="calls per timed run")
    p.add_argument("--number", type=int, default=3, help="runs of each per repeat")
    p.add_argument("--repeats", type=int, default=None, help="default: jl.benchmark's")
    p.add_argument("--budget", type=float, default=4.0,
                   help="jl.benchmark(budget_s=...) per benchmark (0: none, jl.benchmark's default: max_repeats alone)")
    p.add_argument("--phases", default="quiet,loaded", help="which phases to run: quiet, loaded or both")
    p.add_argument("--than", type=float, default=1.05)
    p.add_argument("--burners", type=int, default=2)
    p.add_argument("--batch", type=int, default=35, help="sessions per worker process")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    args.phases = {s.strip() for s in args.phases.split(",")}
    if not args.phases or args.phases - {"quiet", "loaded"}:
        raise SystemExit(f"--phases: quiet, loaded or both, got {sorted(args.phases)}")
    options: dict = {"number": args.number, "than": args.than}
    if args.budget > 0:
        options["budget_s"] = args.budget
    if args.repeats is not None:
        options["repeats"] = args.repeats
    phases = _plan(args)
    started = time.time()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores; LJ-64 x{args.base} per call "
          f"(reference), {args.steps} calls a run; jl.benchmark({', '.join(f'{k}={v}' for k, v in options.items())})")
    found: list[dict] = []
    for phase in phases:
        burners = _burners(args.burners) if phase.load != "quiet" else []
        try:
            time.sleep(2.0 if burners else 0.0)
            before = os.getloadavg()[0]
            found += _run_sessions(_specs(phase, args), options, args.batch)
            after = os.getloadavg()[0]
        finally:
            for b in burners:
                b.kill()
                b.wait()
        print(f"# {phase.load}: load average {before:.1f} before, {after:.1f} after")
    print()
    print("\n".join(_table(found, phases)))
    print()
    print(f"verdicts at than={args.than:g}; targets:")
    print("\n".join(_targets(found, judge=not args.quick)))
    print(f"# {len(found)} sessions in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
