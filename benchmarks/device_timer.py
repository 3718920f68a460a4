"""``jl.benchmark``'s timers side by side on an accelerator: the same LJ-64 kernel against a scan of
it, once with wall time and once with device time (the devices' busy seconds read from a profiler
trace of each run), and an A/B case whose kernel does 1.25x the work. Prints one line per
benchmark: the verdict, the ratio, its interval and what it could detect.

    python benchmarks/device_timer.py      # on a machine with a GPU; on the CPU: wall and CPU time
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
from jax import lax

import pytest_jaxlog as jl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from kernels.lj import make_lj  # noqa: E402

STEPS = 2_000


def main() -> None:
    timers = ("wall", "cpu") if jax.default_backend() == "cpu" else ("wall", "device")  # device: accelerators
    step, state = make_lj(4)[:2]

    def times(k: int):
        return lambda s: lax.fori_loop(0, k, lambda _, c: step(c), s)

    scan = jax.jit(lambda s: lax.scan(lambda c, _: (step(c), None), s, None, length=STEPS)[0])
    reference = lambda: jax.block_until_ready(scan(state))  # noqa: E731
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}; LJ-64, {STEPS:,} steps a run")
    for case, kernel, n in (("A/A", step, STEPS), ("1.25x work", times(5), STEPS // 4)):
        # "1.25x work": 5 steps a call for a quarter of the calls: 1.25x the steps of the reference
        for timer in timers:
            found = jl.benchmark(kernel, state, n, reference=reference, timer=timer,
                                 repeats=7, number=3, progress=False)
            print(f"{case:10} {timer:6}: {found.verdict:11} ratio {found.ratio:.3f} "
                  f"[{found.interval.lo:.3f}, {found.interval.hi:.3f}], detectable x{found.detectable:.3f}, "
                  f"{sum(map(len, found.samples))} runs")


if __name__ == "__main__":
    main()
