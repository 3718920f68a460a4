"""Commits (store/hdf5/journal.py): a kill or a power loss at any system call of a commit leaves a
file that loads, with every frame and checkpoint acknowledged before it, and nothing else wrong;
a reader polling a live file never sees half a commit.

Acknowledged: ``flush()``, a checkpoint's flush, or ``close()`` returned. The kills are real
SIGKILLs at each system call of the scenario's commits in turn (``commit_kills.py``); the power
losses keep, of what was not synced, any subset of the writes, some torn to whole sectors
(``commit_faults.LossyDisk``). The file, each time, must read the same carried away from what
lies beside it: copied, moved, uploaded without its dot files (the journal is inside the file);
and another file put in its place must read as itself. Without the journal the same kills leave
wrong values: the control shows the campaign can fail.
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
from pytest_jaxlog.store.hdf5 import journal

sys.path.insert(0, str(Path(__file__).parent))
from commit_faults import (SCHEMA, STEPS_PER_BATCH, Acks, CountingDisk, LossyDisk, check_file, frames, old_journal,  # noqa: E402
                           run_of, scenario, values)
from commit_kills import carried  # noqa: E402

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
    assert out["hot"] >= 150, out  # kills that left a commit half applied: read alone, elsewhere, the same
    where = out["where"]
    for place in ("fresh/open", "fresh/flush", "fresh/checkpoint", "fresh/timed",
                  "swap/open", "swap/flush", "swap/swap-checkpoint", "swap/timed"):
        assert where.get(place, 0) >= 20, (place, where)
    assert where.get("fresh/close", 0) >= 5 and where.get("swap/close", 0) >= 5, where  # a close is a few calls
    # every system call of both scenarios was a kill point (the calls are cycled through in order)
    assert sum(v for k, v in where.items() if not k.endswith("timed")) >= sum(out["ops"].values())


def test_a_file_killed_mid_commit_reads_the_same_copied_moved_or_uploaded_without_its_dot_files(tmp_path):
    """The campaign's checks of the file carried away from what lies beside it (``carried`` in
    ``commit_kills.py``: every kill of the campaign above runs them too), here on a sample of
    kills inside the flushes and checkpoints, where commits are left half applied."""
    out = _campaign(tmp_path, 60, first_op=45)
    assert out["failed"] == 0, out["failures"]
    assert out["hot"] >= 10, out  # was: 4 in 11 of them read the new values with steps 0, no error


def test_the_same_kills_without_the_journal_leave_wrong_or_unreadable_files(tmp_path):
    out = _campaign(tmp_path, 90, first_op=45, without_journal=True)
    assert out["failed"] > 0, out
    assert all("wrong values" in f or "does not load" in f or "lost" in f for f in out["failures"])


def _power_loss_run(d: Path, kind: str, at: int, rng: random.Random, monkeypatch, reference: Path) -> str | None:
    """A whole file (run 0) at the path, then run 1 until the power goes at its ``at``-th call;
    the files as the loss left them must hold what was acknowledged, read as they are (at the
    path, and carried away from what lies beside it: ``commit_kills.carried``) and after the next
    writer rolled back a half-applied commit."""
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
    for first in (True, False):  # as the loss left it; then after the next writer's roll-back
        at_path = run_of(path)
        expect = acks if acks.in_place or at_path == 1 else before
        problems = [problem for problem in [check_file(path, expect)] if problem]
        if first and not problems:
            problems = carried(path, expect, d / "carried", reference)
        if problems:
            return f"{kind}, power lost at call {at} ({disk.ops[-1]}): {'; '.join(problems)}"
        journal.recover(path)
    return None


@pytest.mark.parametrize("kind", ["fresh", "swap"])
def test_a_power_loss_at_any_system_call_keeps_every_acknowledged_frame(tmp_path, monkeypatch, kind):
    counter = CountingDisk()
    monkeypatch.setattr(journal, "SYSTEM", counter)
    scenario(tmp_path / "dry.h5", run=1, batches=3, replace_at=17 if kind == "swap" else None, ack=Acks(1),
             phase=lambda name: setattr(counter, "phase", name))
    total = len(counter.ops)
    # a power loss in every phase of the file's life: 60 calls fresh, 38 swapped (the writer batches its writes)
    assert any(op.endswith("sync") for op in counter.ops) and total > 30
    assert {op.split(":")[0] for op in counter.ops} == {"open", "flush", "checkpoint", "close"}, counter.ops
    rng = random.Random(kind)
    problems, losses = [], 0
    reference = tmp_path / "reference" / "t.h5"
    reference.parent.mkdir()
    scenario(reference, run=99, batches=1, replace_at=None, ack=Acks(99), phase=lambda _: None)
    for at in range(1, total + 1):
        d = tmp_path / str(at)
        d.mkdir()
        problem = _power_loss_run(d, kind, at, rng, monkeypatch, reference)
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



def test_the_writers_small_writes_reach_the_disk_together(tmp_path, monkeypatch):
    """On the writer thread each system call is handed to the disk's helper thread and waited for
    (tens of microseconds, more than the call): HDF5's small writes of 20 batches and of their
    commit, new bytes and rewritten pages, go in a few calls, and the file reads every frame."""
    counter = CountingDisk()
    monkeypatch.setattr(journal, "SYSTEM", counter)
    path = tmp_path / "t.h5"
    w = jl.HDF5Writer(path, flush_every_s=1e9)
    w.open(SCHEMA, {"provenance": {}})
    opened = len(counter.ops)
    for k in range(20):
        w.write(frames(STEPS_PER_BATCH * k, STEPS_PER_BATCH * (k + 1), 0))
    w.flush()
    made = counter.ops[opened:]
    w.close()
    # new bytes in one or two runs, the journal, the pages in a run, the journal zeroed: three syncs
    assert made.count("open:sync") == 3 and made.count("open:write") <= 8, made
    assert check_file(path, None) is None
    traj = jl.load(path)
    steps = np.arange(20 * STEPS_PER_BATCH)
    np.testing.assert_array_equal(traj["x"], values("x", steps, 0))
    np.testing.assert_array_equal(traj["e"], values("e", steps[::2], 0))


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
    from pytest_jaxlog.store.hdf5.parts import PartsWriter

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
from pytest_jaxlog.store.hdf5.writer import HDF5Writer
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
    changing the file), wherever the file went; the next writer of the path rolls it back."""
    path = tmp_path / "t.h5"
    scenario(path, run=0, batches=3, replace_at=None, ack=Acks(0), phase=lambda _: None)
    before = path.read_bytes()
    fd = os.open(path, os.O_RDWR)
    cf = journal.CommittedFile(fd, path)
    last = (len(before) - 1) // journal.PAGE * journal.PAGE
    entries = [journal.Entry(0, before[:4096]), journal.Entry(last, before[last:])]
    cf.journal.hot(len(before), entries, size=len(before), start=len(before))
    os.pwrite(fd, b"\xff" * 4096, 0)  # the commit's first and last pages applied, then the kill
    os.pwrite(fd, b"\xee" * (len(before) - last), last)
    cf.journal.unlock()  # (which frees the writer's lock on the journal beside the file)
    os.close(fd)
    damaged = path.read_bytes()
    assert len(damaged) > len(before) and journal.read_state(path).committed == len(before)
    assert check_file(path, None) is None and run_of(path) == 0
    assert path.read_bytes() == damaged  # reading changed nothing
    away = tmp_path / "away"
    away.mkdir()
    (away / "copied.h5").write_bytes(damaged)  # carried without what lies beside it: reads the same commit
    assert check_file(away / "copied.h5", None) is None and run_of(away / "copied.h5") == 0
    assert journal.recover(path) is True
    assert path.read_bytes() == before and not journal.journal_path(path).exists()
    assert journal.read_state(path) is None and journal.recover(path) is False


