"""Checkpoints, resume and post-mortem states of runs over two processes (``jax.distributed`` on
the CPU, gloo collectives, 2 devices each): each process keeps its blocks of the state in its
part file; a checkpoint counts only where every part holds it; a SIGTERM to one process stops
both at one step with a checkpoint there; a resume in two processes equals, bit for bit, the
run nobody stopped. The programs print one JSON line per process that the tests assert on.
The state lies on a mesh of explicit axes (``jax.make_mesh``'s default), which a resume must
rebuild as such; automatic axes are covered by the one-process resumes (tests/test_explicit_mesh.py,
tests/test_shardstate.py) and tests/test_sharding.py's two-process runs: these runs, about 45 s
together, are run once, not once per kind of axes.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import pytest_jaxlog as jl
from test_checkpoint import _StopAt
from test_sharding import _env, _free_port, _result, multi_prelude

STEPS = 400  # long enough for a stop voted after SIGTERM (a vote about every 0.1 s) to come before the end

CHILD = multi_prelude("explicit") + textwrap.dedent("""
    import hashlib, signal, time
    from jax.experimental import multihost_utils

    mode = sys.argv[4]
    KW = dict(chunk=5, record=RECORD, dt=0.01, invariants=[jl.finite("energy")])
    STEPS = %(steps)d


    class SignalAt(jl.ProgressLogger):
        # process 1 signals itself once the run has written a step (as the run goes, in its main thread)
        def __init__(self, at, sig):
            super().__init__(STEPS, enabled=False)
            self.at, self.sig = at, sig

        def advance(self, step, state=None):
            if process == 1 and step >= self.at:
                if self.sig == signal.SIGKILL:  # its writer idle first: a SIGKILL mid-write can leave HDF5 metadata
                    time.sleep(1.0)             # the library cannot parse (docs/file-format.md), not this test's case
                os.kill(os.getpid(), self.sig)


    def digest(tree):
        return [hashlib.sha256(np.asarray(multihost_utils.process_allgather(x, tiled=True)).tobytes()).hexdigest()
                for x in jax.tree_util.tree_leaves(tree)]


    out = {"process": process}
    try:
        if mode == "full":
            run = jl.run(step, state, STEPS, sinks=[jl.HDF5Writer(path)], checkpoint=jl.every(10), **KW)
        elif mode in ("term", "kill"):
            sig, at, every = (signal.SIGTERM, 23, 20) if mode == "term" else (signal.SIGKILL, 43, 10)
            run = jl.run(step, state, STEPS, sinks=[jl.HDF5Writer(path)], checkpoint=jl.every(every),
                         progress=SignalAt(at, sig), **KW)
        elif mode == "resume":
            run = jl.resume(path, step, STEPS, like=state, **KW)
            out["resumed_from"] = run.resumed_from
        elif mode == "postmortem":
            peaks = np.asarray(jl.run(step, state, STEPS, record={"peak": RECORD["peak"]}, chunk=5).trajectory["peak"])
            bound = float(peaks[:20].max())  # first passed after step 20
            out["first"] = int(np.argmax(peaks > bound))
            try:
                jl.run(step, state, STEPS, chunk=5, record=RECORD, dt=0.01, sinks=[jl.HDF5Writer(path)], postmortem=3,
                       invariants=[jl.bounded("peak", hi=bound)])
            except jl.InvariantViolation as e:
                out["violation"] = e.step
        elif mode == "errors":
            for what, args, kw in (("sinks", (path,), {"sinks": [jl.MemorySink()]}),
                                   ("one process", (sys.argv[5],), {})):
                try:
                    jl.resume(*args, step, STEPS, like=state, **{**KW, **kw})
                except jl.JaxlogError as e:
                    out[what] = str(e)
        if mode not in ("postmortem", "errors"):
            out["steps"] = run.steps_done
            out["state"] = digest(run.state)
            out["axis_types"] = [str(t) for t in run.state.x.sharding.mesh.axis_types]
    except KeyboardInterrupt as e:
        out["interrupted"] = type(e).__name__
        out["notes"] = getattr(e, "__notes__", [])
        out["steps"] = e.jaxlog_run.steps_done
    print(json.dumps(out), flush=True)
    jax.distributed.shutdown()
