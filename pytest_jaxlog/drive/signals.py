"""SIGTERM handled like Ctrl-C while a run records.

CI cancellation, job time limits and schedulers send SIGTERM; its default action kills the
process at once, losing frames handed to the writer but not yet flushed and leaving the file
``running``. While a run records, SIGTERM raises :class:`~pytest_jaxlog.errors.Terminated` (a
KeyboardInterrupt) instead, so the driver stops as for Ctrl-C. The handler is installed only in
the main thread (Python delivers signals there) and only over the default action: a handler the
user or a framework installed, or SIGTERM being ignored, is left alone. The previous handler is
restored when the run ends.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

from ..errors import Terminated


def _raise_terminated(signum, frame) -> None:
    raise Terminated(signum)


@contextmanager
def sigterm_as_interrupt() -> Iterator[bool]:
    """Yields whether the handler was installed (False off the main thread or over another handler)."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        yield False
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield True
    finally:
        signal.signal(signal.SIGTERM, previous)


class Deferred:
    """SIGTERM noted, not raised: in a run over several processes a process that stopped alone
    would leave the others waiting in a collective, so the run reads ``signum`` at each chunk
    and every process stops at the step they agree on (``drive.consensus.StopVote``)."""

    def __init__(self) -> None:
        self.signum = 0  # the signal that arrived, 0 while none did
        self.acted = False  # the run stopped for it

    def note(self, signum, frame) -> None:
        self.signum = signum


@contextmanager
def sigterm_deferred() -> Iterator[Deferred | None]:
    """Yields the ``Deferred`` SIGTERM is noted in (None off the main thread or over a handler
    that is neither the default action nor this module's). A SIGTERM noted that the run did not
    stop for (it came after its last chunk's vote) is raised as ``Terminated`` at the end."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL and previous is not _raise_terminated:
        yield None
        return
    deferred = Deferred()
    signal.signal(signal.SIGTERM, deferred.note)
    try:
        yield deferred
    finally:
        signal.signal(signal.SIGTERM, previous)
    if deferred.signum and not deferred.acted:
        raise Terminated(deferred.signum)