def test_journals_that_are_not_the_files_are_never_applied(tmp_path):
    """Nothing beside a file is applied to it: a rollback journal of the earlier format naming
    the file itself (stale: the file was put at the path after it), junk, a link; each is
    ignored with one note, and the next writer removes it (never writing through a link)."""
    path = tmp_path / "t.h5"
    scenario(path, run=0, batches=2, replace_at=None, ack=Acks(0), phase=lambda _: None)
    good = path.read_bytes()
    jpath = journal.journal_path(path)
    other = tmp_path / "other"
    other.write_bytes(b"x" * 8192)
    jpath.write_bytes(old_journal(path, [(0, b"\0" * 4096)]))  # would zero the superblock, were it applied
    with pytest.warns(jl.JaxlogRuntimeWarning, match=r"^\[jaxlog\] .*ignoring \.t\.h5\.jaxlog-journal .*earlier"):
        assert check_file(path, None) is None
    assert journal.recover(path) is False and path.read_bytes() == good and not jpath.exists()
    with pytest.warns(jl.JaxlogRuntimeWarning, match="not a file of pytest-jaxlog"):
        for junk in (b"", b"JAXLOGJ1" + b"\xff" * 200, os.urandom(5000)):  # torn or hostile: not a journal
            jpath.write_bytes(junk)
            assert journal.read_state(path) is None and journal.generation(path) is None
            assert check_file(path, None) is None and path.read_bytes() == good
    jpath.unlink()
    jpath.symlink_to(other)  # a link planted at the journal's name: the writer never writes through it
    w = jl.HDF5Writer(path)
    w.open(SCHEMA, {"provenance": {}, "scenario_run": 5})
    w.write(frames(0, 6, 5))
    w.close()
    assert other.read_bytes() == b"x" * 8192 and run_of(path) == 5
    assert not os.path.lexists(jpath)


