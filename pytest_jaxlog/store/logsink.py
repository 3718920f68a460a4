"""``LoggingSink``: one log line per recorded step through Python's ``logging``.

Why logging and not print: the lines reach whatever the user configured (files, JSON handlers,
pytest's captured log shown beside a failure) with a level to filter on, and cost nothing but a
level check when nobody listens. Each line is one step: control characters and newlines in
record names and values are escaped as the command line escapes them (``record.printable``).
"""

from __future__ import annotations

import logging
from typing import Any


from ..errors import JaxlogError
from ..record.frames import Frames, Schema
from ..record.printable import printable
from ..record.schedule import Schedule, every as every_n
from .dtypes import check_frames
from .scalars import real_paths, rows_by_step, scalar_paths
from .sink import Sink

DEFAULT_LOGGER = "pytest_jaxlog"


class LoggingSink(Sink):
    """Sink logging ``step 1000: energy/total=-186.25 temperature=1.02`` per recorded step (one
    line per system in batched runs: ``step 1000 system 3: ...``).

    ``logger``: a ``logging.Logger``, a logger name, or None for ``"pytest_jaxlog"``.
    ``every``: log only these steps, an int (every n-th step) or a schedule (``jl.every(n)``,
    ``jl.at(...)``); by default every recorded step. ``records``: the scalar records shown (default:
    all real scalar records). ``fmt``: format of each value.
    """

    def __init__(self, logger: logging.Logger | str | None = None, level: int = logging.INFO, every: Any = None,
                 records: list[str] | tuple[str, ...] | None = None, fmt: str = ".6g"):
        if logger is None or isinstance(logger, str):
            logger = logging.getLogger(logger or DEFAULT_LOGGER)
        if not isinstance(logger, logging.Logger):
            raise JaxlogError(f"LoggingSink(logger={logger!r}): expected a logging.Logger, a logger name or None")
        if every is not None and not isinstance(every, Schedule):
            every = every_n(every)
        self.logger, self.level, self.every, self.fmt = logger, int(level), every, fmt
        self.records = None if records is None else tuple(records)
        self._schema: Schema | None = None
        self._paths: tuple[str, ...] = ()

    def open(self, schema: Schema, meta: dict[str, Any]) -> None:
        who = f"LoggingSink({self.logger.name})"
        self._paths = real_paths(schema, scalar_paths(schema, self.records, who, kind="LoggingSink"), who)
        self._schema = schema
        format(0.0, self.fmt)  # a bad fmt fails here, not mid-run

    def write(self, frames: Frames) -> None:
        assert self._schema is not None, "[jaxlog] LoggingSink.write before open"
        check_frames(self._schema, frames)
        if not self.logger.isEnabledFor(self.level):
            return
        batched = self._schema.batched
        for step, rows in rows_by_step(frames, self._paths, self._schema.n_systems if batched else None):
            if self.every is not None and not self.every.contains(step):
                continue
            for system, row in enumerate(rows):
                where = f"step {step} system {system}" if batched else f"step {step}"
                text = " ".join(f"{p}={format(v, self.fmt)}" for p, v in row.items())
                # names and values escaped: a record named "x\nstep 9: ok" or holding a terminal
                # escape neither forges a log line nor drives the terminal the log is shown on
                self.logger.log(self.level, "%s: %s", where, printable(text, newlines=False))

    def close(self, status: str = "complete", *, steps_done: int | None = None, violation: dict | None = None,
              summary: dict | None = None) -> None:
        if status != "complete" and self.logger.isEnabledFor(self.level):
            self.logger.log(self.level, "run %s after %s steps", status, steps_done)

    def __repr__(self) -> str:
        return f"LoggingSink({self.logger.name!r}, level={logging.getLevelName(self.level)})"
