"""Time jl.load of a two-process index of N one-element blocks of one record (and its values):

    PYTHONPATH=. python benchmarks/index_blocks.py /tmp 500 1000 2000 4000
"""
import sys
import time
import numpy as np
import pytest_jaxlog as jl
from pytest_jaxlog.record.frames import Block, Frames, LeafSpec, Schema
from pytest_jaxlog.record.schedule import every
from pytest_jaxlog.store.hdf5.writer import HDF5Writer
from pytest_jaxlog.store.hdf5.parts import PartsWriter


def make(path, n):
    schema = Schema((LeafSpec("x", "x", (n,), np.dtype(np.float32), every(1)),))
    layout = {"x": [Block(((b, b + 1),), b % 2).to_json() for b in range(n)]}
    sinks = []
    for me in (1, 0):
        meta = {"run": {"processes": {"count": 2, "index": me, "run_id": "r", "layout": layout}}}
        s = PartsWriter(HDF5Writer(path))
        s.open(schema, meta)
        sinks.append(s)
    fr = Frames()
    fr.add("x", np.arange(2), np.arange(2 * n, dtype=np.float32).reshape(2, n))
    for s in sinks:
        s.write(fr)
        s.close("complete", steps_done=1)


if __name__ == "__main__":
    d = sys.argv[1]
    for n in map(int, sys.argv[2:]):
        p = f"{d}/idx{n}.h5"
        make(p, n)
        t = time.perf_counter()
        traj = jl.load(p)
        v = traj["x"]
        dt = time.perf_counter() - t
        assert v.shape == (2, n) and (v == np.arange(2 * n).reshape(2, n)).all()
        print(f"{n} blocks: jl.load + read {dt:.2f} s", flush=True)