class _FailingDisk(journal.Disk):
    """Once armed, fails (EIO) the second sync, the one after a commit's pages are applied; with
    ``forever``, every call after it too (a disk gone)."""

    def __init__(self, forever: bool):
        self.forever = forever
        self.armed = False
        self.syncs = 0
        self.broken = False

    def _check(self) -> None:
        if self.broken and self.forever:
            raise OSError(5, "Input/output error")

    def pwrite(self, fd, data, offset):
        self._check()
        super().pwrite(fd, data, offset)

    def fsync(self, fd):
        self._check()
        if self.armed:
            self.syncs += 1
            if self.syncs == 2:
                self.broken = True
                raise OSError(5, "Input/output error")
        super().fsync(fd)


@pytest.mark.parametrize("forever", [False, True], ids=["transient", "disk gone"])
def test_a_commit_failing_after_its_journal_is_whole_leaves_the_last_commit(tmp_path, monkeypatch, forever):
    """The commit's pages are put back from its journal and the writer finishes the file as
    failed with what it holds; where even that fails, nothing more is written, and the file
    reads as of its last commit through the journal in it until the next writer rolls it back."""
    path = tmp_path / "t.h5"
    disk = _FailingDisk(forever)
    monkeypatch.setattr(journal, "SYSTEM", disk)
    w = jl.HDF5Writer(path, flush_every_s=1e9)
    w.open(SCHEMA, {"provenance": {}, "scenario_run": 0})
    w.write(frames(0, 6, 0))
    w.flush()
    w.write(frames(6, 12, 0))
    disk.armed = True
    with pytest.raises(jl.WriterError, match="Input/output error"):
        w.flush()
    assert check_file(path, Acks(0)) is None and list(jl.load(path).steps("x")) == list(range(6))
    assert (journal.read_state(path) is not None) == forever  # put back, or read through
    w.close("failed")
    monkeypatch.setattr(journal, "SYSTEM", journal.Disk())
    traj = jl.load(path)
    if forever:
        assert traj.status == "running" and list(traj.steps("x")) == list(range(6))
        assert journal.recover(path) is True and journal.read_state(path) is None
        assert list(jl.load(path).steps("x")) == list(range(6))
    else:  # the frames handed over before the failure, committed with the status
        assert traj.status == "failed" and "Input/output error" in traj.writer_error
        assert list(traj.steps("x")) == list(range(12)) and check_file(path, None) is None
