"""Checkpoints and resume: a run stopped by an exception, Ctrl-C, SIGTERM or SIGKILL continues
from its newest checkpoint in the same file, and the file then equals, bit for bit, the one an
uninterrupted run writes; a resume that does not match the file is refused."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl


class Walk(NamedTuple):
    x: jax.Array
    t: jax.Array
    key: jax.Array  # a typed key in the state


def walk(key, s: Walk) -> Walk:
    k1, k2 = jax.random.split(s.key)
    noise = jax.random.normal(key, s.x.shape) + 0.1 * jax.random.normal(k1, s.x.shape)
    return Walk(s.x * 0.99 + 0.1 * noise, s.t + 1, k2)


S0 = Walk(jnp.ones(4, jnp.float32), jnp.int32(0), jax.random.key(9))
KEY = jax.random.key(1)
RECORD = {"x": lambda s: s.x, "t": jl.Record(lambda s: s.t, every=7), "e": lambda s: jnp.sum(s.x ** 2)}
INVARIANTS = [jl.finite("x"), jl.conserved("e", atol=1e6), jl.monotonic("t"),
              jl.aggregate("e", "mean", hi=1e6, steps=jl.window(10, 150))]


def _run(path, steps, flush_every_s=1.0, **kw):
    kw.setdefault("chunk", 13)
    kw.setdefault("progress", False)
    return jl.run(walk, S0, steps, key=KEY, record=RECORD, invariants=INVARIANTS,
                  sinks=[jl.HDF5Writer(path, flush_every_s=flush_every_s)], dt=0.01, **kw)


def _same_file(a, b):
    a, b = jl.load(a), jl.load(b)
    assert a.records == b.records and a.steps_done == b.steps_done and a.status == b.status
    for p in a.records:
        np.testing.assert_array_equal(a.steps(p), b.steps(p))
        np.testing.assert_array_equal(a.time(p), b.time(p))
        np.testing.assert_array_equal(a[p], b[p])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("ref") / "ref.h5"
    run = _run(path, 200, checkpoint=jl.every(25))
    return path, run


class _StopAt(jl.ProgressLogger):
    """Ctrl-C once the run has written ``at`` steps."""

    def __init__(self, total, at):
        super().__init__(total, enabled=False)
        self.at = at

    def advance(self, step, state=None):
        if step >= self.at:
            raise KeyboardInterrupt


@pytest.mark.parametrize("stop_at, chunk", [(30, 13), (77, 5), (151, 40)])
def test_ctrl_c_checkpoints_and_resume_equals_the_uninterrupted_run(tmp_path, reference, stop_at, chunk):
    ref_path, ref_run = reference
    path = tmp_path / "t.h5"
    with pytest.raises(KeyboardInterrupt):
        _run(path, 200, checkpoint=jl.every(25), progress=_StopAt(200, stop_at), chunk=chunk)
    stopped = jl.load(path)
    assert stopped.status == "stopped"
    newest = max(stopped.attachment("checkpoint"))
    assert newest == stopped.steps_done  # Ctrl-C wrote one where the frames end
    run = jl.resume(path, walk, 200, like=S0, key=KEY, record=RECORD, invariants=INVARIANTS, dt=0.01,
                    checkpoint=jl.every(25), chunk=chunk + 3, progress=False)
    assert run.steps_done == 200 and run.stop_reason == "steps"
    for a, b in zip(jax.tree_util.tree_leaves(run.state), jax.tree_util.tree_leaves(ref_run.state)):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    _same_file(path, ref_path)
    assert isinstance(jl.load(path).state(200, like=S0), Walk)
    assert not [p for p in os.listdir(tmp_path) if "resume" in p]  # the old file's second name is gone


def test_a_complete_run_says_so_and_a_mismatched_resume_is_refused(tmp_path, reference):
    ref_path, _ = reference
    with pytest.raises(jl.JaxlogError, match=r"ended complete at step 200 \(steps\): there is nothing to resume"):
        jl.resume(ref_path, walk, 300, like=S0, key=KEY, record=RECORD, invariants=INVARIANTS, dt=0.01)
    path = tmp_path / "t.h5"
    with pytest.raises(KeyboardInterrupt):
        _run(path, 200, checkpoint=jl.every(25), progress=_StopAt(200, 60))
    common = dict(like=S0, invariants=INVARIANTS, dt=0.01, progress=False)
    cases = [
        (dict(key=KEY, record={**RECORD, "t": jl.Record(lambda s: s.t, every=5)}), r"records differ \(t"),
        (dict(key=KEY, record={"x": RECORD["x"]}), r"records differ"),
        (dict(key=jax.random.key(2), record=RECORD), r"a different key= than the file's run"),
        (dict(key=KEY, record=RECORD, dt=0.02), r"dt=0.02 \(the file's run had dt=0.01\)"),
        (dict(key=KEY, record=RECORD, invariants=INVARIANTS[:1]), r"1 invariants \(the file's run checked 4\)"),
    ]
    for extra, match in cases:
        with pytest.raises(jl.JaxlogError, match=match):
            jl.resume(path, walk, 200, **{**common, **extra})
    with pytest.raises(jl.JaxlogError, match=r"step function .*other_walk"):
        def other_walk(key, s):
            return walk(key, s)
        jl.resume(path, other_walk, 200, key=KEY, record=RECORD, **common)
    last = jl.load(path).steps_done  # where the Ctrl-C left the frames: the last checkpoint is there
    assert last >= 60 and last in jl.load(path).attachment("checkpoint")
    with pytest.raises(jl.JaxlogError, match=rf"checkpoint at step {last}: leaf state/x has shape \(4,\), like= has \(5,\)"):
        jl.resume(path, walk, 200, key=KEY, record=RECORD, **{**common, "like": S0._replace(x=jnp.ones(5))})
    assert jl.load(path).status == "stopped"  # refusals leave the file as it was
    jl.resume(path, walk, 200, record=RECORD, checkpoint=jl.every(25), **common)  # the key from the file
    _same_file(path, ref_path)


class _InterruptedWrite(jl.MemorySink):
    """Ctrl-C inside the ``at``-th write: the invariants have taken that batch, the sinks not."""

    def __init__(self, at):
        super().__init__()
        self.at, self.writes = at, 0

    def write(self, frames):
        self.writes += 1
        if self.writes == self.at:
            raise KeyboardInterrupt
        super().write(frames)


def test_ctrl_c_while_a_batch_is_checked_and_written_saves_no_checkpoint_past_the_invariants(tmp_path, reference):
    ref_path, _ = reference
    path = tmp_path / "t.h5"
    with pytest.raises(KeyboardInterrupt) as info:
        jl.run(walk, S0, 200, key=KEY, record=RECORD, invariants=INVARIANTS, dt=0.01, chunk=13, progress=False,
               checkpoint=jl.every(25), sinks=[jl.HDF5Writer(path, flush_every_s=0.0), _InterruptedWrite(5)])
    stopped = jl.load(path)
    assert stopped.status == "stopped"
    # the fifth batch was checked, not written: a checkpoint on the way out where the frames end would
    # hold invariants that saw past it, so the newest stays a scheduled one
    saved = sorted(stopped.attachment("checkpoint"))
    assert saved and all(s % 25 == 0 and s <= stopped.steps_done for s in saved), (saved, stopped.steps_done,
                                                                                   getattr(info.value, "__notes__", ""))
    jl.resume(path, walk, 200, like=S0, key=KEY, record=RECORD, invariants=INVARIANTS, dt=0.01,
              checkpoint=jl.every(25), chunk=11, progress=False)
    _same_file(path, ref_path)


CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import test_checkpoint as t
    import pytest_jaxlog as jl

    class Go(jl.ProgressLogger):  # says when the run is under way (past its first checkpoint)
        def advance(self, step, state=None):
            if step >= 400 and not getattr(self, "said", False):
                self.said = True
                print("go", flush=True)

    t._run(sys.argv[1], STEPS, checkpoint=jl.every(200), chunk=int(sys.argv[2]), flush_every_s=0.05,
           progress=Go(STEPS, enabled=False))
""").replace("STEPS", "20000")  # long enough that a signal within 0.3 s of "go" finds it running


