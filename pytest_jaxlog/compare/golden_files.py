"""A trajectory golden's files: its entries per platform, what a golden says of itself (the
options it is checked with, the platform it was made on), and the pending goldens left for
review."""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..errors import JaxlogError
from ..record.schedule import schedule_from_json

PLATFORM_KEYS = ("backend", "device_kind", "jax", "x64")


def platform(provenance: dict) -> dict:
    """The platform fields of a provenance record (``jl.Trajectory.provenance``)."""
    return {k: provenance.get(k) for k in PLATFORM_KEYS}


def describe(options: dict[str, Any], provenance: dict, jax_range: dict | None = None) -> dict[str, Any]:
    """The ``golden`` attribute for comparison ``options`` (rtol, atol, records, steps, equal_nan,
    defaults applied), the provenance of the run the golden is made from and the jax versions it
    stands for (``{"from": "0.10.2", "below": "0.11"}``; None: the running jax's minor series)."""
    records = options.get("records")
    made = platform(provenance)
    return {
        "rtol": float(options["rtol"]),
        "atol": float(options["atol"]),
        "records": None if records is None else [records] if isinstance(records, str) else list(records),
        "steps": _steps_json(options.get("steps")),
        "equal_nan": bool(options.get("equal_nan", True)),
        "tolerances": _tolerances_json(options.get("tolerances")),
        "platform": made,
        "jax_range": jax_range or minor_series(made.get("jax")),
    }


def minor_series(version: Any) -> dict | None:
    """``{"from": "0.12.0.1", "below": "0.13"}``: the versions of ``version``'s minor series from it
    on (XLA's numerics change between minor releases); None for an unknown version."""
    parts = version_tuple(version)
    if parts is None:
        return None
    major, minor = (parts + (0, 0))[:2]
    return {"from": str(version), "below": f"{major}.{minor + 1}"}


def version_tuple(version: Any) -> tuple[int, ...] | None:
    """``"0.12.0.1"`` -> ``(0, 12, 0, 1)``; the numeric release part only (``0.5.0.dev1`` -> (0, 5, 0));
    None when it does not start with a number."""
    if not isinstance(version, str):
        return None
    out: list[int] = []
    for part in version.split("."):
        digits = ""
        for c in part:
            if not c.isdigit():
                break
            digits += c
        if not digits:
            break
        out.append(int(digits))
        if len(digits) < len(part):
            break
    return tuple(out) or None


def options(info: dict[str, Any], where: str = "golden") -> dict[str, Any]:
    """The comparison options a golden's ``golden`` attribute stores (those it holds), validated:
    a field present but not of its kind (a tolerance NaN, infinite or negative, a record that is
    not a name) is a JaxlogError naming ``where`` (the file) and the field."""
    out: dict[str, Any] = {}
    for key in ("rtol", "atol"):
        value = info.get(key)
        if value is None:
            continue
        if not _is_number(value) or not math.isfinite(value) or value < 0:
            raise invalid(where, key, value, "a finite number >= 0")
        out[key] = float(value)
    records = info.get("records")
    if records is not None:
        if not (isinstance(records, list) and records and all(isinstance(r, str) and r for r in records)):
            raise invalid(where, "records", records, "a list of record names")
        out["records"] = list(records)
    if info.get("steps") is not None:
        steps = _steps_from_json(info["steps"])
        if steps is None:
            raise invalid(where, "steps", info["steps"], "a slice, step numbers or a schedule")
        out["steps"] = steps
    if info.get("tolerances") is not None:
        out["tolerances"] = _tolerances_read(info["tolerances"], where)
    if info.get("equal_nan") is not None:
        if not isinstance(info["equal_nan"], bool):
            raise invalid(where, "equal_nan", info["equal_nan"], "true or false")
        out["equal_nan"] = info["equal_nan"]
    stored_platform(info, where)  # the rest of the attribute is validated on the same read
    stored_range(info, where)
    return out


def _tolerances_json(tolerances: Any) -> dict | None:
    """Per-record tolerances (and what else a calibration keeps of each record: its spread) as JSON."""
    if tolerances is None:
        return None
    return {str(k): {str(n): float(v) for n, v in entry.items()} for k, entry in tolerances.items()}


def _tolerances_read(doc: Any, where: str) -> dict:
    """Stored per-record tolerances: ``{record: {"rtol": x, "atol": y, ...}}``, every figure finite, >= 0."""
    if not isinstance(doc, dict):
        raise invalid(where, "tolerances", doc, 'an object {record: {"rtol": ..., "atol": ...}}')
    for record, entry in doc.items():
        if not isinstance(entry, dict) or not entry:
            raise invalid(where, f"tolerances.{record}", entry, 'an object {"rtol": ..., "atol": ...}')
        for name, value in entry.items():
            if not _is_number(value) or not math.isfinite(value) or value < 0:
                raise invalid(where, f"tolerances.{record}.{name}", value, "a finite number >= 0")
    return {record: dict(entry) for record, entry in doc.items()}


