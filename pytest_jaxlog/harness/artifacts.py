"""Artifact directories over time: those of tests that keep none, removed off the tests' own
time, and the evidence earlier sessions left for tests this session does not run again."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping

from .compile_cache import alive


@dataclass
class Earlier:
    """The previous manifest of the artifact folder, read at session start (before any test writes)."""

    base: Path
    doc: dict[str, Any] = field(default_factory=dict)

    @property
    def session(self) -> str:
        return _manifest().session_id(self.doc)

    def own_dir(self, name: Any) -> Path | None:
        """``base/name`` when ``name`` is a direct subdirectory that exists, else None."""
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            return None
        d = self.base / name
        return d if d.is_dir() else None

    def named_dirs(self) -> list[Path]:
        """Every existing directory the manifest names (its tests' and its stale ones), once each."""
        seen = {d for e in _manifest().artifact_dirs(self.doc) if (d := self.own_dir(e.get("dir"))) is not None}
        return sorted(seen)

    def carried(self, now: Mapping[str, dict]) -> list[dict]:
        """The earlier entries of tests this session did not run, marked stale with their session;
        an entry whose directory is gone keeps its outcome and names no files."""
        out = []
        for old in _manifest().tests(self.doc):
            if old["nodeid"] in now:
                continue
            entry = dict(old, stale=True, session=old.get("session") if old.get("stale") else self.session)
            if old.get("dir") is not None and self.own_dir(old.get("dir")) is None:
                entry.update(dir=None, kept=False, artifacts={})
            out.append(entry)
        return out

    def stale_dirs(self, carried: list[dict], now: Mapping[str, dict]) -> list[dict]:
        """The manifest's ``stale`` list: the directories of carried entries, and those an older
        manifest listed as stale for tests not run again (by dir name, once each)."""
        rerun = {e.get("dir") for e in now.values()} | {t["nodeid"] for t in now.values()}
        out: dict[str, dict] = {}
        for e in carried:
            if e.get("dir"):
                out[e["dir"]] = {"nodeid": e["nodeid"], "dir": e["dir"], "outcome": e.get("outcome"),
                                 "session": e["session"]}
        for s in _manifest().stale(self.doc):
            name = s["dir"]
            if name not in out and name not in rerun and s.get("nodeid") not in rerun and self.own_dir(name):
                out[name] = dict(s, session=s.get("session") or self.session)
        return [out[k] for k in sorted(out)]

    def replaced(self, now: Mapping[str, dict]) -> list[Path]:
        """Directories of tests this session ran again that its own entries no longer name (a test
        that now errors before its fixture, or keeps nothing): its earlier evidence is replaced."""
        out = []
        for old in _manifest().tests(self.doc):
            new = now.get(old["nodeid"])
            d = self.own_dir(old.get("dir"))
            if new is not None and d is not None and new.get("dir") != old.get("dir"):
                out.append(d)
        return out


def _manifest() -> ModuleType:
    from ..store import manifest

    return manifest


def remove(dirs: list[Path]) -> list[str]:
    """Remove ``dirs`` (best effort: a file held open elsewhere stays); their names."""
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    return [d.name for d in dirs]

# ---------------------------------------------------------------------------------------------
# Removing the artifact directories of tests that keep none, off the tests' own time.
#
# Why: deleting a test's files (an HDF5 trajectory, a timeline) costs milliseconds of filesystem
# work per test, often more than the fixture's other bookkeeping together, and a hand-written test
# with ``tmp_path`` pays nothing for it (pytest keeps its temporary directories). So a directory is
# renamed into a trash folder at once (its name is free and ``exists()`` is false from then on) and
# the trash is deleted when the session finishes, in one go, by an ``rm -rf`` of its own that the
# session does not wait for (40 tests' directories took ~0.3 s of ``shutil.rmtree`` at the end of
# every session; where there is no ``rm``, that is what deletes them). A thread deleting during the
# session was tried: its Python-level work in ``shutil.rmtree`` holds the GIL for up to the switch
# interval, which the tests then wait for. Trash left by a process killed before it deleted its
# own is deleted by the next session. Imports the standard library only.

class Discard:
    """``discard(d)``: the directory is gone from its place now; ``finish()`` deletes it from the disk."""

    def __init__(self, base: Path):
        self.trash = base / f".trash-{os.getpid()}-{secrets.token_hex(3)}"  # one per session
        self._count = 0

    def __call__(self, d: Path) -> None:
        try:
            self.trash.mkdir(parents=True, exist_ok=True)
            self._count += 1
            os.rename(d, self.trash / str(self._count))
        except OSError:  # another filesystem, a file held open elsewhere: removed here, best effort
            shutil.rmtree(d, ignore_errors=True)

    def finish(self) -> None:
        """Delete the trash, and that of processes of this session's kind killed before they could,
        in the background where the system has ``rm``."""
        if not self._count:
            return
        doomed = [self.trash]
        for old in self.trash.parent.glob(".trash-*"):
            pid = old.name[len(".trash-"):].split("-")[0]
            if pid.isdigit() and int(pid) != os.getpid() and not alive(int(pid)):
                doomed.append(old)
        rm = shutil.which("rm") if os.name == "posix" else None
        if rm is not None:
            try:
                subprocess.Popen([rm, "-rf", "--", *map(str, doomed)], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
                return
            except OSError:
                pass  # cannot start it: deleted here
        for d in doomed:
            shutil.rmtree(d, ignore_errors=True)
