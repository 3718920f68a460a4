"""Peak host memory of ``jl.run`` with large records, one fresh process per case.

    python benchmarks/memory.py                  # records of 16, 64, 128 MB, every sink
    python benchmarks/memory.py --mb 16,64 --sinks hdf5,drop
    python benchmarks/memory.py --root /tmp/old   # another checkout's package, against this bound
    python benchmarks/memory.py --case hdf5 64 1  # one case, its figures as JSON (used by the table)

The kernel's state is one float32 array of the record's size; a case records it every step (or
every ``k`` steps) for ``STEPS`` steps into a sink: ``hdf5`` (``jl.HDF5Writer``), ``memory``
(``jl.MemorySink``: keeps every frame, so it grows with the run, as it must), ``drop`` (a
``jl.CallbackSink`` that keeps nothing). Its growth is the process's peak resident memory
(``VmHWM``) less that of a baseline process that runs the same kernel on the same state recording
only a scalar: what recording the array costs on the host. On the CPU backend the "device"
buffers (the chunk's record buffers) live in the same memory, so the figure includes them; the
bound it is compared with (``pytest_jaxlog.drive.device.chunks.bound``) says which part is which.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

STEPS = 24
MB = 2**20


def _vm_hwm() -> int:
    """Peak resident set of this process, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def run_case(sink: str, mb: int, every: int) -> dict:
    """One case in this process: its peak resident memory and what the bound allows."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import pytest_jaxlog as jl

    n = mb * MB // 4

    def step(x):
        return x * jnp.float32(0.5) + jnp.float32(1.0)

    x0 = jnp.zeros((n,), jnp.float32)
    jax.block_until_ready(x0)
    with tempfile.TemporaryDirectory() as tmp:
        if sink == "baseline":
            record, sinks = {"s": lambda x: x[0]}, [jl.CallbackSink(lambda frames: None)]
        else:
            record = {"x": jl.Record(lambda x: x, every=every)}
            sinks = {"hdf5": lambda: [jl.HDF5Writer(os.path.join(tmp, "t.h5"))],
                     "memory": lambda: [jl.MemorySink()],
                     "drop": lambda: [jl.CallbackSink(lambda frames: None)]}[sink]()
        before = _vm_hwm()
        run = jl.run(step, x0, STEPS, record=record, sinks=sinks)
        jax.block_until_ready(run.state)
        peak = _vm_hwm()
        if sink == "hdf5":  # the file holds what was recorded
            got = jl.load(os.path.join(tmp, "t.h5"))
            assert list(got.steps("x")) == list(range(0, STEPS + 1, every)), got.steps("x")
            assert float(np.asarray(got["x"][-1])[0]) == float(np.asarray(run.state)[0])
    return {"sink": sink, "mb": mb, "every": every, "peak": peak, "before": before}


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(sink: str, mb: int, every: int, root: str = ROOT) -> dict:
    """One case in a fresh process, with the package found in ``root``."""
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--case", sink, str(mb), str(every)],
                         env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"case {sink} {mb} MB every {every} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(mbs: list[int], sinks: list[str], everies: list[int], root: str = ROOT) -> str:
    sys.path.insert(0, ROOT)
    from pytest_jaxlog.drive.device.chunks import bound as bound_of

    rows = ["| record | every | sink | peak RSS growth | growth / record | bound (formula) |",
            "|---:|---:|---|---:|---:|---:|"]
    for mb in mbs:
        base = measure("baseline", mb, 1, root)["peak"]
        for every in everies:
            for sink in sinks:
                r = measure(sink, mb, every, root)
                growth = r["peak"] - base
                host = bound_of(mb * MB, every=every, sink=sink).host
                bound = "grows with the run" if host is None else f"{host / MB:.0f} MiB"
                rows.append(f"| {mb} MB | {every} | {sink} | {growth / MB:.0f} MiB | {growth / (mb * MB):.1f}x "
                            f"| {bound} |")
                print(rows[-1], file=sys.stderr, flush=True)
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", default="16,64,128", help="record sizes in MiB, comma-separated")
    ap.add_argument("--sinks", default="hdf5,memory,drop")
    ap.add_argument("--every", default="1,4", help="record every k steps, comma-separated")
    ap.add_argument("--root", default=ROOT, help="where the package measured is (another checkout: its figures "
                    "beside this one's bound)")
    ap.add_argument("--case", nargs=3, metavar=("SINK", "MB", "EVERY"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        sink, mb, every = args.case
        print(json.dumps(run_case(sink, int(mb), int(every))))
        return
    print(f"jl.run, a float32 state recorded whole, {STEPS} steps; growth = peak RSS (VmHWM) less a run "
          f"recording a scalar; one fresh process per case")
    print(table([int(m) for m in args.mb.split(",")], args.sinks.split(","),
                [int(e) for e in args.every.split(",")], os.path.abspath(args.root)))


if __name__ == "__main__":
    main()
