"""Commits (store/journal.py): a kill or a power loss at any system call of a commit leaves a
file that loads, with every frame and checkpoint acknowledged before it, and nothing else wrong;
a reader polling a live file never sees half a commit.

Acknowledged: ``flush()``, a checkpoint's flush, or ``close()`` returned. The kills are real
SIGKILLs at each system call of the scenario's commits in turn (``commit_kills.py``); the power
losses keep, of what was not synced, any subset of the writes, some torn to whole sectors
(``commit_faults.LossyDisk``). Without the journal the same kills leave wrong values: the
control shows the campaign can fail.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.store import journal

sys.path.insert(0, str(Path(__file__).parent))
from commit_faults import SCHEMA, Acks, CountingDisk, LossyDisk, check_file, frames, run_of, scenario  # noqa: E402

HERE = Path(__file__).parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}


def _campaign(tmp_path, runs: int, first_op: int = 1, without_journal: bool = False) -> dict:
    env = dict(ENV, JAXLOG_TEST_WITHOUT_JOURNAL="1" if without_journal else "0")
    proc = subprocess.run([sys.executable, str(HERE / "commit_kills.py"), str(tmp_path), str(runs), "7", str(first_op)],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("runs", [110, pytest.param(1100, marks=pytest.mark.campaign)])
def test_a_thousand_kills_at_flushes_checkpoints_swaps_and_closes_lose_nothing_acknowledged(tmp_path, runs):
    """The campaign (``-m campaign``): 1,100 runs, every system call of both scenarios a kill point;
    by default a sample of 110, the first calls of each in turn."""
    out = _campaign(tmp_path, runs)
    assert out["failed"] == 0, out["failures"]
    assert out["checked"] == runs
    if runs < 1100:  # (about 9 runs in 10 are killed: some end before their kill point)
        assert out["kills"] >= runs * 8 // 10, out
        return
    assert out["kills"] >= 1000
    where = out["where"]
    for place in ("fresh/open", "fresh/flush", "fresh/checkpoint", "fresh/timed",
                  "swap/open", "swap/flush", "swap/swap-checkpoint", "swap/timed"):
        assert where.get(place, 0) >= 20, (place, where)
    assert where.get("fresh/close", 0) >= 5 and where.get("swap/close", 0) >= 5, where  # a close is a few calls
    # every system call of both scenarios was a kill point (the calls are cycled through in order)
    assert sum(v for k, v in where.items() if not k.endswith("timed")) >= sum(out["ops"].values())


def test_the_same_kills_without_the_journal_leave_wrong_or_unreadable_files(tmp_path):
    out = _campaign(tmp_path, 90, first_op=45, without_journal=True)
    assert out["failed"] > 0, out
    assert all("wrong values" in f or "does not load" in f or "lost" in f for f in out["failures"])


def _power_loss_run(d: Path, kind: str, at: int, rng: random.Random, monkeypatch) -> str | None:
    """A whole file (run 0) at the path, then run 1 until the power goes at its ``at``-th call;
    the files as the loss left them must hold what was acknowledged, read as they are and after
    the next writer rolled back a half-applied commit."""
    path = d / "t.h5"
    replace_at = 17 if kind == "swap" else None
    before = Acks(0)
    monkeypatch.setattr(journal, "SYSTEM", journal.Disk())
    scenario(path, run=0, batches=2, replace_at=None, ack=before, phase=lambda _: None)
    disk = LossyDisk(at, rng)
    monkeypatch.setattr(journal, "SYSTEM", disk)
    acks = Acks(1, replace_at)
    try:
        scenario(path, run=1, batches=3, replace_at=replace_at, ack=acks, phase=lambda name: setattr(disk, "phase", name))
    except (jl.JaxlogError, OSError):
        pass
    monkeypatch.setattr(journal, "SYSTEM", journal.Disk())
    if not disk.off:
        return None  # the run ended before the power went
    disk.crash(d)
    for _ in range(2):  # as the loss left it; then after the next writer's roll-back
        at_path = run_of(path)
        problem = check_file(path, acks if acks.in_place or at_path == 1 else before)
        if problem:
            return f"{kind}, power lost at call {at} ({disk.ops[-1]}): {problem}"
        journal.recover(path)
    return None


@pytest.mark.parametrize("kind", ["fresh", "swap"])
def test_a_power_loss_at_any_system_call_keeps_every_acknowledged_frame(tmp_path, monkeypatch, kind):
    counter = CountingDisk()
    monkeypatch.setattr(journal, "SYSTEM", counter)
    scenario(tmp_path / "dry.h5", run=1, batches=3, replace_at=17 if kind == "swap" else None, ack=Acks(1),
             phase=lambda name: setattr(counter, "phase", name))
    total = len(counter.ops)
    assert any(op.endswith("sync") for op in counter.ops) and total > 40
    rng = random.Random(kind)
    problems, losses = [], 0
    for at in range(1, total + 1):
        d = tmp_path / str(at)
        d.mkdir()
        problem = _power_loss_run(d, kind, at, rng, monkeypatch)
        losses += 1
        if problem:
            problems.append(problem)
    assert not problems, problems[:10]
    assert losses == total


def test_each_commit_is_synced_unless_durable_is_off(tmp_path, monkeypatch):
    for durable, syncs in ((True, True), (False, False)):
        counter = CountingDisk()
        monkeypatch.setattr(journal, "SYSTEM", counter)
        w = jl.HDF5Writer(tmp_path / f"{durable}.h5", flush_every_s=1e9, durable=durable)
        w.open(SCHEMA, {"provenance": {}})
        w.write(frames(0, 6, 0))
        before = counter.ops.count("open:sync")
        w.flush()
        w.close()
        flush_syncs = sum(op.endswith("sync") for op in counter.ops) - before
        assert (flush_syncs >= 2) == syncs, (durable, counter.ops)
        assert check_file(tmp_path / f"{durable}.h5", None) is None



class _NamingDisk(journal.Disk):
    """Names what each sync and rename touched, in order."""

    def __init__(self):
        self.ops: list[str] = []

    def fsync(self, fd):
        target = Path(os.readlink(f"/proc/self/fd/{fd}"))
        self.ops.append(f"sync {'dir' if target.is_dir() else target.name}")
        super().fsync(fd)

    def rename(self, src, dst):
        self.ops.append(f"rename {Path(src).name.split('.index-')[0]}.index -> {Path(dst).name}")
        super().rename(src, dst)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names a file descriptor's file through /proc")
@pytest.mark.parametrize("durable", [True, False])
def test_the_index_of_a_run_over_several_processes_is_synced_before_and_after_its_rename(tmp_path, monkeypatch,
                                                                                       durable):
    from pytest_jaxlog.store.parts import PartsWriter

    disk = _NamingDisk()
    monkeypatch.setattr(journal, "SYSTEM", disk)
    w = PartsWriter(jl.HDF5Writer(tmp_path / "t.h5", flush_every_s=1e9, durable=durable))
    w.open(SCHEMA, {"provenance": {}, "run": {"processes": {"count": 2, "index": 0, "run_id": "r"}}})
    renamed = disk.ops.index("rename .t.h5.index -> t.h5")
    synced_before = [op for op in disk.ops[:renamed] if op.startswith("sync .t.h5.index-")]
    assert (len(synced_before) == 1 and disk.ops[renamed + 1] == "sync dir") == durable, disk.ops
    with h5py.File(tmp_path / "t.h5", "r") as f:  # the index in place, naming both parts
        assert json.loads(f["jaxlog"].attrs["parts"])["files"] == ["t.h5.p0", "t.h5.p1"]
    w.close()


LIVE_WRITER = """
import sys, time
sys.path.insert(0, sys.argv[2])
from commit_faults import SCHEMA, frames
from pytest_jaxlog.store.hdf5 import HDF5Writer
w = HDF5Writer(sys.argv[1], flush_every_s=0.02)
w.open(SCHEMA, {"provenance": {}, "scenario_run": 3})
print("open", flush=True)
end = time.monotonic() + float(sys.argv[3])
lo = 0
while time.monotonic() < end:
    w.write(frames(lo, lo + 6, 3))
    lo += 6
