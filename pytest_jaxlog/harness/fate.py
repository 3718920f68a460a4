"""Shared fate of the child processes of one multi-process test.

The processes of a ``jax.distributed`` program wait for each other in every collective, so one
that fails leaves the others blocked: without help a failing process turns into a hang. The
parent watches every process's reports as they come (each child rewrites its report file after
each phase) and, once one fails, lets it finish its own teardown (its files closed, its
manifest entry made) for at most ``GRACE_S``, then stops the others: SIGTERM first (a child
pytest turns it into an interrupt: its runs stop with their files ``stopped``), SIGKILL after
``GRACE_S`` for one blocked in a collective, where no Python signal handler runs. A group that
runs past its timeout is stopped the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

GRACE_S = 5.0  # a failing process's own teardown; then SIGTERM's lead time before SIGKILL
POLL_S = 0.1


@dataclass
class Member:
    """One process of the group: its child pytest, where it reports, what it printed."""

    index: int
    proc: subprocess.Popen
    report: Path
    output: Path
    reports: list[dict] = field(default_factory=list)  # serialised TestReports, as the child wrote them
    stopped: str | None = None  # SIGTERM or SIGKILL when the parent ended it

    def read(self) -> None:
        try:
            data = json.loads(self.report.read_text())
        except (OSError, ValueError):  # not written yet (each write is atomic: never half a file)
            return
        self.reports = list(data.get("reports", ()))

    def failed(self) -> bool:
        """A failed phase, or an exit with an error before reporting one (a crash, a usage error)."""
        code = self.proc.poll()
        return any(r.get("outcome") == "failed" for r in self.reports) or (code is not None and code != 0)

    def finished(self) -> bool:
        return self.proc.poll() is not None or any(r.get("when") == "teardown" for r in self.reports)

    def tail(self, chars: int = 6000) -> str:
        try:
            text = self.output.read_text(errors="replace")
        except OSError:
            return ""
        return text[-chars:]


@dataclass(frozen=True)
class Ending:
    """How the group ended: the process that failed first (None if none did), and whether the
    group ran past its timeout."""

    first_failed: int | None
    timed_out: bool


def watch(members: list[Member], timeout_s: float) -> Ending:
    """Wait for every process; stop them all when one fails or the timeout passes."""
    deadline = time.monotonic() + timeout_s
    first: int | None = None
    grace_until = 0.0
    while True:
        for m in members:
            m.read()
        if first is None:
            first = next((m.index for m in members if m.failed()), None)
            grace_until = time.monotonic() + GRACE_S
        alive = [m for m in members if m.proc.poll() is None]
        if not alive:
            break
        if first is not None and (members[first].finished() or time.monotonic() > grace_until):
            stop([m for m in alive if m.index != first])
            _let_finish(members[first], grace_until + GRACE_S)
            break
        if time.monotonic() > deadline:
            stop(alive)
            for m in members:
                m.read()
            return Ending(first, True)
        time.sleep(POLL_S)
    for m in members:
        m.read()
    return Ending(first, False)


def _let_finish(m: Member, until: float) -> None:
    """The failing process past its teardown is still writing its reports and its manifest entry:
    a signal now would land inside pytest's report hooks (a traceback in its output, an entry
    lost), so it is left to exit on its own until ``until``, and stopped only after that."""
    while m.proc.poll() is None and time.monotonic() < until:
        time.sleep(POLL_S)
    if m.proc.poll() is None:
        stop([m])


def _signal(m: Member, sig: int) -> None:
    """``sig`` to the child's process group (it started one: the test may have started processes too)."""
    try:
        os.killpg(m.proc.pid, sig)
    except (AttributeError, ProcessLookupError, PermissionError):
        try:
            m.proc.send_signal(sig)
        except ProcessLookupError:
            pass


def stop(members: list[Member]) -> None:
    """SIGTERM to every member still running, SIGKILL to those alive ``GRACE_S`` later."""
    for m in members:
        if m.proc.poll() is None:
            _signal(m, signal.SIGTERM)
            m.stopped = "SIGTERM"
    deadline = time.monotonic() + GRACE_S
    for m in members:
        try:
            m.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(m, getattr(signal, "SIGKILL", signal.SIGTERM))
            m.stopped = "SIGKILL"
            m.proc.wait()


@contextmanager
def cores_held(base: Path) -> Iterator[None]:
    """One multi-process test at a time for all sessions writing to ``base`` (the workers of one
    xdist session share it): their N processes each want the machine's cores, and two groups
    side by side only slow each other into their timeouts. No lock where ``fcntl`` is missing."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    digest = hashlib.sha1(str(base).encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"jaxlog-processes-{digest}.lock"
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
