"""What a commit costs: ``jl.HDF5Writer``'s flushes, each a commit through its rollback journal
(``pytest_jaxlog/store/hdf5/journal.py``), against h5py writing and flushing the same frames itself.

    python benchmarks/commit.py                       # 200 batches of 10 frames of 8 KiB
    python benchmarks/commit.py --frame-kb 256 --batches 40 --repeats 9
    python benchmarks/commit.py --root /tmp/old      # another checkout's package (before journals)

Each variant writes a new file of one record (``x``, float64 frames, and its steps): a batch of
frames, then a flush, ``--batches`` times, then closes it. Variants run interleaved (the order
reversed every other repeat); printed: each variant's median seconds, and its ratio to the
reference computed in the same repeat (median, min-max):

- ``h5py``: the reference. h5py's own driver, one chunked resizable dataset per column,
  ``File.flush()`` after each batch: no journal, no sync (a kill mid-flush may tear the file).
- ``h5py + fsync``: the same, with ``os.fsync`` after each flush (durable, not consistent).
- ``HDF5Writer``: ``flush()`` after each batch, ``durable=True`` (the default: each commit synced).
- ``HDF5Writer durable=False``: the same commits, not synced (a kill loses nothing committed).
- ``HDF5Writer, 1 s flushes``: no ``flush()`` calls (the default ``flush_every_s=1.0``): what
  a run that does not ask for flushes pays.
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent),
                    help="the checkout whose pytest_jaxlog is measured")
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--per-batch", type=int, default=10, help="frames per batch")
    ap.add_argument("--frame-kb", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    sys.path.insert(0, args.root)
    from pytest_jaxlog.record.frames import Frames, LeafSpec, Schema
    from pytest_jaxlog.record.schedule import every
    from pytest_jaxlog.store.hdf5.writer import HDF5Writer

    journaled = "durable" in inspect.signature(HDF5Writer).parameters  # a checkout before journals has none
    width = args.frame_kb * 1024 // 8
    schema = Schema((LeafSpec("x", "x", (width,), np.dtype("float64"), every(1)),))
    batches = []
    for b in range(args.batches):
        steps = np.arange(b * args.per_batch, (b + 1) * args.per_batch, dtype=np.int64)
        batches.append((steps, np.random.default_rng(b).standard_normal((args.per_batch, width))))
    chunk_rows = max(1, min(args.per_batch * 4, (512 << 10) // (width * 8)))

    def h5py_plain(path: Path, sync: bool) -> None:
        with h5py.File(path, "w", libver=("v108", "v108")) as f:
            g = f.create_group("observables/x")
            value = g.create_dataset("value", (0, width), maxshape=(None, width), dtype="f8",
                                     chunks=(chunk_rows, width), fletcher32=True)
            step = g.create_dataset("step", (0,), maxshape=(None,), dtype="i8", chunks=(chunk_rows * 64,),
                                    fletcher32=True)
            n = 0
            for steps, values in batches:
                value.resize(n + len(steps), axis=0)
                value[n:] = values
                step.resize(n + len(steps), axis=0)
                step[n:] = steps
                n += len(steps)
                f.flush()
                if sync:
                    fd = f.id.get_vfd_handle()
                    os.fsync(fd)

    def writer(path: Path, durable: bool, flushes: bool) -> None:
        w = HDF5Writer(path, flush_every_s=1.0, **({"durable": durable} if journaled else {}))
        w.open(schema, {"provenance": {}, "run": {"steps": args.batches * args.per_batch}})
        for steps, values in batches:
            fr = Frames()
            fr.add("x", steps, values)
            w.write(fr)
            if flushes:
                w.flush()
        w.close()

    variants = {
        "h5py": lambda p: h5py_plain(p, False),
        "h5py + fsync": lambda p: h5py_plain(p, True),
        "HDF5Writer": lambda p: writer(p, True, True),
        "HDF5Writer durable=False": lambda p: writer(p, False, True),
        "HDF5Writer, 1 s flushes": lambda p: writer(p, True, False),
    }
    if not journaled:
        del variants["HDF5Writer durable=False"]
    times: dict[str, list[float]] = {k: [] for k in variants}
    where = os.environ.get("JAXLOG_BENCH_DIR") or tempfile.gettempdir()  # the file system measured
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        for r in range(args.repeats + 1):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for k in order:
                path = Path(tmp) / f"{r}-{len(times[k])}-{abs(hash(k))}.h5"
                t = time.perf_counter()
                variants[k](path)
                dt = time.perf_counter() - t
                path.unlink()
                if r:  # the first round warms up (imports, the writer's layout template)
                    times[k].append(dt)
    mb = args.batches * args.per_batch * width * 8 / 2**20
    print(f"pytest_jaxlog from {args.root}{'' if journaled else ' (no journal)'}")
    print(f"{args.batches} batches of {args.per_batch} frames of {args.frame_kb} KiB ({mb:.1f} MiB), a flush after "
          f"each; {args.repeats} interleaved repeats; files in {where}")
    print(f"{'variant':28s} {'median s':>9s} {'vs h5py':>8s} {'(min-max)':>14s}")
    for k, ts in times.items():
        rel = [a / b for a, b in zip(ts, times["h5py"])]
        print(f"{k:28s} {statistics.median(ts):9.4f} {statistics.median(rel):7.2f}x ({min(rel):.2f}-{max(rel):.2f})")


if __name__ == "__main__":
    main()
