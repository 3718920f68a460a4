"""A hung disk: the writer thread stuck inside an HDF5 write for good.

The child process's writer thread blocks inside h5py (a file object whose ``write`` never
returns, the way a write to a hung disk never does), holding h5py's global lock. ``jl.run`` must
raise, and the process must still exit: the interpreter's teardown frees h5py objects, which
takes that lock, so a process that waits for the thread never ends (a pytest session with it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from pytest_jaxlog.store.hdf5.trajectory import load

GUARD_S = 120  # a hang guard, not a performance threshold
REPO = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent(
    """
    import io, sys, threading
    import h5py, numpy as np
    import jax.numpy as jnp
    import pytest_jaxlog as jl
    from pytest_jaxlog.store.hdf5.writer import HDF5Writer

    never = threading.Event()


    class HungDisk(io.BytesIO):
        def write(self, data):
            never.wait()  # the disk never answers
            return super().write(data)


    class HungWriter(HDF5Writer):
        batches = 0

        def _append(self, frames):
            HungWriter.batches += 1
            if HungWriter.batches == 1:
                return super()._append(frames)
            with h5py.File(HungDisk(), "w") as f:  # inside an HDF5 write, h5py's lock held
                f["x"] = np.zeros(1000)
                f.flush()


    sink = HungWriter(sys.argv[1], stall_timeout_s=1.0, flush_every_s=0)
    try:
        jl.run(lambda s: s + 1.0, jnp.float32(0), 40, record={"e": lambda s: s}, sinks=[sink],
               chunk_budget_bytes=4 * 4)
    except jl.WriterError as exc:
        print("raised:", exc, flush=True)
    print("returned", flush=True)
    """
)


def test_a_writer_stuck_in_an_hdf5_write_lets_the_process_exit(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "t.h5")], capture_output=True, text=True,
                          env=env, timeout=GUARD_S)  # a TimeoutExpired here is the hang
    assert "raised: [jaxlog]" in proc.stdout and "written nothing for 1 s" in proc.stdout, proc.stderr
    assert proc.stdout.rstrip().endswith("returned")  # the run raised, the script went on
    assert proc.returncode == 1, proc.stderr
    assert "[jaxlog] exiting with status 1 without waiting for the writer thread of" in proc.stderr
    assert "Traceback" not in proc.stderr
    traj = load(tmp_path / "t.h5")  # the file keeps what was flushed before the disk hung
    assert traj.status == "running"
    steps = traj.steps("e")
    assert len(steps) >= 1
    np.testing.assert_array_equal(steps, np.arange(len(steps)))
    np.testing.assert_array_equal(traj["e"], np.arange(len(steps), dtype=np.float32))

