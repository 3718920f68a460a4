"""Removing the artifact directories of tests that keep none, off the tests' own time.

Why: deleting a test's files (an HDF5 trajectory, a timeline) costs milliseconds of filesystem
work per test, often more than the fixture's other bookkeeping together, and a hand-written test
with ``tmp_path`` pays nothing for it (pytest keeps its temporary directories). So a directory is
renamed into a trash folder at once (its name is free and ``exists()`` is false from then on) and
the trash is deleted when the session finishes, in one go, by an ``rm -rf`` of its own that the
session does not wait for (40 tests' directories took ~0.3 s of ``shutil.rmtree`` at the end of
every session; where there is no ``rm``, that is what deletes them). A thread deleting during the
session was tried: its Python-level work in ``shutil.rmtree`` holds the GIL for up to the switch
interval, which the tests then wait for. Trash left by a process killed before it deleted its
own is deleted by the next session. Imports the standard library only.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

from .compile_cache import alive


class Discard:
    """``discard(d)``: the directory is gone from its place now; ``finish()`` deletes it from the disk."""

    def __init__(self, base: Path):
        self.trash = base / f".trash-{os.getpid()}-{secrets.token_hex(3)}"  # one per session
        self._count = 0

    def __call__(self, d: Path) -> None:
        try:
            self.trash.mkdir(parents=True, exist_ok=True)
            self._count += 1
            os.rename(d, self.trash / str(self._count))
        except OSError:  # another filesystem, a file held open elsewhere: removed here, best effort
            shutil.rmtree(d, ignore_errors=True)

    def finish(self) -> None:
        """Delete the trash, and that of processes of this session's kind killed before they could,
        in the background where the system has ``rm``."""
        if not self._count:
            return
        doomed = [self.trash]
        for old in self.trash.parent.glob(".trash-*"):
            pid = old.name[len(".trash-"):].split("-")[0]
            if pid.isdigit() and int(pid) != os.getpid() and not alive(int(pid)):
                doomed.append(old)
        rm = shutil.which("rm") if os.name == "posix" else None
        if rm is not None:
            try:
                subprocess.Popen([rm, "-rf", "--", *map(str, doomed)], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
                return
            except OSError:
                pass  # cannot start it: deleted here
        for d in doomed:
            shutil.rmtree(d, ignore_errors=True)
