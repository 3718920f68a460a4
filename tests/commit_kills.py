"""The kill campaign of ``test_storage_commit.py``: ``python commit_kills.py DIR RUNS SEED
[FIRST_OP]`` prints one JSON line (kills by where they landed, and every file that failed its check).

Each kill forks a writer that SIGKILLs itself at a chosen system call of its commits (every call
of the scenario in turn: the journal's writes and syncs, the pages applied, the journal zeroed,
the renames, the removals beside the path), in the phase it was in (flush, checkpoint, close,
open, or a swap of a writer that takes the path at a checkpoint); one in five is killed instead
by this process after a random delay. A forked checker then loads what the path holds: it must
load, hold only the values its run wrote, and every frame and checkpoint its run acknowledged.
The file carried away without what lies beside it must read the same: copied (``cp``), moved
(``mv``, then moved back) and uploaded without its dot files (as CI artifact uploads do), each
checked as the path is and read frame for frame against it; and another whole file put in its
place (``cp`` over it, the kill's leftovers beside it) must read as that file. The next writer of
the path starts from what the kill left (rolling back a half-applied commit). No jax: forking a
process with jax's threads is unsafe.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from commit_faults import SCHEMA, Acks, CountingDisk, KillingDisk, check_file, run_of, scenario  # noqa: E402
from pytest_jaxlog.store.hdf5 import journal# noqa: E402

BATCHES = 4
WITHOUT_JOURNAL = os.environ.get("JAXLOG_TEST_WITHOUT_JOURNAL") == "1"
KINDS = {"fresh": None, "swap": 5}  # replace_at: the writer takes the path at its checkpoint of step 17


def _read_all(fd: int) -> str:
    chunks = []
    while True:
        b = os.read(fd, 65536)
        if not b:
            return b"".join(chunks).decode()
        chunks.append(b)


def _fork(fn) -> tuple[int, int]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            fn(w)
        except BaseException as exc:  # noqa: BLE001
            os.write(w, f"error {type(exc).__name__}: {exc}\n".encode())
        os._exit(0)
    os.close(w)
    return pid, r


def _writer(path: Path, run: int, kind: str, at: int | None):
    replace_at = None if KINDS[kind] is None else 17

    def body(w: int) -> None:
        say = lambda text: os.write(w, (text + "\n").encode())  # noqa: E731
        disk = KillingDisk(at, report=lambda op: say(f"kill {op}")) if at else CountingDisk()
        if at is None:
            disk.at = None
        journal.SYSTEM = disk
        if WITHOUT_JOURNAL:  # the control: commits applied in place with no journal to roll them back
            journal.Journal.hot = lambda *a, **k: None  # type: ignore[method-assign]
            journal.Journal.clean = lambda *a, **k: None  # type: ignore[method-assign]

        def phase(name: str) -> None:
            disk.phase = ("swap-" + name) if replace_at is not None and name == "checkpoint" else name

        try:
            scenario(path, run=run, batches=BATCHES, replace_at=replace_at,
                     ack=lambda kind, step: say(f"ack {kind} {step}"), phase=phase)
        finally:
            say(f"ops {len(disk.ops)}")

    return body


def _contents(path: Path) -> list | None:
    """Every step and value ``path`` reads back (None: it does not load)."""
    from pytest_jaxlog.errors import JaxlogError
    from pytest_jaxlog.store.hdf5.trajectory import load

    try:
        traj = load(path)
        return [(traj.steps(leaf.path).tolist(), traj.values(leaf.path).tobytes()) for leaf in SCHEMA.leaves]
    except JaxlogError:
        return None


def _overwrite(path: Path, data: bytes) -> None:
    """``cp`` onto an existing file: its inode keeps the name, with other bytes."""
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(data)


def carried(path: Path, expect: Acks | None, scratch: Path, reference: Path) -> list[str]:
    """What is wrong with ``path`` read elsewhere, without the files beside it: a copy under
    another name, the file moved (and moved back), the directory uploaded without its dot files;
    each must pass the path's check and read exactly what the path reads. And another file put at
    the path (``cp`` over it, so the inode the kill left: the ``reference`` file), with what the
    kill left beside it, must read exactly as that file (the path's bytes are then put back)."""
    problems: list[str] = []
    want = _contents(path)
    copy, upload = scratch / "copy" / "copied.h5", scratch / "upload"
    copy.parent.mkdir(parents=True)
    shutil.copyfile(path, copy)
    upload.mkdir()
    for entry in os.scandir(path.parent):
        if not entry.name.startswith(".") and entry.is_file(follow_symlinks=False):
            shutil.copyfile(entry.path, upload / entry.name)
    left = path.read_bytes()
    moved = path.with_name("moved.h5")
    os.rename(path, moved)
    try:
        for how, where in (("copied", copy), ("moved", moved), ("uploaded without dot files", upload / path.name)):
            problem = check_file(where, expect)
            if problem is None and _contents(where) != want:
                problem = "reads other frames than the file it was made from"
            if problem is not None:
                problems.append(f"{how}: {problem}")
    finally:
        os.rename(moved, path)
        shutil.rmtree(scratch)
    _overwrite(path, reference.read_bytes())
    try:
        problem = check_file(path, None)
        if problem is None and _contents(path) != _contents(reference):
            problem = "reads other frames than the file put there"
        if problem is not None:
            problems.append(f"another file put in its place: {problem}")
    finally:
        _overwrite(path, left)
    return problems


def _dry_counts(base: Path) -> dict[str, int]:
    counts = {}
    for kind in KINDS:
        d = base / f"dry-{kind}"
        d.mkdir()
        for run in (0, 1):
            pid, r = _fork(_writer(d / "t.h5", run, kind, None))
            out = _read_all(r)
            os.close(r)
            os.waitpid(pid, 0)
        counts[kind] = int(out.split("ops ")[-1].split()[0])
    return counts


def main(base: Path, kills: int, seed: int, first_op: int = 1) -> dict:
    rng = random.Random(seed)
    counts = _dry_counts(base)
    where: Counter = Counter()
    failures: list[str] = []
    checked = hot = 0
    paths = {kind: base / kind / "t.h5" for kind in KINDS}
    held: dict[str, Acks | None] = {kind: None for kind in KINDS}  # what the file at each path must hold
    nexts = {kind: first_op for kind in KINDS}
    run = 0
    reference = base / "reference" / "t.h5"  # a whole file of another run, put in place of killed ones
    reference.parent.mkdir()
    pid, r = _fork(_writer(reference, 99, "fresh", None))
    _read_all(r)
    os.close(r)
    os.waitpid(pid, 0)
    for kind, path in paths.items():  # each path starts with a whole file (run 0)
        path.parent.mkdir()
        pid, r = _fork(_writer(path, run, kind if kind == "fresh" else "fresh", None))
        out = _read_all(r)
        os.close(r)
        os.waitpid(pid, 0)
        acks = Acks(0)
        for line in out.splitlines():
            if line.startswith("ack "):
                _, k, step = line.split()
                acks(k, int(step))
        held[kind] = acks
    for i in range(kills):
        kind = list(KINDS)[i % len(KINDS)]
        path = paths[kind]
        run += 1
        timed = i % 5 == 4
        at = None
        if not timed:
            at = nexts[kind]
            nexts[kind] = at % counts[kind] + 1
        pid, r = _fork(_writer(path, run, kind, at))
        if timed:
            time.sleep(rng.uniform(0.0, 0.03))
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out = _read_all(r)
        os.close(r)
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        acks = Acks(run, 17 if KINDS[kind] is not None else None)
        label = "timed" if timed else "none"
        for line in out.splitlines():
            if line.startswith("ack "):
                _, k, step = line.split()
                acks(k, int(step))
            elif line.startswith("kill "):
                label = line.split()[1]
            elif line.startswith("error "):
                failures.append(f"kill {i} ({kind}, op {at}): the writer raised: {line}")
        if killed:
            where[f"{kind}/{label.split(':')[0]}" if label != "timed" else f"{kind}/timed"] += 1
        # what the path must hold: the new run's acknowledged frames once it had the path, else
        # the file it held before (or the new run's, had it taken the path unacknowledged)
        def check(w: int, acks=acks, before=held[kind]) -> None:
            at_path = run_of(path)
            expect = acks if acks.in_place or at_path == acks.run else before
            state = journal.read_state(path)
            verdict = {"run": at_path, "problem": check_file(path, expect), "hot": bool(state is not None and state.hot),
                       "carried": carried(path, expect, base / "carried", reference)}
            os.write(w, json.dumps(verdict).encode())

        cpid, cr = _fork(check)
        text = _read_all(cr)
        os.close(cr)
        os.waitpid(cpid, 0)
        checked += 1
        try:
            verdict = json.loads(text)
        except ValueError:
            verdict = {"run": None, "problem": f"the checker died: {text[-500:]}", "hot": False, "carried": []}
        at_path = str(verdict["run"])
        hot += verdict["hot"]
        if verdict["problem"] is not None:
            failures.append(f"kill {i} ({kind}, op {at}, {label}): {verdict['problem']}")
        for problem in verdict["carried"]:
            failures.append(f"kill {i} ({kind}, op {at}, {label}{', hot' if verdict['hot'] else ''}): {problem}")
        if at_path == str(run):  # the path holds this run's file now: what it acknowledged must stay
            held[kind] = acks
    return {"kills": sum(where.values()), "runs": kills, "checked": checked, "where": dict(sorted(where.items())),
            "ops": counts, "failures": failures[:20], "failed": len(failures), "hot": hot}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), *map(int, sys.argv[2:]))))
