"""What is recorded: named views of the state, each with a schedule.

``record={"energy": f, "x": Record(g, every=10)}``. A view may return any pytree of arrays; its
leaves become record paths ``"<name>/<key>/<key>"``. Resolving views against a state (shapes,
dtypes, leaf paths) happens once, before the run, so bad views fail before any step runs.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..errors import JaxlogError
from .schedule import Schedule, as_schedule

__all__ = ['check_meta', 'run_meta', 'described_run', 'MAX_BYTES', 'READ_MAX_BYTES', 'KEY']

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

# ---------------------------------------------------------------------------------------------
# A run's metadata: ``jl.run(..., meta={...})``, JSON kept with the trajectory.
#
# Why: what describes a run but is no array (a configuration, a solver's convergence message, a
# dataset's name) has no place in records, and ``jl.log`` takes arrays only. It is stored in the
# file with the run's own description (the ``/jaxlog`` ``meta`` attribute, as JSON: H5MD tools
# ignore it, ``traj.meta`` reads it back), as ``{"run": {"driver": ..., "meta": {...}}}``, and
# listed in the manifest.
#
# Values are JSON as written: strings, numbers (finite), bools, None, lists and dicts with string
# keys. Anything else is refused where it is given, naming the key, not turned into its ``repr``;
# the JSON text is bounded (``MAX_BYTES``), and so is what a reader accepts of a file's
# description (``READ_MAX_BYTES``: a hostile file cannot make the reader allocate more).

KEY = "meta"  # the key of the run's metadata in the description sinks get (and the file keeps)
MAX_BYTES = 1 << 20  # the JSON text of a run's metadata: a description, not data
READ_MAX_BYTES = 16 << 20  # the description attribute a reader accepts: metadata, layout of processes and all

_ADVICE = "JSON values: strings, numbers, bools, None, lists, dicts with string keys"


def check_meta(meta: Any, where: str = "meta=") -> dict:
    """``meta`` as a plain JSON dict (tuples as lists, numpy scalars as numbers), or one
    :class:`JaxlogError` naming the key whose value is not JSON."""
    if not isinstance(meta, dict):
        raise JaxlogError(f"{where} must be a dict of {_ADVICE}, got {type(meta).__name__}")
    out = _plain(meta, "", where)
    size = len(json.dumps(out).encode())
    if size > MAX_BYTES:
        raise JaxlogError(f"{where} is {size} bytes of JSON, more than {MAX_BYTES} a run's metadata may take: "
                          f"arrays and long data belong in records, jl.log or an artifact file")
    return out


def _plain(value: Any, path: str, where: str) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise JaxlogError(f"{where} {path or '(the value)'!r} is {value}, which JSON cannot hold")
        return value
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == () and getattr(value, "dtype", None) is not None:
        if getattr(value.dtype, "kind", None) in ("b", "i", "u", "f"):  # a numpy or jax scalar number
            return _plain(item(), path, where)
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise JaxlogError(f"{where} key {k!r} under {path or '(the top)'!r} is a {type(k).__name__}; JSON "
                                  f"object keys are strings")
            out[k] = _plain(v, f"{path}/{k}" if path else k, where)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{path}[{i}]", where) for i, v in enumerate(value)]
    raise JaxlogError(f"{where} {path or '(the value)'!r} is a {type(value).__name__}, not JSON ({_ADVICE}); "
                      f"arrays belong in records or jl.log")


def run_meta(description: dict) -> dict:
    """A run's metadata from the description its sinks got (``traj.meta``): ``{}`` for a run
    given none. A description no driver wrote (a sink opened by hand with its caller's own
    dict) is that caller's metadata as it is."""
    run = described_run(description)
    if run is None:
        return dict(description)
    meta = run.get(KEY)
    return dict(meta) if isinstance(meta, dict) else {}


def described_run(description: dict) -> dict | None:
    """The run's part of a description a driver wrote (``{"run": {"driver": ...}}``), else None."""
    run = description.get("run")
    return run if isinstance(run, dict) and "driver" in run else None
