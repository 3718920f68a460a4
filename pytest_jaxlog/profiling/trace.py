"""Read traces back in Python: JAX's Chrome-JSON traces and our Perfetto protobuf ``.pftrace``.

JAX 0.10 writes, per profiler session, ``<dir>/plugins/profile/<time>/<host>.trace.json.gz``
(Chrome JSON) and, with ``create_perfetto_trace=True``, ``perfetto_trace.json.gz`` (the same
events without metadata). A ``StepTraceAnnotation("jaxlog_step", step_num=k)`` appears there as a
complete event ``{"ph": "X", "name": "jaxlog_step", "ts": µs, "dur": µs, "args": {"step_num": "k"}}``
on the annotating thread. Our ``.pftrace`` has ``jaxlog_step`` slices with a ``step_num``
annotation on the ``window steps`` track. Nothing here needs trace_processor (no download).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import JaxlogError
from .timeline import STEP_SLICE

__all__ = ['Slice', 'Trace', 'load_trace', 'find_jax_trace']

@dataclass(frozen=True)
class Slice:
    """One slice: seconds from the trace's own origin, the track (thread) it is on, its args."""

    name: str
    start_s: float
    dur_s: float
    track: str = ""
    args: dict = field(default_factory=dict)

    @property
    def end_s(self) -> float:
        return self.start_s + self.dur_s


