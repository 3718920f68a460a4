"""Timeline -> .pftrace, parsed back with the perfetto package's protobuf classes."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from pytest_jaxlog import Timeline
from pytest_jaxlog.profiling.timeline import now_ns
from pytest_jaxlog import load_trace


def _parse(path):
    trace = pb.Trace.FromString(path.read_bytes())
    names, counters = {}, set()
    for p in trace.packet:
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            names[d.uuid] = d.name
            if d.HasField("counter"):
                counters.add(d.uuid)
    return trace, names, counters


def test_tracks_slices_instants_counters(tmp_path):
    tl = Timeline()
    tl.slice("dispatch", "chunk", 1_000, 5_000, {"steps": 64, "first": 0})
    tl.slice("dispatch", "chunk", 5_000, 9_000, {"steps": 64, "first": 64})  # back to back
    tl.slice("writer", "write batch", 2_000, 3_000, {"frames": 64})
    tl.slice("window steps", "jaxlog_step", 6_000, 6_500, {"step_num": 5})
    tl.instant("invariants", "conserved(energy, rtol=0.0001)", 7_000, {"step": 70, "value": 1.25})
    tl.counter_series("energy", np.array([1_000, 2_000, 3_000]), np.array([1.0, 0.5, 0.25]))
    tl.counter_series("energy", [4_000], [0.125])
    path = tl.write(tmp_path / "run.pftrace")
    assert path.exists() and not list(tmp_path.glob("*.tmp*"))

    trace, names, counters = _parse(path)
    by_name = {v: k for k, v in names.items()}
    assert {"dispatch", "writer", "window steps", "invariants", "energy"} <= set(names.values())
    assert by_name["energy"] in counters and by_name["dispatch"] not in counters

    events = [(p.timestamp, p.track_event) for p in trace.packet if p.HasField("track_event")]
    begins = [(ts, names[e.track_uuid], e.name) for ts, e in events if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN]
    ends = [(ts, names[e.track_uuid]) for ts, e in events if e.type == pb.TrackEvent.TYPE_SLICE_END]
    assert sorted(begins) == [(1_000, "dispatch", "chunk"), (2_000, "writer", "write batch"),
                              (5_000, "dispatch", "chunk"), (6_000, "window steps", "jaxlog_step")]
    assert sorted(ends) == [(3_000, "writer"), (5_000, "dispatch"), (6_500, "window steps"), (9_000, "dispatch")]
    # the END of the first chunk comes before the BEGIN of the second at the same timestamp
    order = [(ts, e.type) for ts, e in events if names[e.track_uuid] == "dispatch"]
    assert order == [(1_000, pb.TrackEvent.TYPE_SLICE_BEGIN), (5_000, pb.TrackEvent.TYPE_SLICE_END),
                     (5_000, pb.TrackEvent.TYPE_SLICE_BEGIN), (9_000, pb.TrackEvent.TYPE_SLICE_END)]
    (inst,) = [e for _, e in events if e.type == pb.TrackEvent.TYPE_INSTANT]
    assert names[inst.track_uuid] == "invariants"
    assert {a.name: (a.int_value or a.double_value) for a in inst.debug_annotations} == {"step": 70, "value": 1.25}
    values = [(ts, e.double_counter_value) for ts, e in events if e.type == pb.TrackEvent.TYPE_COUNTER]
    assert values == [(1_000, 1.0), (2_000, 0.5), (3_000, 0.25), (4_000, 0.125)]

    back = load_trace(path)
    assert back.format == "pftrace"
    assert back.steps() == {5: pytest.approx(500e-9)}
    (viol,) = back.instants()
    assert viol.args == {"step": 70, "value": 1.25} and viol.track == "invariants"
    np.testing.assert_allclose(back.counters["energy"][1], [1.0, 0.5, 0.25, 0.125])
    chunks = back.slices("chunk", track="dispatch")
    assert [(c.start_s, c.dur_s, c.args["first"]) for c in chunks] == [
        (pytest.approx(1e-6), pytest.approx(4e-6), 0), (pytest.approx(5e-6), pytest.approx(4e-6), 64)]


def test_span_nests_and_records_on_error(tmp_path):
    tl = Timeline()
    with pytest.raises(RuntimeError):
        with tl.span("host", "outer", chunk=3):
            with tl.span("host", "inner"):
                pass
            raise RuntimeError("boom")
    back = load_trace(tl.write(tmp_path / "t.pftrace"))
    (outer,) = back.slices("outer")
    (inner,) = back.slices("inner")
    assert outer.args == {"chunk": 3}
    assert outer.start_s <= inner.start_s and inner.end_s <= outer.end_s


def test_threads_each_on_their_own_track(tmp_path):
    tl = Timeline()

    def worker(i):
        for j in range(50):
            with tl.span(f"writer-{i}", "write", j=j):
                pass

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    back = load_trace(tl.write(tmp_path / "t.pftrace"))
    for i in range(4):
        got = back.slices("write", track=f"writer-{i}")
        assert sorted(s.args["j"] for s in got) == list(range(50))
    assert len(back.slices("write")) == 200


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**12), st.integers(0, 10**9)), min_size=1, max_size=30),
       st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64), min_size=1, max_size=30))
def test_roundtrip_property(tmp_path_factory, intervals, counter_values):
    """Disjoint slices on one track and any counter values come back exactly."""
    tl = Timeline()
    t = 0
    expect = []
    for gap, dur in intervals:
        start = t + gap
        tl.slice("dispatch", "chunk", start, start + dur, {"i": len(expect)})
        expect.append((start, dur))
        t = start + dur
    ts = np.arange(len(counter_values)) * 10
    tl.counter_series("e", ts, counter_values)
    path = tl.write(tmp_path_factory.mktemp("p") / "t.pftrace")
    trace, names, _ = _parse(path)
    begins = [p.timestamp for p in trace.packet
              if p.HasField("track_event") and p.track_event.type == pb.TrackEvent.TYPE_SLICE_BEGIN]
    assert begins == [s for s, _ in expect]
    back = load_trace(path)
    got = sorted(((s.args["i"], s) for s in back.slices("chunk")), key=lambda p: p[0])
    assert len(got) == len(expect)
    assert [(round(s.start_s * 1e9), round(s.dur_s * 1e9)) for _, s in got] == expect
    vals = [p.track_event.double_counter_value for p in trace.packet
            if p.HasField("track_event") and p.track_event.type == pb.TrackEvent.TYPE_COUNTER]
    assert vals == [float(v) for v in counter_values]


def test_bad_input():
    tl = Timeline()
    with pytest.raises(ValueError, match="ends before it starts"):
        tl.slice("host", "x", 10, 5)
    with pytest.raises(ValueError, match="2 timestamps for 3 values"):
        tl.counter_series("e", [1, 2], [1.0, 2.0, 3.0])
    assert now_ns() > 0


def test_overlapping_slices_on_one_track_stay_well_formed(tmp_path):
    """Slices that overlap without nesting (two threads misusing a track) go to an overlap track."""
    tl = Timeline()
    tl.slice("host", "a", 0, 100)
    tl.slice("host", "b", 50, 150)
    tl.slice("host", "c", 10, 20)
    tl.slice("host", "zero", 100, 100)
    back = load_trace(tl.write(tmp_path / "t.pftrace"))
    got = {s.name: (s.track, round(s.start_s * 1e9), round(s.dur_s * 1e9)) for s in back.slices()}
    assert got == {"a": ("host", 0, 100), "c": ("host", 10, 10), "zero": ("host", 100, 0),
                   "b": ("host (overlap)", 50, 100)}


def test_counter_series_keep_record_order_when_their_intervals_overlap(tmp_path):
    """Chunk i+1 is dispatched before chunk i's frames reach the host, so the drivers hand over
    series whose time intervals overlap; the counter must still read in record order."""
    tl = Timeline()
    tl.counter_series("e", [100, 200, 300], [0.0, 1.0, 2.0])
    tl.counter_series("e", [150, 400], [3.0, 4.0])  # starts before the previous series ended
    tl.counter_series("e", [250, 250, 250], [5.0, 6.0, 7.0])  # equal stamps
    tl.counter_series("f", [10], [9.0])  # another track keeps its own clock
    back = load_trace(tl.write(tmp_path / "t.pftrace"))
    ts, vals = back.counters["e"]
    assert list(vals) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert np.all(np.diff(ts) > 0) and round(ts[-4] * 1e9) == 400  # squeezed, not shifted: no drift
    assert list(back.counters["f"][1]) == [9.0]


@given(samples=st.lists(st.tuples(st.integers(0, 2**63 - 1), st.floats(), st.integers(-1, 2**62)), max_size=20),
       uuid=st.integers(1, 2**62))
@settings(max_examples=200, deadline=None)
def test_counter_packets_parse_as_protobuf_builds_them(samples, uuid):
    """Counter samples are laid out without protobuf objects (fast); parsed, they must be exactly
    the packets protobuf builds, in order, NaN and infinities included."""
    from pytest_jaxlog.profiling.timeline import _counter_packets

    ts = np.array([t for t, _, _ in samples], np.int64)
    values = np.array([v for _, v, _ in samples], np.float64)
    steps = np.array([k for _, _, k in samples], np.int64)
    got = pb.Trace.FromString(_counter_packets(uuid, ts, values, steps)).packet
    assert len(got) == len(samples)
    for packet, (t, v, k) in zip(got, samples):
        want = pb.TracePacket(timestamp=t, trusted_packet_sequence_id=1)
        te = want.track_event
        te.type = pb.TrackEvent.TYPE_COUNTER
        te.track_uuid = uuid
        te.double_counter_value = v
        if k >= 0:
            ann = te.debug_annotations.add()
            ann.name = "step"
            ann.int_value = k
        if v != v:  # NaN: compare the rest, and that the value is NaN
            assert packet.track_event.double_counter_value != packet.track_event.double_counter_value
            packet.track_event.double_counter_value = te.double_counter_value = 0.0
        assert packet == want


def test_a_thousand_step_counter_is_read_back_whole(tmp_path):
    """The directly encoded counter packets, interleaved with protobuf-built ones, read back as
    the samples given, each with its step, and slices still nest."""
    tl = Timeline()
    tl.slice("dispatch", "chunk", 0, 2_000_000, {"steps": 1000})
    steps = np.arange(1001)
    tl.counter_series("energy", 1_000 + steps * 1_000, np.cos(steps / 50.0), steps=steps)
    path = tl.write(tmp_path / "run.pftrace")
    tr = load_trace(path)
    ts, values = tr.counters["energy"]
    np.testing.assert_array_equal(values, np.cos(steps / 50.0))
    np.testing.assert_array_equal(tr.counter_steps["energy"], steps)
    assert [s.name for s in tr.slices(track="dispatch")] == ["chunk"]


@given(args=st.dictionaries(st.text(max_size=8), st.one_of(
    st.booleans(), st.integers(-(2**63), 2**63 - 1), st.integers(2**63, 2**70), st.floats(allow_nan=False),
    st.text(max_size=12)), max_size=5), name=st.text(max_size=12), track=st.text(min_size=1, max_size=8))
@settings(max_examples=100, deadline=None)
def test_slices_and_their_arguments_parse_back(tmp_path_factory, args, name, track):
    """What the timeline writes without protobuf objects parses with perfetto's own classes to
    what was given: names, tracks and every argument's type and value (ints beyond int64 as text)."""
    tl = Timeline(name="proc")
    tl.slice(track, name, 10, 20, args)
    tl.instant("invariants", name, 15, args)
    trace, names, counters = _parse(tl.write(tmp_path_factory.mktemp("t") / "run.pftrace"))
    events = [p.track_event for p in trace.packet if p.HasField("track_event")]
    assert [e.type for e in events] == [pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_INSTANT,
                                        pb.TrackEvent.TYPE_SLICE_END]
    assert names[events[0].track_uuid] == track and names[events[1].track_uuid] == "invariants"
    assert events[2].track_uuid == events[0].track_uuid
    for e in events[:2]:
        assert e.name == name
        got = {}
        for a in e.debug_annotations:
            got[a.name] = getattr(a, a.WhichOneof("value"))
        want = {k: (str(v) if isinstance(v, int) and not isinstance(v, bool) and v >= 2**63 else v)
                for k, v in args.items()}
        assert got == want


def test_writing_a_timeline_leaves_perfetto_unimported(tmp_path):
    """Writing needs no generated protobuf classes (their import costs every session ~0.25 s)."""
    import subprocess
    import sys

    code = ("import sys; from pytest_jaxlog import Timeline; import numpy as np; tl = Timeline(); "
            "tl.slice('dispatch', 'chunk', 0, 5, {'steps': 5}); tl.counter_series('e', [1, 2], [0.5, 0.25]); "
            f"tl.write({str(tmp_path / 'run.pftrace')!r}); "
            "print(sorted(m for m in sys.modules if m.startswith(('perfetto', 'google.protobuf'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    assert load_trace(tmp_path / "run.pftrace").counters["e"][1].tolist() == [0.5, 0.25]
