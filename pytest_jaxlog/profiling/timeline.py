"""Protobuf's wire format, the few pieces a ``.pftrace`` needs.

Why not the ``perfetto`` package's generated classes: importing them builds the whole Perfetto
descriptor pool (~0.25 s, paid by every pytest session and every xdist worker that writes a
timeline), and an object per packet costs ~10 us. Writing needs only varints, fixed64 and
length-delimited fields; reading still uses the generated classes, and tests/test_perfetto.py
parses what is written here with them.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

__all__ = ['varint', 'uint', 'sint', 'double', 'text', 'message', 'wide_varints', 'WIRE_VARINT', 'WIRE_FIXED64', 'WIRE_BYTES', 'Timeline', 'now_ns', 'STEP_SLICE', 'TRACKS', 'MAX_COUNTER_SAMPLES']

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

# ---------------------------------------------------------------------------------------------
# Timeline: a thread-safe collector of a run's events, written as one Perfetto protobuf trace.
#
# The driver, the writer thread and the invariant checker add slices/instants/counters while the
# run goes; ``write(path)`` turns them into a ``.pftrace`` (protobuf's wire format written
# directly: ``profiling.timeline``) that opens in ui.perfetto.dev: one track per named
# track (``dispatch``, ``host``, ``writer``, ``compile``, ``window steps``, ``invariants``...), slices as
# ``TYPE_SLICE_BEGIN``/``TYPE_SLICE_END`` pairs, instants for violations, and one counter track per
# scalar record. Times are ``time.perf_counter_ns()`` nanoseconds.
#
# Counter samples carry their step number (a ``step`` annotation). Why a long run's counters are
# thinned: a sample costs ~40 bytes, so a 60,000-step run with a few scalar records would make the
# timeline larger than the trajectory, which holds every value anyway. A counter track keeps at
# most ``MAX_COUNTER_SAMPLES``: beyond that, the lowest and the highest sample of each stretch of
# steps (a spike or a NaN stays visible), and an instant on the ``timeline`` track says so.
#
# One track should be written by one actor at a time (slices on a track must nest); give each
# thread its own track, as the writer thread does.

#: Name of the per-step slice, in our trace and in JAX's (``StepTraceAnnotation("jaxlog_step")``).
STEP_SLICE = "jaxlog_step"
#: Conventional track names used by pytest-jaxlog's drivers.
TRACKS = ("dispatch", "host", "writer", "compile", "window steps", "invariants")

_SEQ_ID = 1
#: The most samples one counter track keeps in a written trace (see the module's docstring).
MAX_COUNTER_SAMPLES = 2000
#: The instant that says a counter track was thinned, on this track.
NOTES_TRACK = "timeline"
#: While a run goes, a counter track holding this many samples is thinned to a quarter of it, so
#: the timeline's memory stays bounded for any run length (the written trace is thinned further).
_COMPACT_AT = 16 * MAX_COUNTER_SAMPLES


def now_ns() -> int:
    return time.perf_counter_ns()


@dataclass
class _Slice:
    track: str
    name: str
    start_ns: int
    end_ns: int
    args: dict | None


@dataclass
class _Instant:
    track: str
    name: str
    ts_ns: int
    args: dict | None


@dataclass
class _Counter:
    name: str
    ts_ns: np.ndarray
    values: np.ndarray
    unit: str | None = None
    steps: np.ndarray | None = None  # the step of each sample (-1: not known)


@dataclass
class _Events:
    slices: list = field(default_factory=list)
    instants: list = field(default_factory=list)
    counters: list = field(default_factory=list)
    tracks: list = field(default_factory=list)  # names in first-use order


def _annotation(key: str, value: Any) -> bytes:
    """A ``DebugAnnotation`` (value 2 bool, 4 int, 5 double, 6 string; name 10), its fields in
    number order as protobuf writes them."""
    if isinstance(value, (bool, np.bool_)):
        field = uint(2, int(bool(value)))
    elif isinstance(value, (int, np.integer)) and -(2**63) <= int(value) < 2**63:
        field = sint(4, int(value))
    elif isinstance(value, (float, np.floating)):
        field = double(5, float(value))
    else:
        field = text(6, str(value))
    return field + text(10, str(key))


def _bytes_column(data: bytes, n: int) -> np.ndarray:
    return np.broadcast_to(np.frombuffer(data, np.uint8), (n, len(data)))


# Counter samples are most of a long run's packets; one at a time each cost ~10 us (~10 ms for a
# 1,000-step test's energy), laid out with numpy a whole track costs about one.
# perfetto's field numbers: Trace.packet 1; TracePacket.timestamp 8, .trusted_packet_sequence_id
# 10, .track_event 11; TrackEvent.debug_annotations 4, .type 9 (TYPE_COUNTER = 4), .track_uuid 11,
# .double_counter_value 44; DebugAnnotation.int_value 4, .name 10 (tests/test_perfetto.py parses
# the result with protobuf).
def _counter_packets(track_uuid: int, ts_ns: np.ndarray, values: np.ndarray, steps: np.ndarray) -> bytes:
    """One counter track's samples as serialized ``Trace.packet`` fields, in order; each sample
    with a known step (>= 0) carries it as its ``step`` annotation."""
    n = len(values)
    if n == 0:
        return b""
    steps = np.asarray(steps, np.int64)
    known = steps >= 0
    if not known.all() and known.any():  # rows of one layout each: those with a step, those without
        return b"".join(_counter_packets(track_uuid, ts_ns[i:i + 1], values[i:i + 1], steps[i:i + 1]) for i in range(n))
    ts, uuid = wide_varints(ts_ns), wide_varints(np.full(n, track_uuid))
    columns = [_bytes_column(b"\x48\x04\x58", n), uuid,  # type COUNTER, track_uuid
               _bytes_column(b"\xe1\x02", n), np.asarray(values, "<f8").view(np.uint8).reshape(n, 8)]  # the value
    if known.all():  # debug_annotations: int_value (the step), name "step"
        step = wide_varints(steps)
        columns = [_bytes_column(b"\x22" + bytes([1 + step.shape[1] + 6]) + b"\x20", n), step,
                   _bytes_column(b"\x52\x04step", n), *columns]
    event_len = sum(c.shape[1] for c in columns)  # at most 42 and the packet 57: one-byte lengths
    packet_len = 1 + ts.shape[1] + 2 + 2 + event_len
    rows = np.hstack([_bytes_column(bytes([0x0A, packet_len, 0x40]), n), ts,  # Trace.packet, length, timestamp
                      _bytes_column(uint(10, _SEQ_ID) + bytes([0x5A, event_len]), n),  # sequence, track_event
                      *columns])
    return rows.tobytes()


@dataclass
class _CounterTrack:
    """One counter track as written: its samples in order, thinned to ``MAX_COUNTER_SAMPLES``."""

    name: str
    ts_ns: np.ndarray
    values: np.ndarray
    steps: np.ndarray  # -1 where not known
    thinned_from: int = 0  # the number of samples before thinning (0: none dropped)


def _merged(series: list[_Counter]) -> _Counter:
    """One track's series as one, in order (steps -1 where a series had none)."""
    steps = [np.full(len(c.values), -1, np.int64) if c.steps is None else c.steps for c in series]
    return _Counter(series[0].name, np.concatenate([c.ts_ns for c in series]),
                    np.concatenate([c.values for c in series]), series[0].unit, np.concatenate(steps))


