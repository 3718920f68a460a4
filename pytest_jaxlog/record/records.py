"""What is recorded: named views of the state, each with a schedule.

``record={"energy": f, "x": Record(g, every=10)}``. A view may return any pytree of arrays; its
leaves become record paths ``"<name>/<key>/<key>"``. Resolving views against a state (shapes,
dtypes, leaf paths) happens once, before the run, so bad views fail before any step runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..errors import JaxlogError
from ..record.schedule import Schedule, as_schedule

_NAME = re.compile(r"^[^/\s][^/]*$")
AUX = "aux"
LOG = "log"  # values logged with jl.log inside the step or a view: "log/<name>"
WHEN = "when"  # "when/<record>": which systems each row of a batched per-system when= record holds


@dataclass(frozen=True)
class Record:
    """A view of the state (``state -> pytree of arrays``) and when to take it: on a schedule
    and, with ``when=pred``, only at the scheduled steps where ``pred(state)`` holds (accepted
    samples, steps where an event fired), decided on the device so only kept rows reach the host."""

    view: Callable[[Any], Any]
    every: Any = None  # int or Schedule; None means every step
    when: Callable[[Any], Any] | None = None

    def __post_init__(self):
        if not callable(self.view):
            raise JaxlogError(f"Record view must be callable, got {self.view!r}")
        if self.when is not None and not callable(self.when):
            raise JaxlogError(f"Record when= must be a callable state -> bool, got {self.when!r}")

    @property
    def schedule(self) -> Schedule:
        return as_schedule(self.every, "Record(every=...)")


@dataclass(frozen=True)
class RecordSpec:
    name: str
    view: Callable[[Any], Any]
    schedule: Schedule
    when: Callable[[Any], Any] | None = None


def path_part_ok(part: Any) -> bool:
    """The one rule for a component of a record path (a record name, a pytree key under it): what
    a trajectory file can name and its reader accepts. Not empty, no '/', not '.' or '..' (which
    HDF5 and file paths take as "here" and "up"), no NUL."""
    return isinstance(part, str) and part not in ("", ".", "..") and "/" not in part and "\x00" not in part


def is_record_path(path: Any) -> bool:
    """A record path ``a/b/c`` whose every component :func:`path_part_ok` accepts."""
    return isinstance(path, str) and all(path_part_ok(p) for p in path.split("/"))


def check_name(name: Any, what: str = "record name") -> str:
    if not isinstance(name, str) or not _NAME.match(name) or not path_part_ok(name):
        raise JaxlogError(
            f"{what} {name!r} is invalid: use a non-empty string without '/' "
            "(nest records by returning a dict from the view instead)"
        )
    return name


def normalize_records(record: Mapping[str, Any] | None, *, reserved: tuple[str, ...] = ()) -> list[RecordSpec]:
    """Turn the user's ``record=`` mapping into specs, checking names."""
    if record is None:
        return []
    if not isinstance(record, Mapping):
        raise JaxlogError(f"record= must be a dict of name -> view or jl.Record, got {type(record).__name__}")
    specs = []
    for name, value in record.items():
        check_name(name)
        if name in reserved:
            holds = {AUX: "the step function's aux output", LOG: "the values logged with jl.log"}.get(name, "")
            raise JaxlogError(f"record name {name!r} is reserved" + (f" (it holds {holds})" if holds else ""))
        if isinstance(value, Record):
            specs.append(RecordSpec(name, value.view, value.schedule, value.when))
        elif callable(value):
            specs.append(RecordSpec(name, value, as_schedule(None, name)))
        else:
            raise JaxlogError(f"record {name!r}: expected a callable view or jl.Record, got {value!r}")
    return specs


def key_to_str(entry: Any) -> str:
    """One pytree key-path entry as a path component."""
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def leaf_paths(prefix: str, key_paths: list[tuple]) -> list[str]:
    """Record paths for the leaves of one view's output; a bare array keeps the record name."""
    paths = []
    for kp in key_paths:
        parts = [key_to_str(e) for e in kp]
        for part in parts:
            if not path_part_ok(part):
                raise JaxlogError(f"record {prefix!r}: pytree key {part!r} cannot be a record path component")
        paths.append("/".join([prefix, *parts]))
    dupes = {p for p in paths if paths.count(p) > 1}
    if dupes:
        raise JaxlogError(f"record {prefix!r}: duplicate record paths {sorted(dupes)}")
    return paths