def stored_platform(info: dict[str, Any], where: str = "golden") -> dict | None:
    """The platform a golden's attribute says it was made on, validated (None when it says none)."""
    made = info.get("platform")
    if made is None:
        return None
    kinds = {"backend": str, "device_kind": str, "jax": str, "x64": bool}
    if not isinstance(made, dict):
        raise invalid(where, "platform", made, "an object (backend, device_kind, jax, x64)")
    for key, kind in kinds.items():
        if made.get(key) is not None and not isinstance(made[key], kind):
            raise invalid(where, f"platform.{key}", made[key], f"a {kind.__name__}")
    return {k: made.get(k) for k in PLATFORM_KEYS}


def stored_range(info: dict[str, Any], where: str = "golden") -> dict | None:
    """The jax versions a golden stands for (``{"from", "below"}``), validated; None when absent."""
    doc = info.get("jax_range")
    if doc is None:
        return None
    if not (isinstance(doc, dict) and all(version_tuple(doc.get(k)) is not None for k in ("from", "below"))):
        raise invalid(where, "jax_range", doc, 'an object {"from": VERSION, "below": VERSION}')
    return {"from": doc["from"], "below": doc["below"]}


def invalid(where: str, field: str, value: Any, wanted: str) -> JaxlogError:
    """The error for a stored field that is not what it should be."""
    return JaxlogError(f"[jaxlog] {where}: stored field {field!r} is {value!r:.80}, expected {wanted}; "
                       "fix the file or regenerate it with --jaxlog-regen")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def platform_line(p: dict) -> str:
    """``backend 'cpu', device kind 'cpu', jax 0.10.2, x64 off``."""
    x64 = p.get("x64")
    return (f"backend {p.get('backend')!r}, device kind {p.get('device_kind')!r}, jax {p.get('jax')}, "
            f"x64 {'?' if x64 is None else 'on' if x64 else 'off'}")


def _steps_json(steps: Any) -> Any:
    """``steps=`` as JSON: a slice or range, step numbers, or a schedule; None when not given."""
    if steps is None:
        return None
    if isinstance(steps, (slice, range)):
        return {"slice": [steps.start, steps.stop, steps.step]}
    if hasattr(steps, "to_json"):
        return {"schedule": steps.to_json()}
    if not hasattr(steps, "__iter__"):  # one step number (numpy integers too)
        return {"steps": [int(steps)]}
    return {"steps": [int(s) for s in steps]}


def _steps_from_json(doc: Any) -> Any:
    if not isinstance(doc, dict):
        return None
    bounds = doc.get("slice")
    if isinstance(bounds, list) and len(bounds) == 3 and all(b is None or _is_int(b) for b in bounds):
        return slice(*bounds)
    steps = doc.get("steps")
    if isinstance(steps, list) and steps and all(_is_int(s) and s >= 0 for s in steps):
        return list(steps)
    if isinstance(doc.get("schedule"), dict):
        try:
            return schedule_from_json(doc["schedule"])
        except (JaxlogError, TypeError, ValueError, KeyError):  # damaged: absent, as any other bad field
            return None
    return None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)

# ---------------------------------------------------------------------------------------------
# A trajectory golden's entries per platform: the file ``<name>.h5`` is the reference entry, and
# ``<name>.platforms/<key>.h5`` beside it hold the entries of other platforms (backend, device kind,
# x64, a range of jax versions), each a golden file of its own.
#
# Why: a kernel's trajectory differs in its last digits between jax versions and backends, so a
# project that supports several cannot keep one tight golden. Each platform gets its entry; a
# platform without one is compared with the reference entry at the tolerance the reference stores,
# and the message says where the reference was made. An entry's platform is what its own ``golden``
# attribute says (the file name only keeps entries apart), so a renamed file still tells the truth.
# Files written before entries existed are reference entries: their platform is their provenance.

PLATFORMS = ".platforms"  # the folder of other platforms' entries: <stem>.platforms/
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")


@dataclass(frozen=True)
class Platform:
    """Where an entry stands: backend, device kind and x64 exact, jax from ``jax_from`` (inclusive)
    to ``jax_below`` (exclusive); a jax version that is not a number (a development build) only
    itself (``jax``). A field that is None is unknown and matches nothing."""

    backend: str | None
    device_kind: str | None
    x64: bool | None
    jax_from: str | None
    jax_below: str | None
    jax: str | None = None  # the version it was made with

    @classmethod
    def of(cls, made: dict, jax_range: dict | None) -> "Platform":
        """From a platform record (``golden_info.platform``) and a stored jax range (None: the
        made-on version's minor series)."""
        rng = jax_range or minor_series(made.get("jax")) or {}
        return cls(made.get("backend"), made.get("device_kind"), made.get("x64"), rng.get("from"), rng.get("below"),
                   made.get("jax"))

    def covers(self, here: dict) -> bool:
        """Whether an entry made for this platform stands for ``here`` (a platform record)."""
        if None in (self.backend, self.device_kind, self.x64) or self.backend != here.get("backend"):
            return False
        if self.device_kind != here.get("device_kind") or bool(self.x64) != bool(here.get("x64")):
            return False
        if self.jax_from is None:
            return self.jax is not None and self.jax == here.get("jax")
        v, lo, hi = (version_tuple(x) for x in (here.get("jax"), self.jax_from, self.jax_below))
        return v is not None and lo is not None and hi is not None and lo <= v < hi

    @property
    def jax_range(self) -> dict | None:
        return None if self.jax_from is None else {"from": self.jax_from, "below": self.jax_below}

    def key(self) -> str:
        """A file name for the entry: ``cpu-cpu-x32-jax0.12.0.1-0.13``."""
        bits = "x64" if self.x64 else "x32"
        jax = f"{self.jax_from}-{self.jax_below}" if self.jax_from is not None else self.jax
        raw = f"{self.backend}-{self.device_kind}-{bits}-jax{jax}"
        return _UNSAFE.sub("_", raw)

    def line(self) -> str:
        """``backend 'cpu', device kind 'cpu', x64 off, jax 0.10.2 up to 0.11``."""
        x64 = "?" if self.x64 is None else "on" if self.x64 else "off"
        jax = f"{self.jax_from} up to {self.jax_below}" if self.jax_from is not None else self.jax
        return f"backend {self.backend!r}, device kind {self.device_kind!r}, x64 {x64}, jax {jax}"


