"""SIGTERM (what CI cancellation and job time limits send) during a test's run: the run stops
like Ctrl-C, its trajectory says ``stopped`` with every frame on disk, and pytest still writes
its summary and the manifest."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np

import pytest_jaxlog as jl

TEST = textwrap.dedent("""
    import os, signal, threading, time
    import jax.numpy as jnp

    def test_long(jaxlog):
        def term_when_written():
            # the file starts at about 1 MiB (the writer claims its space ahead), so past 3 MiB
            # frames are being written: the signal lands in the run, not in the file's creation
            path = jaxlog.dir / "trajectory.h5"
            while not path.exists() or path.stat().st_size < 3 * 2**20:
                time.sleep(0.02)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=term_when_written, daemon=True).start()
        jaxlog.run(lambda s: s * 0.999 + 0.001, jnp.ones(1000), 10**8, chunk=2000, record={"s": lambda s: s[:4]})
""")


def test_sigterm_in_a_test_leaves_a_stopped_trajectory_and_the_manifest(tmp_path):
    (tmp_path / "test_term.py").write_text(TEST)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_term.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]  # interrupted, as for Ctrl-C
    assert "Terminated" in r.stdout or "terminated by signal 15" in r.stdout
    manifest = json.loads((tmp_path / ".jaxlog" / "manifest.json").read_text())
    (test,) = [t for t in manifest["tests"] if t["nodeid"] == "test_term.py::test_long"]
    assert test["outcome"] == "interrupted" and test["kept"] and manifest["exitstatus"] == 2
    assert [(r["status"], r["stop_reason"]) for r in test["runs"]] == [("stopped", "interrupted")]
    traj = jl.load(next((tmp_path / ".jaxlog").glob("*test_long*/trajectory.h5")))
    assert traj.status == "stopped" and traj.stop_reason == "interrupted"
    steps = traj.steps("s")
    np.testing.assert_array_equal(steps, np.arange(len(steps)))
    assert steps[-1] == traj.steps_done > 0
