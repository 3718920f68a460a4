"""What ``jl.log`` costs, against the same work done without it, side by side in one process.

    .venv/bin/python benchmarks/log.py            # full run (a few minutes on 2 CPU cores)
    .venv/bin/python benchmarks/log.py --quick    # smoke run

Three comparisons, each a ratio of wall times of two variants run interleaved (A, B, A, B, ...)
after a warm-up (compilation excluded); printed as the median of the per-repeat ratios, with
their min-max and the ratio of the best times. Where the two variants compile to the same
program (checked and printed), the ratio only measures the machine's noise:

1. **collected vs has_aux** (LJ-64, ``examples/kernels/lj.py``): ``jl.run`` of a step whose force
   function logs its largest force component with ``jl.log``, against ``jl.run`` of the same step
   returning that value through ``has_aux=True``. Both record it every step. Target <= 1.05x.
2. **uncollected vs no logs**: a jitted ``lax.scan`` of the LJ-64 step with ``jl.log`` calls in
   the force function (nothing collects), against the same scan without them. The two programs
   lower to the same text (checked); the ratio is machine noise. Target <= 1.02x.
3. **the lox workload** (total and kinetic energy every step, positions every 10 steps) on LJ-64
   and 1024 harmonic oscillators, logged with ``jl.log`` from inside a nested ``lax.scan`` and
   collected with ``jl.spool``, against a bare ``lax.scan`` computing and returning the same
   values (the limit). Also ``jl.run`` with the energies and positions logged from the step
   (``logs={"positions": jl.every(10)}``) into an HDF5 file. For reference, lox's own spool
   measured 1.04x (LJ-64) and 1.72x (oscillators) on this workload, with memory growing with the
   run; ``jl.run`` keeps it bounded.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # references.py

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import pytest_jaxlog as jl  # noqa: E402
from references import scan_with_records  # noqa: E402


# ------------------------------------------------------------------------------------- kernels
def lj_steps(n_side: int = 4):
    """(state, step logging fmax, step returning fmax as aux, step without logs, energies)."""
    from kernels.lj import LJState, _pair_terms, box_length, make_lj

    _, state, energies = make_lj(n_side=n_side)
    n = n_side**3
    box = box_length(n)
    rc = min(2.5, box / 2)
    dt = jnp.asarray(0.005, jnp.float32)

    def make(mode: str):
        def forces(x):
            _, f = _pair_terms(x, box, rc)
            if mode == "log":
                jl.log("fmax", jnp.max(jnp.abs(f)))
            return f

        def step(s):
            v_half = s.velocities + 0.5 * dt * s.forces
            x = s.positions + dt * v_half
            x = x - box * jnp.floor(x / box)
            f = forces(x)
            new = LJState(x, v_half + 0.5 * dt * f, f)
            return (new, {"fmax": jnp.max(jnp.abs(f))}) if mode == "aux" else new

        return step

    return state, make("log"), make("aux"), make("plain"), energies


def osc_kernel():
    from kernels.oscillators import make_oscillators

    step, state, total = make_oscillators(n=1024)

    def energies(s):
        return {"total": total(s), "kinetic": jnp.sum(0.5 * s.v**2)}

    return step, state, energies, (lambda s: s.x)


# ------------------------------------------------------------------------------------ timing
def paired(a, b, repeats: int) -> tuple[float, float, float, float, float, float]:
    """(median ratio a/b, min ratio, max ratio, median seconds of a, of b, ratio of the best
    times), interleaved repeats."""
    a()
    b()  # warm-up: compile
    ta, tb = [], []
    for _ in range(repeats):
        for fn, ts in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    ratios = [x / y for x, y in zip(ta, tb)]
    return (statistics.median(ratios), min(ratios), max(ratios), statistics.median(ta), statistics.median(tb),
            min(ta) / min(tb))


def row(label: str, result, target: float | None = None, same: bool = False) -> str:
    """One comparison; ``same``: the two variants compile to one program, so the target holds
    whatever this machine's noise makes of the measured ratio."""
    med, lo, hi, ta, tb, best = result
    if target is None:
        goal = ""
    elif same:
        goal = f"  target <= {target:.2f}x: OK (one program; the ratio is noise)"
    else:
        goal = f"  target <= {target:.2f}x: {'OK' if med <= target else 'MISSED'}"
    return (f"  {label:<40} {med:6.3f}x (min-max {lo:.3f}-{hi:.3f}, best times {best:.3f}x; "
            f"{ta * 1e3:.0f} vs {tb * 1e3:.0f} ms){goal}")


def _hlo(compiled) -> str:
    """An optimized HLO module without source locations (metadata, stack-frame tables)."""
    import re

    text = re.sub(r", metadata=\{[^}]*\}", "", compiled.as_text())
    text = re.sub(r"^HloModule [^,]+,", "HloModule,", text)
    return "\n".join(line for line in text.splitlines()
                     if not re.match(r"^(FileNames|FunctionNames|FileLocations|StackFrames)$|^\d+ ", line))


