"""A resume killed at any instant leaves a path that ``jl.load`` opens and ``jl.resume`` resumes to
the trajectory of the run done in one go, and the resume after it leaves no hidden file behind.

Each resume runs in a child process killed with SIGKILL at a chosen instant. The instants are
made deterministic by the child itself: it wraps the functions the resume goes through (the
checkpoint search, the writer's open, its frame and checkpoint writes, the swap of the new file
into place, the close) so that at its instant it prints a marker and sleeps, and the test kills it
then; the timed kills fire at fixed delays after the writer opened (the copy, the swap and the
first own chunks). Where the instant is before the swap, the path must still hold the old file,
byte for byte; after it, the new file with the checkpoint the resume continued from.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

import pytest_jaxlog as jl

import resume_helpers as k

GUARD_S = 120  # a hang guard, not a performance threshold
REPO = Path(__file__).resolve().parents[1]
FROM = 30  # the failed run's newest checkpoint: where every resume here continues from

CHILD = textwrap.dedent(
    """
    import os, signal, sys, threading, time

    import pytest_jaxlog as jl
    from pytest_jaxlog.drive import resume as resume_mod
    from pytest_jaxlog.store.hdf5.writer import HDF5Writer
    from pytest_jaxlog.store.hdf5.journal import PendingSwap
    import resume_helpers as k

    instant, path = sys.argv[1], sys.argv[2]


    def pause(name):
        if name == instant:
            print(f"at {name}", flush=True)
            time.sleep(600)  # killed here


    def wrap(owner, attr, name, when=lambda *a, **kw: True, before=False):
        orig = getattr(owner, attr)

        def wrapped(*a, **kw):
            if before and when(*a, **kw):
                pause(name)
            out = orig(*a, **kw)
            if not before and when(*a, **kw):
                pause(name)
            return out

        setattr(owner, attr, wrapped)


    def first_step(self, frames):
        return min(int(s[0]) for s in frames.steps.values() if len(s))


    def checkpoint_at(step):
        return lambda self, name, at, host: name == "checkpoint" and at == step


    wrap(resume_mod, "prepare", "linked")
    wrap(HDF5Writer, "open", "opened")
    wrap(HDF5Writer, "_append", "frames-copied", lambda self, f: first_step(self, f) <= 30)
    wrap(HDF5Writer, "_write_attachment", "checkpoint-10", checkpoint_at(10))
    wrap(HDF5Writer, "_write_attachment", "checkpoint-30-unflushed", checkpoint_at(30), before=True)
    wrap(PendingSwap, "checkpoint_written", "before-swap", lambda self, step: step >= self.at and not self.done,
         before=True)
    wrap(PendingSwap, "checkpoint_written", "after-swap", lambda self, step: self.done)
    wrap(HDF5Writer, "_append", "own-frames", lambda self, f: first_step(self, f) > 30, before=True)
    wrap(HDF5Writer, "_write_attachment", "checkpoint-40", checkpoint_at(40))
    wrap(HDF5Writer, "_finalize", "closing", before=True)
    wrap(HDF5Writer, "close", "closed")
    wrap(resume_mod, "resume_run", "returned")
    if instant.startswith("opened+"):  # a timed kill, so many ms after the writer opened
        delay = int(instant.split("+")[1]) / 1000

        def arm(*a, **kw):
            threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL)).start()

        wrap(HDF5Writer, "open", "armed", arm)
    jl.resume(path, k.STEP, k.TOTAL, like=k.STATE, **k.run_kwargs())
    print("done", flush=True)
    time.sleep(600)  # a timed kill still comes
    """
)

PAUSED = ["linked", "opened", "frames-copied", "checkpoint-10", "checkpoint-30-unflushed", "before-swap",
          "after-swap", "own-frames", "checkpoint-40", "closing", "closed", "returned"]
TIMED = [f"opened+{ms}" for ms in (0, 1, 2, 4, 6, 9, 13, 18, 25, 35, 50, 80, 120)]
BEFORE_SWAP = {"linked", "opened", "frames-copied", "checkpoint-10", "checkpoint-30-unflushed", "before-swap"}
WINDOW = 3  # children alive at once (each imports jax and compiles the chunk before its instant)


def _child(script: Path, instant: str, path: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]))
    return subprocess.Popen([sys.executable, str(script), instant, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _kill_at_marker(proc: subprocess.Popen, instant: str) -> None:
    """Kill the child once it says it is at its instant (a timed one kills itself)."""
    if instant in PAUSED:
        line = proc.stdout.readline()
        if line.strip() != f"at {instant}":
            proc.kill()
            raise AssertionError(f"{instant}: the child never reached it: {line!r} {proc.communicate()[1][-3000:]}")
        proc.send_signal(signal.SIGKILL)
    rc = proc.wait(GUARD_S)
    assert rc == -signal.SIGKILL, (instant, rc, proc.communicate()[1][-3000:])
    proc.stdout.close()
    proc.stderr.close()


def _hidden(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


def _state_equal(a, b) -> None:
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _same_trajectory(path: Path, whole) -> None:
    traj = jl.load(path)
    assert traj.status == "complete" and traj.steps_done == k.TOTAL
    assert traj.records == whole.records
    assert traj.attachment_steps("checkpoint") == whole.attachment_steps("checkpoint")
    for p in whole.records:
        np.testing.assert_array_equal(traj.steps(p), whole.steps(p))
        np.testing.assert_array_equal(traj.time(p), whole.time(p))
        np.testing.assert_array_equal(traj[p], whole[p])
    _state_equal(traj.state(k.TOTAL, like=k.STATE), whole.state(k.TOTAL, like=k.STATE))


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    path = tmp_path_factory.mktemp("whole") / "t.h5"
    run = jl.run(k.STEP, k.STATE, k.TOTAL, sinks=[jl.HDF5Writer(path)], **k.run_kwargs())
    return run, jl.load(path)


@pytest.fixture(scope="module")
def failed(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("failed") / "t.h5"
    k.failed_file(path)
    traj = jl.load(path)
    assert traj.status == "failed" and max(traj.attachment_steps("checkpoint")) == FROM < traj.steps_done
    return path.read_bytes()


def test_a_resume_killed_at_any_instant_leaves_a_path_that_resumes(tmp_path, whole, failed):
    """25 resumes killed at 25 instants; each path then loads, resumes bit for bit, and is clean."""
    whole_run, whole_traj = whole
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    cases = PAUSED + TIMED
    paths = {}
    for instant in cases:
        d = tmp_path / instant.replace("+", "-")
        d.mkdir()
        paths[instant] = d / "t.h5"
        paths[instant].write_bytes(failed)
    inodes = {instant: os.stat(p).st_ino for instant, p in paths.items()}
    procs = {}
    seen = {"old": 0, "new": 0}
    for i, instant in enumerate(cases):
        for ahead in cases[i:i + WINDOW]:
            if ahead not in procs:
                procs[ahead] = _child(script, ahead, paths[ahead])
        _kill_at_marker(procs.pop(instant), instant)
        path = paths[instant]
        left = jl.load(path)  # opens, whatever the instant
        kept = os.stat(path).st_ino == inodes[instant]
        if kept:  # the old file, untouched
            assert path.read_bytes() == failed, instant
        else:  # the new file, with the checkpoint it continued from
            assert FROM in left.attachment_steps("checkpoint"), (instant, left.attachment_steps("checkpoint"))
            assert left.steps_done >= FROM
        if instant in BEFORE_SWAP:
            assert kept, f"{instant}: the path changed before the new file held its checkpoint"
        elif instant in PAUSED:
            assert not kept, f"{instant}: the path still holds the old file after the swap"
        seen["old" if kept else "new"] += 1
        if left.status == "complete":  # killed once the resume had finished its file: nothing left to do
            assert instant not in BEFORE_SWAP
            with pytest.raises(jl.JaxlogError, match="there is nothing to resume"):
                jl.resume(path, k.STEP, k.TOTAL, like=k.STATE, **k.run_kwargs())
        else:
            run = jl.resume(path, k.STEP, k.TOTAL, like=k.STATE, **k.run_kwargs())
            assert run.steps_done == k.TOTAL
            _state_equal(run.state, whole_run.state)
        _same_trajectory(path, whole_traj)
        assert _hidden(path.parent) == [], instant  # the killed resume's hidden files are gone
    assert seen["old"] >= len(BEFORE_SWAP) and seen["new"] >= len(PAUSED) - len(BEFORE_SWAP)


def test_a_live_resume_keeps_its_hidden_name_and_a_plain_run_removes_a_dead_ones(tmp_path, failed):
    """A second resume of the same path, while the first is alive (before it locks the path),
    leaves the first one's hidden name alone; once the first is dead, a plain run removes it."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    path = tmp_path / "t.h5"
    path.write_bytes(failed)
    proc = _child(script, "linked", path)
    line = proc.stdout.readline()
    assert line.strip() == "at linked", proc.communicate()[1][-3000:] if not line else line
    theirs = f".t.h5.resume-{proc.pid}"
    try:
        assert _hidden(tmp_path) == [theirs]
        jl.resume(path, k.STEP, k.TOTAL, like=k.STATE, **k.run_kwargs())
        assert _hidden(tmp_path) == [theirs]  # its process lives: not ours to remove
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(GUARD_S)
        proc.stdout.close()
        proc.stderr.close()
    jl.run(k.STEP, k.STATE, 5, sinks=[jl.HDF5Writer(path)], **k.run_kwargs())
    assert _hidden(tmp_path) == []
