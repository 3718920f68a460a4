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
from typing import Any, Callable, Iterable

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

# ---------------------------------------------------------------------------------------------
# Whether a document is a manifest as the plugin writes it, field by field, before anything reads
# it: ``jaxlog merge`` and ``jaxlog summary`` reject a malformed one with one message naming the
# field, instead of a traceback halfway through, a merged manifest that ``summary`` then skips, or
# "0 tests, exit status None" passed off as a reading. Standard library only (see ``manifest``).

_NUMBER = (int, float)
_TEXT_OR_NONE = (str, type(None))

# the fields a manifest may hold: (types a value may have, whether it must be there)
_TOP: dict[str, tuple[tuple[type, ...], bool]] = {
    "version": ((int,), True),
    "tests": ((list,), True),
    "exitstatus": ((int, type(None)), False),  # None or absent: the session did not say (unknown, never 0)
    "session": (_TEXT_OR_NONE, False),
    "started": ((*_NUMBER, type(None)), False),
    "finished": ((*_NUMBER, type(None)), False),
    "rootdir": (_TEXT_OR_NONE, False),
    "golden_dir": (_TEXT_OR_NONE, False),
    "settings": ((dict, type(None)), False),
    "stale": ((list, type(None)), False),
    "shards": ((list,), False),
}
_TEST: dict[str, tuple[tuple[type, ...], bool]] = {
    "nodeid": ((str,), True),
    "outcome": ((str,), True),
    "kept": ((bool,), False),
    "stale": ((bool,), False),
    "dir": (_TEXT_OR_NONE, False),
    "error": (_TEXT_OR_NONE, False),
    "session": (_TEXT_OR_NONE, False),
    "artifacts": ((dict, type(None)), False),
    "violations": ((list, type(None)), False),
    "runs": ((list, type(None)), False),
    "goldens": ((list, type(None)), False),
    "shard": ((int,), False),
}


def _type_names(types: tuple[type, ...]) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


def _fields(obj: Any, spec: dict[str, tuple[tuple[type, ...], bool]], where: str) -> None:
    if not isinstance(obj, dict):
        raise JaxlogError(f"{where} is {type(obj).__name__}, not an object")
    for name, (types, required) in spec.items():
        if name not in obj:
            if required:
                raise JaxlogError(f"{where} has no {name!r}")
            continue
        value = obj[name]
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            raise JaxlogError(f"{where}: {name!r} is {type(value).__name__}, not {_type_names(types)}")


def _paths(obj: Any, where: str) -> None:
    """A mapping of names to paths (a test's or a violation's artifacts)."""
    for key, value in (obj or {}).items():
        if not isinstance(value, str):
            raise JaxlogError(f"{where}: artifact {key!r} is {type(value).__name__}, not a path")


def _test(t: Any, where: str) -> None:
    _fields(t, _TEST, where)
    where = f"{where} ({t['nodeid']!r})"
    _paths(t.get("artifacts"), where)
    for j, v in enumerate(t.get("violations") or ()):
        if isinstance(v, dict):
            if not isinstance(v.get("message", ""), str):
                raise JaxlogError(f"{where}: violation {j}'s message is not text")
            if not isinstance(v.get("artifacts") or {}, dict):
                raise JaxlogError(f"{where}: violation {j}'s artifacts are not an object")
            _paths(v.get("artifacts"), f"{where}, violation {j}")
        elif not isinstance(v, str):
            raise JaxlogError(f"{where}: violation {j} is {type(v).__name__}, not an object or text")
    for j, r in enumerate(t.get("runs") or ()):
        if not isinstance(r, dict):
            raise JaxlogError(f"{where}: run {j} is {type(r).__name__}, not an object")
    for j, g in enumerate(t.get("goldens") or ()):
        if not isinstance(g, dict):
            raise JaxlogError(f"{where}: golden {j} is {type(g).__name__}, not an object")
        for key in ("status", "path", "pending"):
            if not isinstance(g.get(key, ""), _TEXT_OR_NONE):
                raise JaxlogError(f"{where}: golden {j}'s {key!r} is {type(g[key]).__name__}, not text")


