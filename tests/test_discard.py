"""Discarded artifact directories: gone from their place at once, deleted from the disk after the
session without it waiting, trash of killed sessions deleted by the next one, a live one's kept."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from pytest_jaxlog.harness.artifacts import Discard


def _gone(path: Path, within: float = 60.0) -> bool:
    deadline = time.monotonic() + within
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not path.exists()


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_discarded_directories_leave_at_once_and_the_disk_after_finish(tmp_path):
    base = tmp_path / ".jaxlog"
    dirs = []
    for i in range(3):
        d = base / f"test_{i}"
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "trajectory.h5").write_bytes(b"x" * 1000)
        dirs.append(d)
    dead = base / f".trash-{_dead_pid()}-abc"
    (dead / "1").mkdir(parents=True)
    live = base / f".trash-{os.getppid()}-def"  # the process that started this one: alive
    (live / "1").mkdir(parents=True)
    discard = Discard(base)
    for d in dirs:
        discard(d)
        assert not d.exists()  # the name is free at once
    assert discard.trash.is_dir() and len(list(discard.trash.iterdir())) == 3
    discard.finish()
    assert _gone(discard.trash) and _gone(dead)
    assert live.is_dir()  # another session's, still running
    assert sorted(p.name for p in base.iterdir()) == [live.name]


def test_nothing_discarded_touches_nothing(tmp_path):
    dead = tmp_path / f".trash-{_dead_pid()}-x"
    dead.mkdir()  # even a dead process's trash waits for a session that discards something
    Discard(tmp_path).finish()
    assert dead.is_dir()
