"""Paths as people see them and as a test names them: how a path is shown in messages, the
terminal summary and the report, and the names of a test's files (its artifact directory,
its goldens) from its pytest node id."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Callable

__all__ = ['shown', 'use_project', 'golden_name']

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

# ---------------------------------------------------------------------------------------------
# Names of a test's files (its artifact directory, its goldens) from its pytest node id.
#
# Its own module, with the standard library only, because the plugin names a directory for every
# test while most suites never touch a golden: importing ``golden`` (numpy, the store) for a name
# cost a session ~0.1 s.

_UNSAFE = re.compile(r"[^A-Za-z0-9._+=-]")


def golden_name(nodeid: str, suffix: str = ".h5", *, name: str | None = None) -> str:
    """A file name for a test's golden, from its pytest node id and the check's ``name=``; stable across
    runs and machines, and different for every (test, name) pair.

    ``examples/test_lj.py::TestNVE::test_energy[64-float32]`` ->
    ``examples.test_lj.TestNVE.test_energy-64-float32.h5`` (``/`` and ``::`` -> ``.``, ``.py`` dropped,
    ``[a-b]`` -> ``-a-b``); with ``name="second"``: ``...test_energy-64-float32--second.h5``. The ``--``
    before the name appears nowhere else in a plain name, so ``test_f[a]`` with ``name="b"``
    (``test_f-a--b``) and ``test_f[a-b]`` (``test_f-a-b``) differ. When characters had to be replaced,
    the test part would contain ``--`` or end with ``-``, or the name would be long (over 120
    characters), a short hash of the node id (and name) keeps names unique and within file-name limits.
    """
    file, _, rest = nodeid.partition("::")
    if file.endswith(".py"):
        file = file[:-3]
    raw = file.replace("\\", "/").split("/")
    parts = [p for p in raw if p not in ("", ".", "..")]
    head, bracket, param = rest.partition("[")  # the parameter id may hold '::' itself: split it off first
    if bracket and not param.endswith("]"):
        head, bracket, param = rest, "", ""
    parts += [p for p in head.split("::") if p]
    # a '.' inside a part ('v1.2/test_x.py' vs 'v1/2/test_x.py') or a '..' dropped from the path would
    # make two tests' names equal: hashed like replaced characters
    ambiguous = ".." in raw or any("." in p for p in parts)
    stem = ".".join(parts)
    if bracket:
        stem = f"{stem}-{param[:-1]}"
    safe = _UNSAFE.sub("_", stem)
    # '--' separates the check's name: a test part with '--' in it, or ending in '-', is hashed
    if safe != stem or ambiguous or "--" in safe or safe.endswith("-") or len(safe) > 120:
        safe = f"{safe[:110]}-{_digest(nodeid)}"
    if name is not None:
        name = str(name)
        clean = _UNSAFE.sub("_", name)
        full = f"{safe}--{clean}"
        if clean != name or clean.startswith("-") or len(full) > 120:
            full = f"{full[:110]}-{_digest(nodeid + chr(0) + name)}"
        safe = full
    return safe + suffix


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:8]
