"""Pending goldens: under review (CI), a golden that no longer matches is never rewritten; the
obtained trajectory is written beside it as ``<entry>.h5.pending`` with ``<entry>.h5.pending.json``
(what it replaces, the test, the first lines of the comparison), and a person applies it
(``jaxlog golden accept``) or drops it (``jaxlog golden reject``) where the goldens are versioned.

Why: a CI job that rewrites goldens hides the change it should show; one that only fails leaves
the person to reproduce the run locally to get the new reference. A pending file is the new
reference, ready to be looked at (``jaxlog diff``) and taken. Its ID is the entry's path relative
to the golden directory, e.g. ``tests.test_md.test_nve.h5``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..errors import JaxlogError

SUFFIX = ".pending"
NOTE = SUFFIX + ".json"


@dataclass(frozen=True)
class Pending:
    """One pending golden: ``data`` the obtained trajectory, ``target`` the entry it would replace."""

    id: str
    target: Path
    data: Path
    note: Path
    test: str | None
    summary: str

    def accept(self) -> None:
        """The pending file becomes the entry (atomic replace), its note goes."""
        if not self.data.is_file():
            raise JaxlogError(f"[jaxlog] pending golden {self.id}: its file {self.data} is gone; "
                              "rerun the test to write it again")
        self.target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.data, self.target)
        self.note.unlink(missing_ok=True)

    def reject(self) -> None:
        self.data.unlink(missing_ok=True)
        self.note.unlink(missing_ok=True)


def paths(target: Path) -> tuple[Path, Path]:
    """The pending data file and note of entry ``target``."""
    return target.with_name(target.name + SUFFIX), target.with_name(target.name + NOTE)


def write(save: Any, target: Path, golden_dir: Path, *, test: str | None, summary: str) -> Pending:
    """Write the pending golden of ``target``: ``save(path)`` writes the trajectory (beside, then
    renamed, so a reader never sees half a file), then the note."""
    data, note = paths(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = data.with_name(f".{data.name}.{os.getpid()}.tmp")
    try:
        save(tmp)
        os.replace(tmp, data)
    finally:
        tmp.unlink(missing_ok=True)
    ident = pending_id(target, golden_dir)
    doc = {"id": ident, "target": target.name, "test": test, "written": time.time(), "summary": summary}
    tmp_note = note.with_name(f".{note.name}.{os.getpid()}.tmp")
    tmp_note.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp_note, note)
    return Pending(ident, target, data, note, test, summary)


def pending_id(target: Path, golden_dir: Path) -> str:
    """The entry's path relative to the golden directory (its name where it lies elsewhere)."""
    try:
        return target.resolve().relative_to(golden_dir.resolve()).as_posix()
    except ValueError:
        return target.name


def find(golden_dir: Path) -> list[Pending]:
    """Every pending golden under ``golden_dir``, by ID; a note that is not one is a JaxlogError naming it."""
    out = []
    for note in sorted(Path(golden_dir).rglob("*" + NOTE)):
        target = note.with_name(note.name[: -len(NOTE)])
        try:
            doc = json.loads(note.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise JaxlogError(f"[jaxlog] pending golden note {note} is not readable JSON ({e}); delete it") from None
        if not isinstance(doc, dict):
            raise JaxlogError(f"[jaxlog] pending golden note {note} is not a JSON object; delete it")
        test, summary = doc.get("test"), doc.get("summary")
        out.append(Pending(pending_id(target, golden_dir), target, paths(target)[0], note,
                           test if isinstance(test, str) else None, summary if isinstance(summary, str) else ""))
    return sorted(out, key=lambda p: p.id)


def select(found: list[Pending], ids: Iterable[str], every: bool) -> list[Pending]:
    """The pending goldens named by ``ids`` (an ID, or it without ``.h5``, or a pending file's
    path), or all of them with ``every``; an ID that names none is a JaxlogError listing them."""
    ids = list(ids)
    if every:
        return found
    if not ids:
        raise JaxlogError("[jaxlog] name the pending goldens (IDs as `jaxlog golden list` shows them) or give --all")
    chosen: list[Pending] = []
    for ident in ids:
        hits = [p for p in found if ident in (p.id, p.id.removesuffix(".h5"), str(p.data), str(p.note))
                or Path(ident).resolve() in (p.data.resolve(), p.note.resolve(), p.target.resolve())]
        if not hits:
            have = ", ".join(p.id for p in found) or "none"
            raise JaxlogError(f"[jaxlog] no pending golden {ident!r} (pending: {have})")
        chosen += [p for p in hits if p not in chosen]
    return chosen
