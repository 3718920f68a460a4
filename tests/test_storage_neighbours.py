"""Files planted beside a trajectory never hang it, break it, or change what it reads.

Beside ``t.h5`` a live writer keeps ``.t.h5.jaxlog-journal``, the commit generation and lock its
readers check (the rollback journal of a commit is inside the file: ``store/hdf5/journal.py``).
Whatever is planted at that name, for real (a FIFO, a directory, a link to a file elsewhere,
megabytes of junk, a header declaring 16 GiB, a rollback journal of the earlier format with
300,000 empty entries naming the file itself, a stale one that would zero the superblock, the
journal of another file), ``jl.load``, ``jaxlog info`` and ``jl.run`` each either work exactly or
fail with one ``JaxlogError`` naming it, within bounded work: nothing there is opened blocking or
read past a fixed-size header, nothing there is applied, and a note says it is ignored. The FIFO
cases run in a child process with a timeout, so that a hang fails the test instead of hanging
the suite. The rollback journal inside a file is checked the same way before anything it
declares is read.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.cli import main as cli
from pytest_jaxlog.store.hdf5 import journal

sys.path.insert(0, str(Path(__file__).parent))
from commit_faults import SCHEMA, frames, old_journal  # noqa: E402

HERE = Path(__file__).parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
       "JAX_PLATFORMS": "cpu"}
GUARD_S = 120  # a hang guard for the child processes, not a performance threshold
STEPS = 40
PRECIOUS = b"bytes beside the trajectory that nothing may change\n" * 8


def write(path: Path, start: float = 0.0) -> None:
    jl.run(lambda s: s + 1.0, jnp.full(3, start, jnp.float32), STEPS, record={"x": lambda s: s, "e": lambda s: s[0]},
           sinks=[jl.HDF5Writer(path)], progress=False)


def _load_exact(path: Path, start: float) -> str:
    traj = jl.load(path)
    steps = np.arange(STEPS + 1)
    if traj.status == "complete" and traj.steps_done == STEPS and np.array_equal(traj.steps("x"), steps) \
            and np.array_equal(traj["e"], start + steps.astype(np.float32)) \
            and np.array_equal(traj["x"], np.repeat((start + steps.astype(np.float32))[:, None], 3, 1)):
        return "exact"
    return f"wrong: {traj!r}, steps {traj.steps('x')}, e {traj['e']}"


def _info_exact(path: Path) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli(["info", str(path)])
    if rc == 2 and err.getvalue().count("\n") == 1 and err.getvalue().startswith("[jaxlog]"):
        return f"error: {err.getvalue().strip()}"
    lines = [line.split() for line in out.getvalue().splitlines()]
    ok = rc == 0 and all(["41", "frames,", "steps", "0..40"] == row[3:7] for row in lines if row[:1] in (["x"], ["e"]))
    return "exact" if ok and sum(row[:1] in (["x"], ["e"]) for row in lines) == 2 else \
        f"wrong: rc {rc}: {out.getvalue()} {err.getvalue()}"


def _outcome(fn) -> str:
    """'exact', or the one JaxlogError raised ('error: ...'); any other exception fails the test."""
    try:
        return fn()
    except jl.JaxlogError as exc:
        return f"error: {exc}"


def load_info_run(path: Path) -> dict:
    """What ``jl.load``, ``jaxlog info`` and a new ``jl.run`` over ``path`` make of it, with the
    notes they gave (warnings); ``kept``: whether a run that failed left the file as it was."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out: dict = {"load": _outcome(lambda: _load_exact(path, 0.0)), "info": _outcome(lambda: _info_exact(path))}
        before = path.read_bytes()
        try:
            write(path, 100.0)
            out["run"] = _outcome(lambda: _load_exact(path, 100.0))
        except jl.JaxlogError as exc:
            out["run"] = f"error: {exc}"
            out["kept"] = path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir() if p.name != "outside")
    out["notes"] = sorted({str(w.message) for w in caught if issubclass(w.category, jl.JaxlogRuntimeWarning)})
    return out


# -- what is planted at the journal's name --------------------------------------------------------

def _fifo(path: Path) -> None:
    os.mkfifo(journal.journal_path(path))


def _directory(path: Path) -> None:
    d = journal.journal_path(path)
    d.mkdir()
    (d / "inside").write_bytes(PRECIOUS)


def _symlink(path: Path) -> None:
    outside = path.parent / "outside"
    outside.write_bytes(PRECIOUS)
    journal.journal_path(path).symlink_to(outside)


def _junk(path: Path) -> None:
    journal.journal_path(path).write_bytes(np.random.default_rng(0).bytes(4 << 20))


