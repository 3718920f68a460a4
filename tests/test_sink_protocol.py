"""The Sink protocol is declared, not probed: a sink subclassing ``jl.Sink`` gets every call the
driver makes (timeline, ``key_impls=``, ``summary=``); an object with only the original four
methods is adapted and still receives every frame and snapshot."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.drive.host.pipeline import SinkSet


def _step(s):
    key, sub = jax.random.split(s["key"])
    return {"x": s["x"] + jax.random.normal(sub, (3,)), "key": key}


STATE = {"x": jnp.zeros(3), "key": jax.random.key(0)}


class FullSink(jl.Sink):
    def __init__(self):
        self.steps, self.attached, self.summary, self.timeline = [], {}, None, "unset"

    def open(self, schema, meta):
        self.paths = schema.paths

    def write(self, frames):
        self.steps.extend(frames.steps["x"].tolist())

    def attach(self, name, step, tree, *, key_impls=None):
        self.attached[(name, int(step))] = dict(key_impls or {})

    def close(self, status, *, steps_done, violation=None, summary=None):
        self.status, self.steps_done, self.summary = status, steps_done, summary

    def set_timeline(self, timeline):
        self.timeline = timeline


class FourMethods:
    """A sink written against the original protocol: no key_impls, no summary, no timeline."""

    def __init__(self):
        self.steps, self.attached, self.closed = [], [], None

    def open(self, schema, meta):
        pass

    def write(self, frames):
        self.steps.extend(frames.steps["x"].tolist())

    def attach(self, name, step, tree):
        self.attached.append((name, int(step)))

    def close(self, status, *, steps_done, violation=None):
        self.closed = (status, steps_done)


def test_a_subclass_gets_summary_key_impls_and_the_timeline(tmp_path):
    full, mem = FullSink(), jl.MemorySink()
    r = jl.run(_step, STATE, 6, record={"x": lambda s: s["x"]}, sinks=[full, mem],
               checkpoint=jl.every(3), progress=False)
    assert full.steps == list(range(7)) == mem.frames().steps["x"].tolist()
    assert full.status == "complete" and full.steps_done == 6
    assert full.summary == mem.summary and full.summary is not None
    assert sorted(k for k in full.attached if k[0] == "checkpoint") == [("checkpoint", 3), ("checkpoint", 6)]
    assert full.attached[("checkpoint", 3)]  # the state's PRNG key impl reached it
    assert np.array_equal(r.trajectory["x"], mem.frames().values["x"])


def test_an_object_with_the_four_original_methods_still_works():
    old, mem = FourMethods(), jl.MemorySink()
    jl.run(_step, STATE, 6, record={"x": lambda s: s["x"]}, sinks=[old, mem],
           checkpoint=jl.every(3), progress=False)
    assert old.steps == list(range(7))
    assert [a for a in old.attached if a[0] == "checkpoint"] == [("checkpoint", 3), ("checkpoint", 6)]
    assert old.closed == ("complete", 6)


def test_an_object_missing_a_method_is_one_error_naming_it():
    class NoClose(FourMethods):
        close = None

    with pytest.raises(jl.JaxlogError, match=r"missing close\(\)"):
        SinkSet([NoClose()])


def test_a_subclass_missing_a_required_method_cannot_be_made():
    class NoWrite(jl.Sink):
        def open(self, schema, meta):
            pass

        def close(self, status, *, steps_done, violation=None, summary=None):
            pass

    with pytest.raises(TypeError, match="write"):
        NoWrite()


def test_the_package_sinks_are_sinks(tmp_path):
    for s in (jl.MemorySink(), jl.CSVWriter(tmp_path / "a.csv"), jl.CallbackSink(print),
              jl.HDF5Writer(tmp_path / "a.h5")):
        assert isinstance(s, jl.Sink)


def test_the_timeline_reaches_sinks_that_take_it_and_skips_the_others():
    full, old, timeline = FullSink(), FourMethods(), jl.Timeline()
    SinkSet([full, old]).set_timeline(timeline)
    assert full.timeline is timeline