w.close()
print("closed", lo, flush=True)
"""


def test_a_reader_polling_a_live_writer_never_sees_half_a_commit(tmp_path):
    path = tmp_path / "live.h5"
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(LIVE_WRITER), str(path), str(HERE), "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stdout.readline() == "open\n", proc.stderr.read()
        reads, grew, problems = 0, set(), []
        gens = set()
        while proc.poll() is None:
            gens.add(journal.generation(path))
            problem = check_file(path, None)
            if problem:
                problems.append(problem)
            else:
                grew.add(len(jl.load(path).steps("x")))
            reads += 1
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert not problems, problems[:5]
    assert reads >= 20 and len(grew) >= 5 and len(gens - {None}) >= 5  # reads of a file growing, commit after commit
    total = int(out.split()[-1])
    assert np.array_equal(jl.load(path).steps("x"), np.arange(total))
    assert not journal.journal_path(path).exists()  # removed with the writer's close


def test_a_hot_journal_of_a_killed_commit_is_read_through_and_then_rolled_back(tmp_path):
    """A commit killed half applied, built by hand: the reader sees the previous commit (never
    changing the file), the next writer of the path rolls it back, the journal goes."""
    path = tmp_path / "t.h5"
    scenario(path, run=0, batches=3, replace_at=None, ack=Acks(0), phase=lambda _: None)
    before = path.read_bytes()
    fd = os.open(path, os.O_RDWR)
    cf = journal.CommittedFile(fd, path)
    entries = [journal.Entry(0, before[:4096]), journal.Entry(len(before) - 100, before[-100:])]
    cf.journal.hot(len(before), entries)
    os.pwrite(fd, b"\xff" * 4096, 0)  # the commit's first page applied, then the kill
    os.ftruncate(fd, len(before) - 50)
    os.close(fd)
    damaged = path.read_bytes()
    assert check_file(path, None) is None and run_of(path) == 0
    assert path.read_bytes() == damaged  # reading changed nothing
    assert journal.recover(path) is True
    assert path.read_bytes() == before and not journal.journal_path(path).exists()


def test_journals_that_are_not_the_files_are_never_applied(tmp_path):
    path = tmp_path / "t.h5"
    scenario(path, run=0, batches=2, replace_at=None, ack=Acks(0), phase=lambda _: None)
    good = path.read_bytes()
    jpath = journal.journal_path(path)
    other = tmp_path / "other"
    other.write_bytes(b"x" * 8192)
    fd = os.open(other, os.O_RDWR)
    foreign = journal.Journal(path, fd, durable=False)  # a journal naming another inode
    foreign.hot(8192, [journal.Entry(0, b"\0" * 4096)])
    os.close(fd)
    assert check_file(path, None) is None
    assert journal.recover(path) is False and path.read_bytes() == good and not jpath.exists()
    for junk in (b"", b"JAXLOGJ1" + b"\xff" * 200, os.urandom(5000)):  # torn or hostile: not a journal
        jpath.write_bytes(junk)
        assert journal.read_state(path) is None and check_file(path, None) is None
    jpath.unlink()
    jpath.symlink_to(other)  # a link planted at the journal's name: the writer never writes through it
    w = jl.HDF5Writer(path)
    w.open(SCHEMA, {"provenance": {}, "scenario_run": 5})
    w.write(frames(0, 6, 5))
    w.close()
    assert other.read_bytes() == b"x" * 8192 and run_of(path) == 5
    assert not os.path.lexists(jpath)
