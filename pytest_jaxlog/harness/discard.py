"""Removing the artifact directories of tests that keep none, off the tests' own time.

Why: deleting a test's files (an HDF5 trajectory, a timeline) costs milliseconds of filesystem
work per test, often more than the fixture's other bookkeeping together, and a hand-written test
with ``tmp_path`` pays nothing for it (pytest keeps its temporary directories). So a directory is
renamed into a trash folder at once (its name is free and ``exists()`` is false from then on) and
deleted by a background thread; the session waits for that thread when it finishes. Imports the
standard library only.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
from pathlib import Path

from .compile_cache import alive


class Discard:
    """``discard(d)``: the directory is gone from its place now and from the disk soon; ``finish()``
    waits until it is."""

    def __init__(self, base: Path):
        self.trash = base / f".trash-{os.getpid()}"
        self._queue: queue.SimpleQueue[Path | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._count = 0

    def __call__(self, d: Path) -> None:
        try:
            self.trash.mkdir(parents=True, exist_ok=True)
            self._count += 1
            target = self.trash / str(self._count)
            os.rename(d, target)
        except OSError:  # another filesystem, a file held open elsewhere: removed here, best effort
            shutil.rmtree(d, ignore_errors=True)
            return
        if self._thread is None:
            for old in self.trash.parent.glob(".trash-*"):  # of a process killed before it finished
                pid = old.name[len(".trash-"):]
                if pid.isdigit() and int(pid) != os.getpid() and not alive(int(pid)):
                    self._queue.put(old)
            self._thread = threading.Thread(target=self._work, name="jaxlog-discard", daemon=True)
            self._thread.start()
        self._queue.put(target)

    def _work(self) -> None:
        while (d := self._queue.get()) is not None:
            shutil.rmtree(d, ignore_errors=True)

    def finish(self) -> None:
        """Wait for the removals, then remove the trash folder itself."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        shutil.rmtree(self.trash, ignore_errors=True)
