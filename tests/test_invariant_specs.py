"""``check/invariants.py``: each built-in invariant as JSON and back checks the same frames the same
way, under the name the file gives; code (a predicate, a subclass) has no spec; a spec a file
could hold that is not one is one ``JaxlogError``."""

from __future__ import annotations

import json

import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.check.invariants import from_spec, spec_of

BUILT_IN = [
    jl.finite("x", "y"),
    jl.finite(),
    jl.bounded("x", lo=0, hi=np.float32(0.7), atol=1e-3),
    jl.bounded("y", hi=2),
    jl.conserved("y", rtol=0.01, atol=1e-9),
    jl.monotonic("y", increasing=False, strict=True),
    jl.aggregate("x", np.mean, lo=0.1, hi=0.25, steps=jl.window(4, 12, every=2)),
    jl.aggregate("y", "std", hi=0.001, steps=jl.at(1, 3, 5)),
]


def _frames(n=20):
    steps = np.arange(n)
    x = np.sin(steps / 3.0)[:, None] * np.ones((1, 2))
    y = 1.0 - 0.01 * steps
    y[13] = np.nan
    return {"x": x, "y": y}


def _violations(inv):
    run = jl.from_arrays(_frames(), invariants=[inv], on_violation="record")
    v = run.violation
    return None if v is None else (v.invariant, v.step, v.record, str(v.value), str(v.expected))


@pytest.mark.parametrize("inv", BUILT_IN, ids=lambda inv: inv.name)
def test_a_built_in_comes_back_checking_the_same(inv):
    spec = json.loads(json.dumps(spec_of(inv)))  # as a file stores it
    again = from_spec(spec, inv.name, "here")
    assert type(again) is type(inv) and again.name == inv.name
    found = _violations(inv)
    assert found is not None and _violations(again) == found  # each breaks on these frames: compared where it does


def test_code_has_no_spec():
    class Mine(jl.conserved):
        pass

    assert spec_of(jl.invariant("cool", lambda v: v < 1, "x")) is None
    assert spec_of(Mine("y")) is None


@pytest.mark.parametrize("spec", [None, [], {"kind": "nope"}, {"kind": "bounded", "record": "x"},
                                  {"kind": "bounded", "record": "x", "lo": None, "hi": None, "atol": 0},
                                  {"kind": "monotonic", "record": "x", "increasing": "yes", "strict": False},
                                  {"kind": "aggregate", "record": "x", "reduce": ["mean"], "lo": 0, "hi": 1,
                                   "atol": 0, "steps": None},
                                  {"kind": "aggregate", "record": "x", "reduce": "mean", "lo": 0, "hi": 1,
                                   "atol": 0, "steps": {"kind": "every", "n": -1}}])
def test_what_is_not_a_spec_is_one_error(spec):
    with pytest.raises(jl.JaxlogError, match=r"f\.h5: invariant inv cannot be rebuilt from the file .*pass invariants="):
        from_spec(spec, "inv", "f.h5")
