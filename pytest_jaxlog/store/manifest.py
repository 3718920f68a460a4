"""The session manifest, ``manifest.json`` in the artifact directory: one owner for its name,
version and fields, so the plugin that writes it and ``jaxlog summary`` that reads it agree.

Every path in it is relative to the directory of the file (the folder can be moved or
downloaded as a CI artifact). Reading tolerates what an older or damaged manifest lacks:
a field that is not what it should be reads as absent. Standard library only: the plugin
imports this without jax or numpy.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any, Iterable

from ..errors import JaxlogError

NAME = "manifest.json"
VERSION = 2
PATHS = "relative to the directory of this file"
QUIET_OUTCOMES = ("passed", "skipped", "xfailed")  # every other outcome is "not passed"
WORST_FIRST = ("error", "failed", "interrupted", "xpassed")  # the outcomes not passed, the worst first


def document(*, started: float, finished: float, exitstatus: int, rootdir: str, golden_dir: str,
             settings: dict[str, Any], tests: list[dict], stale: list[dict],
             session: str | None = None) -> dict[str, Any]:
    """A manifest's fields, in the order they are written. ``session``: the id that entries carried
    into a later session's manifest (marked ``stale``) name as the session they came from."""
    return {
        "version": VERSION,
        "session": session,
        "paths": PATHS,
        "started": started,
        "finished": finished,
        "exitstatus": int(exitstatus),
        "rootdir": rootdir,
        "golden_dir": golden_dir,
        "settings": settings,
        "tests": tests,
        "stale": stale,
    }


def new_session_id(started: float) -> str:
    """A session's id: its start time (UTC, to the millisecond, so that ids sort as the sessions
    started: stale evidence is listed newest session first) and a random tail (two sessions may
    start in one millisecond)."""
    ms = int(started * 1000) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(started)) + f".{ms:03d}Z-{secrets.token_hex(3)}"


def session_id(doc: dict[str, Any]) -> str:
    """The id of the session that wrote ``doc``; a manifest written before ids existed is named by
    its start time."""
    sid = doc.get("session")
    if isinstance(sid, str) and sid:
        return sid
    started = doc.get("started")
    if isinstance(started, (int, float)) and not isinstance(started, bool):
        try:
            return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
        except (OverflowError, OSError, ValueError):  # a damaged time: the session is unknown
            pass
    return "unknown"


def write(directory: Path, doc: dict[str, Any]) -> Path:
    """``doc`` as ``directory/manifest.json``, written beside it and renamed over it: a reader
    sees the old manifest or the new one, never half of one."""
    path = Path(directory) / NAME
    text = json.dumps(doc, indent=1, default=str).encode()
    for attempt in range(8):  # a new file of our own: never written through a link planted at a name
        tmp = path.with_name(f".manifest-{os.getpid()}-{secrets.token_hex(4)}.json")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
            break
        except FileExistsError:
            if attempt == 7:
                raise JaxlogError(f"cannot write {path}: every temporary name tried beside it is taken") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def read(path: Path) -> dict[str, Any]:
    """The manifest at ``path``; unreadable, not JSON or not an object is one JaxlogError whose
    message is the cause (the caller says which file)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise JaxlogError(f"{type(exc).__name__}: {exc}" if isinstance(exc, RecursionError) else str(exc)) from None
    if not isinstance(doc, dict):
        raise JaxlogError("not a JSON object")
    return doc


def find(roots: Iterable[str | os.PathLike]) -> list[Path]:
    """The manifest files under ``roots`` (a root may be a manifest file itself)."""
    out: list[Path] = []
    for root in roots:
        r = Path(root)
        out += [r] if r.is_file() else sorted(r.rglob(NAME)) if r.is_dir() else []
    return out


def tests(doc: dict[str, Any]) -> list[dict]:
    """The test entries (each with a ``nodeid``), those carried from earlier sessions (``stale``) included."""
    return [t for t in _list(doc.get("tests")) if isinstance(t, dict) and "nodeid" in t]


def current_tests(doc: dict[str, Any]) -> list[dict]:
    """The entries of the tests the session that wrote ``doc`` ran: all that its counts, its time and
    its outcome may speak for (a report that counted carried entries would pass them off as its own)."""
    return [t for t in tests(doc) if not t.get("stale")]


def stale_tests(doc: dict[str, Any]) -> list[dict]:
    """Entries carried from earlier sessions (a test not run again, or renamed or deleted since):
    evidence to show apart, with the session each came from, never counted as this session's."""
    return [t for t in tests(doc) if t.get("stale")]


def entry_session(entry: dict[str, Any]) -> str:
    """The session a stale entry came from, as the manifest names it (its id starts with the session's
    UTC start time, so ids sort oldest first); "unknown" for an entry that does not say."""
    sid = entry.get("session")
    return sid if isinstance(sid, str) and sid else "unknown"


def by_session(entries: Iterable[dict]) -> dict[str, list[dict]]:
    """``entries`` grouped by the session they came from, the newest session first: what the report,
    ``jaxlog summary`` and the terminal summary each badge stale evidence with."""
    groups: dict[str, list[dict]] = {}
    for e in entries:
        groups.setdefault(entry_session(e), []).append(e)
    return {sid: groups[sid] for sid in sorted(groups, key=lambda sid: (sid != "unknown", sid), reverse=True)}


def not_passed(entry: dict[str, Any]) -> bool:
    """Whether a test's outcome is one a person must look at (what "not passed" counts)."""
    return entry.get("outcome") not in QUIET_OUTCOMES


def severity(entry: dict[str, Any]) -> int:
    """How bad a test's outcome is, 0 the worst: the outcomes a person must look at (an outcome
    this version does not know among them, after the known ones), then those that pass quietly."""
    outcome = entry.get("outcome")
    if outcome in WORST_FIRST:
        return WORST_FIRST.index(outcome)
    if not_passed(entry):
        return len(WORST_FIRST)
    return len(WORST_FIRST) + 1 + QUIET_OUTCOMES[::-1].index(outcome)


def worst_per_test(entries: Iterable[dict]) -> list[dict]:
    """One entry per test (``nodeid``), its worst outcome's (the first of those alike): a test that
    failed in one shard of a merge and passed in another is listed, and counted, as failed."""
    worst: dict[Any, dict] = {}
    for e in entries:
        held = worst.get(e.get("nodeid"))
        if held is None or severity(e) < severity(held):
            worst[e.get("nodeid")] = e
    return list(worst.values())


def stale(doc: dict[str, Any]) -> list[dict]:
    """Artifact directories of earlier sessions listed as stale (each with a ``dir``)."""
    return [s for s in _list(doc.get("stale")) if isinstance(s, dict) and s.get("dir")]


def settings(doc: dict[str, Any]) -> dict[str, Any]:
    value = doc.get("settings")
    return value if isinstance(value, dict) else {}


def artifact_dirs(doc: dict[str, Any]) -> list[dict]:
    """Every artifact directory the manifest names (its tests' and the stale ones), with the
    test's ``nodeid``, ``outcome`` and the session's ``finished`` time."""
    finished = doc.get("finished")
    out = [{"nodeid": t.get("nodeid"), "dir": t.get("dir"), "outcome": t.get("outcome"), "finished": finished}
           for t in _list(doc.get("tests")) if isinstance(t, dict) and t.get("dir")]
    return out + stale(doc)


def is_plot(key: str) -> bool:
    """Whether artifact ``key`` is a plot: ``plot`` (a test's first) or ``<run or check>:plot``."""
    return key == "plot" or key.endswith(":plot")


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []
