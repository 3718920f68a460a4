"""All of pytest-jaxlog's performance targets, measured side by side in one run.

    python benchmarks/run.py             # everything (several minutes on 2 CPU cores)
    python benchmarks/run.py --quick     # a smoke run: fewer steps and repeats (targets not judged)
    python benchmarks/run.py --docs      # also rewrite the table of docs/performance.md
    python benchmarks/run.py --only sparse,fixed

Every measurement compares pytest-jaxlog with a reference computed in the same process (or, for
compile times, in fresh processes started alternately), repeated ``--repeats`` times (at least 7)
with the variants interleaved, so machine load hits both alike; a ratio is taken per repeat and
the table shows the median and the min–max of those ratios. JAX's default backend is used (set
``JAX_PLATFORMS`` to choose one): on a machine with a GPU the same command measures the GPU.

Workloads ("standard": total and kinetic energy every step, positions every 10 steps, ``finite``
+ ``conserved`` invariants, the HDF5 writer into a temporary directory):

- ``sparse``: 1024 oscillators, an expensive pairwise observable (``sum |x_i - x_j|``, 10^6 pairs)
  recorded every 100 of 50,000 steps: ``jl.run`` against a nested scan that computes it only
  then (target <= 1.05x), and the run's chunk program alone (one dispatch, no host work) and the
  nested scan with a runtime inner trip count against it, the run's time beyond its program,
  and a 10,000-step run against its nested scan;
- ``fixed``: fixed costs. A ``chunk=1`` run (the energies in memory) against a Python loop of the
  jitted step (target <= 2x), and against a loop of a jitted step that also returns the energies
  (what the records cost by hand: their own computation is in both). Host work per chunk:
  ``jl.run(chunk=1)`` (standard workload) against a loop that only dispatches the same compiled
  chunk program, per step (target <= 100 us beyond it; a loop of the bare jitted step is shown
  too). A 1,000-step and a 10,000-step oscillator run
  (standard workload) against the scan computing the same records (target <= 1.5x at 1,000).
  ``jl.Recorder`` in a hand-written loop (standard workload) against the same loop keeping the
  same records with jitted views (target <= 1.5x);
- ``compile``: LJ-64, the first ``jl.run`` against the first call of the scan computing the same
  records, each in a fresh process after the package and JAX are warm (compile time = first call
  less a second, warm call; target <= 1.2x); and whether a run of another length compiles
  anything (target: nothing);
- ``long``: the long runs: LJ-64 NVE for 20,000 steps (target <= 1.05x) and 1024 harmonic
  oscillators for 200,000 steps (target <= 1.25x) against the scan computing the same records;
- ``suite``: where users live, a pytest suite: 40 parametrized regression tests of a
  256-oscillator kernel (1,000 steps each, the energy every step, the positions every 100,
  ``finite`` + ``conserved``, a trajectory file), written four ways (``benchmarks/suites.py``: by
  hand with a module-level jitted scan, numpy and h5py; the ``jaxlog`` fixture with views inline
  in each test, with a factory per test, with views at module level), each run by pytest in a
  fresh process with no persistent compilation cache (cold), the suites interleaved, serially and
  with ``-n 2``: the wall time against the hand-written suite's (targets: inline views and
  factories <= 1.5x, module-level views <= 1.2x). Also what a run that reuses a compiled program
  pays to know it is the same (its functions traced again: a warm run of new function objects
  less one of the same objects, LJ-64 and 256 oscillators) and the wall time of ``pytest
  examples``;
- ``accelerator``: the GPU workload, an LJ fluid of 4,096 atoms and 10^6 oscillators: the bare
  scan, the scan with the records, ``jl.run`` and ``jl.run`` with a 10-step profile window. It
  runs when JAX's default backend is not the CPU (``--accelerator`` forces it; ``--quick`` on the
  CPU runs it at small sizes, to check that the code runs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # references.py

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import pytest_jaxlog as jl  # noqa: E402
from pytest_jaxlog.drive.device import program# noqa: E402
from references import bare_scan, scan_with_records, write_bytes, write_records  # noqa: E402

PAGE = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- benchmarks:begin -->", "<!-- benchmarks:end -->"


# --------------------------------------------------------------------------------- results
@dataclass
class Row:
    """One comparison: per-repeat ratios (jaxlog / reference), or per-repeat values in ``unit``."""

    section: str
    name: str
    workload: str
    values: list[float] = field(default_factory=list)
    unit: str = "x"  # "x": a ratio; "us": microseconds
    target: float | None = None
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    def cell(self) -> str:
        if not self.values:
            return "n/a"
        lo, hi = min(self.values), max(self.values)
        if self.unit == "x":
            return f"{self.median:.2f}x ({lo:.2f}–{hi:.2f})"
        if self.unit == "copies" or self.unit == "s" and hi < 10:
            return f"{self.median:.2f} {self.unit} ({lo:.2f}–{hi:.2f})"
        return f"{self.median:.0f} {self.unit} ({lo:.0f}–{hi:.0f})"

    def verdict(self, judged: bool) -> str:
        if self.target is None or not self.values:
            return ""
        if not judged:
            return "(not judged)"
        return "OK" if self.median <= self.target else "MISSED"

    def target_text(self) -> str:
        if self.target is None:
            return ""
        return f"<= {self.target:g}{'x' if self.unit == 'x' else ' ' + self.unit}"


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


UNTIMED = 2  # untimed calls of each variant before the timed repeats (see interleaved)


def interleaved(variants: dict[str, Callable[[], object]], repeats: int,
                between: Callable[[], object] | None = None) -> dict[str, list[float]]:
    """Seconds per call of each variant, ``repeats`` times, the variants interleaved, after two
    untimed rounds: the first compiles, the second runs each variant once more warm (on a GPU the
    first timed call after the compiles read up to 2.5x slow, with the clocks and caches of a
    device that sat idle while the host compiled). ``between``: after every call, untimed (files
    of gigabytes removed: all the calls' would not fit the disk)."""
    for _ in range(UNTIMED):
        for fn in variants.values():
            fn()
            if between is not None:
                between()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(repeats):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))  # no variant always runs first
        for k in order:
            times[k].append(timed(variants[k]))
            if between is not None:
                between()
    return times