def _thinned(c: _Counter, limit: int) -> _Counter:
    keep = _extremes(c.values, c.steps if (c.steps >= 0).all() else c.ts_ns, limit)
    return _Counter(c.name, c.ts_ns[keep], c.values[keep], c.unit, c.steps[keep])


def _counter_tracks(counters: list[_Counter], totals: dict[str, int]) -> list[_CounterTrack]:
    """The tracks as written; ``totals``: samples recorded per track (more than held, once compacted)."""
    by_name: dict[str, list[_Counter]] = {}
    for c in counters:
        by_name.setdefault(c.name, []).append(c)
    out = []
    for name, series in by_name.items():
        c = _merged(series)
        total = max(totals.get(name, 0), len(c.values))
        if len(c.values) > MAX_COUNTER_SAMPLES:
            c = _thinned(c, MAX_COUNTER_SAMPLES)
        out.append(_CounterTrack(name, c.ts_ns, c.values, c.steps, thinned_from=total if total > len(c.values) else 0))
    return out


def _thinning_note(track: _CounterTrack) -> _Instant:
    """The instant that says, in the trace, that a counter track shows fewer samples than recorded."""
    return _Instant(NOTES_TRACK, "counter downsampled", int(track.ts_ns[-1]),
                    {"counter": track.name, "samples": track.thinned_from, "kept": len(track.values),
                     "kept samples": "the first, the last, and the lowest and highest of each stretch of steps"})


