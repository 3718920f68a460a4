"""A state sharded over 4 host CPU devices: ``jl.run`` against a bare sharded ``lax.scan`` of the
same step computing the same records.

    .venv/bin/python benchmarks/sharded.py            # full run (a few minutes on 2 CPU cores)
    .venv/bin/python benchmarks/sharded.py --quick    # smoke run

The process starts jax with ``--xla_force_host_platform_device_count=4`` (set here, before jax
starts). Kernels from ``examples/kernels``, their leaves sharded along the particle axis over a
1-D mesh of the 4 devices (``NamedSharding(mesh, P("d"))``), its axis automatic and explicit
(``--axes``; ``jax.make_mesh``'s default is explicit):

- ``osc``: 16384 harmonic oscillators (4096 per device): short steps, where per-chunk costs show;
- ``lj``: LJ-216 NVE, all pairs (the positions are all-gathered each step, by both variants).

Records: the total energy every step (a reduction across devices: replicated), the positions
every 10 steps (sharded like the state). Variants, timed interleaved (each repeat runs every
variant once, so machine load hits all alike), compilation excluded by a warm-up:

- ``bare scan``: one jitted ``lax.scan`` over the sharded state that computes the same records
  (energies as scan outputs, positions through a nested scan every 10 steps), kept on the devices;
- ``jl.run``: the records pulled shard by shard into host frames (in memory);
- ``jl.run + HDF5 + invariants``: also written with ``HDF5Writer`` and checked by ``finite`` and
  ``conserved``.

Printed per variant: the median time over the repeats with its min-max, the ratio of medians to
the bare scan (target <= 1.10x for ``jl.run``) with the range of the per-repeat ratios (each
repeat's time over the bare scan's in the same repeat), and the ratio of the fastest runs, the
least disturbed by other work on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

_flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
os.environ["XLA_FLAGS"] = " ".join([*_flags, "--xla_force_host_platform_device_count=4"])
os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # references.py

import jax  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import pytest_jaxlog as jl  # noqa: E402
from references import scan_with_records  # noqa: E402

TARGET = 1.10


def kernel(name: str, axes: str = "auto"):
    """(step, sharded state, energy, positions view, conserved rtol), on a mesh of ``axes`` axes
    (``auto``, or ``explicit``: ``jax.make_mesh``'s default, a value's type carrying its sharding)."""
    if name == "lj":
        from kernels.lj import make_lj

        step, state, energies = make_lj(n_side=6)
        energy, positions, rtol = (lambda s: energies(s)["total"]), (lambda s: s.positions), 1e-2
    elif name == "osc":
        from kernels.oscillators import make_oscillators

        step, state, energy = make_oscillators(n=16384)
        positions, rtol = (lambda s: s.x), 1e-2
    else:
        raise SystemExit(f"unknown kernel {name}")
    mesh = jax.make_mesh((4,), ("d",), axis_types=(AxisType.Explicit if axes == "explicit" else AxisType.Auto,))
    sharded = NamedSharding(mesh, P("d"))
    if name == "lj" and axes == "explicit":
        # all pairs (x[:, None] - x[None]) puts both atom axes on "d", which JAX refuses on explicit
        # axes: the positions are gathered by hand, as an automatic mesh's compiler gathers them
        # itself, and the new state put back on "d" (the scan it is compared with runs the same step)
        whole = lambda s: jax.tree_util.tree_map(lambda a: jax.sharding.reshard(a, NamedSharding(mesh, P())), s)  # noqa: E731
        back = lambda s: jax.tree_util.tree_map(lambda a: jax.sharding.reshard(a, sharded), s)  # noqa: E731
        lj_step, lj_energy = step, energy
        step, energy = (lambda s: back(lj_step(whole(s)))), (lambda s: lj_energy(whole(s)))
    return step, jax.device_put(state, sharded), energy, positions, rtol


def variants(name: str, steps: int, tmp: Path, axes: str) -> dict:
    step, state, energy, positions, rtol = kernel(name, axes)
    record = {"energy": energy, "positions": jl.Record(positions, every=10)}

    scan = scan_with_records(step, energy, positions, steps)

    def bare():
        jax.block_until_ready(scan(state))

    def run():
        r = jl.run(step, state, steps, record=record, progress=False)
        assert r.steps_done == steps and r.state.x.sharding.spec == P("d") if name == "osc" else True
        return r

    counter = [0]

    def run_hdf5():
        counter[0] += 1
        path = tmp / f"{name}-{counter[0]}.h5"
        r = jl.run(step, state, steps, record=record, sinks=[jl.HDF5Writer(path)], progress=False,
                   invariants=[jl.finite("energy", "positions"), jl.conserved("energy", rtol=rtol)])
        assert r.steps_done == steps and r.violation is None
        path.unlink()

    return {"bare scan": bare, "jl.run": run, "jl.run + HDF5 + invariants": run_hdf5}


def bench(name: str, steps: int, repeats: int, axes: str) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as d:
        vs = variants(name, steps, Path(d), axes)
        for fn in vs.values():
            fn()  # warm-up: compile
        times: dict[str, list[float]] = {label: [] for label in vs}
        for _ in range(repeats):
            for label, fn in vs.items():
                t0 = time.perf_counter()
                fn()
                times[label].append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few steps and repeats: a smoke run")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--kernels", default="osc,lj")
    ap.add_argument("--axes", default="auto,explicit", help="mesh axis types: auto, explicit (jax.make_mesh's default)")
    args = ap.parse_args()
    steps = {"osc": 20_000, "lj": 2_000} if not args.quick else {"osc": 2_000, "lj": 200}
    repeats = args.repeats or (3 if args.quick else 9)
    assert jax.device_count() == 4, jax.devices()
    load = os.getloadavg()
    print(f"jax {jax.__version__}, {jax.device_count()} host CPU devices on {os.cpu_count()} cores, "
          f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1 / 5 / 15 min); "
          f"median of {repeats} interleaved repeats [min-max]")
    verdicts = []
    for axes, name in ((a, k) for a in args.axes.split(",") for k in args.kernels.split(",")):
        n = steps[name]
        times = bench(name, n, repeats, axes)
        base = times["bare scan"]
        print(f"\n{name}: {n} steps, sharded over 4 devices, {axes} mesh axes")
        print(f"  {'variant':<28} {'time (s)':>22} {'ratio of medians':>17} {'per-repeat ratios':>19} "
              f"{'ratio of minima':>16}")
        for label, ts in times.items():
            med = statistics.median(ts)
            ratios = [a / b for a, b in zip(ts, base)]
            print(f"  {label:<28} {med:>8.3f} [{min(ts):.3f}-{max(ts):.3f}] {med / statistics.median(base):>16.2f}x "
                  f"{'':>7}[{min(ratios):.2f}-{max(ratios):.2f}] {min(ts) / min(base):>15.2f}x")
        ratio = statistics.median(times["jl.run"]) / statistics.median(base)
        verdicts.append(f"target {name}, {axes} axes: jl.run {ratio:.2f}x the bare sharded scan (target <= {TARGET}x): "
                        f"{'OK' if ratio <= TARGET else 'MISSED'}")
    load = os.getloadavg()
    print(f"\nload average at the end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")
    for v in verdicts:
        print(v + (" (--quick: short runs)" if args.quick else ""))


if __name__ == "__main__":
    main()
