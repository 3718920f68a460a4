"""Goldens from the test's side: the file a check uses, regenerating (``--jaxlog-regen``), creating
missing ones (``--jaxlog-create-goldens``), and explaining a missing golden.

A golden's name comes from the test id, which pytest makes relative to its rootdir; started from
another directory, or without an ini file at the project root, the same test gets another id and
so another file name. When a golden is missing, the message therefore looks for a file under the
old name and says which rootdir would have produced it.
"""

from __future__ import annotations

import inspect
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import JaxlogAssertionError, JaxlogError, JaxlogRuntimeWarning
from .options import GOLDEN_DIR_INI, OPTIONS, lookup
from .session import GoldenNote, JaxlogSession, TestState

_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
CREATE_FLAG = OPTIONS["create_goldens"].flag_name
REGEN_FLAG = OPTIONS["regen"].flag_name
REVIEW_FLAG = OPTIONS["golden_review"].flag_name
_SCAN_LIMIT = 20000  # files looked at when searching for a golden under another name


class Rewrite(NamedTuple):
    """A stored figure to (re)write instead of compare: ``status`` created|regenerated, ``flag``
    the option that asked for it (for the warning)."""

    status: str
    flag: str


def rewrite(session: JaxlogSession, exists: bool) -> Rewrite | None:
    """Whether a stored gate (cost, ESS rate) writes its figure rather than compares with it:
    ``--jaxlog-regen`` always, ``--jaxlog-create-goldens`` where it is missing (``exists``: the
    file, or this platform's entry in it); None: compare, or fail as missing."""
    if session.regen:
        return Rewrite("regenerated" if exists else "created", REGEN_FLAG)
    if not exists and session.create_goldens:
        return Rewrite("created", CREATE_FLAG)
    return None


def golden_path(session: JaxlogSession, nodeid: str, name: str | None) -> Path:
    from ..names import golden_name

    return session.golden_dir / golden_name(nodeid, name=name)


def check(session: JaxlogSession, state: TestState, checked: set[Path], run: Any, name: str | None,
          options: dict[str, Any]) -> str:
    """The fixture's ``check_golden``: compare, regenerate or create; returns ok|regenerated|created."""
    from ..golden import diff_trajectories, regenerate

    __tracebackhide__ = True
    if name is not None and (not _NAME.fullmatch(str(name)) or str(name).startswith(".")):
        raise JaxlogError(f"check_golden(name={name!r}): use letters, digits, '_', '-', '.' (it names a file)")
    try:
        inspect.signature(diff_trajectories).bind(run, None, **options)
    except TypeError as e:
        raise JaxlogError(f"check_golden: {e} (options: those of jl.assert_trajectory_close)") from None
    path = golden_path(session, state.nodeid, name)
    if path in checked:  # else --jaxlog-regen keeps the last run's and the first run then fails
        raise JaxlogError(
            f"check_golden(name={name!r}): this test already checked golden {session.display(path)}; "
            "give each checked run its own name= (e.g. name=\"second\")"
        )
    checked.add(path)
    written = path
    if session.golden_review and path.exists():
        status = _compare(session, state, run, path, name, options)
    elif session.regen:
        written, status = regenerate(run, path, **options), "regenerated"
    elif not path.exists() and session.create_goldens:
        regenerate(run, path, **options)
        status = "created"
    elif not path.exists():
        raise JaxlogAssertionError(missing_message(session, state.nodeid, path))
    else:
        status = _compare(session, state, run, path, name, options)
    state.goldens.append(GoldenNote(written, status))
    if status == "regenerated":
        warnings.warn(JaxlogRuntimeWarning(
            f"[jaxlog] regenerated golden {session.display(written)} ({REGEN_FLAG}){_status_note(run)}"), stacklevel=3)
    elif status == "created":
        found = find_elsewhere(session, state.nodeid, path)
        other = f"; note: {found[0].explain(session)}" if found else ""
        warnings.warn(JaxlogRuntimeWarning(
            f"[jaxlog] created missing golden {session.display(path)} ({CREATE_FLAG}){_status_note(run)}{other}"),
            stacklevel=3)
    return status


def _compare(session: JaxlogSession, state: TestState, run: Any, path: Path, name: str | None,
             options: dict[str, Any]) -> str:
    """Compare with this platform's entry (else the reference); a difference fails the test, and
    under review writes the obtained golden beside the entry as a pending file first."""
    from ..golden import TrajectoryMismatch, compare_golden
    from . import failure_plots

    __tracebackhide__ = True
    result = compare_golden(run, path, **options)
    if result.ok:
        return "ok"
    hint = _review(session, state, run, result, options) if session.golden_review else None
    exc = TrajectoryMismatch(result.message(hint), result.diff)
    failure_plots.golden_mismatch(session, state, run, result.entry.path, name, exc)
    raise exc


def _review(session: JaxlogSession, state: TestState, run: Any, result: Any, options: dict[str, Any]) -> str:
    """Write the pending golden of a mismatch (the golden itself untouched); the message's last line."""
    from ..golden import write_golden
    from ..store import golden_pending

    jax_range = result.choice.mine.platform.jax_range if result.choice.mine is not None else None
    summary = "\n".join([result.provenance_line(), *result.diff.report().splitlines()[:2]])
    pending = golden_pending.write(lambda tmp: write_golden(run, tmp, jax_range, **options), result.target,
                                   session.golden_dir, test=state.nodeid, summary=summary)
    state.goldens.append(GoldenNote(result.target, "pending", pending.data, pending.id))
    source = lookup(session.config, "golden_review")
    why = "CI is set" if source.origin == "default" else f"{source.label} is on"
    return (f"golden left as it is (review: {why}); the obtained one is pending as {session.display(pending.data)}"
            f"\nto apply it: python -m pytest_jaxlog golden accept {pending.id} (reject: drop it; --all: every "
            "pending golden)")


