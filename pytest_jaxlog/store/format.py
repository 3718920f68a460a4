"""The HDF5 file's format constants and JSON attribute helpers, shared by the writer
(``hdf5.py``), the multi-process index (``parts.py``) and the reader (``trajectory.py``).

JSON attributes are kept as fixed-length bytes in the object header (checksummed by HDF5),
not in the global heap (no checksum; a damaged one can make HDF5 loop while reading it); the
ones in ``CRC_COVERS`` are covered by our own checksum in ``CRC_ATTR`` as well.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np

LIBVER = ("v108", "v108")
# HDF5 keeps string attributes in its global heap, which has no checksum: ours does
CRC_ATTR = "json_crc32"
CRC_COVERS = ("format_version", "schema", "provenance", "meta", "violation")


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


def json_crc32(texts: dict[str, str | bytes | None]) -> int:
    """Checksum of the JSON attributes in ``CRC_COVERS`` (absent ones count as empty)."""
    parts = (texts.get(k) or b"" for k in CRC_COVERS)
    return zlib.crc32(b"\0".join(p if isinstance(p, bytes) else p.encode() for p in parts))


def attr_text(value: str) -> np.bytes_:
    """A string attribute as fixed-length bytes: stored in the object header (checksummed), not in
    HDF5's global heap (no checksum; a damaged one can make HDF5 loop while reading it)."""
    return np.bytes_(value.encode())
