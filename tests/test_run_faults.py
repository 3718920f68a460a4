"""Runs stopped from outside: SIGTERM in a real process (as CI cancellation sends it), and
failures between opening the sinks and the first step. Every frame handed over stays on disk and
the file says why the run stopped; the path can be used again in the same process."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading

import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl

CHILD = textwrap.dedent("""
    import os, signal, sys, threading
    import jax.numpy as jnp
    import pytest_jaxlog as jl

    def step(s):
        return s * 0.999 + 0.001

    path, driver = sys.argv[1], sys.argv[2]
    sink = jl.HDF5Writer(path)

    class TermMidRun(jl.ProgressLogger):  # SIGTERM once thousands of steps are handed over
        def advance(self, step, state=None):
            if step >= 20000:
                os.kill(os.getpid(), signal.SIGTERM)

    try:
        if driver == "run":
            jl.run(step, jnp.ones(1000), 10**8, chunk=2000, record={"s": lambda s: s[:4]}, sinks=[sink],
                   progress=TermMidRun(10**8, enabled=False))
        else:
            jstep = __import__("jax").jit(step)
            with jl.Recorder({"s": lambda s: s[:4]}, sinks=[sink], flush_every=50) as rec:
                s = jnp.ones(1000)
                for k in range(10**8):
                    rec.log(s, k)
                    s = jstep(s)
                    if k == 3000:
                        os.kill(os.getpid(), signal.SIGTERM)
    except jl.Terminated as e:
        print("terminated", isinstance(e, KeyboardInterrupt), signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
        sys.exit(3)
""")


@pytest.mark.parametrize("driver", ["run", "recorder"])
def test_sigterm_stops_the_run_like_ctrl_c_and_keeps_every_frame(tmp_path, driver):
    path = tmp_path / "t.h5"
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), driver], capture_output=True, text=True, timeout=300)
    assert r.returncode == 3, r.stderr[-3000:]
    assert r.stdout.split() == ["terminated", "True", "True"]  # a KeyboardInterrupt; the default handler restored
    traj = jl.load(path)
    assert traj.status == "stopped" and traj.steps_done > 0
    steps = traj.steps("s")
    np.testing.assert_array_equal(steps, np.arange(len(steps)))  # nothing handed over was lost
    assert steps[-1] >= traj.steps_done
    if driver == "run":
        assert traj.stop_reason == "interrupted" and steps[-1] == traj.steps_done


def test_the_sigterm_handler_is_only_installed_over_the_default_in_the_main_thread():
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda *a: seen.append(a))
    try:
        def step(s):
            return s + 1

        jl.run(step, jnp.zeros(2), 3, progress=False)
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # the user's handler stays
    finally:
        signal.signal(signal.SIGTERM, previous)
    out = []
    t = threading.Thread(target=lambda: out.append(jl.run(lambda s: s + 1, jnp.zeros(2), 3, progress=False)))
    t.start()
    t.join()
    assert out and out[0].steps_done == 3  # off the main thread: runs, installs nothing
    assert signal.getsignal(signal.SIGTERM) is previous


def _writer_threads() -> int:
    return sum(1 for t in threading.enumerate() if "jaxlog" in t.name.lower() or "hdf5" in t.name.lower())


class _BrokenBar(jl.ProgressLogger):
    def __enter__(self):
        raise RuntimeError("no terminal")


def test_a_failure_before_the_first_step_closes_the_file_and_frees_the_path(tmp_path):
    """The progress bar fails before the first chunk is dispatched: the file is made and closed
    ``failed``, no writer thread is left, and the same path takes a new run at once."""
    path = tmp_path / "t.h5"
    before = _writer_threads()
    with pytest.raises(RuntimeError, match="no terminal"):
        jl.run(lambda s: s + 1, jnp.ones(3), 5, sinks=[jl.HDF5Writer(path)], progress=_BrokenBar(5))
    assert _writer_threads() == before
    assert jl.load(path).status == "failed"
    run = jl.run(lambda s: s + 1, jnp.ones(3), 5, record={"s": lambda s: s}, sinks=[jl.HDF5Writer(path)],
                 progress=False)
    assert run.trajectory.status == "complete"


def test_the_file_is_made_once_the_first_chunk_is_dispatched_and_a_failure_before_is_on_record(tmp_path):
    """A first run traces and compiles its program before its file is made (the file is made
    while the first chunk runs, milliseconds off a short run); a failure while tracing the
    program still leaves the file, closed ``failed``."""
    path = tmp_path / "t.h5"
    seen = []

    def step(s):  # called when the run is resolved, then when its program (one of its own: + 1.25) is traced
        seen.append(path.exists())
        return s + 1.25

    run = jl.run(step, jnp.ones(3), 5, record={"s": lambda s: s}, sinks=[jl.HDF5Writer(path)], progress=False)
    assert len(seen) >= 2 and not any(seen)
    assert run.trajectory.status == "complete" and run.trajectory.steps_done == 5
    bad = {"s": jl.Record(lambda s: s, every=2, when=lambda s: s)}  # not one bool: found tracing the program
    with pytest.raises(jl.JaxlogError, match="when= must return one bool"):
        jl.run(lambda s: s * 2, jnp.ones(3), 5, record=bad, sinks=[jl.HDF5Writer(path)], progress=False)
    traj = jl.load(path)
    assert traj.status == "failed" and traj.steps_done == 0 and traj.stop_reason == "interrupted"


def test_a_deleted_state_array_is_named_before_any_file_is_made(tmp_path):
    gone = jnp.ones(3)
    gone.delete()
    with pytest.raises(jl.JaxlogError, match=r"state leaf \['x'\] was deleted"):
        jl.run(lambda s: s, {"x": gone}, 5, sinks=[jl.HDF5Writer(tmp_path / "t.h5")], progress=False)
    assert not (tmp_path / "t.h5").exists()


class _InterruptedBar(jl.ProgressLogger):
    def __enter__(self):
        raise KeyboardInterrupt


def test_ctrl_c_while_the_progress_bar_starts_leaves_the_file_stopped(tmp_path):
    path = tmp_path / "t.h5"
    with pytest.raises(KeyboardInterrupt):
        jl.run(lambda s: s + 1, jnp.ones(3), 5, record={"s": lambda s: s}, sinks=[jl.HDF5Writer(path)],
               progress=_InterruptedBar(5))
    assert jl.load(path).status == "stopped"
    again = jl.run(lambda s: s + 1, jnp.ones(3), 5, record={"s": lambda s: s}, sinks=[jl.HDF5Writer(path)],
                   progress=False)
    assert again.trajectory.status == "complete"
