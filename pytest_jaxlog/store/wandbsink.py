"""``WandbSink``: scalar records as a Weights & Biases run, offline by default.

Why offline: a test run (CI included) must not need a network or an account; W&B's offline
mode writes the run to a directory (``<dir>/wandb/offline-run-*``) that ``wandb sync`` uploads
later, where the run then looks as if it had been logged online. Values reach W&B's history as
JSON numbers, so float64 and float32 values (as Python floats) and integers are kept exactly.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from ..errors import JaxlogError
from ..record.frames import Schema
from .background import QUEUE_BYTES, STALL_S
from .dashboard import DashboardSink, Ending, StepMetrics, missing_extra

MODES = ("offline", "online")


class WandbSink(DashboardSink):
    """Sink logging scalar records to a W&B run: ``run.log({key: value}, step=k)`` per recorded step.

    Keys: a record's path (``energy/total``); in batched runs one key per system
    (``energy/system_3``), so each system is a line in the record's section of the workspace.
    ``records=None`` takes every real scalar record (bools as 0/1); naming another is an error.
    W&B's step is the run's step number. The run's description (driver, steps, chunk, dt, the
    ``meta=`` given to ``jl.run``) and provenance are the W&B config's ``jaxlog`` entry, beside
    ``config``; at the end the summary holds ``jaxlog/status``, ``jaxlog/steps_done`` (and
    ``jaxlog/violation``), and the W&B run's exit code is 0 for a complete run, 1 otherwise.

    ``mode="offline"`` (the default) writes the run under ``dir/wandb/`` (``artifacts["wandb"]``
    is its directory, for ``wandb sync``); ``"online"`` logs to the W&B server as
    ``wandb.init`` would. ``init``: more keyword arguments for ``wandb.init`` (``entity``,
    ``tags``, ``group``, ``notes``, ``settings``, ...); by default W&B does not capture the
    console (pytest does) and prints nothing. Each sink starts its own W&B run, beside any run
    already active in the process (``reinit="create_new"``). Needs the extra:
    ``pip install 'pytest-jaxlog[wandb]'``.
    """

    kind = "W&B"

    def __init__(self, dir: str | os.PathLike, records: list[str] | tuple[str, ...] | None = None, *,
                 project: str = "jaxlog", name: str | None = None, mode: Literal["offline", "online"] = "offline", config: dict | None = None,
                 queue_bytes: int = QUEUE_BYTES, stall_timeout_s: float = STALL_S, **init: Any):
        try:
            import wandb  # noqa: F401  (the library is an optional extra: refused here, before any run)
        except ImportError as exc:
            raise missing_extra("jl.WandbSink", "wandb", "wandb", exc) from None
        if mode not in MODES:
            raise JaxlogError(f"WandbSink(mode={mode!r}): mode is one of {', '.join(map(repr, MODES))}")
        if config is not None and not isinstance(config, dict):
            raise JaxlogError(f"WandbSink(config=...): a dict, got {type(config).__name__}")
        super().__init__(records, queue_bytes=queue_bytes, stall_timeout_s=stall_timeout_s)
        self.dir = Path(dir)
        self.project, self.name, self.mode = project, name, mode
        self.config = dict(config or {})
        self.init = init
        self.run: Any = None

    def _start(self, schema: Schema, meta: dict[str, Any]) -> None:
        import wandb

        self.dir.mkdir(parents=True, exist_ok=True)
        init = {"settings": wandb.Settings(console="off", silent=True, disable_git=True), **self.init}
        self.run = wandb.init(dir=str(self.dir), project=self.project, name=self.name, mode=self.mode,
                              config={**self.config, "jaxlog": meta}, reinit="create_new", **init)

    def _log(self, metrics: list[StepMetrics]) -> None:
        for m in metrics:
            self.run.log(m.values, step=m.step)

    def _finish(self, ending: Ending) -> None:
        if self.run is None:
            return
        end: dict[str, Any] = {"jaxlog/status": ending.status, "jaxlog/steps_done": ending.steps_done}
        if ending.violation is not None:
            end["jaxlog/violation"] = ending.violation
        self.run.summary.update(end)
        self.run.finish(exit_code=0 if ending.status == "complete" else 1)

    @property
    def artifacts(self) -> dict[str, Path]:
        return {} if self.run is None or self.mode != "offline" else {"wandb": Path(self.run.settings.sync_dir)}

    def __repr__(self) -> str:
        return f"WandbSink({str(self.dir)!r})"