def _status_note(run: Any) -> str:
    """A reference made from a broken run deserves a second look: say how the run ended."""
    traj = getattr(run, "trajectory", run)
    status = getattr(traj, "status", None)
    if status in (None, "complete"):
        return ""
    v = getattr(traj, "violation", None)
    inv = v.get("invariant") if isinstance(v, dict) else None
    return f"; note: the run's status is {status!r}" + (f" ({inv} violated at step {v.get('step')})" if inv else "")


def missing_message(session: JaxlogSession, nodeid: str, path: Path) -> str:
    lines = [f"[jaxlog] golden trajectory {session.display(path)} does not exist"]
    found = find_elsewhere(session, nodeid, path)
    for f in found[:3]:
        lines.append(f"  {f.explain(session)}")
    if found:
        lines.append("  pytest names goldens after test ids relative to its rootdir: run pytest where the goldens "
                     "were made, or put an ini file (pytest.ini, or pyproject.toml with [tool.pytest.ini_options]) "
                     "at the project root so the rootdir does not depend on where pytest starts")
    lines.append(f"to create it, run pytest with {CREATE_FLAG} (missing goldens only) or {REGEN_FLAG}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Found:
    """A golden for the same test under another name or in another golden directory."""

    path: Path
    name: str  # the name this session computes
    nodeid: str
    rootdir: Path  # this session's
    other_rootdir: Path | None  # the rootdir that would give the found name, when it can be told
    prefix: str  # path components by which the two test ids differ ("tests/"), or ""
    found_longer: bool  # the found name has the extra components

    def explain(self, session: JaxlogSession) -> str:
        where = session.display(self.path)
        if not self.prefix:
            return (f"found {where}: the same file name in another golden directory; this session's is "
                    f"{session.display(session.golden_dir)} ({GOLDEN_DIR_INI} relative to rootdir {self.rootdir})")
        if self.found_longer:
            why = (f"its test id starts with {self.prefix!r}, this session's ({self.nodeid}) does not: "
                   f"pytest's rootdir is {self.rootdir} here")
        else:
            why = (f"this session's test id ({self.nodeid}) starts with {self.prefix!r}, the file's does not: "
                   f"pytest's rootdir is {self.rootdir} here")
        made = f", it was made with rootdir {self.other_rootdir}" if self.other_rootdir is not None else ""
        return f"found {where} for the same test under another name: {why}{made}"


def find_elsewhere(session: JaxlogSession, nodeid: str, path: Path) -> list[Found]:
    """Goldens that look like this test's under another rootdir or golden directory: the same name in
    another golden directory, or a name that differs by leading path components of the test id."""
    target = path.name
    out: list[Found] = []
    seen: set[Path] = set()
    for directory in _golden_dirs(session, nodeid):
        for f in _files(directory):
            if f in seen or f == path:
                continue
            seen.add(f)
            fname = f.name
            if fname == target:
                out.append(Found(f, target, nodeid, session.rootdir, None, "", False))
            elif fname.endswith("." + target):
                prefix = fname[: -len(target) - 1]
                out.append(Found(f, target, nodeid, session.rootdir, _shorter(session.rootdir, prefix),
                                 prefix.replace(".", "/") + "/", True))
            elif target.endswith("." + fname):
                prefix = target[: -len(fname) - 1]
                out.append(Found(f, target, nodeid, session.rootdir, session.rootdir.joinpath(*prefix.split(".")),
                                 prefix.replace(".", "/") + "/", False))
    return sorted(out, key=lambda x: (len(x.prefix), str(x.path)))


def _shorter(rootdir: Path, prefix: str) -> Path | None:
    """The rootdir whose test ids have ``prefix`` in front of ours: ours minus those trailing folders."""
    parts = prefix.split(".")
    if len(parts) < len(rootdir.parts) and list(rootdir.parts[-len(parts):]) == parts:
        return rootdir.parents[len(parts) - 1]
    return None


def _golden_dirs(session: JaxlogSession, nodeid: str) -> list[Path]:
    """This session's golden directory, and the ones the ini key would give from the invocation
    directory, from a few folders above the rootdir and from the folders between the rootdir and
    the test file (each a rootdir the test could have had)."""
    dirs = [session.golden_dir]
    rel = Path(os.path.expanduser(str(session.config.getini(GOLDEN_DIR_INI))))
    if not rel.is_absolute():
        folders = [p for p in nodeid.split("::")[0].replace("\\", "/").split("/")[:-1] if p not in ("", ".", "..")]
        below = [session.rootdir.joinpath(*folders[:i]) for i in range(1, len(folders) + 1)]
        for base in (session.invocation_dir, *list(session.rootdir.parents)[:3], *below):
            d = base / rel
            if d not in dirs:
                dirs.append(d)
    return [d for d in dirs if d.is_dir()]


def _files(directory: Path) -> list[Path]:
    from ..store.golden_entries import PLATFORMS

    out: list[Path] = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.endswith(PLATFORMS)]  # other platforms' entries of a golden
        for name in files:
            if name.endswith(".h5"):
                out.append(Path(root) / name)
            if len(out) >= _SCAN_LIMIT:
                return out
    return out
