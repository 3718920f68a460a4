"""``TensorBoardWriter``: scalar records as a TensorBoard event file, written off the run's thread.

TensorBoard groups tags by their first component, so a record ``energy/total`` is its own chart
in the ``energy`` group, and in batched runs each system is a tag of the record's group
(``energy/system_3``). Values are stored as float32 (TensorBoard's scalar type): the file is for
looking at; the trajectory file keeps the exact values.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..errors import JaxlogError, WriterError
from ..record.frames import Frames, Schema
from .background import QUEUE_BYTES, STALL_S, Background
from .dtypes import check_frames
from .dashboard import dashboard_paths, metric_keys
from .sink import Sink
from .tfevents import file_header, scalar_events

_SERIAL = itertools.count()


class TensorBoardWriter(Sink):
    """Sink writing scalar records to ``logdir/events.out.tfevents.*`` (``tensorboard --logdir``).

    ``records=None`` takes every real scalar record; naming another record is an error.
    ``queue_bytes``/``stall_timeout_s``: as for ``HDF5Writer`` (memory handed to the writer
    thread; how long a caller waits on a thread that writes nothing before ``WriterError``).
    """

    def __init__(self, logdir: str | os.PathLike, records: list[str] | tuple[str, ...] | None = None, *,
                 queue_bytes: int = QUEUE_BYTES, stall_timeout_s: float = STALL_S):
        self.logdir = Path(logdir)
        self.records = None if records is None else tuple(records)
        self.queue_bytes, self.stall_timeout_s = int(queue_bytes), float(stall_timeout_s)
        self.path: Path | None = None
        self.tags: dict[str, tuple[str, ...]] = {}
        self._schema: Schema | None = None
        self._last_steps: dict[str, int] = {}
        self._fh: IO[bytes] | None = None
        self._bg: Background | None = None

    def open(self, schema: Schema, meta: dict[str, Any]) -> None:
        if self._schema is not None:
            raise JaxlogError(f"TensorBoardWriter({self.logdir}): a writer is opened once; make a new one per run")
        who = f"TensorBoardWriter({self.logdir})"
        self.tags = metric_keys(schema, dashboard_paths(schema, self.records, who, "TensorBoard"))
        self._schema = schema
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.{next(_SERIAL)}"
        try:
            self.logdir.mkdir(parents=True, exist_ok=True)
            self.path = self.logdir / name
            self._fh = open(self.path, "wb")
            self._fh.write(file_header(time.time()))
            self._fh.flush()
        except OSError as exc:
            raise WriterError(f"{who}: cannot create the event file: {exc}") from exc
        self._bg = Background(f"TensorBoardWriter({self.path})", self._write_events, self._fh.close,
                              queue_bytes=self.queue_bytes, stall_s=self.stall_timeout_s)

    def write(self, frames: Frames) -> None:
        if self._bg is None:
            raise WriterError(f"{self!r} is {'closed' if self._schema is not None else 'not open'}, cannot write")
        check_frames(self._schema, frames, self._last_steps)
        wall = time.time()
        for path, tags in self.tags.items():
            steps = frames.steps.get(path)
            if steps is None or not len(steps):
                continue
            values = frames.values[path]
            self._bg.put({"tags": tags, "steps": steps, "values": values, "wall_time": wall},
                         values.nbytes + steps.nbytes)

    def _write_events(self, batch: dict) -> None:  # the writer thread
        self._fh.write(scalar_events(batch["tags"], batch["steps"], np.asarray(batch["values"]), batch["wall_time"]))
        self._fh.flush()  # TensorBoard shows a run as it goes

    def close(self, status: str = "complete", *, steps_done: int | None = None, violation: dict | None = None,
              summary: dict | None = None) -> None:
        bg, self._bg = self._bg, None
        if bg is not None:
            bg.close()

    @property
    def artifacts(self) -> dict[str, Path]:
        return {} if self.path is None else {"tensorboard": self.path}

    def __repr__(self) -> str:
        return f"TensorBoardWriter({str(self.logdir)!r})"
