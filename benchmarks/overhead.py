"""Overhead of recording, against a bare ``lax.scan`` of the same kernel (the limit).

    .venv/bin/python benchmarks/overhead.py            # full run (a few minutes on 2 CPU cores)
    .venv/bin/python benchmarks/overhead.py --quick    # smoke run (seconds)

Kernels: LJ-64 NVE (``examples/kernels/lj.py``) and 1024 harmonic oscillators
(``examples/kernels/oscillators.py``). Workload for the recording variants: total and kinetic
energy every step, positions every 10 steps, ``finite`` + ``conserved`` invariants, HDF5Writer
into a temporary directory. Variants, all in this process, each timed as the median of
``--repeats`` runs after a warm-up (compilation excluded):

- ``lax.scan + records`` (the limit): one jitted ``lax.scan`` of the step that also computes the
  recorded values (energies every step as scan outputs, positions every 10 steps via a nested
  scan) and keeps them on the device: the same device work as the workload, no host I/O;
- ``lax.scan, no records``: the bare kernel, for reference (computing the energies is part of the
  workload: for LJ it is a second pair loop, for the oscillators two reductions per step);
- ``python loop``: the jitted step called from Python, nothing recorded;
- ``jl.run``: the driver with the workload above;
- ``jl.run, no invariants``: the same without ``finite`` + ``conserved``. The invariants' cost
  (target under 5% of the run) is the time spent inside their checks in one more ``jl.run``; the
  paired ratio of the two whole runs is printed too, but machine noise is larger than the cost;
- ``jl.Recorder loop``: the jitted step in a Python loop with ``Recorder.log`` each step;
- ``host callback``: ``io_callback`` of the energies per step inside the scan.

The per-step Python variants and the callback run 1/20 of the steps (throughput is compared).
Two ratios of time per step are printed: against the limit (``lax.scan + records``, the same device
work as the workload) and against the bare kernel (``lax.scan, no records``).

Then peak RSS of ``jl.run`` in a fresh subprocess for the run length and 10x that, to show the
memory does not grow with the run length.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # references.py

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import pytest_jaxlog as jl  # noqa: E402
from references import bare_scan, scan_with_records  # noqa: E402


# ------------------------------------------------------------------------------------- kernels
def kernel(name: str):
    """(step, state, records dict, invariants) for a kernel name."""
    if name == "lj64":
        from kernels.lj import make_lj

        step, state, energies = make_lj(n_side=4)

        def energy(s):
            e = energies(s)
            return {"total": e["total"], "kinetic": e["kinetic"]}

        positions = lambda s: s.positions  # noqa: E731
        rtol = 1e-2
    elif name == "osc1024":
        from kernels.oscillators import make_oscillators

        step, state, total = make_oscillators(n=1024)

        def energy(s):
            return {"total": total(s), "kinetic": jnp.sum(0.5 * s.v**2)}

        positions = lambda s: s.x  # noqa: E731
        rtol = 1e-2
    else:
        raise SystemExit(f"unknown kernel {name}")
    record = {"energy": energy, "positions": jl.Record(positions, every=10)}
    return step, state, record, energy, positions, rtol


def invariants(rtol):
    try:
        import pytest_jaxlog.check.invariants  # noqa: F401
    except ImportError:
        print("  (pytest_jaxlog.check.invariants not available: running without invariants)")
        return ()
    return (jl.finite("energy", "positions"), jl.conserved("energy/total", rtol=rtol))


# ------------------------------------------------------------------------------------ variants
def make_variants(name: str, steps: int, tmp: Path, callbacks: bool):
    step, state, record, energy, positions, rtol = kernel(name)
    invs = invariants(rtol)
    jstep = jax.jit(step)

    scan_limit = bare_scan(step, steps)
    scan_records = scan_with_records(step, energy, positions, steps)

    def limit():
        jax.block_until_ready(scan_limit(state))

    def limit_rec():
        jax.block_until_ready(scan_records(state))

    slow = max(10, steps // 20)  # per-step Python variants: fewer steps, throughput compared

    def py_loop():
        s = state
        for _ in range(slow):
            s = jstep(s)
        jax.block_until_ready(s)

    counter = [0]

    def run(invs=invs):
        counter[0] += 1
        path = tmp / f"{name}-run-{counter[0]}.h5"
        r = jl.run(step, state, steps, record=record, invariants=invs, sinks=[jl.HDF5Writer(path)], progress=False)
        assert r.steps_done == steps and r.violation is None, r
        path.unlink()
        return r

    def run_no_invariants():
        return run(())

    def recorder():
        counter[0] += 1
        path = tmp / f"{name}-rec-{counter[0]}.h5"
        s = state
        with jl.Recorder(record, sinks=[jl.HDF5Writer(path)], invariants=invs) as rec:
            rec.log(s, 0)
            for k in range(1, slow + 1):
                s = jstep(s)
                rec.log(s, k)
        jax.block_until_ready(s)
        path.unlink()

    variants = {
        "lax.scan + records": (limit_rec, steps),
        "lax.scan, no records": (limit, steps),
        "python loop": (py_loop, slow),
        "jl.run": (run, steps),
        "jl.run, no invariants": (run_no_invariants, steps),
        "jl.Recorder loop": (recorder, slow),
    }
    if callbacks:
        from jax.experimental import io_callback

        cb_steps = slow
        sink: list = []

        def host(e):
            sink.append(e)

        @jax.jit
        def scan_cb(s):
            def body(c, _):
                c = step(c)
                io_callback(host, None, energy(c), ordered=True)
                return c, None

            return lax.scan(body, s, None, length=cb_steps)[0]

        def cb():
            sink.clear()
            jax.block_until_ready(scan_cb(state))

        variants["host callback"] = (cb, cb_steps)
    return variants


def check_seconds(fn) -> tuple[float, float]:
    """(seconds spent inside the invariants' checks, wall seconds) for one call of ``fn``: the
    checks' own cost, which noise between whole runs cannot hide or inflate. Every invariant runs
    through the one ``Checker`` (``check`` per batch, ``finish`` at the end), so timing those two
    covers them all."""
    from pytest_jaxlog.check.checker import Checker

    spent = [0.0]
    originals = {name: getattr(Checker, name) for name in ("check", "finish")}

    def timed(original):
        def call(self, *args):
            t0 = time.perf_counter()
            try:
                return original(self, *args)
            finally:
                spent[0] += time.perf_counter() - t0

        return call

    for name, original in originals.items():
        setattr(Checker, name, timed(original))
    try:
        t0 = time.perf_counter()
        fn()
        return spent[0], time.perf_counter() - t0
    finally:
        for name, original in originals.items():
            setattr(Checker, name, original)


def bench(name: str, steps: int, repeats: int, callbacks: bool) -> tuple[list[tuple[str, float]], dict]:
    """Median steps/s per variant; variants interleaved per repeat so machine load hits all alike.
    Also the invariants' cost: the median over repeats of the paired ratio of jl.run with and
    without them, and the time spent inside the checks in one more run."""
    with tempfile.TemporaryDirectory() as d:
        variants = make_variants(name, steps, Path(d), callbacks)
        for fn, _ in variants.values():
            fn()  # warm-up: compile
        times: dict[str, list[float]] = {label: [] for label in variants}
        for _ in range(repeats):
            for label, (fn, n) in variants.items():
                t0 = time.perf_counter()
                fn()
                times[label].append(time.perf_counter() - t0)
        paired = statistics.median(a / b for a, b in zip(times["jl.run"], times["jl.run, no invariants"])) - 1
        inside, wall = check_seconds(variants["jl.run"][0])
        rows = [(label, variants[label][1] / statistics.median(ts)) for label, ts in times.items()]
        return rows, {"paired": paired, "inside": inside, "wall": wall}


# ------------------------------------------------------------------------------------- RSS child
def rss_child(name: str, steps: int) -> None:
    step, state, record, _, _, rtol = kernel(name)
    with tempfile.TemporaryDirectory() as d:
        r = jl.run(step, state, steps, record=record, invariants=invariants(rtol),
                   sinks=[jl.HDF5Writer(Path(d) / "t.h5")], progress=False)
        size = (Path(d) / "t.h5").stat().st_size
    print(json.dumps({"steps": r.steps_done, "chunk": r.chunk, "maxrss_mb": peak_rss_mb(), "file_mb": size / 2**20}))


def peak_rss_mb() -> float:
    """This process's own high-water mark: on Linux ``ru_maxrss`` keeps the parent's across exec."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss(name: str, steps: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--rss-child", name, str(steps)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few steps and repeats: a smoke run")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--kernels", default="lj64,osc1024")
    ap.add_argument("--no-callbacks", action="store_true", help="skip the host-callback reference")
    ap.add_argument("--no-rss", action="store_true")
    ap.add_argument("--rss-child", nargs=2, metavar=("KERNEL", "STEPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        rss_child(args.rss_child[0], int(args.rss_child[1]))
        return
    steps = {"lj64": 20_000, "osc1024": 200_000}
    if args.quick:
        steps = {"lj64": 2_000, "osc1024": 50_000}
    repeats = args.repeats or (2 if args.quick else 7)
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind} ({os.cpu_count()} cores), "
          f"median of {repeats} repeats")
    results = {}
    for name in args.kernels.split(","):
        n = steps[name]
        rows, inv = bench(name, n, repeats, not args.no_callbacks)
        by = dict(rows)
        limit, bare = by["lax.scan + records"], by["lax.scan, no records"]
        print(f"\n{name}: {n} steps")
        print(f"  {'variant':<24} {'steps/s':>12} {'time / limit':>13} {'time / bare scan':>17}")
        print(f"  {'':<24} {'':>12} {'(scan+records)':>13} {'(no records)':>17}")
        for label, sps in rows:
            print(f"  {label:<24} {sps:>12.4g} {limit / sps:>12.2f}x {bare / sps:>16.2f}x")
        print(f"  invariants (finite + conserved): {inv['inside'] * 1e3:.1f} ms inside the checks of a "
              f"{inv['wall'] * 1e3:.0f} ms run ({inv['inside'] / inv['wall'] * 100:.1f}%, target < 5%); "
              f"paired whole-run difference {inv['paired'] * 100:+.1f}% (machine noise included)")
        results[name] = (rows, inv)
        if not args.no_rss:
            small, big = rss(name, n), rss(name, 10 * n)
            print(f"  peak RSS of jl.run: {small['maxrss_mb']:.0f} MB for {small['steps']} steps "
                  f"({small['file_mb']:.1f} MB file), {big['maxrss_mb']:.0f} MB for {big['steps']} steps "
                  f"({big['file_mb']:.1f} MB file)")
    targets = {"lj64": 1.10, "osc1024": 1.5}
    print()
    note = " (--quick: short runs where fixed per-run costs weigh more; targets are for the full run)" \
        if args.quick else ""
    for name, (rows, inv) in results.items():
        by = dict(rows)
        ratio = by["lax.scan + records"] / by["jl.run"]
        ok = "OK" if ratio <= targets[name] else "MISSED"
        print(f"target {name}: jl.run {ratio:.2f}x the limit (target <= {targets[name]}x): {ok}{note}")
        cost = inv["inside"] / inv["wall"]
        ok = "OK" if cost < 0.05 else "MISSED"
        print(f"target {name}: invariant checks take {cost * 100:.1f}% of jl.run's time (target < 5%): {ok}{note}")


if __name__ == "__main__":
    main()