def _extremes(values: np.ndarray, where: np.ndarray, limit: int) -> np.ndarray:
    """Indices of at most ``limit`` samples, in order: the first, the last, and the lowest and the
    highest of each of ``(limit - 2) // 2`` equal stretches of ``where`` (increasing steps or
    times, so samples thinned before count by the span they cover, not by how many are left);
    argmin/argmax point at a NaN if there is one."""
    n = len(values)
    where = where.astype(np.float64)
    edges = np.linspace(where[0], where[-1], max(1, (limit - 2) // 2) + 1)
    cuts = np.searchsorted(where, edges[1:-1], side="right")
    keep = [0, n - 1]
    for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), n]):
        if hi > lo:
            part = values[lo:hi]
            keep += [lo + int(np.argmin(part)), lo + int(np.argmax(part))]
    return np.unique(np.array(keep, np.int64))


class Timeline:
    """Collects slices, instants and counter series from any thread; ``write`` makes a ``.pftrace``."""

    def __init__(self, name: str = "pytest-jaxlog"):
        self.name = name
        self._lock = threading.Lock()
        self._ev = _Events()
        self._counter_last: dict[str, int] = {}
        self._counter_total: dict[str, int] = {}  # samples recorded per counter track
        self._counter_held: dict[str, int] = {}  # of which held now (fewer once compacted)

    # -- collecting ---------------------------------------------------------------------------
    def _track(self, track: str) -> None:
        if track not in self._ev.tracks:
            self._ev.tracks.append(track)

    def slice(self, track: str, name: str, start_ns: int, end_ns: int, args: dict | None = None) -> None:
        """A finished slice ``[start_ns, end_ns]`` on ``track``."""
        start_ns, end_ns = int(start_ns), int(end_ns)
        if end_ns < start_ns:
            raise ValueError(f"[jaxlog] slice {name!r} on {track!r} ends before it starts")
        with self._lock:
            self._track(track)
            self._ev.slices.append(_Slice(track, name, start_ns, end_ns, dict(args) if args else None))

    @contextlib.contextmanager
    def span(self, track: str, name: str, **args: Any) -> Iterator[None]:
        """Time the body as a slice (recorded even if the body raises)."""
        t0 = now_ns()
        try:
            yield
        finally:
            self.slice(track, name, t0, now_ns(), args or None)

    def instant(self, track: str, name: str, ts_ns: int | None = None, args: dict | None = None) -> None:
        """A point event (e.g. an invariant violation)."""
        with self._lock:
            self._track(track)
            self._ev.instants.append(_Instant(track, name, now_ns() if ts_ns is None else int(ts_ns),
                                              dict(args) if args else None))

    def counter_series(self, name: str, ts_ns: Any, values: Any, unit: str | None = None, *,
                       steps: Any = None) -> None:
        """Append points to the counter track ``name`` (e.g. energy against time); ``steps``: the
        step number of each point, written beside it.

        Points are in record order: each series is placed strictly after the track's previous
        points (its timestamps that are not are moved up to just after them), so a counter never shows
        values out of step order. The drivers stamp a chunk's frames between its dispatch and
        the time they reached the host, and chunk i+1 is dispatched before chunk i's frames
        arrive, so consecutive chunks' intervals overlap."""
        ts = np.asarray(ts_ns, dtype=np.int64).reshape(-1)
        vals = np.asarray(values, dtype=np.float64).reshape(-1)
        if ts.shape != vals.shape:
            raise ValueError(f"[jaxlog] counter {name!r}: {ts.size} timestamps for {vals.size} values")
        step_arr = None if steps is None else np.asarray(steps, dtype=np.int64).reshape(-1)
        if step_arr is not None and step_arr.shape != vals.shape:
            raise ValueError(f"[jaxlog] counter {name!r}: {step_arr.size} steps for {vals.size} values")
        if not ts.size:
            return
        ramp = np.arange(ts.size, dtype=np.int64)
        ts = np.maximum.accumulate(ts - ramp) + ramp  # strictly increasing within the series
        with self._lock:
            last = self._counter_last.get(name)
            if last is not None and ts[0] <= last:  # squeeze the overlap (no drift across chunks)
                ts = np.maximum(ts, last + 1 + ramp)
            self._counter_last[name] = int(ts[-1])
            self._ev.counters.append(_Counter(name, ts.copy(), vals.copy(), unit,
                                              None if step_arr is None else step_arr.copy()))
            self._counter_total[name] = self._counter_total.get(name, 0) + len(vals)
            self._counter_held[name] = self._counter_held.get(name, 0) + len(vals)
            if self._counter_held[name] > _COMPACT_AT:
                self._compact(name)

    def _compact(self, name: str) -> None:
        """Thin the samples held for counter ``name`` to a quarter of ``_COMPACT_AT`` (lock held)."""
        mine = [c for c in self._ev.counters if c.name == name]
        at = next(i for i, c in enumerate(self._ev.counters) if c.name == name)
        one = _thinned(_merged(mine), _COMPACT_AT // 4)
        rest = [c for c in self._ev.counters if c.name != name]
        self._ev.counters = rest[:at] + [one] + rest[at:]
        self._counter_held[name] = len(one.values)

    @property
    def tracks(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._ev.tracks)

    def slices(self, track: str | None = None) -> list[_Slice]:
        with self._lock:
            return [s for s in self._ev.slices if track is None or s.track == track]

    def instants(self, track: str | None = None) -> list[_Instant]:
        with self._lock:
            return [i for i in self._ev.instants if track is None or i.track == track]

    def counter_names(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(dict.fromkeys(c.name for c in self._ev.counters))

    # -- writing ------------------------------------------------------------------------------
    def to_proto(self) -> Any:
        """The trace as a ``perfetto_trace_pb2.Trace`` message (``to_bytes`` parsed)."""
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

        return pb.Trace.FromString(self.to_bytes())

    def to_bytes(self) -> bytes:
        """The serialized ``.pftrace``: a ``Trace`` message is its packets, each a length-delimited
        field 1, so packets are serialized one by one and joined (``protowire``); counter tracks
        are laid out whole (``_counter_packets``)."""
        with self._lock:
            tracks = list(self._ev.tracks)
            slices = list(self._ev.slices)
            instants = list(self._ev.instants)
            counters = list(self._ev.counters)
            totals = dict(self._counter_total)
        counter_tracks = _counter_tracks(counters, totals)
        notes = [_thinning_note(t) for t in counter_tracks if t.thinned_from]
        if notes and NOTES_TRACK not in tracks:
            tracks.append(NOTES_TRACK)
        instants += notes

        uuids = iter(range(1000, 1 << 62))
        process_uuid = next(uuids)
        sequence = uint(10, _SEQ_ID)

        def descriptor(uuid: int, name: str, *, counter: bytes | None = None, rank: int | None = None) -> bytes:
            """A ``TracePacket`` holding a ``TrackDescriptor`` (60): uuid 1, name 2, parent_uuid 5,
            counter 8, sibling_order_rank 12."""
            desc = uint(1, uuid) + text(2, name) + uint(5, process_uuid)
            if counter is not None:
                desc += message(8, counter)
            if rank is not None:
                desc += sint(12, rank)
            return sequence + message(60, desc)

        # the process (3): pid 1, process_name 6; sequence_flags 13 = SEQ_INCREMENTAL_STATE_CLEARED
        process = message(3, sint(1, os.getpid()) + text(6, self.name))
        head = [sequence + uint(13, 1) + message(60, uint(1, process_uuid) + process)]
        track_uuid: dict[str, int] = {}
        for i, name in enumerate(tracks):
            track_uuid[name] = next(uuids)
            head.append(descriptor(track_uuid[name], name, rank=i))
        counter_uuid: dict[str, int] = {}
        for c in counters:
            if c.name not in counter_uuid:
                counter_uuid[c.name] = next(uuids)
                head.append(descriptor(counter_uuid[c.name], c.name, counter=text(6, c.unit) if c.unit else b""))

        # Per track, slices become properly nested BEGIN/END pairs (a stack walk over slices
        # sorted by start, longest first); a slice that overlaps without nesting goes to a
        # "<track> (overlap)" track so no END ever closes the wrong slice. Streams are then
        # merged by time with a stable sort, which keeps each track's order at equal times.
        events: list[tuple[int, tuple[str, Any]]] = []
        by_track: dict[str, list[_Slice]] = {}
        for s in slices:
            by_track.setdefault(s.track, []).append(s)
        pending = list(by_track.items())
        while pending:
            track, group = pending.pop(0)
            if track not in track_uuid:
                track_uuid[track] = next(uuids)
                head.append(descriptor(track_uuid[track], track))
            group.sort(key=lambda s: (s.start_ns, -(s.end_ns - s.start_ns)))
            stack: list[_Slice] = []
            spill: list[_Slice] = []
            for s in group:
                while stack and stack[-1].end_ns <= s.start_ns:
                    events.append((stack.pop().end_ns, ("E", track)))
                if stack and s.end_ns > stack[-1].end_ns:
                    spill.append(_Slice(f"{track} (overlap)", s.name, s.start_ns, s.end_ns, s.args))
                    continue
                events.append((s.start_ns, ("B", s)))
                stack.append(s)
            while stack:
                events.append((stack.pop().end_ns, ("E", track)))
            if spill:
                pending.append((spill[0].track, spill))
        for ins in instants:
            events.append((ins.ts_ns, ("I", ins)))
        events.sort(key=lambda e: e[0])

        # each a TrackEvent (11): debug_annotations 4, type 9 (SLICE_BEGIN 1, SLICE_END 2,
        # INSTANT 3), track_uuid 11, name 23
        body: list[bytes] = []
        for ts, (kind, obj) in events:
            if kind == "E":
                event = uint(9, 2) + uint(11, track_uuid[obj])
            else:
                event = b"".join(message(4, _annotation(k, v)) for k, v in (obj.args or {}).items())
                event += uint(9, 1 if kind == "B" else 3) + uint(11, track_uuid[obj.track]) + text(23, obj.name)
            body.append(uint(8, ts) + sequence + message(11, event))
        # each counter track's samples after the slices, in time order (readers sort by time)
        counter_packets = [_counter_packets(counter_uuid[c.name], c.ts_ns, c.values, c.steps) for c in counter_tracks]
        return b"".join([*(message(1, p) for p in head + body), *counter_packets])

    def write(self, path: str | os.PathLike) -> Path:
        """Write the ``.pftrace`` (atomically: a temp file renamed into place) and return its path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.to_bytes()
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        return path
