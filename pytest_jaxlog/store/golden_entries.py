"""A trajectory golden's entries per platform: the file ``<name>.h5`` is the reference entry, and
``<name>.platforms/<key>.h5`` beside it hold the entries of other platforms (backend, device kind,
x64, a range of jax versions), each a golden file of its own.

Why: a kernel's trajectory differs in its last digits between jax versions and backends, so a
project that supports several cannot keep one tight golden. Each platform gets its entry; a
platform without one is compared with the reference entry at the tolerance the reference stores,
and the message says where the reference was made. An entry's platform is what its own ``golden``
attribute says (the file name only keeps entries apart), so a renamed file still tells the truth.
Files written before entries existed are reference entries: their platform is their provenance.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import JaxlogError
from . import golden_info

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
        rng = jax_range or golden_info.minor_series(made.get("jax")) or {}
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
        v, lo, hi = (golden_info.version_tuple(x) for x in (here.get("jax"), self.jax_from, self.jax_below))
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
    from .trajectory import load

    traj = load(path)
    info = traj.golden or {}
    where = f"golden {path}"
    made = golden_info.stored_platform(info, where) or golden_info.platform(traj.provenance or {})
    return Entry(path, Platform.of(made, golden_info.stored_range(info, where)), made, reference,
                 golden_info.options(info, where))


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
