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