""") % {"steps": STEPS}


def _launch(mode: str, path: Path, *extra: str) -> list[subprocess.Popen]:
    port = _free_port()
    return [subprocess.Popen([sys.executable, "-c", CHILD, str(i), str(port), str(path), mode, *extra], env=_env(2),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]


def _two(mode: str, path: Path, *extra: str) -> list[dict]:
    """Both processes' JSON lines (each must end well; one hung is killed, both outputs shown)."""
    procs, ends = _launch(mode, path, *extra), []
    deadline = time.monotonic() + 150
    try:
        for p in procs:
            try:
                ends.append(p.communicate(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                ends.append(p.communicate())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    shown = f"{mode}: " + "\n".join(f"process {i} (exit {p.returncode}):\n{out[-2000:]}\n{err[-4000:]}"
                      for i, (p, (out, err)) in enumerate(zip(procs, ends)))
    assert all(p.returncode == 0 for p in procs), shown
    return [_result(out) for out, _ in ends]


def _killed(path: Path) -> list[int]:
    """A run whose process 1 SIGKILLs itself mid-run; process 0, left waiting for it (or failing
    in a collective), is killed too, as a scheduler would. Their exit codes."""
    procs = _launch("kill", path)
    try:
        procs[1].communicate(timeout=180)
        deadline = time.monotonic() + 10
        while procs[0].poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    return [p.returncode for p in procs]


def _checkpoints(part: Path) -> list[int]:
    """The checkpoints a part holds whole (read plainly with h5py: its record written last)."""
    with h5py.File(part, "r") as f:
        root = f.get("jaxlog/attachments/checkpoint")
        return sorted(int(k) for k in root if "jaxlog_checkpoint" in root[k]) if root is not None else []


def _assembled(parts: list[Path], name: str, step: int) -> dict[str, np.ndarray]:
    """A sharded snapshot's state, put together plainly from every part's blocks."""
    snaps = [jl.load(p).snapshot(name, step).arrays for p in parts]
    described = [json.loads(bytes(np.asarray(s["jaxlog_blocks"], np.uint8)).decode()) for s in snaps]
    assert all(d["leaves"] == described[0]["leaves"] for d in described)
    assert [d["process"] for d in described] == list(range(len(parts)))
    out = {}
    for path, info in described[0]["leaves"].items():
        whole = np.full(info["shape"], np.nan, dtype=info["dtype"])
        for b, block in enumerate(info["blocks"]):
            held = [i for i, s in enumerate(snaps) if f"{path}@{b}" in s]
            assert held == [block["owner"]], (path, b, held)  # each block once, by its owner
            whole[tuple(slice(a, z) for a, z in block["index"])] = snaps[block["owner"]][f"{path}@{b}"]
        out[path] = whole
    return out


def _same_trajectory(got: Path, want: Path) -> None:
    a, b = jl.load(got), jl.load(want)
    assert a.records == b.records and a.status == b.status == "complete" and a.steps_done == b.steps_done == STEPS
    for name in a.records:
        np.testing.assert_array_equal(a.steps(name), b.steps(name))
        assert a[name].tobytes() == b[name].tobytes(), name  # bit for bit (the same gloo reductions)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted run; one SIGTERMed (a copy kept before its resume); one SIGKILLed; each resumed."""
    d = tmp_path_factory.mktemp("mpckpt")
    for name in ("full", "term", "kill"):
        (d / name).mkdir()
    out = {"dir": d, "full": _two("full", d / "full" / "t.h5"), "term": _two("term", d / "term" / "t.h5")}
    shutil.copytree(d / "term", d / "term-copy")
    out["term_parts"] = {i: _checkpoints(d / "term" / f"t.h5.p{i}") for i in range(2)}
    out["killed"] = _killed(d / "kill" / "t.h5")
    out["kill_parts"] = {i: _checkpoints(d / "kill" / f"t.h5.p{i}") for i in range(2)}
    out["term_resumed"] = _two("resume", d / "term" / "t.h5")
    out["kill_resumed"] = _two("resume", d / "kill" / "t.h5")
    return out


def test_each_process_checkpoints_its_own_blocks(runs):
    d = runs["dir"] / "full"
    assert all(o["steps"] == STEPS for o in runs["full"])
    parts = [d / "t.h5.p0", d / "t.h5.p1"]
    for i, part in enumerate(parts):
        assert _checkpoints(part) == list(range(10, STEPS + 1, 10))
        arrays = jl.load(part).snapshot("checkpoint", 30).arrays
        mine = {"state/x@0", "state/x@1", "state/v@0", "state/v@1"} if i == 0 else \
            {"state/x@2", "state/x@3", "state/v@2", "state/v@3"}
        assert set(arrays) == mine | {"jaxlog_blocks", "jaxlog_checkpoint"}
    # the blocks put together are the state at that step (x is recorded at every step)
    traj = jl.load(d / "t.h5")
    state = _assembled(parts, "checkpoint", 30)
    assert state["state/x"].tobytes() == traj["x", 30].tobytes()
    assert state["state/v"].tobytes() == traj["v", 6].tobytes()  # v every 5 steps: frame 6 is step 30


def test_sigterm_to_one_process_stops_both_at_one_checkpointed_step(runs):
    outs, parts = runs["term"], runs["term_parts"]
    stop = outs[0]["steps"]
    assert 23 <= stop < STEPS and outs[1]["steps"] == stop
    for o in outs:  # both stop, the unsignalled one told why
        assert o["interrupted"] == "Terminated"
        assert f"[jaxlog] every process of the run stopped after step {stop}: process 1 received signal 15" in o["notes"]
    d = runs["dir"] / "term-copy"
    index = jl.load(d / "t.h5")
    assert (index.status, index.steps_done) == ("stopped", stop)
    for i in range(2):
        part = jl.load(d / f"t.h5.p{i}")
        assert (part.status, part.steps_done) == ("stopped", stop)
        scheduled = list(range(20, stop + 1, 20))  # every 20 steps, and where it stopped
        assert parts[i] == scheduled + ([stop] if stop % 20 else [])


def test_resume_in_two_processes_equals_the_uninterrupted_run(runs):
    d = runs["dir"]
    full = runs["full"][0]["state"]
    for kind, newest in (("term", runs["term"][0]["steps"]),
                         ("kill", max(set(runs["kill_parts"][0]) & set(runs["kill_parts"][1])))):
        resumed = runs[f"{kind}_resumed"]
        assert [o["resumed_from"] for o in resumed] == [newest, newest], kind
        assert all(o["steps"] == STEPS and o["state"] == full for o in resumed), kind
        # rebuilt on the mesh's own axis types (automatic ones were another type to the step)
        assert all(o["axis_types"] == ["AxisType.Explicit"] for o in resumed + runs["full"]), (kind, resumed)
        _same_trajectory(d / kind / "t.h5", d / "full" / "t.h5")
        assert sorted(p.name for p in (d / kind).iterdir()) == ["t.h5", "t.h5.p0", "t.h5.p1"]  # no second names left


def test_a_run_killed_in_one_process_resumes_from_the_newest_checkpoint_both_parts_hold(runs):
    assert runs["killed"][1] == -signal.SIGKILL
    held = runs["kill_parts"]
    assert held[0] and held[1]
    common = set(held[0]) & set(held[1])
    assert runs["kill_resumed"][0]["resumed_from"] == max(common)
    assert max(common) == min(max(held[0]), max(held[1]))  # (each part's checkpoints are a prefix of the schedule)


def test_a_checkpoint_only_one_part_holds_is_not_used(runs, tmp_path):
    src = runs["dir"] / "term-copy"
    stop = runs["term"][0]["steps"]
    for f in src.iterdir():
        shutil.copy(f, tmp_path / f.name)
    with h5py.File(tmp_path / "t.h5.p1", "r+") as f:  # part 1's record of the newest checkpoint gone
        del f[f"jaxlog/attachments/checkpoint/{stop}/jaxlog_checkpoint"]
    assert _checkpoints(tmp_path / "t.h5.p0")[-1] == stop and _checkpoints(tmp_path / "t.h5.p1")[-1] < stop
    outs = _two("resume", tmp_path / "t.h5")
    older = _checkpoints(tmp_path / "t.h5.p1")  # (the resumed part holds the checkpoints from there on again)
    before = runs["term_parts"][1][-2]  # the checkpoint before it, which both parts hold
    assert [o["resumed_from"] for o in outs] == [before] * 2 and before in older
    assert all(o["state"] == runs["full"][0]["state"] for o in outs)
    _same_trajectory(tmp_path / "t.h5", runs["dir"] / "full" / "t.h5")


def test_post_mortem_states_are_kept_per_process(runs, tmp_path):
    outs = _two("postmortem", tmp_path / "t.h5")
    first = outs[0]["first"]
    assert first > 20 and [o["violation"] for o in outs] == [first, first]
    parts = [tmp_path / "t.h5.p0", tmp_path / "t.h5.p1"]
    full = jl.load(runs["dir"] / "full" / "t.h5")
    for k in (first - 2, first - 1, first):
        for i, part in enumerate(parts):
            names = set(jl.load(part).snapshot("postmortem", k).arrays) - {"jaxlog_blocks"}
            assert names == ({"state/x@0", "state/x@1", "state/v@0", "state/v@1"} if i == 0 else
                             {"state/x@2", "state/x@3", "state/v@2", "state/v@3"})
        state = _assembled(parts, "postmortem", k)  # the uninterrupted run's state at that step
        assert state["state/x"].tobytes() == full["x", k].tobytes(), k
    assert sorted(jl.load(parts[0]).postmortem) == [first - 2, first - 1, first]


def test_usage_errors_name_their_cause(runs, tmp_path):
    copy = tmp_path / "two"
    shutil.copytree(runs["dir"] / "term-copy", copy)
    with pytest.raises(jl.JaxlogError) as e:  # resumed in one process
        jl.resume(copy / "t.h5", lambda s: s, STEPS)
    assert "was recorded by 2 processes; this run has 1: resume it in as many processes" in str(e.value)

    from kernels.oscillators import make_oscillators

    step, state, energy = make_oscillators(n=64)
    single = tmp_path / "one.h5"
    with pytest.raises(KeyboardInterrupt):
        jl.run(step, state, STEPS, record={"x": lambda s: s.x}, checkpoint=jl.every(10), sinks=[jl.HDF5Writer(single)],
               progress=_StopAt(STEPS, 30))
    outs = _two("errors", copy / "t.h5", str(single))
    for o in outs:
        assert o["sinks"].endswith("in a run over several processes the resumed run writes its parts of the "
                                   "trajectory only; sinks= is not taken")
        assert f"{single} was recorded by 1 process; this run has 2: resume it in 1 process" in o["one process"]
    assert sorted(p.name for p in copy.iterdir()) == ["t.h5", "t.h5.p0", "t.h5.p1"]  # nothing left by the refusals


def test_a_resume_reads_only_the_checkpoints_it_needs(runs):
    """Newest first: the newest checkpoint both parts hold whole is read once from each part, the
    older ones not at all (a resume of a long run with large states reads one state, not all)."""
    from pytest_jaxlog.drive.checkpoints.partresume import _Checkpoints

    d = runs["dir"] / "full"
    checkpoints = _Checkpoints([jl.load(d / f"t.h5.p{i}") for i in range(2)])
    assert checkpoints.named() == list(range(STEPS, 0, -10))
    assert checkpoints.whole(STEPS)
    assert sorted(checkpoints._read) == [(0, STEPS), (1, STEPS)]
    assert checkpoints.at(1, STEPS).state.keys() >= {"state/x@2", "state/v@3", "jaxlog_blocks"}