def check(doc: Any) -> None:
    """Raise one JaxlogError saying what in ``doc`` is not as the plugin writes a manifest (the
    caller names the file)."""
    _fields(doc, _TOP, "the manifest")
    for i, t in enumerate(doc["tests"]):
        _test(t, f"test entry {i}")
    for i, s in enumerate(doc.get("stale") or ()):
        if not isinstance(s, dict) or not isinstance(s.get("dir"), str):
            raise JaxlogError(f"stale entry {i} is not an object with a 'dir' path")
    for i, s in enumerate(doc.get("shards") or ()):
        if not isinstance(s, dict) or not isinstance(s.get("exitstatus"), (int, type(None))):
            raise JaxlogError(f"shard {i} is not an object with an exit status")

# ---------------------------------------------------------------------------------------------
# One manifest from the ``manifest.json`` of several sessions: the shards of a suite that CI
# jobs ran apart (a matrix with pytest's own selection or pytest-split), each leaving its
# ``.jaxlog/``.
#
# The merge is an ordinary manifest (``jaxlog summary`` and anything else reading manifests reads
# it unchanged): every path in it is rewritten to be relative to the merge's own directory, so the
# shards' files stay where they are and are found from there. Each test entry says which shard it
# came from (``shard``: its position in ``shards``); a test that ran in several shards is listed
# once per shard. A shard's ``.jaxlog/`` restored from an earlier run carries entries of tests it
# did not run again (``stale``): those of a test another shard ran are left out, and of a test no
# shard ran only the newest is kept, so each test is listed as its latest evidence says (``summary``
# counts and lists a test in several shards once, as its worst outcome). A shard that is not a
# manifest as the plugin writes it is refused, naming the field (``manifest_check``); the merge's
# exit status is the first failing shard's, else unknown (null) where a shard has none, never 0.
# Pure JSON and paths: no trajectory is opened.

MANIFEST_NAME = NAME



def manifest_file(root: str | os.PathLike) -> Path:
    """``root`` itself when it is a file, else ``root/manifest.json``; JaxlogError when missing."""
    p = Path(root)
    f = p if p.is_file() else p / MANIFEST_NAME
    if not f.is_file():
        raise JaxlogError(f"[jaxlog] merge: no {MANIFEST_NAME} in {p} (the shard's jaxlog directory, e.g. .jaxlog)")
    return f


def _read(path: Path) -> dict:
    """The manifest at ``path``, checked field by field (``manifest_check``): a malformed shard is
    one error naming it, never a merge that ``summary`` cannot read."""
    try:
        doc = read(path)
        check(doc)
    except JaxlogError as e:
        cause = str(e).removeprefix("[jaxlog] ")
        raise JaxlogError(f"[jaxlog] merge: {path} is not a jaxlog manifest ({cause})") from None
    return doc


def exit_status(statuses: list[int | None]) -> int | None:
    """The merge's exit status: the first shard's that did not pass; else None (unknown) where a
    shard did not say, never 0 for a suite part of which is unaccounted for; else 0."""
    failed = [s for s in statuses if s is not None and s != 0]
    if failed:
        return failed[0]
    return None if None in statuses else 0


def _rebase(rel: Any, src: Path, out: Path) -> Any:
    """A path relative to ``src`` (a shard's directory) made relative to ``out``."""
    if not isinstance(rel, str) or not rel:
        return rel
    p = Path(rel) if Path(rel).is_absolute() else src / rel
    try:
        return Path(os.path.relpath(p, out)).as_posix()
    except ValueError:  # another drive: no relative form
        return str(p)