@dataclass
class Trace:
    """A loaded trace: ``.slices(name)``, ``.steps()``, ``.instants(name)``, ``.counters``."""

    path: Path | None
    format: str  # "chrome-json" | "pftrace"
    all_slices: list[Slice]
    all_instants: list[Slice] = field(default_factory=list)
    counters: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    tracks: tuple[str, ...] = ()
    #: per counter track, the step of each sample (our ``.pftrace``: -1 where the trace does not say)
    counter_steps: dict[str, np.ndarray] = field(default_factory=dict)

    def slices(self, name: str | None = None, *, track: str | None = None) -> list[Slice]:
        """Slices called ``name`` (all when None), optionally on one track, by start time."""
        return [s for s in self.all_slices
                if (name is None or s.name == name) and (track is None or s.track == track)]

    def instants(self, name: str | None = None) -> list[Slice]:
        return [s for s in self.all_instants if name is None or s.name == name]

    def names(self) -> set[str]:
        return {s.name for s in self.all_slices}

    def steps(self, name: str = STEP_SLICE) -> dict[int, float]:
        """``{step_num: seconds}`` from step-annotation slices, ascending by step.

        A step annotated more than once (e.g. on two threads) keeps its longest slice.
        """
        out: dict[int, float] = {}
        for s in self.slices(name):
            raw = s.args.get("step_num", s.args.get("step"))
            if raw is None:
                continue
            try:
                k = int(raw)
            except (TypeError, ValueError):
                continue
            out[k] = max(out.get(k, 0.0), s.dur_s)
        return dict(sorted(out.items()))

    def step_seconds(self, steps: range | None = None, name: str = STEP_SLICE) -> np.ndarray:
        """Per-step seconds as an array; with ``steps``, exactly those steps (JaxlogError if any is missing)."""
        got = self.steps(name)
        if steps is None:
            return np.array(list(got.values()), dtype=np.float64)
        missing = [k for k in steps if k not in got]
        if missing:
            raise JaxlogError(f"trace {self.path}: no {name!r} annotation for steps {missing} "
                              f"(found {sorted(got)})")
        return np.array([got[k] for k in steps], dtype=np.float64)

    def device_busy_s(self) -> float | None:
        """Seconds the devices were busy: the union of the slices on the trace's device tracks
        (``/device:GPU:0/Stream #14(...)``; kernels and copies of overlapping streams counted
        once), summed over devices. None where the trace has no device track (the CPU backend
        runs its programs on host threads)."""
        by_device: dict[str, list[tuple[float, float]]] = {}
        for s in self.all_slices:
            if s.track.startswith("/device:") and s.dur_s > 0:
                by_device.setdefault(s.track.split("/")[1], []).append((s.start_s, s.end_s))
        if not by_device:
            return None
        total = 0.0
        for spans in by_device.values():
            spans.sort()
            lo, hi = spans[0]
            for a, b in spans[1:]:
                if a > hi:
                    total += hi - lo
                    lo, hi = a, b
                else:
                    hi = max(hi, b)
            total += hi - lo
        return total

    def query(self, sql: str, *, trace_processor_shell: str | os.PathLike | None = None) -> str:
        """Run SQL with a trace_processor_shell binary you already have (never downloaded here).

        The binary comes from ``trace_processor_shell=`` or ``$JAXLOG_TRACE_PROCESSOR``; returns
        its text output.
        """
        shell = trace_processor_shell or os.environ.get("JAXLOG_TRACE_PROCESSOR") or shutil.which("trace_processor_shell")
        if not shell or not Path(shell).exists():
            raise JaxlogError("Trace.query needs a trace_processor_shell binary: pass trace_processor_shell= "
                              "or set JAXLOG_TRACE_PROCESSOR (pytest-jaxlog never downloads one)")
        if self.path is None:
            raise JaxlogError("Trace.query needs a trace loaded from a file")
        res = subprocess.run([str(shell), "-Q", sql, str(self.path)], capture_output=True, text=True, timeout=300)
        if res.returncode != 0:
            raise JaxlogError(f"trace_processor_shell failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
        return res.stdout


# --- locating JAX's files ---------------------------------------------------------------------

def find_jax_trace(directory: str | os.PathLike) -> dict[str, Path]:
    """Files JAX wrote under a profiler log dir: ``jax_trace`` (perfetto_trace.json.gz if present,
    else the ``*.trace.json.gz``), ``jax_trace_json`` and ``xplane`` when present.

    A log dir used by several sessions holds one ``plugins/profile/<time>/`` folder per session:
    the files all come from the newest one (by modification time), never a mix of sessions."""
    root = Path(directory)
    sessions: dict[Path, dict[str, Path]] = {}
    for pattern, kind in (("perfetto_trace.json.gz", "jax_perfetto"), ("*.trace.json.gz", "jax_trace_json"),
                          ("*.xplane.pb", "xplane")):
        for name in sorted(root.rglob(pattern)):
            sessions.setdefault(name.parent, {})[kind] = name

    def newest(item: tuple[Path, dict[str, Path]]) -> tuple[float, str]:
        files = [f for k, f in item[1].items() if k != "xplane"] or list(item[1].values())
        return max(_mtime(f) for f in files), str(item[0])

    found = max(sessions.items(), key=newest)[1] if sessions else {}
    out: dict[str, Path] = {}
    main = found.get("jax_perfetto") or found.get("jax_trace_json")
    if main is not None:
        out["jax_trace"] = main
    if "jax_trace_json" in found:
        out["jax_trace_json"] = found["jax_trace_json"]
    if "xplane" in found:
        out["xplane"] = found["xplane"]
    return out


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


# --- loading ----------------------------------------------------------------------------------

def _load_chrome(obj: Any, path: Path | None) -> Trace:
    events = obj["traceEvents"] if isinstance(obj, dict) else obj
    threads: dict[tuple[Any, Any], str] = {}
    procs: dict[Any, str] = {}
    for e in events:
        if e.get("ph") == "M":
            if e.get("name") == "thread_name":
                threads[(e.get("pid"), e.get("tid"))] = str(e.get("args", {}).get("name", ""))
            elif e.get("name") == "process_name":
                procs[e.get("pid")] = str(e.get("args", {}).get("name", ""))

    def track(e: dict) -> str:
        pid, tid = e.get("pid"), e.get("tid")
        t = threads.get((pid, tid), str(tid))
        p = procs.get(pid, str(pid))
        return f"{p}/{t}"

    slices: list[Slice] = []
    instants: list[Slice] = []
    open_: dict[tuple[Any, Any], list[dict]] = {}
    counters: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        ph = e.get("ph")
        if ph == "X":
            slices.append(Slice(str(e.get("name", "")), float(e.get("ts", 0.0)) * 1e-6,
                                float(e.get("dur", 0.0)) * 1e-6, track(e), dict(e.get("args") or {})))
        elif ph == "B":
            open_.setdefault((e.get("pid"), e.get("tid")), []).append(e)
        elif ph == "E":
            stack = open_.get((e.get("pid"), e.get("tid")))
            if stack:
                b = stack.pop()
                args = dict(b.get("args") or {})
                args.update(e.get("args") or {})
                ts = float(b.get("ts", 0.0))
                slices.append(Slice(str(b.get("name", "")), ts * 1e-6, (float(e.get("ts", ts)) - ts) * 1e-6,
                                    track(b), args))
        elif ph in ("i", "I", "n"):
            instants.append(Slice(str(e.get("name", "")), float(e.get("ts", 0.0)) * 1e-6, 0.0, track(e),
                                  dict(e.get("args") or {})))
        elif ph == "C":
            for k, v in (e.get("args") or {}).items():
                try:
                    counters.setdefault(f"{e.get('name', '')}/{k}" if k != "value" else str(e.get("name", "")),
                                        []).append((float(e.get("ts", 0.0)) * 1e-6, float(v)))
                except (TypeError, ValueError):
                    pass
    slices.sort(key=lambda s: s.start_s)
    tracks = tuple(dict.fromkeys(s.track for s in slices))
    return Trace(path, "chrome-json", slices, instants,
                 {k: (np.array([t for t, _ in v]), np.array([x for _, x in v])) for k, v in counters.items()},
                 tracks)


def _annotation_value(a: Any) -> Any:
    which = a.WhichOneof("value")
    if which is None:
        return None
    v = getattr(a, which)
    return v if which in ("bool_value", "uint_value", "int_value", "double_value", "string_value") else str(v)


def _load_pftrace(data: bytes, path: Path | None) -> Trace:
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    trace = pb.Trace.FromString(data)
    names: dict[int, str] = {}
    is_counter: set[int] = set()
    for p in trace.packet:
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            names[d.uuid] = d.name or (d.process.process_name if d.HasField("process") else "") or str(d.uuid)
            if d.HasField("counter"):
                is_counter.add(d.uuid)
    slices: list[Slice] = []
    instants: list[Slice] = []
    stacks: dict[int, list[tuple[int, str, dict]]] = {}
    counters: dict[str, list[tuple[float, float]]] = {}
    counter_steps: dict[str, list[int]] = {}
    for p in trace.packet:
        if not p.HasField("track_event"):
            continue
        te = p.track_event
        uuid = te.track_uuid
        tname = names.get(uuid, str(uuid))
        args = {a.name: _annotation_value(a) for a in te.debug_annotations}
        if te.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            stacks.setdefault(uuid, []).append((p.timestamp, te.name, args))
        elif te.type == pb.TrackEvent.TYPE_SLICE_END:
            stack = stacks.get(uuid)
            if stack:
                t0, name, a0 = stack.pop()
                slices.append(Slice(name, t0 * 1e-9, (p.timestamp - t0) * 1e-9, tname, a0))
        elif te.type == pb.TrackEvent.TYPE_INSTANT:
            instants.append(Slice(te.name, p.timestamp * 1e-9, 0.0, tname, args))
        elif te.type == pb.TrackEvent.TYPE_COUNTER:
            value = te.double_counter_value if te.HasField("double_counter_value") else float(te.counter_value)
            counters.setdefault(tname, []).append((p.timestamp * 1e-9, value))
            counter_steps.setdefault(tname, []).append(int(args.get("step", -1)))
    slices.sort(key=lambda s: s.start_s)
    tracks = tuple(names[u] for u in names if u not in is_counter)
    return Trace(path, "pftrace", slices, instants,
                 {k: (np.array([t for t, _ in v]), np.array([x for _, x in v])) for k, v in counters.items()},
                 tracks, {k: np.array(v, np.int64) for k, v in counter_steps.items()})


MAX_TRACE_BYTES = 1 << 30  # a gzip trace that inflates past this is refused (a bounded read)


def _gunzip(raw: bytes, path: Path) -> bytes:
    """``raw`` decompressed, at most ``MAX_TRACE_BYTES``: a small file can declare (inflate to)
    any size."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(raw, MAX_TRACE_BYTES)
        if d.unconsumed_tail:
            raise JaxlogError(f"trace file {path} inflates to over {MAX_TRACE_BYTES} bytes; refused")
        out += d.flush()
    except zlib.error as e:
        raise JaxlogError(f"trace file {path} is not valid gzip: {e}") from None
    if not d.eof:
        raise JaxlogError(f"trace file {path} is a truncated gzip file")
    return out


def load_trace(path: str | os.PathLike) -> Trace:
    """Load JAX's ``perfetto_trace.json.gz`` / ``*.trace.json.gz`` (or a profiler log dir) or our ``.pftrace``."""
    path = Path(path)
    if path.is_dir():
        found = find_jax_trace(path)
        if "jax_trace" not in found:
            raise JaxlogError(f"no JAX trace (perfetto_trace.json.gz or *.trace.json.gz) under {path}")
        path = found["jax_trace"]
    if not path.exists():
        raise JaxlogError(f"trace file {path} does not exist")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = _gunzip(raw, path)
    stripped = raw.lstrip()[:1]
    if stripped in (b"{", b"["):
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise JaxlogError(f"trace file {path} is not valid JSON: {type(e).__name__}: {e}") from None
        try:
            return _load_chrome(obj, path)
        except (TypeError, KeyError, ValueError, AttributeError, IndexError, OverflowError, RecursionError) as e:
            raise JaxlogError(f"trace file {path}: its events are not Chrome trace events "
                              f"({type(e).__name__}: {e})") from None
    try:
        return _load_pftrace(raw, path)
    except Exception as e:  # protobuf DecodeError and friends
        raise JaxlogError(f"trace file {path} is neither Chrome JSON nor a Perfetto protobuf trace: {e}") from e