def ratios(times: dict[str, list[float]], num: str, den: str, scale: float = 1.0) -> list[float]:
    return [a / b * scale for a, b in zip(times[num], times[den])]


# --------------------------------------------------------------------------------- kernels
def oscillators(n: int = 1024):
    from kernels.oscillators import make_oscillators

    step, state, total = make_oscillators(n=n)

    def energy(s):
        return {"total": total(s), "kinetic": jnp.sum(0.5 * s.v**2)}

    return step, state, energy, (lambda s: s.x)


def lj(n_side: int = 4):
    from kernels.lj import make_lj

    step, state, energies = make_lj(n_side=n_side)

    def energy(s):
        e = energies(s)
        return {"total": e["total"], "kinetic": e["kinetic"]}

    return step, state, energy, (lambda s: s.positions)


def standard(energy, positions):
    record = {"energy": energy, "positions": jl.Record(positions, every=10)}
    invariants = (jl.finite("energy", "positions"), jl.conserved("energy/total", rtol=1e-2))
    return record, invariants


class Files:
    """Fresh trajectory paths in one temporary directory, each removed after its run."""

    def __init__(self, tmp: Path):
        self.tmp, self.n = tmp, 0

    def path(self) -> Path:
        self.n += 1
        path = self.tmp / f"t{self.n}.h5"
        if path.exists():
            path.unlink()
        return path

    def writer(self, **kw) -> "jl.HDF5Writer":
        return jl.HDF5Writer(self.path(), **kw)

    def clean(self) -> None:
        for p in self.tmp.glob("t*.h5"):
            p.unlink()


# --------------------------------------------------------------------------------- sections
SPARSE_STEPS = 50_000  # ~90 ms of the nested scan on 2 CPU cores, nearly all of it the pairwise sums
SPARSE_SHORT = 10_000  # a shorter run of it, where the run's own fixed costs weigh 5x more