@dataclass(frozen=True)
class Entry:
    """One golden file of a golden: ``made`` the platform record it was made on (for messages)."""

    path: Path
    platform: Platform
    made: dict
    reference: bool
    stored: dict[str, Any]  # the comparison options its golden attribute stores (validated)


@dataclass(frozen=True)
class Choice:
    """What a check of one golden compares with: ``mine`` the entry for this platform (None when
    there is none), ``reference`` the reference entry (None when the golden has none)."""

    mine: Entry | None
    reference: Entry | None
    entries: tuple[Entry, ...]

    @property
    def entry(self) -> Entry | None:
        return self.mine or self.reference


def folder(reference: Path) -> Path:
    """The folder of the other platforms' entries of the golden whose reference is ``reference``."""
    return reference.with_name(reference.stem + PLATFORMS)


def entry_path(reference: Path, platform: Platform) -> Path:
    """Where the entry for ``platform`` of the golden ``reference`` is written."""
    return folder(reference) / f"{platform.key()}{reference.suffix or '.h5'}"


def read_entry(path: Path, reference: bool) -> Entry:
    """One entry: its platform from its golden attribute, else (older files) its provenance; every
    stored field validated (a bad one is a JaxlogError naming the file and the field)."""
    from ..store.hdf5.trajectory import load

    traj = load(path)
    info = traj.golden or {}
    where = f"golden {path}"
    made = stored_platform(info, where) or platform(traj.provenance or {})
    return Entry(path, Platform.of(made, stored_range(info, where)), made, reference,
                 options(info, where))


def entries(reference: Path, damaged: list[Path] | None = None) -> list[Entry]:
    """The reference entry (when it exists), then the other platforms' entries by file name. A
    damaged entry is a JaxlogError naming it, or (``damaged`` given) left out and listed there."""
    found = [reference] if reference.is_file() else []
    others = folder(reference)
    if others.is_dir():
        found += [p for p in sorted(others.glob("*" + (reference.suffix or ".h5"))) if p.is_file()]
    out = []
    for path in found:
        try:
            out.append(read_entry(path, path == reference))
        except JaxlogError:
            if damaged is None:
                raise
            damaged.append(path)
    return out


def choose(reference: Path, here: dict, damaged: list[Path] | None = None) -> Choice:
    """The entry for platform ``here`` (another platform's entry first, then the reference when it
    covers ``here``) and the reference entry."""
    found = entries(reference, damaged)
    ref = next((e for e in found if e.reference), None)
    mine = next((e for e in found if not e.reference and e.platform.covers(here)), None)
    if mine is None and ref is not None and ref.platform.covers(here):
        mine = ref
    return Choice(mine, ref, tuple(found))


def target(reference: Path, here: dict) -> tuple[Path, dict | None]:
    """Where a regeneration on platform ``here`` writes, and the jax range to keep: this platform's
    entry (its range kept), the reference when the golden has none yet (or it is damaged: the
    message that named it promised a regeneration fixes it), else a new entry beside it."""
    damaged: list[Path] = []
    choice = choose(reference, here, damaged)
    if choice.mine is not None:
        return choice.mine.path, choice.mine.platform.jax_range
    if choice.reference is None:
        return reference, None
    return entry_path(reference, Platform.of(here, None)), None

# ---------------------------------------------------------------------------------------------
# Pending goldens: under review (CI), a golden that no longer matches is never rewritten; the
# obtained trajectory is written beside it as ``<entry>.h5.pending`` with ``<entry>.h5.pending.json``
# (what it replaces, the test, the first lines of the comparison), and a person applies it
# (``jaxlog golden accept``) or drops it (``jaxlog golden reject``) where the goldens are versioned.
#
# Why: a CI job that rewrites goldens hides the change it should show; one that only fails leaves
# the person to reproduce the run locally to get the new reference. A pending file is the new
# reference, ready to be looked at (``jaxlog diff``) and taken. Its ID is the entry's path relative
# to the golden directory, e.g. ``tests.test_md.test_nve.h5``.

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
