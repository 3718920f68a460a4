"""A writer thread for sinks whose work is plain: take a payload, write it, in order.

Why: encoding and writing must not cost the run's thread (the driver hands a batch over and
dispatches the next chunk), yet a failure must surface on the caller's thread at its next
``put`` or at ``close``, never as a hang or a silent loss. The hand-over is a ``ByteQueue``, so
the memory held is bounded and a stuck disk gives an error after ``stall_s``.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from ..errors import WriterError
from .bytequeue import ByteQueue, Item, Stalled

QUEUE_BYTES = 32 << 20
STALL_S = 60.0
_ITEM_BYTES = 256


class Background:
    """``handle(payload)`` runs on a daemon thread for each ``put``; ``finish()`` runs there last."""

    def __init__(self, name: str, handle: Callable[[Any], None], finish: Callable[[], None], *,
                 queue_bytes: int = QUEUE_BYTES, stall_s: float = STALL_S):
        self.name = name
        self._handle, self._finish = handle, finish
        self._queue = ByteQueue(queue_bytes, stall_s)
        self._error: BaseException | None = None
        self._raised = False
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"jaxlog-{name}", daemon=True)
        self._thread.start()

    def put(self, payload: Any, nbytes: int) -> None:
        """Hand a payload over (waits while the queue is full); raises a pending writer error."""
        self.raise_pending()
        try:
            waited = self._queue.put(Item("frames", payload, nbytes + _ITEM_BYTES), self._thread.is_alive,
                                     self.raise_pending)
        except Stalled as exc:
            raise WriterError(f"{self.name}: the writer thread wrote nothing for {exc.waited_s:.0f} s") from None
        if waited < 0:
            self.raise_pending()
            raise WriterError(f"{self.name}: the writer thread died")

    def close(self) -> None:
        """Write everything handed over, run ``finish``, and raise a writer error not raised yet."""
        if self._thread.is_alive():
            self._queue.put(Item("close", None, 0), self._thread.is_alive, force=True)
            try:
                self._queue.wait_for(self._finished.is_set, self._thread.is_alive)
            except Stalled as exc:
                raise WriterError(f"{self.name}: closing: the writer thread wrote nothing for "
                                  f"{exc.waited_s:.0f} s") from None
            self._thread.join(1.0)
        self.raise_pending()

    def raise_pending(self) -> None:
        if self._error is not None and not self._raised:
            self._raised = True
            raise self._error

    def _run(self) -> None:
        while True:
            item = self._queue.get(None)
            if item is None:
                continue
            try:
                if item.kind == "close":
                    self._finish()
                elif self._error is None:
                    self._handle(item.payload)
            except BaseException as exc:  # noqa: BLE001  (raised on the caller's thread)
                if self._error is None:
                    self._error = WriterError(f"{self.name}: {type(exc).__name__}: {exc}")
                    self._error.__cause__ = exc
            finally:
                if item.kind == "close":
                    self._finished.set()  # before done(): done() wakes the waiting caller
                self._queue.done(item)
            if item.kind == "close":
                return
