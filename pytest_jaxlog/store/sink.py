"""The sink protocol: where frames go. Sinks are opened with the schema before the first frame."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..record.frames import Frames, Schema

STATUSES = ("running", "complete", "stopped", "violated", "failed")


@runtime_checkable
class Sink(Protocol):
    def open(self, schema: Schema, meta: dict[str, Any]) -> None:
        """Called once, before any frame. ``meta``: provenance and run settings, JSON-able."""

    def write(self, frames: Frames) -> None:
        """Append a batch. May be asynchronous; raises a pending background error."""

    def attach(self, name: str, step: int, tree: dict[str, np.ndarray], *, key_impls: dict | None = None) -> None:
        """Store a named snapshot (post-mortem state at ``step``) beside the frames. ``key_impls``:
        the PRNG impl of each path holding key data (optional: sinks without it get the plain call)."""

    def close(self, status: str, *, steps_done: int, violation: dict | None = None) -> None:
        """Flush everything, write the final status, and raise any pending writer error."""

    @property
    def artifacts(self) -> dict[str, Path]:
        """Files this sink produced, by kind (e.g. ``{"trajectory": path}``)."""
