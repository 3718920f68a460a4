"""Protobuf's wire format, the few pieces a ``.pftrace`` needs.

Why not the ``perfetto`` package's generated classes: importing them builds the whole Perfetto
descriptor pool (~0.25 s, paid by every pytest session and every xdist worker that writes a
timeline), and an object per packet costs ~10 us. Writing needs only varints, fixed64 and
length-delimited fields; reading still uses the generated classes, and tests/test_perfetto.py
parses what is written here with them.
"""

from __future__ import annotations

import struct

import numpy as np

__all__ = ["varint", "uint", "sint", "double", "text", "message", "wide_varints", "WIRE_VARINT", "WIRE_FIXED64",
           "WIRE_BYTES"]

WIRE_VARINT, WIRE_FIXED64, WIRE_BYTES = 0, 1, 2
_MASK64 = (1 << 64) - 1


def varint(n: int) -> bytes:
    """An unsigned varint; a negative int (int32/int64 fields) as its 64-bit two's complement."""
    n &= _MASK64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def uint(number: int, n: int) -> bytes:
    """A varint field (uint32/64, and int32/64, bool, enum)."""
    return tag(number, WIRE_VARINT) + varint(n)


sint = uint  # int32/int64 fields are plain varints of the two's complement


def double(number: int, x: float) -> bytes:
    return tag(number, WIRE_FIXED64) + struct.pack("<d", x)


def message(number: int, payload: bytes) -> bytes:
    """A length-delimited field: a sub-message, bytes."""
    return tag(number, WIRE_BYTES) + varint(len(payload)) + payload


def text(number: int, s: str) -> bytes:
    """A string field (UTF-8; a lone surrogate is replaced, as protobuf requires valid UTF-8)."""
    return message(number, s.encode("utf-8", "replace"))


def wide_varints(x: np.ndarray) -> np.ndarray:
    """Non-negative integers as varints of one width, one row each (the width the largest
    needs): readers accept a varint padded with continuation bytes, and a fixed width lets many
    fields be laid out at once."""
    x = np.asarray(x, np.int64).astype(np.uint64)
    width = max(1, -(-int(x.max(initial=0)).bit_length() // 7))
    out = ((x[:, None] >> (np.arange(width, dtype=np.uint64) * np.uint64(7))) & np.uint64(0x7F)).astype(np.uint8)
    out[:, :width - 1] |= 0x80
    return out