# ------------------------------------------------------------------------------------ benchmarks
def same_chunk_program(state, step_log, step_aux) -> bool:
    """Whether jl.run compiles the logging step and the has_aux step to the same executable (the
    chunk programs the two runs dispatched, ``run.compiled_chunk()``, compared without source
    locations)."""
    runs = (jl.run(step_log, state, 10, progress=False), jl.run(step_aux, state, 10, has_aux=True, progress=False))
    texts = [_hlo(r.compiled_chunk()) for r in runs]
    return texts[0] == texts[1]


def collected_vs_aux(steps: int, repeats: int):
    state, step_log, step_aux, _, _ = lj_steps()

    def by_log():
        r = jl.run(step_log, state, steps, progress=False)
        assert r.schema["log/fmax"] is not None

    def by_aux():
        jl.run(step_aux, state, steps, has_aux=True, progress=False)

    return paired(by_log, by_aux, repeats), same_chunk_program(state, step_log, step_aux)


def uncollected_vs_plain(steps: int, repeats: int):
    state, step_log, _, step_plain, _ = lj_steps()

    def scan_of(step):
        def run(s):
            return lax.scan(lambda c, _: (step(c), None), s, None, length=steps)[0]

        run.__name__ = "lj_scan"  # the same program name, so the lowered texts compare
        return jax.jit(run)

    with_logs, without = scan_of(step_log), scan_of(step_plain)
    lw, lo = with_logs.lower(state), without.lower(state)
    same = lw.as_text() == lo.as_text() and _hlo(lw.compile()) == _hlo(lo.compile())
    res = paired(lambda: jax.block_until_ready(with_logs(state)),
                 lambda: jax.block_until_ready(without(state)), repeats)
    return res, same


def lox_workload(kernel: str, steps: int, repeats: int, tmp: Path):
    if kernel == "lj64":
        state, _, _, step, energies = lj_steps()
        positions = lambda s: s.positions  # noqa: E731
    else:
        step, state, energies, positions = osc_kernel()

    def logged(s):  # lox style: log where the values are computed, inside the loops
        def inner(c, _):
            c = step(c)
            jl.log("energy", energies(c))
            return c, None

        def outer(c, _):
            c = lax.scan(inner, c, None, length=10)[0]
            jl.log("positions", positions(c))
            return c, None

        return lax.scan(outer, s, None, length=steps // 10)[0]

    spooled = jl.spool(logged)

    bare = scan_with_records(step, energies, positions, steps)  # the limit: the same values threaded out by hand

    from pytest_jaxlog.logs import collect

    same = _hlo(jax.jit(collect(logged)).lower(state).compile()) == _hlo(bare.lower(state).compile())
    out, logs = spooled(state)
    ref = bare(state)
    assert (logs["energy"]["total"] == ref[1][0]["total"]).all()
    assert (logs["positions"] == ref[1][1]).all()

    def step_logging(s):
        s = step(s)
        jl.log({"energy": energies(s), "positions": positions(s)})
        return s

    counter = [0]

    def by_run():
        counter[0] += 1
        path = tmp / f"{kernel}-{counter[0]}.h5"
        jl.run(step_logging, state, steps, logs={"positions": jl.every(10)}, sinks=[jl.HDF5Writer(path)],
               progress=False)
        path.unlink()

    spool_res = paired(lambda: jax.block_until_ready(spooled(state)), lambda: jax.block_until_ready(bare(state)),
                       repeats)
    run_res = paired(by_run, lambda: jax.block_until_ready(bare(state)), repeats)
    return spool_res, run_res, same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short runs, 3 repeats: a smoke run")
    ap.add_argument("--repeats", type=int, default=None)
    args = ap.parse_args()
    repeats = args.repeats or (3 if args.quick else 11)
    lj_n, osc_n = (2_000, 20_000) if args.quick else (10_000, 200_000)
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind} ({os.cpu_count()} cores); "
          f"ratios are medians of {repeats} interleaved repeats (min-max of the per-repeat ratios)")

    print(f"\n1. LJ-64, {lj_n} steps: fmax logged inside the force function vs returned through has_aux")
    res, same = collected_vs_aux(lj_n, repeats)
    print(row("jl.run, jl.log vs jl.run, has_aux", res, 1.05, same))
    print(f"  same compiled chunk program (without source locations): {same}")

    print(f"\n2. LJ-64, {lj_n} steps: jl.log calls nobody collects vs no jl.log calls (jitted lax.scan)")
    res, same = uncollected_vs_plain(lj_n, repeats)
    print(row("scan with uncollected logs vs scan without", res, 1.02, same))
    print(f"  same lowered and compiled programs (without source locations): {same}")

    print("\n3. lox workload (energies every step, positions every 10) vs a bare lax.scan of the same")
    with tempfile.TemporaryDirectory() as d:
        for kernel, n, lox in (("lj64", lj_n, 1.04), ("osc1024", osc_n, 1.72)):
            spool_res, run_res, same = lox_workload(kernel, n, repeats, Path(d))
            print(f"  {kernel}, {n} steps (lox's spool: {lox:.2f}x)")
            print(row("  jl.spool, logs in the nested scan", spool_res, lox, same))
            print(f"    jl.spool compiles to the bare scan's program (without source locations): {same}")
            print(row("  jl.run, logs from the step, HDF5", run_res))


if __name__ == "__main__":
    main()