def _declares_16_gib(path: Path) -> None:  # was a raw MemoryError
    journal.journal_path(path).write_bytes(old_journal(path, [], declared=1 << 34))


def _empty_entries(path: Path) -> None:  # 300,000 entries naming the file itself: was over 60 s a load
    journal.journal_path(path).write_bytes(old_journal(path, [(0, b"")] * 300_000))


def _stale_old_journal(path: Path) -> None:  # hot, naming the file's inode: would zero its superblock
    journal.journal_path(path).write_bytes(old_journal(path, [(0, bytes(4096))], committed=4096))


def _another_files_journal(path: Path) -> None:
    """What a live writer of another file keeps beside it, copied here (a current one)."""
    other = path.parent / "other" / "o.h5"
    other.parent.mkdir()
    w = jl.HDF5Writer(other, flush_every_s=1e9)
    w.open(SCHEMA, {"provenance": {}})
    for lo in (0, 6, 12):  # the later flushes rewrite committed bytes: the writer has its journal
        w.write(frames(lo, lo + 6, 0))
        w.flush()
    shutil.copyfile(journal.journal_path(other), journal.journal_path(path))
    w.close()


PLANTS = {"fifo": _fifo, "directory": _directory, "symlink": _symlink, "junk": _junk,
          "declares 16 GiB": _declares_16_gib, "300,000 empty entries": _empty_entries,
          "stale journal of the earlier format": _stale_old_journal, "another file's journal": _another_files_journal}


@contextlib.contextmanager
def reads_of(target: Path):
    """The sizes of every read made of ``target`` (through ``os.pread`` and ``os.read``)."""
    sizes: list[int] = []
    real_pread, real_read = os.pread, os.read

    def names(fd: int) -> bool:
        try:
            return os.readlink(f"/proc/self/fd/{fd}") == str(target)
        except OSError:
            return False

    def pread(fd, n, offset):
        if names(fd):
            sizes.append(n)
        return real_pread(fd, n, offset)

    def read(fd, n):
        if names(fd):
            sizes.append(n)
        return real_read(fd, n)

    os.pread, os.read = pread, read
    try:
        yield sizes
    finally:
        os.pread, os.read = real_pread, real_read


def _check(kind: str, out: dict, path: Path) -> None:
    assert out["load"] == "exact" and out["info"] == "exact", out
    notes = out["notes"]
    if kind == "another file's journal":
        assert notes == [], notes  # a generation of another writer: harmless, never applied
    else:
        assert len(notes) == 1 and notes[0].startswith("[jaxlog]") and "\n" not in notes[0], notes
        assert f"ignoring {journal.journal_path(path).name} beside it" in notes[0], notes
    if kind == "directory":  # refused before anything is touched (was: the file replaced, then a 0-frame file)
        assert out["run"].startswith("error: [jaxlog] cannot write") and "is a directory" in out["run"], out
        assert out["kept"] == [".t.h5.jaxlog-journal", "t.h5"], out
        assert (journal.journal_path(path) / "inside").read_bytes() == PRECIOUS
    else:
        assert out["run"] == "exact", out
        assert not os.path.lexists(journal.journal_path(path))  # the next writer removed the name, and only the name
    if kind == "symlink":
        assert (path.parent / "outside").read_bytes() == PRECIOUS


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts reads through /proc/self/fd")
@pytest.mark.parametrize("kind", [k for k in PLANTS if k != "fifo"])
def test_what_is_planted_beside_a_trajectory_is_ignored_within_bounded_reads(tmp_path, kind):
    path = tmp_path / "t.h5"
    write(path)
    PLANTS[kind](path)
    with reads_of(journal.journal_path(path)) as sizes:
        out = load_info_run(path)
    _check(kind, out, path)
    assert max(sizes, default=0) <= 64, sizes  # a fixed-size header, whatever the file declares or holds


CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import test_storage_neighbours as t

path = Path(sys.argv[2])
t.write(path)
if sys.argv[3] == "trajectory":  # the trajectory's own path a FIFO
    path.unlink()
    import os
    os.mkfifo(path)
    print(json.dumps({"load": t._outcome(lambda: t._load_exact(path, 0.0)), "info": t._outcome(lambda: t._info_exact(path))}))
else:
    t.PLANTS[sys.argv[3]](path)
    print(json.dumps(t.load_info_run(path)))
