"""How often ``Benchmark.assert_not_slower(than=1.10)`` fails when it should not, and how often it
catches a kernel that is 1.5x slower: each in its own Python session (compiling anew), two
sessions at a time on the machine (each the other's load, as under ``pytest -n 2``).

    .venv/bin/python benchmarks/false_alarms.py              # 20 sessions of each (a few minutes)
    .venv/bin/python benchmarks/false_alarms.py --sessions 4 # smoke run

The kernel: the LJ-64 step (``examples/kernels/lj.py``) applied ``k`` times per call, timed with
``jl.benchmark`` against a reference applying it twice per call, built separately (so compiled
separately): ``k=2`` is the same work (a failure is a false alarm), ``k=3`` is exactly 1.5x the
work (a failure is a detection). Printed: failures, and each session's ratio and interval.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SESSION = """
import json, sys
import pytest_jaxlog as jl
from examples.kernels.lj import make_lj, repeated

def calls(k):
    step, state, _ = make_lj(4)
    return repeated(step, k), state

k, steps, than, options = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), json.loads(sys.argv[4])
kernel, state = calls(k)
ref, ref_state = calls(2)
b = jl.benchmark(kernel, state, steps, reference=(ref, ref_state), **options)
try:
    b.assert_not_slower(than=than)
    failed = False
except jl.TimingAssertionError:
    failed = True
print(json.dumps({"k": k, "repeats": len(b.samples), "number": len(b.samples[0]), "ratio": b.ratio,
                  "lo": b.interval.lo, "hi": b.interval.hi, "failed": failed,
                  "steps_per_s": b.steps_per_s, "reference_steps_per_s": b.reference_steps_per_s}))
"""


def _start(k: int, args: argparse.Namespace) -> subprocess.Popen:
    options = {name: getattr(args, name) for name in ("repeats", "number") if getattr(args, name) is not None}
    cmd = [sys.executable, "-c", SESSION, str(k), str(args.steps), str(args.than), json.dumps(options)]
    env = {"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=20)
    p.add_argument("--steps", type=int, default=100, help="calls of the kernel per timed run")
    p.add_argument("--repeats", type=int, default=None, help="default: jl.benchmark's")
    p.add_argument("--number", type=int, default=None, help="default: jl.benchmark's")
    p.add_argument("--than", type=float, default=1.10)
    args = p.parse_args()
    results: dict[int, list[dict]] = {2: [], 3: []}
    for _ in range(args.sessions):  # one session of each kind at the same time
        procs = [_start(2, args), _start(3, args)]
        for proc in procs:
            out, _ = proc.communicate()
            r = json.loads(out.strip().splitlines()[-1])
            results[r["k"]].append(r)
    for k, what in ((2, "identical work (false alarms)"), (3, "1.5x the work (detections)")):
        rs = results[k]
        print(f"{what}: {sum(r['failed'] for r in rs)} of {len(rs)} sessions failed at than={args.than} "
              f"({rs[0]['repeats']} repeats of {rs[0]['number']} runs of {args.steps} calls)")
        print("  ratios: " + " ".join(f"{r['ratio']:.3f}" for r in rs))
        print("  interval low ends: " + " ".join(f"{r['lo']:.3f}" for r in rs))
        print(f"  interval high ends: max {max(r['hi'] for r in rs):.3f}; "
              f"kernel steps/s median {sorted(r['steps_per_s'] for r in rs)[len(rs) // 2]:,.0f}")


if __name__ == "__main__":
    main()