def _rebased_entry(entry: dict, move: Callable[[Any], Any], shard: int) -> dict:
    e = dict(entry)
    e["dir"] = move(e.get("dir"))
    e["artifacts"] = {k: move(v) for k, v in (e.get("artifacts") or {}).items()}
    e["violations"] = [dict(v, artifacts={k: move(p) for k, p in (v.get("artifacts") or {}).items()})
                       if isinstance(v, dict) else v for v in e.get("violations") or ()]
    e["goldens"] = [_rebased_golden(g, move) if isinstance(g, dict) else g for g in e.get("goldens") or ()]
    e["shard"] = shard
    return e


def _rebased_golden(note: dict, move: Callable[[Any], Any]) -> dict:
    """A golden's note: its path, and a pending golden's file (what ``jaxlog golden accept`` applies)."""
    out = dict(note, path=move(note.get("path")))
    if "pending" in out:
        out["pending"] = move(out["pending"])
    return out


def _latest_per_test(tests: list[dict]) -> list[dict]:
    """The entries of tests a shard ran (each shard's), and of each test no shard ran the newest
    stale entry (sessions are named by their start time, so the greatest name is the newest)."""
    ran = {t.get("nodeid") for t in tests if not t.get("stale")}
    newest: dict[Any, dict] = {}
    for t in tests:
        if t.get("stale") and t.get("nodeid") not in ran:
            held = newest.get(t.get("nodeid"))
            if held is None or str(t.get("session") or "") >= str(held.get("session") or ""):
                newest[t.get("nodeid")] = t
    return [t for t in tests if not t.get("stale")] + list(newest.values())


def merge(roots: list[str | os.PathLike], out: str | os.PathLike) -> Path:
    """Write ``out/manifest.json`` joining the manifests of ``roots`` (directories or files), in
    that order; returns its path. The shards must share the manifest's format version."""
    if not roots:
        raise JaxlogError("[jaxlog] merge: name the shards' jaxlog directories")
    out = Path(out).resolve()
    files = [manifest_file(r).resolve() for r in roots]
    if out / MANIFEST_NAME in files:
        raise JaxlogError(f"[jaxlog] merge: the output {out / MANIFEST_NAME} is one of the shards' manifests")
    docs = [_read(f) for f in files]
    versions = sorted({str(d.get("version")) for d in docs})
    if len(versions) > 1:
        raise JaxlogError(f"[jaxlog] merge: the shards' manifests have different format versions ({', '.join(versions)})")
    tests, stale, shards = [], [], []
    for i, (f, doc) in enumerate(zip(files, docs)):
        def move(rel: Any, src: Path = f.parent) -> Any:
            return _rebase(rel, src, out)

        tests += [_rebased_entry(t, move, i) for t in doc["tests"] if isinstance(t, dict)]
        stale += [dict(s, dir=move(s.get("dir")), shard=i) for s in doc.get("stale") or () if isinstance(s, dict)]
        shards.append({"manifest": move(f.name), "exitstatus": doc.get("exitstatus"), "tests": len(doc["tests"]),
                       "started": doc.get("started"), "finished": doc.get("finished"),
                       "settings": doc.get("settings")})
    first = docs[0]
    statuses = [d.get("exitstatus") for d in docs]
    merged = dict(first)
    merged.update(
        started=min((d["started"] for d in docs if isinstance(d.get("started"), (int, float))), default=None),
        finished=max((d["finished"] for d in docs if isinstance(d.get("finished"), (int, float))), default=None),
        exitstatus=exit_status(statuses),
        rootdir=_rebase(first.get("rootdir"), files[0].parent, out),
        golden_dir=_rebase(first.get("golden_dir"), files[0].parent, out),
        tests=sorted(_latest_per_test(tests), key=lambda t: (str(t.get("nodeid")), t["shard"])),
        stale=stale,
        shards=shards,
    )
    try:
        out.mkdir(parents=True, exist_ok=True)
        return write(out, merged)
    except OSError as e:
        raise JaxlogError(f"[jaxlog] merge: cannot write {out / MANIFEST_NAME}: {e.strerror or e}") from None
