"""SIGTERM handled like Ctrl-C while a run records, acted on where the run can stop cleanly.

CI cancellation, job time limits and schedulers send SIGTERM; its default action kills the
process at once, losing frames handed to the writer but not yet flushed and leaving the file
``running``. The handler here never raises while a run records: Python runs a handler wherever
the main thread is, and an exception raised inside a garbage-collector callback, a ``__del__``
or a weakref callback is printed as "Exception ignored" and dropped, so the run would go on
until SIGKILL. It notes the signal instead; ``jl.run`` acts on it at its next chunk boundary and
``jl.Recorder`` at its next ``log``, raising :class:`~pytest_jaxlog.errors.Terminated` (a
KeyboardInterrupt) from their own code, so the run stops as for Ctrl-C (file ``stopped``, every
frame handed over on disk, one more checkpoint). A signal noted after the run's last boundary
is raised when the run returns. In a run over several processes the processes vote on it first
(``drive.prepare.sharding.StopVote``): one process stopping alone would leave the others waiting in a
collective.

Outside any run (a pytest session between runs, where no file of a run is open) the handler
raises at once, as Ctrl-C does; the note stays, so a raise Python dropped is acted on by the
next run's first boundary. The handler is installed only in the main thread (Python delivers
signals there) and only over the default action: a handler the user or a framework installed,
or SIGTERM being ignored, is left alone. The previous handler is restored when the scope ends.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

from ...errors import Terminated


class Noted:
    """The SIGTERM noted and not acted on yet (one per process: there is one handler)."""

    def __init__(self) -> None:
        self.signum = 0  # the signal that arrived, 0 while none did
        self.recording = 0  # runs and recorders in progress, which act on it at their boundaries

    def take(self) -> int:
        """The signal noted (0: none), now acted on."""
        signum, self.signum = self.signum, 0
        return signum

    def act(self) -> None:
        """Raise ``Terminated`` for a signal noted (a run's boundary: its own code, never a handler)."""
        if self.signum:
            raise Terminated(self.take())


NOTED = Noted()


def _note(signum, frame) -> None:
    NOTED.signum = signum
    if not NOTED.recording:  # no run to stop at a boundary: stop what runs now, as Ctrl-C does
        raise Terminated(signum)


@contextmanager
def sigterm_as_interrupt() -> Iterator[bool]:
    """SIGTERM as an interrupt for a scope that holds several runs (a pytest session); yields
    whether the handler was installed (False off the main thread or over another handler)."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        yield False
        return
    signal.signal(signal.SIGTERM, _note)
    try:
        yield True
    finally:
        signal.signal(signal.SIGTERM, previous)
        NOTED.signum = 0  # a note left belongs to this scope, not to a later one


@contextmanager
def sigterm_noted() -> Iterator[Noted | None]:
    """The scope of one run: SIGTERM noted, not raised, in the ``Noted`` yielded (None off the
    main thread or over a handler that is neither the default action nor this module's). A
    signal noted that the run did not act on is raised as ``Terminated`` when the scope ends
    without an error."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL and previous is not _note:
        yield None
        return
    NOTED.recording += 1  # before the handler: a signal from here on is noted
    if previous is not _note:
        signal.signal(signal.SIGTERM, _note)
    ended = False
    try:
        yield NOTED
        ended = True
    finally:
        if previous is not _note:
            signal.signal(signal.SIGTERM, previous)
            if not ended:  # the run's error is on its way out: the note does not outlive its handler
                NOTED.signum = 0
        NOTED.recording -= 1
    NOTED.act()
