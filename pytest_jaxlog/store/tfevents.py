"""TensorBoard's event-file format, written without TensorBoard: TFRecord framing around
protobuf-encoded ``Event`` messages holding scalar ``Summary`` values.

Why not the ``tensorboard`` package: it brings grpcio, protobuf, werkzeug and more to write a
few dozen bytes per step, and its writer is made for TensorFlow or PyTorch tensors. The subset
written here is small and fixed (``file_version``, then ``wall_time``, ``step`` and
``summary.value[].{tag, simple_value}``); the tests read it back with TensorBoard's own reader.

Why numpy: every event of one record has the same layout, so a batch of them is one byte
matrix, and the CRC32C of all its rows is computed column by column (one numpy operation per
byte of an event, not one Python operation per byte of the file).
"""

from __future__ import annotations

import struct
from typing import Sequence

import numpy as np

FILE_VERSION = b"brain.Event:2"
_MASK_DELTA = 0xA282EAD8


def _crc32c_table() -> np.ndarray:
    poly = 0x82F63B78  # CRC-32C (Castagnoli), reflected
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(poly), table >> 1).astype(np.uint32)
    return table


_TABLE = _crc32c_table()


def crc32c_rows(rows: np.ndarray) -> np.ndarray:
    """CRC-32C of each row of a ``uint8`` matrix."""
    crc = np.full(rows.shape[0], 0xFFFFFFFF, np.uint32)
    for j in range(rows.shape[1]):
        crc = _TABLE[(crc ^ rows[:, j]) & 0xFF] ^ (crc >> np.uint32(8))
    return crc ^ np.uint32(0xFFFFFFFF)


def masked_crc(rows: np.ndarray) -> np.ndarray:
    """TFRecord's masked CRC of each row (so a CRC stored in data does not checksum to itself)."""
    crc = crc32c_rows(rows).astype(np.uint64)
    return (((crc >> np.uint64(15)) | (crc << np.uint64(17))) + np.uint64(_MASK_DELTA)).astype(np.uint32)


def frame_rows(rows: np.ndarray) -> bytes:
    """TFRecords of equal-length payloads: length, its masked CRC, payload, its masked CRC."""
    n, length = rows.shape
    head = np.zeros((n, 8), np.uint8)
    head[:] = np.frombuffer(struct.pack("<Q", length), np.uint8)
    out = np.empty((n, 16 + length), np.uint8)
    out[:, :8] = head
    out[:, 8:12] = masked_crc(head).astype("<u4").view(np.uint8).reshape(n, 4)
    out[:, 12:12 + length] = rows
    out[:, 12 + length:] = masked_crc(rows).astype("<u4").view(np.uint8).reshape(n, 4)
    return out.tobytes()


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1  # int64 fields: negative numbers as their two's complement
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def file_header(wall_time: float) -> bytes:
    """The first record of every event file: ``Event{wall_time, file_version}``."""
    event = b"\x09" + struct.pack("<d", wall_time) + _field(3, FILE_VERSION)
    return frame_rows(np.frombuffer(event, np.uint8)[None, :])


def scalar_events(tags: Sequence[str], steps: np.ndarray, values: np.ndarray, wall_time: float) -> bytes:
    """One event per step, each holding one value per tag: ``values`` is ``[steps, tags]``, stored
    as float32 (TensorBoard's ``simple_value``, what its scalar dashboard reads)."""
    steps = np.asarray(steps, np.int64)
    values = np.asarray(values, np.float32).reshape(len(steps), len(tags))
    if not len(steps):
        return b""
    # Summary.Value{tag=1, simple_value=2}: a fixed layout whose 4 value bytes sit at known offsets
    summary, offsets = bytearray(), []
    for tag in tags:
        name = _field(1, tag.encode())
        value = name + b"\x15"
        offsets.append(len(summary) + len(_varint(1 << 3 | 2)) + len(_varint(len(value) + 4)) + len(value))
        summary += _field(1, value + b"\0\0\0\0")
    summary_field = _field(5, bytes(summary))
    wall = np.frombuffer(struct.pack("<d", wall_time), np.uint8)
    out = []
    # events whose step varint has the same length share one layout: one matrix per length
    if steps.min() < 0:
        raise ValueError(f"negative steps cannot be written as TensorBoard events (got {int(steps.min())})")
    for lo, hi in _varint_groups(steps):
        width = int(_varint_lengths(steps[lo:lo + 1])[0])
        length = 1 + 8 + 1 + width + len(summary_field)
        rows = np.zeros((hi - lo, length), np.uint8)
        rows[:, 0] = 0x09
        rows[:, 1:9] = wall
        rows[:, 9] = 0x10
        rows[:, 10:10 + width] = _varint_columns(steps[lo:hi], width)
        base = 10 + width
        rows[:, base:] = np.frombuffer(summary_field, np.uint8)
        start = base + len(summary_field) - len(summary)
        floats = values[lo:hi].astype("<f4").view(np.uint8).reshape(hi - lo, len(tags), 4)
        for i, off in enumerate(offsets):
            rows[:, start + off:start + off + 4] = floats[:, i]
        out.append(frame_rows(rows))
    return b"".join(out)


def _varint_lengths(steps: np.ndarray) -> np.ndarray:
    """Bytes of each non-negative step's varint: one, plus one per 7 bits beyond the first 7."""
    return 1 + np.sum([(steps >= (1 << (7 * k))).astype(np.int64) for k in range(1, 9)], axis=0)


def _varint_groups(steps: np.ndarray) -> list[tuple[int, int]]:
    """Runs of consecutive steps whose varints have the same length."""
    cuts = np.flatnonzero(np.diff(_varint_lengths(steps))) + 1
    edges = [0, *cuts.tolist(), len(steps)]
    return list(zip(edges[:-1], edges[1:]))


def _varint_columns(steps: np.ndarray, width: int) -> np.ndarray:
    """The varint bytes of steps that all encode in ``width`` bytes, as a ``[n, width]`` matrix."""
    n = steps.astype(np.uint64)
    cols = np.empty((len(steps), width), np.uint8)
    for j in range(width):
        byte = (n >> np.uint64(7 * j)) & np.uint64(0x7F)
        cols[:, j] = byte | (np.uint64(0x80) if j < width - 1 else np.uint64(0))
    return cols