"""


def _child(tmp_path: Path, kind: str) -> dict:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD), str(HERE), str(tmp_path / "t.h5"), kind],
                       capture_output=True, text=True, env=ENV, timeout=GUARD_S, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_fifo_beside_a_trajectory_never_blocks_load_info_or_run(tmp_path):
    """Was: ``jl.load``, ``jaxlog info`` and ``jl.run`` waited forever for a writer of the FIFO."""
    out = _child(tmp_path, "fifo")
    _check("fifo", out, tmp_path / "t.h5")


def test_a_trajectory_path_that_is_a_fifo_is_one_error_not_a_hang(tmp_path):
    out = _child(tmp_path, "trajectory")
    assert out["load"].startswith("error: [jaxlog]") and "is a FIFO, not a trajectory file" in out["load"], out
    assert out["info"].startswith("error: [jaxlog]") and "FIFO" in out["info"], out


# -- the rollback journal inside the file, hostile ------------------------------------------------

def _append_journal(path: Path, kind: str) -> None:
    """A journal appended to a whole file, as a hostile or damaged file may end."""
    data = path.read_bytes()
    size = len(data)
    entry = journal._ENTRY.pack
    if kind == "declares 16 GiB":
        payload, tail = b"", journal.Tail(1, size, size, 1 << 34, 1)
    elif kind == "300,000 empty entries":
        payload = entry(0, 0) * 300_000
        tail = journal.Tail(1, size, size, len(payload), 300_000)
    elif kind == "entries out of order":
        payload = entry(4096, 1) + data[4096:4097] + entry(0, 1) + data[:1]
        tail = journal.Tail(1, size, size, len(payload), 2)
    elif kind == "an entry past the committed file":
        payload = entry(size - 1, 2) + data[-1:] + b"\0"
        tail = journal.Tail(1, size, size, len(payload), 1)
    elif kind == "magic, then junk":
        with open(path, "ab") as f:
            f.write(journal._TAIL_MAGIC + np.random.default_rng(1).bytes(journal._TAIL.size - 8))
        return
    else:  # a whole journal of one byte a page, each the byte the file has: read through, the same file
        offsets = range(0, size, journal.PAGE)
        payload = b"".join(entry(o, 1) + data[o:o + 1] for o in offsets)
        tail = journal.Tail(1, size, size, len(payload), len(offsets))
    with open(path, "ab") as f:
        f.write(payload + journal._tail_bytes(tail, payload))


@pytest.mark.parametrize("kind", ["declares 16 GiB", "300,000 empty entries", "entries out of order",
                                  "an entry past the committed file", "magic, then junk", "whole"])
def test_a_journal_inside_a_file_is_checked_before_anything_it_declares_is_read(tmp_path, kind):
    path = tmp_path / "t.h5"
    write(path)
    _append_journal(path, kind)
    assert (journal.read_state(path) is not None) == (kind == "whole")
    out = load_info_run(path)
    assert out == {"load": "exact", "info": "exact", "run": "exact", "notes": []}, out


# -- a hot journal's file, moved, copied, and another file put in its place -----------------------

def _half_applied(path: Path) -> bytes:
    """``path`` as a kill leaves it halfway through applying a commit (built by hand, as in
    ``test_storage_commit.py``): its superblock page rewritten, the journal whole in it."""
    before = path.read_bytes()
    fd = os.open(path, os.O_RDWR)
    try:
        cf = journal.CommittedFile(fd, path)
        cf.journal.hot(len(before), [journal.Entry(0, before[:4096])], size=len(before), start=len(before))
        os.pwrite(fd, b"\xff" * 4096, 0)
        cf.journal.unlock()  # (the kill frees the writer's lock beside the file)
    finally:
        os.close(fd)
    return before


def test_a_file_killed_mid_commit_reads_its_last_commit_wherever_it_goes(tmp_path):
    path = tmp_path / "t.h5"
    write(path)
    _half_applied(path)
    assert journal.read_state(path) is not None and journal.journal_path(path).exists()
    elsewhere = tmp_path / "upload"
    elsewhere.mkdir()
    for p in tmp_path.iterdir():  # an artifact upload that drops dot files
        if p.is_file() and not p.name.startswith("."):
            shutil.copyfile(p, elsewhere / p.name)
    os.rename(path, tmp_path / "keep.h5")  # mv: the name beside it stays behind
    for where in (elsewhere / "t.h5", tmp_path / "keep.h5"):
        assert _load_exact(where, 0.0) == "exact" and _info_exact(where) == "exact"
    # and a whole file put at the path (cp over it: the same inode), the leftovers beside it
    os.rename(tmp_path / "keep.h5", path)
    other = tmp_path / "other.h5"
    write(other, 100.0)
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(other.read_bytes())
    assert _load_exact(path, 100.0) == "exact" and _info_exact(path) == "exact"
