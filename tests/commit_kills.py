"""The kill campaign of ``test_storage_commit.py``: ``python commit_kills.py DIR RUNS SEED
[FIRST_OP]`` prints one JSON line (kills by where they landed, and every file that failed its check).

Each kill forks a writer that SIGKILLs itself at a chosen system call of its commits (every call
of the scenario in turn: the journal's writes and syncs, the pages applied, the truncation, the
renames, the journal's removal), in the phase it was in (flush, checkpoint, close, open, or a
swap of a writer that takes the path at a checkpoint); one in five is killed instead by this
process after a random delay. A forked checker then loads what the path holds: it must load,
hold only the values its run wrote, and every frame and checkpoint its run acknowledged. The
next writer of the path starts from what the kill left (rolling back a half-applied commit).
No jax: forking a process with jax's threads is unsafe.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from commit_faults import Acks, CountingDisk, KillingDisk, check_file, run_of, scenario  # noqa: E402
from pytest_jaxlog.store import journal  # noqa: E402

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
    checked = 0
    paths = {kind: base / kind / "t.h5" for kind in KINDS}
    held: dict[str, Acks | None] = {kind: None for kind in KINDS}  # what the file at each path must hold
    nexts = {kind: first_op for kind in KINDS}
    run = 0
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
            os.write(w, f"{at_path}\n{check_file(path, expect) or 'ok'}".encode())

        cpid, cr = _fork(check)
        at_path, _, verdict = _read_all(cr).partition("\n")
        os.close(cr)
        os.waitpid(cpid, 0)
        checked += 1
        if verdict != "ok":
            failures.append(f"kill {i} ({kind}, op {at}, {label}): {verdict or 'the checker died'}")
        if at_path == str(run):  # the path holds this run's file now: what it acknowledged must stay
            held[kind] = acks
    return {"kills": sum(where.values()), "runs": kills, "checked": checked, "where": dict(sorted(where.items())),
            "ops": counts, "failures": failures[:20], "failed": len(failures)}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), *map(int, sys.argv[2:]))))