def section_sparse(args, rows: list[Row]) -> None:
    step, state, _, _ = oscillators(1024)

    def pair(s):
        return jnp.sum(jnp.abs(s.x[:, None] - s.x[None, :]))

    def nested_scan(steps: int, runtime: bool = False):
        """``runtime``: the inner loop a while loop to a bound known at run time, as a chunk
        program of any length has it."""
        def inner(c, m):
            if runtime:
                return lax.while_loop(lambda c: c[0] < m, lambda c: (c[0] + 1, step(c[1])), (jnp.int32(0), c))[1]
            return lax.scan(lambda c, _: (step(c), None), c, None, length=100)[0]

        @jax.jit
        def nested(s, m):
            def outer(c, _):
                c = inner(c, m)
                return c, pair(c)

            return pair(s), lax.scan(outer, s, None, length=steps // 100)

        m = jnp.int32(100)
        return lambda: jax.block_until_ready(nested(state, m))

    record = {"pair": jl.Record(pair, every=100)}
    steps, short = (5_000, 2_000) if args.quick else (SPARSE_STEPS, SPARSE_SHORT)
    # tens of milliseconds each, and the pairwise sum's threads make single calls vary 5x: more repeats
    times = interleaved({
        "nested scan": nested_scan(steps),
        "nested, runtime trip count": nested_scan(steps, runtime=True),
        "chunk program": _chunk_program_loop(step, state, record, steps, per_dispatch=steps, initial=True),
        "jl.run": lambda: jl.run(step, state, steps, record=record, progress=False),
        "nested scan, short": nested_scan(short),
        "jl.run, short": lambda: jl.run(step, state, short, record=record, progress=False),
    }, 5 * args.repeats)
    rows.append(Row("sparse", "sparse record (every 100 steps)", f"1024 oscillators, sum |x_i - x_j| every 100 of "
                    f"{steps:,} steps, vs a nested scan computing it then", ratios(times, "jl.run", "nested scan"),
                    target=1.05))
    rows.append(Row("sparse", "sparse: the chunk program alone", "the run's compiled chunk program dispatched once "
                    "for the whole run (no host work), vs the nested scan",
                    ratios(times, "chunk program", "nested scan")))
    rows.append(Row("sparse", "sparse: jl.run beyond its chunk program", "us of the run (checks, setup, dispatch, "
                    "pulling the values, the result) beyond the chunk program dispatched alone",
                    [(a - b) * 1e6 for a, b in zip(times["jl.run"], times["chunk program"])], unit="us"))
    rows.append(Row("sparse", "sparse: a runtime inner trip count", "the nested scan with its inner loop a while loop "
                    "to a bound known at run time (as a chunk program of any length has it), vs the nested scan",
                    ratios(times, "nested, runtime trip count", "nested scan")))
    rows.append(Row("sparse", "sparse record, a shorter run", f"the same, {short:,} steps (the run's own fixed "
                    "costs weigh 5x more)", ratios(times, "jl.run, short", "nested scan, short")))


def _chunk_program_loop(step, state, record, steps: int, per_dispatch: int = 1, initial: bool = False):
    """A loop that dispatches ``jl.run``'s own compiled chunk program ``per_dispatch`` steps at a
    time, chaining its buffers as the driver does, and does nothing else: with one step, the
    dispatch that a ``chunk=1`` run cannot avoid; with the whole run, the device program alone.
    ``initial``: the first dispatch records the initial state, as a run's first chunk does."""
    from pytest_jaxlog.drive.device.plan import capacity_of, laid_out, resolve_run
    from pytest_jaxlog.drive.prepare.config import RunConfig, configure
    from pytest_jaxlog.drive.device.chunks import scalars_on

    cfg = configure(RunConfig(step=step, steps=steps, record=record, chunk=per_dispatch, donate=False), state)
    resolved = resolve_run(cfg, state)
    plan, shapes = resolved.plan, resolved.shapes
    plan = laid_out(plan, capacity_of(cfg, resolved.schema), shapes, pack=True,
                    block=program.block_for(jax.default_backend()))
    per_dispatch = min(per_dispatch, plan.length)
    bufs = [program.buffers(plan, shapes)]
    kept = scalars_on(None, False)  # the dispatch's scalars kept on the device, as the driver keeps them
    stopped = kept.one(np.full((), -1, np.int32))

    def loop():
        s, counts, rows = state, program.empty_counts(plan), 0
        for k in range(0, steps, per_dispatch):
            n = min(per_dispatch, steps - k)
            if rows + n > plan.length:  # the set is full: a fresh one, as the driver takes
                counts, rows = program.empty_counts(plan), 0
            flags = program.RECORD_INITIAL if initial and k == 0 else 0
            out = program.chunk(plan, s, bufs[0], None, kept.control(k, n, rows, flags), kept(counts), (),
                                stopped, resolved.consts)
            s, bufs[0], counts, rows = out["state"], out["bufs"], out["counts"], rows + n
        return jax.block_until_ready(s)

    return loop


def section_fixed(args, rows: list[Row], files: Files) -> None:
    # host work per chunk: chunk=1 runs of two lengths (the difference leaves out the per-run costs)
    n1 = 100 if args.quick else 300
    for name, make in (("osc1024", oscillators), ("lj64", lj)):
        step, state, energy, positions = make()
        record, invs = standard(energy, positions)
        jstep = jax.jit(step)

        def step_loop(jstep=jstep, state=state):
            s = state
            for _ in range(n1):
                s = jstep(s)
            jax.block_until_ready(s)

        def chunk1(n, step=step, state=state, record=record, invs=invs):
            return lambda: jl.run(step, state, n, record=record, invariants=invs, chunk=1, sinks=[files.writer()],
                                  progress=False)

        def chunk1_memory(step=step, state=state, energy=energy):
            return jl.run(step, state, n1, record={"energy": energy}, chunk=1, progress=False)

        def step_and_energy(s, step=step, energy=energy):
            s = step(s)
            return s, energy(s)

        def records_loop(stepped=jax.jit(step_and_energy), state=state):  # noqa: B008  (one jit per kernel)
            s, kept = state, []
            for _ in range(n1):
                s, e = stepped(s)
                kept.append(e)
            jax.device_get(kept)

        times = interleaved({
            "jitted step loop": step_loop,
            "jitted step + energies loop": records_loop,
            "chunk program loop": _chunk_program_loop(step, state, record, n1),
            "jl.run chunk=1": chunk1(n1),
            "jl.run chunk=1, 3x": chunk1(3 * n1),
            "jl.run chunk=1, in memory": chunk1_memory,
        }, args.repeats)
        files.clean()
        rows.append(Row("fixed", f"chunk=1 run, {name}", f"jl.run(chunk=1) of {n1} steps, the energies every step "
                        "in memory, no invariants, vs a Python loop dispatching the jitted step",
                        ratios(times, "jl.run chunk=1, in memory", "jitted step loop"), target=2.0))
        rows.append(Row("fixed", f"chunk=1 run vs the records by hand, {name}", "the same run vs a Python loop "
                        "dispatching a jitted step that also returns the energies (kept, pulled at the end)",
                        ratios(times, "jl.run chunk=1, in memory", "jitted step + energies loop")))
        per = {k: [t / n1 * 1e6 for t in v] for k, v in times.items()}
        per["jl.run per chunk"] = [(a - b) / 2 for a, b in zip(per["jl.run chunk=1, 3x"], per["jl.run chunk=1"])]
        rows.append(Row("fixed", f"host work per chunk, {name}", "jl.run(chunk=1), standard workload: us per step "
                        f"(runs of {3 * n1} less runs of {n1} steps) beyond a loop dispatching the same chunk program",
                        [a - b for a, b in zip(per["jl.run per chunk"], per["chunk program loop"])], unit="us",
                        target=100.0))
        rows.append(Row("fixed", f"chunk program dispatch, {name}", "us per step of that loop beyond a loop of the "
                        "bare jitted step (the program's while loop, buffers and control transfer)",
                        [a - b for a, b in zip(per["chunk program loop"], per["jitted step loop"])], unit="us"))
    # short runs
    step, state, energy, positions = oscillators(1024)
    record, invs = standard(energy, positions)
    for steps, target in ((1_000, 1.5), (10_000, None)):
        ref = scan_with_records(step, energy, positions, steps, initial=True)
        times = interleaved({
            "scan + records": lambda ref=ref: jax.block_until_ready(ref(state)),
            "scan + records, written by hand": lambda ref=ref: write_records(files.path(), ref(state)),
            "jl.run": lambda steps=steps: jl.run(step, state, steps, record=record, invariants=invs,
                                                 sinks=[files.writer()], progress=False),
            "jl.run, in memory": lambda steps=steps: jl.run(step, state, steps, record=record, invariants=invs,
                                                            progress=False),
            "jl.run, not synced": lambda steps=steps: jl.run(step, state, steps, record=record, invariants=invs,
                                                             sinks=[files.writer(durable=False)], progress=False),
        }, args.repeats)
        files.clean()
        rows.append(Row("fixed", f"{steps:,}-step run", "1024 oscillators, standard workload, vs the scan computing "
                        "the same records and h5py writing them by hand to a file once it is done",
                        ratios(times, "jl.run", "scan + records, written by hand"), target=target))
        rows.append(Row("fixed", f"{steps:,}-step run, not synced", "the same with HDF5Writer(durable=False): its "
                        "commits survive a kill but are not synced to the disk (the hand-written file is not either)",
                        ratios(times, "jl.run, not synced", "scan + records, written by hand"), target=target))
        rows.append(Row("fixed", f"{steps:,}-step run vs no file", "the same vs the scan alone, its records kept on "
                        "the device (one file's creation and completion are the difference)",
                        ratios(times, "jl.run", "scan + records")))
        rows.append(Row("fixed", f"{steps:,}-step run, in memory", "the same with a MemorySink instead of the HDF5 "
                        "writer (the file's own creation and closing left out)",
                        ratios(times, "jl.run, in memory", "scan + records"), target=target))
        if steps == 1_000:  # where the short run's time goes, in microseconds
            rows.append(Row("fixed", "1,000-step run: the HDF5 file", "us of the run with the HDF5 writer beyond the "
                            "same run in memory (the file's creation, writing and completion)",
                            [(a - b) * 1e6 for a, b in zip(times["jl.run"], times["jl.run, in memory"])], unit="us"))
            rows.append(Row("fixed", "1,000-step run in memory: beyond the scan", "us of the in-memory run beyond the "
                            "scan computing the same records (the run's fixed costs and its loop's own)",
                            [(a - b) * 1e6 for a, b in zip(times["jl.run, in memory"], times["scan + records"])],
                            unit="us"))
    # the Recorder in a hand-written loop
    steps = 200 if args.quick else 1_000
    for name, make in (("osc1024", oscillators), ("lj64", lj)):
        step, state, energy, positions = make()
        record, invs = standard(energy, positions)
        jstep, jenergy, jpositions = jax.jit(step), jax.jit(energy), jax.jit(positions)

        def bare(jstep=jstep, jenergy=jenergy, jpositions=jpositions, state=state):
            s = state
            es, xs = [jenergy(s)], [jpositions(s)]
            for k in range(1, steps + 1):
                s = jstep(s)
                es.append(jenergy(s))
                if k % 10 == 0:
                    xs.append(jpositions(s))
            jax.device_get((es, xs))

        def recorder(jstep=jstep, state=state, record=record, invs=invs):
            s = state
            with jl.Recorder(record, sinks=[files.writer()], invariants=invs) as rec:
                rec.log(s, 0)
                for k in range(1, steps + 1):
                    s = jstep(s)
                    rec.log(s, k)

        times = interleaved({"python loop + records": bare, "jl.Recorder loop": recorder}, args.repeats)
        files.clean()
        rows.append(Row("fixed", f"jl.Recorder, {name}", f"{steps:,} steps of a hand-written loop, standard workload, "
                        "vs the loop keeping the same records with jitted views",
                        ratios(times, "jl.Recorder loop", "python loop + records"), target=1.5))


def compile_child(which: str) -> None:
    """In a fresh process: warm the package and JAX on a toy kernel, then time the first and a
    warm call of LJ-64 (the scan with records, or jl.run with the standard workload)."""
    with tempfile.TemporaryDirectory() as d:
        files = Files(Path(d))
        x = jnp.zeros(3)
        jl.run(lambda s: s + 1.0, x, 3, record={"x": jl.Record(lambda s: s, every=2)}, sinks=[files.writer()],
               invariants=(jl.finite("x"),), progress=False)
        jax.block_until_ready(lax.scan(lambda c, _: (c + 1.0, c), x, None, length=3))
        step, state, energy, positions = lj()
        record, invs = standard(energy, positions)
        steps = 1_000
        if which == "scan":
            fn = scan_with_records(step, energy, positions, steps, initial=True)
            first = timed(lambda: jax.block_until_ready(fn(state)))
            warm = timed(lambda: jax.block_until_ready(fn(state)))
            other, compiled = None, fn.lower(state).compile()  # from JAX's cache
        else:
            def go(n):
                return jl.run(step, state, n, record=record, invariants=invs, sinks=[files.writer()], progress=False)

            first = timed(lambda: go(steps))
            warm = timed(lambda: go(steps))
            others = [go(1_700), go(250)]
            other = sum(r.timings.compiles for r in others)
            compiled = others[-1].compiled_chunk()  # the one program every length ran
        print(json.dumps({"first": first, "warm": warm, "other_lengths_compiles": other,
                          "kernels": kernels(compiled.as_text())}))


def kernels(hlo: str) -> int:
    """The kernels of a program compiled by XLA:CPU (its fusions, single operations included),
    each of which it compiles on its own."""
    return len(re.findall(r"= \S+ fusion\(", hlo))


def _pythonpath(*first: Path) -> str:
    """This checkout first, then what the caller's PYTHONPATH held: where the package was installed
    as a wheel (a GPU machine's image), its entry point, which registers the plugin, is there."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([*map(str, first), *inherited])


def section_compile(args, rows: list[Row]) -> None:
    def child(which):
        out = subprocess.run([sys.executable, __file__, "--compile-child", which], capture_output=True, text=True,
                             check=True, env={**os.environ, "PYTHONPATH": _pythonpath(ROOT)})
        return json.loads(out.stdout.strip().splitlines()[-1])

    repeats = max(2, args.repeats if not args.quick else 2)
    ratio, others, ms, kernel_counts = [], [], {"run": [], "scan": []}, {"run": [], "scan": []}
    for r in range(repeats):
        pair = {}
        for which in (("scan", "run") if r % 2 == 0 else ("run", "scan")):
            pair[which] = child(which)
            ms[which].append((pair[which]["first"] - pair[which]["warm"]) * 1e3)
            kernel_counts[which].append(float(pair[which]["kernels"]))
        ratio.append(ms["run"][-1] / ms["scan"][-1])
        others.append(pair["run"]["other_lengths_compiles"])
    rows.append(Row("compile", "first-call compile", "LJ-64, standard workload: first jl.run less a warm one, vs the "
                    "first call of the scan computing the same records less a warm one (fresh processes)", ratio,
                    target=1.2))
    rows.append(Row("compile", "first-call compile, jl.run", "ms: first jl.run less a warm one", ms["run"], unit="ms"))
    rows.append(Row("compile", "first-call compile, scan with records", "ms: first call less a warm one", ms["scan"],
                    unit="ms"))
    if jax.default_backend() == "cpu":  # what XLA:CPU compiles: the count the compile times follow
        rows.append(Row("compile", "first-call compile: kernels, jl.run", "kernels XLA:CPU compiles for the run's "
                        "chunk program", kernel_counts["run"], unit="kernels"))
        rows.append(Row("compile", "first-call compile: kernels, scan with records", "kernels XLA:CPU compiles for "
                        "the scan", kernel_counts["scan"], unit="kernels"))
    rows.append(Row("compile", "programs compiled by runs of other lengths", "LJ-64: runs of 1,700 and 250 steps "
                    "after a 1,000-step run", [float(x) for x in others], unit="programs", target=0.0))


def section_long(args, rows: list[Row], files: Files) -> None:
    cases = (("lj64", lj, 2_000 if args.quick else 20_000, 1.05),
             ("osc1024", oscillators, 20_000 if args.quick else 200_000, 1.25))
    for name, make, steps, target in cases:
        step, state, energy, positions = make()
        record, invs = standard(energy, positions)
        ref = scan_with_records(step, energy, positions, steps, initial=True)
        times = interleaved({
            "scan + records": lambda ref=ref, state=state: jax.block_until_ready(ref(state)),
            "jl.run": lambda step=step, state=state, record=record, invs=invs, steps=steps: jl.run(
                step, state, steps, record=record, invariants=invs, sinks=[files.writer()], progress=False),
        }, args.repeats)
        files.clean()
        label = {"lj64": "LJ-64 NVE", "osc1024": "1024 oscillators"}[name]
        rows.append(Row("long", f"long run, {name}", f"{label}, {steps:,} steps, standard workload, vs the scan "
                        "computing the same records", ratios(times, "jl.run", "scan + records"), target=target))


def pytest_wall(target: str | Path, cwd: Path, workers: int = 0, cache: Path | None = None,
                must_pass: bool = True) -> float:
    """Seconds of one pytest session in a fresh process; a failing suite stops the benchmark.
    Cold without ``cache`` (no cache plugin, no persistent compilation cache: everything
    compiles); with it, pytest's cache directory there holds the plugin's compilation cache, as a
    CI job that keeps ``.pytest_cache`` between runs has it."""
    cmd = [sys.executable, "-m", "pytest", "-q", str(target)]
    cmd += ["-o", f"cache_dir={cache}"] if cache else ["-p", "no:cacheprovider"]
    cmd += ["-n", str(workers)] if workers else []
    env = {**os.environ, "PYTHONPATH": _pythonpath(ROOT, cwd)}
    # Python's bytecode is cached, as an installed package's is: a machine that sets
    # PYTHONDONTWRITEBYTECODE would otherwise recompile the package (and pytest re-rewrite
    # its asserts) in every session, which a user's CI does once (see ``section_suite``'s warm-up)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if cache is None:
        env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        if must_pass:
            raise SystemExit(f"suite {target} failed:\n{out.stdout[-3000:]}{out.stderr[-2000:]}")
        print(f"\n{target}: exit {out.returncode} (timed all the same):\n{out.stdout[-1500:]}", flush=True)
    return wall


def reuse_cost(make, steps: int, repeats: int) -> list[float]:
    """Milliseconds a warm run of new function objects (a factory's, with views made inline)
    takes beyond one of the same objects, both reusing one compiled program: what knowing it is
    the same program costs (each function traced once)."""
    def record(energy, positions):
        return {"energy": lambda s: energy(s)["total"], "positions": jl.Record(lambda s: positions(s), every=10)}

    made = [make() for _ in range(repeats + UNTIMED)]  # new objects for every call, untimed ones too
    step, state, energy, positions = made[0]
    same = record(energy, positions)
    fresh = iter(made)
    times = interleaved({
        "same objects": lambda: jl.run(step, state, steps, record=same, progress=False),
        "new objects": lambda: (lambda k: jl.run(k[0], k[1], steps, record=record(k[2], k[3]), progress=False))(
            next(fresh)),
    }, repeats)
    return [(a - b) * 1e3 for a, b in zip(times["new objects"], times["same objects"])]


def section_suite(args, rows: list[Row], files: Files) -> None:
    from suites import SUITES, write_suites

    tests, steps = (6, 200) if args.quick else (40, 1_000)
    repeats = args.suite_repeats or args.repeats
    where = files.tmp / "suites"
    paths = write_suites(where, tests, steps)
    kinds = {"inline": ("views inline in each test", 1.5), "factory": ("a factory per test", 1.5),
             "module": ("views at module level", 1.2)}
    for name in SUITES:  # untimed: writes the bytecode of the package and of the tests
        pytest_wall(paths[name], where)
    for workers, label in ((0, "serial"),) if args.quick else ((0, "serial"), (2, "-n 2")):
        walls: dict[str, list[float]] = {name: [] for name in SUITES}
        for r in range(repeats):
            for name in (SUITES if r % 2 == 0 else tuple(reversed(SUITES))):
                walls[name].append(pytest_wall(paths[name], where, workers))
        work = f"{tests} tests x {steps:,} steps, 256 oscillators, pytest {label}, cold"
        rows.append(Row("suite", f"suite by hand ({label})", f"s: {work}", walls["reference"], unit="s"))
        for name, (what, target) in kinds.items():
            rows.append(Row("suite", f"suite, jaxlog: {what} ({label})", f"{work}, vs the suite by hand",
                            ratios(walls, name, "reference"), target=target if workers == 0 else None))
        # the sessions' own seconds: a ratio also moves when the session by hand gets faster (the
        # plugin loads in it too, and does less there since it is quiet in sessions without jaxlog)
        for name, (what, _) in kinds.items():
            rows.append(Row("suite", f"suite, jaxlog: {what} ({label}), seconds", f"s: {work}", walls[name],
                            unit="s"))
    # warm: each jaxlog suite with pytest's cache kept from a first session (the plugin's
    # compilation cache lives there), against the suite by hand as its author runs it (cold)
    caches = {name: where / f".cache-{name}" for name in kinds}
    for name, cache in caches.items():
        pytest_wall(paths[name], where, cache=cache)
    warm: dict[str, list[float]] = {name: [] for name in SUITES}
    for r in range(repeats):
        for name in (SUITES if r % 2 == 0 else tuple(reversed(SUITES))):
            warm[name].append(pytest_wall(paths[name], where, cache=caches.get(name)))
    work = f"{tests} tests x {steps:,} steps, 256 oscillators, pytest serial, warm compilation cache"
    for name, (what, _) in kinds.items():
        rows.append(Row("suite", f"suite, jaxlog: {what} (serial, warm)", f"{work}, vs the suite by hand (cold)",
                        ratios(warm, name, "reference")))
    for name, make in (("LJ-64", lj), ("256 oscillators", lambda: oscillators(256))):
        rows.append(Row("suite", f"a reused program: knowing it, {name}", f"ms: a warm {steps:,}-step run of new "
                        "function objects less one of the same objects", reuse_cost(make, steps, args.repeats),
                        unit="ms"))
    if not args.quick:
        rows.append(Row("suite", "pytest examples", "s: the examples suite, serial, cold",
                        [pytest_wall(ROOT / "examples", ROOT, must_pass=False)], unit="s"))


def section_accelerator(args, rows: list[Row], files: Files) -> None:
    small = args.quick and jax.default_backend() == "cpu"
    cases = (("lj", lambda: lj(6 if small else 16), 200 if small else 2_000),
             ("osc", lambda: oscillators(65_536 if small else 1_000_000), 1_000 if small else 10_000))
    for name, make, steps in cases:
        step, state, energy, positions = make()
        record, invs = standard(energy, positions)
        n = len(jax.tree_util.tree_leaves(state)[0])
        label = f"LJ, {n:,} atoms" if name == "lj" else f"{n:,} oscillators"
        bare = bare_scan(step, steps)
        ref = scan_with_records(step, energy, positions, steps, initial=True)
        windows = [Path(tempfile.mkdtemp(dir=files.tmp))]

        def profiled():
            return jl.run(step, state, steps, record=record, invariants=invs, sinks=[files.writer()], progress=False,
                          profile=jl.ProfileWindow(steps // 2, steps // 2 + 9, windows[0]))

        kept = jax.block_until_ready(ref(state))  # the records on the device, for the bytes' own bound
        times = interleaved({
            "bare scan": lambda: jax.block_until_ready(bare(state)),
            "scan + records": lambda: jax.block_until_ready(ref(state)),
            "the records' bytes to the disk": lambda kept=kept: write_bytes(files.path(), kept),
            "jl.run": lambda: jl.run(step, state, steps, record=record, invariants=invs, sinks=[files.writer()],
                                     progress=False),
            "jl.run + window": profiled,
        }, args.repeats, between=files.clean)  # a file of the osc case: 4 GB
        del kept  # the osc case's records: 4 GB on the device
        work = f"{label}, {steps:,} steps, standard workload on {jax.devices()[0].device_kind}"
        rows.append(Row("accelerator", f"{name}: jl.run / scan + records", work, ratios(times, "jl.run", "scan + records")))
        rows.append(Row("accelerator", f"{name}: jl.run / bare scan", work, ratios(times, "jl.run", "bare scan")))
        rows.append(Row("accelerator", f"{name}: jl.run + 10-step profile window / scan + records", work,
                        ratios(times, "jl.run + window", "scan + records")))
        if name == "osc":  # records of megabytes a frame: the hardware's bound
            rows.append(Row("accelerator", f"{name}: jl.run / its records' bytes moved and written", f"{work}; the "
                            "reference: the same bytes, kept on the device, moved to the host (pinned) and written "
                            "to one raw file on the same disk, synced", ratios(times, "jl.run", "the records' bytes "
                            "to the disk"), target=1.2))


BLOCKS = (1, 8, 32, 128)  # the plain loop (a runtime trip count per step), then blocks of a trip count XLA knows


def host_copies(step, state, record, steps: int, block: int, tmp: Path) -> tuple[float, int]:
    """Device-to-host copies per step in a profiler trace of a whole run at ``block`` slots a
    block, and the run's masked steps (``None`` copies where the trace has no device track: the
    CPU)."""
    d = Path(tempfile.mkdtemp(dir=tmp))
    with program.block_setting(block):
        jl.run(step, state, steps, record=record, progress=False)  # compiled outside the trace
        with jax.profiler.trace(str(d)):
            run = jl.run(step, state, steps, record=record, progress=False)
    trace = jl.load_trace(d)
    device = [s for s in trace.all_slices if s.track.startswith("/device:")]
    copies = sum(1 for s in device if "MemcpyD2H" in s.name)
    return (copies / steps if device else float("nan")), run.timings.masked_steps


def loop_shapes(step, steps: int, block: int) -> dict[str, Callable]:
    """The same ``steps`` steps in four loops of plain JAX, each jitted with the trip count a
    runtime argument where the loop has one: a scan (the reference), a while loop of one step an
    iteration, and a while loop over blocks of ``block`` slots (a trip count XLA knows), the slots
    past the end masked by a select or skipped by a cond."""
    def masked(skip: bool):
        @jax.jit
        def run(s, n):
            def slot(_, c):
                j, st = c
                live = j < n
                if skip:
                    return j + live.astype(jnp.int32), lax.cond(live, step, lambda x: x, st)
                new = step(st)
                return j + live.astype(jnp.int32), jax.tree_util.tree_map(lambda a, b: jnp.where(live, a, b), new, st)
            return lax.while_loop(lambda c: c[0] < n, lambda c: lax.fori_loop(0, block, slot, c), (jnp.int32(0), s))[1]
        return run

    scan = jax.jit(lambda s: lax.scan(lambda c, _: (step(c), None), s, None, length=steps)[0])
    runtime = jax.jit(lambda s, n: lax.fori_loop(0, n, lambda _, c: step(c), s))
    select, cond = masked(False), masked(True)
    n = jnp.int32(steps)
    return {"scan": scan, "while, one step an iteration": lambda s: runtime(s, n),
            f"while over blocks of {block}, masked by a select": lambda s: select(s, n),
            f"while over blocks of {block}, skipped by a cond": lambda s: cond(s, n)}


def section_blocks(args, rows: list[Row], files: Files) -> None:
    cases = (("lj64", lj, 2_000 if args.quick else 20_000), ("osc1024", oscillators, 5_000 if args.quick else 50_000))
    for name, make, steps in cases:
        step, state, energy, positions = make()
        record, invs = standard(energy, positions)
        ref = scan_with_records(step, energy, positions, steps, initial=True)

        def run_at(block, step=step, state=state, record=record, invs=invs, steps=steps):
            def go():
                with program.block_setting(block):
                    return jl.run(step, state, steps, record=record, invariants=invs, sinks=[files.writer()],
                                  progress=False)
            return go

        variants = {"scan + records": lambda ref=ref, state=state: jax.block_until_ready(ref(state))}
        variants.update({f"block {b}": run_at(b) for b in BLOCKS})
        times = interleaved(variants, args.repeats)
        files.clean()
        label = {"lj64": "LJ-64 NVE", "osc1024": "1024 oscillators"}[name]
        for b in BLOCKS:
            what = "the plain loop (one step an iteration)" if b == 1 else f"blocks of {b}"
            rows.append(Row("blocks", f"{name}: jl.run, {what}", f"{label}, {steps:,} steps, standard workload, vs "
                            "the scan computing the same records", ratios(times, f"block {b}", "scan + records")))
        loops = loop_shapes(step, steps, 32)
        times = interleaved({k: (lambda f=f, state=state: jax.block_until_ready(f(state))) for k, f in loops.items()},
                            args.repeats)
        for k in list(loops)[1:]:
            rows.append(Row("blocks", f"{name}: plain JAX, {k}", f"{label}, {steps:,} steps, no records, vs a scan",
                            ratios(times, k, "scan")))
        short = 200
        for b in (1, program.BLOCK["gpu"]):
            per_step, masked = host_copies(step, state, record, short, b, files.tmp)
            rows.append(Row("blocks", f"{name}: device-to-host copies per step, block {b}",
                            f"copies: a profiler trace of a whole {short}-step run ({masked} masked steps)",
                            [per_step], unit="copies"))


# ------------------------------------------------------------------------------------ output
def table(rows: list[Row], judged: bool) -> str:
    lines = ["| measurement | workload | jaxlog vs reference: median (min–max) | target | |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.name} | {r.workload} | {r.cell()} | {r.target_text()} | {r.verdict(judged)} |")
    return "\n".join(lines)


def header(args) -> str:
    dev = jax.devices()[0]
    load = ""
    if hasattr(os, "getloadavg"):
        load = f", load average {os.getloadavg()[0]:.1f} at the end"
    suite = f" ({args.suite_repeats} for the pytest suites)" if args.suite_repeats else ""
    return (f"jax {jax.__version__}, backend {jax.default_backend()} ({dev.device_kind}), {os.cpu_count()} CPU cores"
            f"{load}; {args.repeats} interleaved repeats{suite}{' (--quick)' if args.quick else ''}; "
            f"{time.strftime('%Y-%m-%d')}")


def write_page(text: str) -> None:
    page = PAGE.read_text()
    if BEGIN not in page or END not in page:
        raise SystemExit(f"{PAGE} has no {BEGIN} ... {END} markers")
    new = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: f"{BEGIN}\n{text}\n{END}", page,
                 flags=re.S)
    PAGE.write_text(new)


SECTIONS = ("sparse", "fixed", "compile", "long", "suite", "accelerator", "blocks")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps and repeats: a smoke run")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 7; --quick 2)")
    ap.add_argument("--only", default=None, help=f"comma-separated sections: {', '.join(SECTIONS)}")
    ap.add_argument("--suite-repeats", type=int, default=None,
                    help="interleaved repeats of the suite section's pytest sessions (default: --repeats)")
    ap.add_argument("--accelerator", action="store_true", help="run the accelerator section on the CPU too")
    # --readme: the flag's name from when the table lived in the README
    ap.add_argument("--docs", "--readme", dest="docs", action="store_true",
                    help="rewrite the table of docs/performance.md between its markers")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    ap.add_argument("--compile-child", default=None, help=argparse.SUPPRESS)
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.compile_child:
        compile_child(args.compile_child)
        return
    args.repeats = args.repeats or (2 if args.quick else 7)
    if args.repeats < 7 and not args.quick:
        raise SystemExit("--repeats: at least 7 (or --quick)")
    only = SECTIONS if args.only is None else tuple(s.strip() for s in args.only.split(","))
    unknown = set(only) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"--only: unknown section(s) {sorted(unknown)}; sections: {', '.join(SECTIONS)}")
    accelerator = jax.default_backend() != "cpu" or args.accelerator or args.quick
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as d:
        files = Files(Path(d))
        for name in only:
            if name == "accelerator" and not accelerator:
                print("accelerator: skipped (JAX's default backend is the CPU; --accelerator runs it anyway)")
                continue
            t0 = time.perf_counter()
            print(f"{name} ...", end=" ", flush=True)
            if name == "sparse":
                section_sparse(args, rows)
            elif name == "fixed":
                section_fixed(args, rows, files)
            elif name == "compile":
                section_compile(args, rows)
            elif name == "long":
                section_long(args, rows, files)
            elif name == "suite":
                section_suite(args, rows, files)
            elif name == "blocks":
                section_blocks(args, rows, files)
            else:
                section_accelerator(args, rows, files)
            print(f"{time.perf_counter() - t0:.0f} s")
            if len(only) > 1:  # each section's rows as soon as they exist: a run cut short keeps them
                print(table([r for r in rows if r.section == name], judged=not args.quick), flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    text = header(args) + "\n\n" + table(rows, judged=not args.quick)
    print()
    print(text)
    if args.docs:
        write_page(text)
        print(f"\nwrote the table into {PAGE}")


if __name__ == "__main__":
    main()
