"""How a path is shown to a person: in messages, the terminal summary, the report.

Why one rule: a path is something a person copies into the next command, so it is written as seen
from where pytest started, relative wherever the file lies inside the project (pytest's rootdir),
``../`` included when the command ran in a subfolder, as pytest writes its own test paths. Only a
file outside the project (an artifact folder under ``/tmp``, a cache in the home folder) is shown
absolute, where a relative form would climb out of the project and mean nothing on another
machine. The manifest has its own rule (every path relative to its directory) and does not use
this one.

The project is whatever the pytest session says its rootdir is (``use_project``); outside a session
(the command line, a script) a path is relative only below the working directory. Standard library
only: the plugin and every layer below it use it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

__all__ = ["shown", "use_project"]

_PROJECT: list[Path] = []  # the innermost session's rootdir last (pytester runs sessions inside sessions)


def use_project(root: str | os.PathLike) -> Callable[[], None]:
    """Make ``root`` the project whose paths are shown relative, until the returned undo is called."""
    entry = Path(root).resolve()
    _PROJECT.append(entry)

    def undo() -> None:
        for i in range(len(_PROJECT) - 1, -1, -1):
            if _PROJECT[i] is entry:
                del _PROJECT[i]
                return

    return undo


def shown(path: str | os.PathLike, *, cwd: str | os.PathLike | None = None,
          root: str | os.PathLike | None = None) -> str:
    """``path`` as a person types it from ``cwd`` (default: the working directory): relative when
    it lies below ``cwd``, or when both lie inside the project ``root`` (default: the session's
    rootdir); else absolute."""
    try:
        here = Path(cwd if cwd is not None else os.getcwd()).resolve()
        p = Path(path)
        p = (p if p.is_absolute() else here / p).resolve()
    except (OSError, RuntimeError, ValueError):  # a vanished working directory, a symlink loop
        return str(path)
    if _below(p, here):
        return str(p.relative_to(here))
    project = Path(root).resolve() if root is not None else (_PROJECT[-1] if _PROJECT else None)
    if project is not None and _below(p, project) and _below(here, project):
        return os.path.relpath(p, here)
    return str(p)


def _below(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents
