"""Where a trajectory came from: versions, backend and machine, stored with every file.

jax is imported inside ``provenance()`` (not at module import) so the plugin stays jax-free.
"""

from __future__ import annotations

import datetime
import json
import platform
import socket
import sys
import zlib
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..dtypes import CHECKPOINT_META as CHECKPOINT_META, DTYPE_ATTR as DTYPE_ATTR, KEY_IMPL_ATTR as KEY_IMPL_ATTR


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


_STATIC: dict | None = None


def provenance() -> dict:
    """JSON-able description of the software and hardware this process runs on.

    Versions and devices do not change within a process: they are looked up once (package
    metadata lookups cost milliseconds per run); the time is fresh on every call."""
    global _STATIC
    if _STATIC is None:
        _STATIC = _describe()
    return {**_STATIC, "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _describe() -> dict:
    from ...version import __version__

    out: dict = {
        "pytest_jaxlog": __version__,
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "h5py": _version("h5py"),
        "ml_dtypes": _version("ml_dtypes"),
        "jax": _version("jax"),
        "jaxlib": _version("jaxlib"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "hostname": socket.gethostname(),
        "argv0": sys.argv[0] if sys.argv else None,
    }
    try:
        import jax

        out["jax"] = jax.__version__
        devices = jax.devices()
        out["backend"] = jax.default_backend()
        out["device_kind"] = devices[0].device_kind if devices else None
        out["device_count"] = len(devices)
        out["x64"] = bool(jax.config.jax_enable_x64)
    except Exception as exc:  # no jax or no backend: provenance must never break a run
        out.update(backend=None, device_kind=None, device_count=0, x64=None, jax_error=repr(exc))
    return out

# ---------------------------------------------------------------------------------------------
# Every name the file holds, written (``writer``, ``writer_thread``, ``parts``) and read
# (``trajectory``, ``parts``) from here: a name spelt twice can drift, and a file whose reader
# looks for another name than its writer wrote reads as damaged.

# groups and datasets (H5MD 1.1 where H5MD names them)
H5MD = "h5md"
H5MD_AUTHOR = "h5md/author"
H5MD_CREATOR = "h5md/creator"
H5MD_VERSION = (1, 1)
CREATOR_NAME = "pytest-jaxlog"  # the creator group's name attribute
OBSERVABLES = "observables"
PARTICLES = "particles"
BOX = "box"
POSITION = "position"  # the particle name H5MD gives positions (its box takes their dimension)
JAXLOG = "jaxlog"
ATTACHMENTS = "attachments"  # under /jaxlog: <name>/<step>/<path>
STEP = "step"  # the datasets of one record, under /observables/<path>
VALUE = "value"
TIME = "time"

# attributes of datasets (the ml_dtypes name of a uint view, a PRNG key's impl) and a checkpoint's
# JSON entry (``CHECKPOINT_META``, ``DTYPE_ATTR``, ``KEY_IMPL_ATTR``, imported above): named by
# ``store.dtypes``, which encodes them, and read from here with the file's other names

# attributes of the H5MD groups
VERSION_ATTR = "version"
NAME_ATTR = "name"
DIMENSION_ATTR = "dimension"
BOUNDARY_ATTR = "boundary"

# /jaxlog attributes (JSON texts)
FORMAT_VERSION_ATTR = "format_version"
SCHEMA_ATTR = "schema"
PROVENANCE_ATTR = "provenance"
META_ATTR = "meta"
VIOLATION_ATTR = "violation"
STATUS_ATTR = "status"
STEPS_DONE_ATTR = "steps_done"
WRITER_ERROR_ATTR = "writer_error"
SUMMARY_ATTR = "summary"
PARTS_ATTR = "parts"  # on a multi-process index: the part files and blocks
GOLDEN_ATTR = "golden"  # on a golden file: how it is checked
PART_META = "part"  # in a part file's meta: {"run_id", "process", "index"}
REQUIRED_ATTRS = (FORMAT_VERSION_ATTR, SCHEMA_ATTR, STATUS_ATTR, STEPS_DONE_ATTR)
OPTIONAL_ATTRS = (PROVENANCE_ATTR, META_ATTR, VIOLATION_ATTR, WRITER_ERROR_ATTR, SUMMARY_ATTR, PARTS_ATTR, GOLDEN_ATTR)
# rewritten in place while the file is written, in fixed sizes (bytes): a full disk still takes the final status
FIXED_ATTRS = {STATUS_ATTR: 16, STEPS_DONE_ATTR: 24, WRITER_ERROR_ATTR: 2048}

# the values of ``status`` the store itself writes (``store.protocol.STATUSES`` lists them all)
RUNNING = "running"
COMPLETE = "complete"
STOPPED = "stopped"
FAILED = "failed"

# attachment names with a meaning to the store
CHECKPOINT = "checkpoint"
POSTMORTEM = "postmortem"


# ---------------------------------------------------------------------------------------------
# The HDF5 file's format constants and JSON attribute helpers, shared by the writer
# (``writer_thread.py``), the multi-process index (``parts.py``) and the reader (``trajectory.py``).
#
# JSON attributes are kept as fixed-length bytes in the object header (checksummed by HDF5),
# not in the global heap (no checksum; a damaged one can make HDF5 loop while reading it); the
# ones in ``CRC_COVERS`` are covered by our own checksum in ``CRC_ATTR`` as well.

LIBVER = ("v108", "v108")
# HDF5 keeps string attributes in its global heap, which has no checksum: ours does
CRC_ATTR = "json_crc32"
CRC_COVERS = (FORMAT_VERSION_ATTR, SCHEMA_ATTR, PROVENANCE_ATTR, META_ATTR, VIOLATION_ATTR)


def json_text(value: Any) -> str:
    """``value`` as JSON; numpy scalars and arrays as numbers and lists, anything else by repr."""
    return json.dumps(value, default=_json_default)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    return repr(obj)


def json_crc32(texts: Mapping[str, str | bytes | None]) -> int:
    """Checksum of the JSON attributes in ``CRC_COVERS`` (absent ones count as empty)."""
    parts = (texts.get(k) or b"" for k in CRC_COVERS)
    return zlib.crc32(b"\0".join(p if isinstance(p, bytes) else p.encode() for p in parts))


def attr_text(value: str) -> np.bytes_:
    """A string attribute as fixed-length bytes: stored in the object header (checksummed), not in
    HDF5's global heap (no checksum; a damaged one can make HDF5 loop while reading it)."""
    return np.bytes_(value.encode())

