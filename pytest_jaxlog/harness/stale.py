"""Evidence of earlier sessions: what a session does with the artifact directories and manifest
entries an earlier session left for tests it does not run again.

Why: running a subset of a suite (or a second command over the same folder) must not delete
another test's failure evidence, nor leave a manifest that forgets it. So a session replaces only
the directories of the tests it runs again; the others stay on disk, and their manifest entries
are carried into the new manifest marked ``stale`` with the session they came from (merged per
test id: the newest entry wins). ``--jaxlog-clean-stale`` removes them instead. Only directories
a manifest names, directly below the artifact folder, are ever touched. Standard library only
(the manifest's reader is imported on use: the plugin imports no package layer at load).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping


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
