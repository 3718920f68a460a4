"""Whether a document is a manifest as the plugin writes it, field by field, before anything reads
it: ``jaxlog merge`` and ``jaxlog summary`` reject a malformed one with one message naming the
field, instead of a traceback halfway through, a merged manifest that ``summary`` then skips, or
"0 tests, exit status None" passed off as a reading. Standard library only (see ``manifest``).
"""

from __future__ import annotations

from typing import Any

from ..errors import JaxlogError

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
