"""A file that takes its path only once it holds a checkpoint (``jl.resume``'s new file).

Why: a resume rewrites its trajectory into a new file (the frames up to the checkpoint it
continues from, then its own). Were the new file renamed into place as soon as it exists, a kill
before it holds that checkpoint would leave the path with a file nothing can resume from, the old
trajectory only under a hidden name. So the new file is written under its temporary name, and
renamed over the path (atomically: the path names one whole file at every instant) right after
the writer has flushed a checkpoint at or past the step the resume continues from. A writer that
closes before that never touches the path: its file is removed and the previous one stays.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .journal import durable_replace


@dataclass
class PendingSwap:
    """The new file under its temporary name ``where`` until a checkpoint at step ``at`` or later
    is on disk; then ``path``."""

    where: Path
    path: Path
    at: int
    durable: bool = True  # the rename survives a power loss (the directory is synced after it)
    done: bool = False

    def due(self, step: int) -> bool:
        """Whether a checkpoint at ``step`` makes the file take the path."""
        return not self.done and step >= self.at

    def checkpoint_written(self, step: int) -> None:
        """A checkpoint at ``step`` was written and flushed: the file takes the path if it is due."""
        if self.due(step):
            durable_replace(self.where, self.path, durable=self.durable)
            self.where, self.done = self.path, True

    def abandon(self) -> None:
        """The writer closed without a due checkpoint: its file goes, the path keeps what it had."""
        if not self.done:
            try:
                os.unlink(self.where)
            except FileNotFoundError:
                pass
