"""One manifest from the ``manifest.json`` of several sessions: the shards of a suite that CI
jobs ran apart (a matrix with pytest's own selection or pytest-split), each leaving its
``.jaxlog/``.

The merge is an ordinary manifest (``jaxlog summary`` and anything else reading manifests reads
it unchanged): every path in it is rewritten to be relative to the merge's own directory, so the
shards' files stay where they are and are found from there. Each test entry says which shard it
came from (``shard``: its position in ``shards``); a test that ran in several shards is listed
once per shard. A shard's ``.jaxlog/`` restored from an earlier run carries entries of tests it
did not run again (``stale``): those of a test another shard ran are left out, and of a test no
shard ran only the newest is kept, so each test is listed as its latest evidence says (``summary``
counts and lists a test in several shards once, as its worst outcome). A shard that is not a
manifest as the plugin writes it is refused, naming the field (``manifest_check``); the merge's
exit status is the first failing shard's, else unknown (null) where a shard has none, never 0.
Pure JSON and paths: no trajectory is opened.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from ..errors import JaxlogError
from . import manifest
from .manifest import NAME as MANIFEST_NAME
from .manifest_check import check


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
        doc = manifest.read(path)
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
        return manifest.write(out, merged)
    except OSError as e:
        raise JaxlogError(f"[jaxlog] merge: cannot write {out / MANIFEST_NAME}: {e.strerror or e}") from None