RESUME_CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import numpy as np
    import test_checkpoint as t
    import pytest_jaxlog as jl

    path, ref = sys.argv[1], sys.argv[2]
    try:
        traj = jl.load(path)
    except jl.JaxlogError:
        print("damaged")
        raise SystemExit(0)
    if traj.status == "complete":  # finished before the signal came
        t._same_file(path, ref)
        print("complete")
    elif not traj.attachment("checkpoint", skip_damaged=True):  # killed before the first checkpoint
        print("no checkpoint")
    else:
        run = jl.resume(path, t.walk, 20000, like=t.S0, key=t.KEY, record=t.RECORD, invariants=t.INVARIANTS,
                        dt=0.01, checkpoint=jl.every(200), chunk=150, progress=False)
        np.testing.assert_array_equal(np.asarray(run.state.x), np.asarray(jl.load(ref).state(20000, like=t.S0).x))
        t._same_file(path, ref)
        print("resumed")
""")


def test_killed_at_random_points_and_resumed_20_times(tmp_path):
    """SIGKILL and SIGTERM at random moments of a real process; each file resumes to the
    uninterrupted run's, bit for bit."""
    ref = tmp_path / "ref.h5"
    _run(ref, 20000, checkpoint=jl.every(200), chunk=64)
    rng = random.Random(7)
    code = CHILD.format(tests=os.path.dirname(__file__))
    trials = [(sig, rng.uniform(0.0, 0.3), rng.choice([64, 97, 150])) for sig in [signal.SIGKILL, signal.SIGTERM] * 10]
    results = []
    for batch in range(0, len(trials), 4):  # a few processes at a time
        procs = []
        for i, (sig, delay, chunk) in enumerate(trials[batch:batch + 4]):
            path = tmp_path / f"k{batch + i}.h5"
            procs.append((path, sig, delay, subprocess.Popen([sys.executable, "-c", code, str(path), str(chunk)],
                                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
        for path, sig, delay, proc in procs:
            assert proc.stdout.readline().strip() == "go", proc.stderr.read()[-2000:]
            time.sleep(delay)
            proc.send_signal(sig)
            proc.communicate(timeout=120)
            results.append((path, sig))
    # each killed file is resumed and compared in a process of its own (a crash there must not
    # take the test down); every flush is a commit, so none may be damaged (store/hdf5/journal.py)
    outcomes = []
    for path, sig in results:
        r = subprocess.run([sys.executable, "-c", RESUME_CHILD.format(tests=os.path.dirname(__file__)), str(path),
                            str(ref)], capture_output=True, text=True, timeout=300)
        outcome = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else "crashed"
        if outcome in ("damaged", "crashed"):
            assert sig == signal.SIGKILL, f"{path.name} ({sig.name}) is {outcome}:\n{r.stderr[-3000:]}"
        else:
            assert outcome in ("resumed", "complete", "no checkpoint"), r.stdout[-2000:] + r.stderr[-2000:]
        outcomes.append(outcome)
    resumed, damaged = outcomes.count("resumed"), outcomes.count("damaged") + outcomes.count("crashed")
    assert resumed >= 6, f"only {resumed} of {len(results)} runs were stopped mid-way with a checkpoint: {outcomes}"
    assert damaged == 0, f"{damaged} killed files did not open: {outcomes}"


def test_the_cli_lists_checkpoints_and_a_timeline_without_window_gives_steps_per_s(tmp_path):
    path = tmp_path / "t.h5"
    tl = jl.Timeline()
    with pytest.raises(KeyboardInterrupt):
        _run(path, 200, checkpoint=jl.every(25), progress=_StopAt(200, 60), timeline=tl)
    r = subprocess.run([sys.executable, "-m", "pytest_jaxlog", "info", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "status: stopped" in r.stdout and "stopped by: interrupted" in r.stdout
    last = jl.load(path).steps_done  # where the Ctrl-C found the frames: the last checkpoint is there
    assert last >= 60 and f"checkpoints: steps 25, 50, {last}  (jl.resume continues from the newest)" in r.stdout
    trace = tl.write(tmp_path / "t.pftrace")
    r = subprocess.run([sys.executable, "-m", "pytest_jaxlog", "trace", str(trace)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f"steps: {last} in " in r.stdout and "steps/s from the run's timeline" in r.stdout


def test_a_stored_state_is_read_alone_and_a_damaged_one_does_not_hide_the_others(tmp_path, reference):
    """``Trajectory.state(k)`` reads the snapshot at ``k`` only: with the checkpoint at step 25
    damaged (a flipped byte under its checksum), the one at 100 still comes back, equal to a run
    of 100 steps, and asking for 25 names the damage; a resume from 50 still works."""
    import shutil

    import h5py

    path = tmp_path / "t.h5"
    shutil.copy(reference[0], path)
    with h5py.File(path, "r") as f:
        ds = f["jaxlog/attachments/checkpoint/25/state/x"]
        offset = ds.id.get_chunk_info(0).byte_offset
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))
    traj = jl.load(path)
    assert traj.attachment_steps("checkpoint") == list(range(25, 201, 25))
    at100 = traj.state(100, like=S0)
    short = _run(tmp_path / "short.h5", 100)
    np.testing.assert_array_equal(at100.x, short.state.x)
    np.testing.assert_array_equal(jax.random.key_data(at100.key), jax.random.key_data(short.state.key))
    with pytest.raises(jl.JaxlogError, match=r"checkpoint/25/state/x.*damaged"):
        traj.state(25)
    resumed = jl.resume(path, walk, 200, like=S0, from_step=50, key=KEY, record=RECORD, invariants=INVARIANTS,
                        dt=0.01, checkpoint=jl.every(25), chunk=13, progress=False)
    np.testing.assert_array_equal(resumed.state.x, reference[1].state.x)
    assert 25 not in jl.load(path).attachment_steps("checkpoint")  # the damaged one is not copied
