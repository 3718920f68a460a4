"""Invariants on hand-built frames: exact first step/system whatever the batch split, messages, JSON."""

from __future__ import annotations

import copy
import json
import math
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pytest_jaxlog as jl
from pytest_jaxlog import JaxlogError, JaxlogRuntimeWarning
from pytest_jaxlog import Frames, LeafSpec, Schema
from pytest_jaxlog import InvariantViolation, bounded, conserved, finite, invariant, monotonic
from pytest_jaxlog.check.invariants import bind_all, check_all, check_on_violation, warn_violation
from pytest_jaxlog import every


def leaf(path, shape=(), dtype="float64", record=None, key_impl=None, schedule=None):
    return LeafSpec(path, record or path.split("/")[0], tuple(shape), np.dtype(dtype), schedule or every(1), key_impl)


def frames(**arrays):
    """frames(energy=(steps, values), ...) ; '__' in a keyword stands for '/'."""
    f = Frames()
    for name, (steps, values) in arrays.items():
        f.add(name.replace("__", "/"), np.asarray(steps), np.asarray(values))
    return f


def run_batches(checker, path_steps_values, splits):
    """Feed the checker consecutive batches (split on frame counts of the first path); first violation."""
    first = next(iter(path_steps_values))
    all_steps = path_steps_values[first][0]
    edges = np.cumsum([0, *splits])
    for lo, hi in zip(edges[:-1], edges[1:]):
        if lo >= len(all_steps):
            break
        s_lo, s_hi = all_steps[lo], all_steps[min(hi, len(all_steps)) - 1]
        f = Frames()
        for path, (steps, values) in path_steps_values.items():
            keep = (steps >= s_lo) & (steps <= s_hi)
            if keep.any():  # a record absent from a batch is simply not in it
                f.add(path, steps[keep], values[keep])
        v = checker.check(f)
        if v is not None:
            return v
    return None


# --------------------------------------------------------------------------- hypothesis: exact location


@st.composite
def scenario(draw, kind):
    batched = draw(st.booleans())
    n_sys = draw(st.integers(1, 4)) if batched else None
    elem = draw(st.sampled_from([(), (3,), (2, 2)]))
    n = draw(st.integers(2, 40))
    stride = draw(st.integers(1, 5))
    offset = draw(st.integers(0, 3))
    shape = ((n_sys,) if batched else ()) + elem
    first_frame = 1 if kind in ("drift", "decrease") else 0
    pos = st.tuples(
        st.integers(first_frame, n - 1),
        st.integers(0, (n_sys or 1) - 1),
        st.integers(0, max(1, int(np.prod(elem, dtype=int))) - 1),
    )
    faults = draw(st.lists(pos, min_size=1, max_size=4))
    remaining, splits = n, []
    while remaining > 0:
        k = draw(st.integers(1, remaining))
        splits.append(k)
        remaining -= k
    seed = draw(st.integers(0, 2**16))
    return dict(batched=batched, n_sys=n_sys, elem=elem, n=n, stride=stride, offset=offset, shape=shape,
                faults=faults, splits=splits, seed=seed)


def build(sc, kind):
    rng = np.random.default_rng(sc["seed"])
    n, shape = sc["n"], sc["shape"]
    steps = np.arange(n, dtype=np.int64) * sc["stride"] + sc["offset"]
    if kind == "decrease":
        values = np.cumsum(rng.uniform(0.1, 1.0, size=(n, *shape)), axis=0)
    elif kind == "drift":
        values = -280.0 * (1 + rng.uniform(-4e-4, 4e-4, size=(n, *shape)))
        values[0] = -280.0
    else:
        values = rng.uniform(-0.9, 0.9, size=(n, *shape))
    bad_value = {"nan": np.nan, "inf": -np.inf, "drift": -251.3, "high": 1.5, "low": -7.0}.get(kind)
    for frame, system, flat in sc["faults"]:
        idx = (frame,) + ((system,) if sc["batched"] else ()) + (np.unravel_index(flat, sc["elem"]) if sc["elem"] else ())
        if kind == "decrease":
            values[idx] = values[(frame - 1,) + idx[1:]] - 1.0
        else:
            values[idx] = bad_value
    frame, system, flat = min(sc["faults"])
    exp_index = tuple(int(i) for i in np.unravel_index(flat, sc["elem"])) if sc["elem"] else None
    exp_system = system if sc["batched"] else None
    return steps, values, int(steps[frame]), exp_system, exp_index


CASES = {
    "nan": lambda: finite(),
    "inf": lambda: finite("x"),
    "drift": lambda: conserved("x", rtol=1e-3),
    "high": lambda: bounded("x", lo=-1.0, hi=1.0),
    "low": lambda: bounded("x", lo=-1.0),
    "decrease": lambda: monotonic("x"),
}


@pytest.mark.parametrize("kind", sorted(CASES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_first_violation_is_exact_for_any_batch_split(kind, data):
    sc = data.draw(scenario("drift" if kind == "drift" else ("decrease" if kind == "decrease" else kind)))
    steps, values, exp_step, exp_system, exp_index = build(sc, kind)
    # a second, clean record on a sparser schedule: missing from some batches, never violating
    other_steps = steps[::3]
    other = np.ones((len(other_steps), *sc["shape"]))
    schema = Schema((leaf("x", sc["shape"]), leaf("y", sc["shape"])), batched=sc["batched"])
    checker = CASES[kind]().bind(schema)
    v = run_batches(checker, {"x": (steps, values), "y": (other_steps, other)}, sc["splits"])
    assert v is not None
    assert (v.step, v.system, v.index) == (exp_step, exp_system, exp_index)
    assert v.record == "x"
    assert f"violated at step {exp_step}" in str(v)
    if exp_system is not None:
        assert f"(system {exp_system})" in str(v)
    assert v.recent[-1][0] == exp_step
    assert [s for s, _ in v.recent] == [int(s) for s in steps[steps <= exp_step][-5:]]
    json.dumps(v.to_json(), allow_nan=False)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(2, 30),
    fx=st.integers(0, 29),
    fz=st.integers(0, 29),
    splits=st.lists(st.integers(1, 7), min_size=1, max_size=30),
)
def test_earliest_leaf_wins_ties_go_to_schema_order(n, fx, fz, splits):
    fx, fz = fx % n, fz % n
    schema = Schema((leaf("s/z"), leaf("s/x")))  # schema order: z before x
    z = np.zeros(n)
    x = np.zeros(n)
    z[fz] = np.nan
    x[fx] = np.inf
    splits = splits + [n]
    v = run_batches(finite("s").bind(schema), {"s/z": (np.arange(n), z), "s/x": (np.arange(n), x)}, splits)
    assert v.step == min(fx, fz)
    assert v.record == ("s/z" if fz <= fx else "s/x")


# --------------------------------------------------------------------------- each invariant


def test_conserved_message_matches_the_documented_style():
    schema = Schema((leaf("energy", (4,)),), batched=True)
    checker = conserved("energy", rtol=0.0001).bind(schema)
    e = np.full((3, 4), -280.1)
    assert checker.check(frames(energy=([0, 917, 1830], e))) is None
    bad = np.full((1, 4), -280.1)
    bad[0, 3] = -251.3
    v = checker.check(frames(energy=([1834], bad)))
    assert isinstance(v, AssertionError) and isinstance(v, jl.InvariantViolation)
    first = str(v).splitlines()[0]
    assert first == (
        "[jaxlog] invariant conserved(energy, rtol=0.0001) violated at step 1834 (system 3): "
        "value -251.3, expected -280.1 ± 0.02801 (relative drift 0.103)"
    )
    assert (v.invariant, v.record, v.step, v.system, v.index) == ("conserved(energy, rtol=0.0001)", "energy", 1834, 3, None)
    assert v.value == -251.3 and v.expected == -280.1 and v.tolerance == pytest.approx(0.02801)
    assert v.recent == [(0, -280.1), (917, -280.1), (1830, -280.1), (1834, -251.3)]
    lines = str(v).splitlines()
    assert lines[1] == "  last recorded values of energy (system 3):"
    assert lines[-1] == "    step 1834: -251.3"
    v2 = v.with_artifacts({"trajectory": "/tmp/run/traj.h5", "jax_trace": "/tmp/run/trace.json.gz"})
    assert v2 is v
    assert str(v).splitlines()[-2:] == ["  trajectory: /tmp/run/traj.h5", "  jax_trace: /tmp/run/trace.json.gz"]
    assert v.args == (str(v),)


def test_conserved_is_per_system_and_elementwise_against_the_first_value():
    schema = Schema((leaf("q", (2, 3)),), batched=True)
    c = conserved("q", atol=0.5).bind(schema)
    base = np.arange(6.0).reshape(2, 3)
    assert c.check(frames(q=([0, 1], np.stack([base, base + 0.4])))) is None
    later = base + 0.4
    later[1, 2] = base[1, 2] - 0.6
    v = c.check(frames(q=([2], later[None])))
    assert (v.step, v.system, v.index) == (2, 1, (2,))
    assert v.expected == 5.0 and v.tolerance == 0.5
    assert "in q[2]" in str(v) and "absolute drift" not in str(v) and "relative drift 0.12" in str(v)


def test_conserved_reference_zero_and_nan_messages():
    schema = Schema((leaf("m"),))
    v = conserved("m", atol=1e-3).bind(schema).check(frames(m=([0, 1], [0.0, 0.5])))
    assert "absolute drift 0.5" in str(v)
    v = conserved("m", rtol=1e-3).bind(schema).check(frames(m=([0, 1, 2], [1.0, 1.0, np.nan])))
    assert v.step == 2 and "value is NaN" in str(v) and math.isnan(v.value)
    v = conserved("m", rtol=1e-3).bind(schema).check(frames(m=([5, 6], [np.nan, 1.0])))
    assert v.step == 5


def test_conserved_uses_float64_on_float32_records():
    # |x - x0| <= rtol*|x0| evaluated on the float32 values promoted to float64
    schema = Schema((leaf("e", dtype="float32"),))
    x = np.array([1.0, 1.0 + 2**-20, 1.0 + 2**-19], np.float32)
    tol = 2**-20
    v = conserved("e", atol=tol).bind(schema).check(frames(e=([0, 1, 2], x)))
    assert v.step == 2


def test_finite_checks_float_complex_bfloat16_and_ignores_ints_and_keys():
    schema = Schema(
        (
            leaf("n", dtype="int32"),
            leaf("flag", dtype="bool"),
            leaf("key", (2,), dtype="uint32", key_impl="threefry2x32"),
            leaf("b", (2,), dtype=ml_dtypes.bfloat16),
            leaf("c", dtype="complex64"),
        )
    )
    c = finite().bind(schema)
    assert [l.path for l in c.leaves] == ["b", "c"]
    ok = frames(n=([0], [1]), flag=([0], [True]), key=([0], [[1, 2]]), b=([0], np.ones((1, 2), ml_dtypes.bfloat16)),
                c=([0], [1 + 1j]))
    assert c.check(ok) is None
    b = np.ones((2, 2), ml_dtypes.bfloat16)
    b[1, 1] = np.nan
    v = c.check(frames(b=([1, 2], b), c=([1, 2], np.array([1j, complex(np.inf, 0)], np.complex64))))
    assert (v.step, v.record, v.index) == (2, "b", (1,))
    v = finite("c").bind(schema).check(frames(c=([3], np.array([complex(0, np.nan)]))))
    assert v.step == 3 and v.expected == "finite"
    json.dumps(v.to_json(), allow_nan=False)
    assert finite("n").bind(schema).check(frames(n=([0], [2**31 - 1]))) is None  # ints ignored


def test_bounded_messages():
    schema = Schema((leaf("t"),))
    v = bounded("t", lo=0.0, hi=2.0).bind(schema).check(frames(t=([0, 1, 2], [1.0, 2.5, -1.0])))
    assert str(v) .startswith("[jaxlog] invariant bounded(t, lo=0.0, hi=2.0) violated at step 1: value 2.5, expected in [0, 2] (above the upper bound by 0.5)")
    v = bounded("t", lo=0).bind(schema).check(frames(t=([0, 1], [1.0, -0.25])))
    assert "expected >= 0 (below the lower bound by 0.25)" in str(v)
    v = bounded("t", hi=0).bind(schema).check(frames(t=([0, 1], [np.nan, 1.0])))
    assert v.step == 0 and "value is NaN" in str(v)
    ints = Schema((leaf("k", (3,), dtype="int64"),))
    v = bounded("k", hi=10).bind(ints).check(frames(k=([0, 1], [[1, 2, 3], [4, 11, 5]])))
    assert (v.step, v.index, v.value) == (1, (1,), 11)


def test_monotonic_across_batches_and_directions():
    schema = Schema((leaf("t"),))
    c = monotonic("t").bind(schema)
    assert c.check(frames(t=([0, 1, 2], [0.0, 1.0, 1.0]))) is None  # non-strict allows equal
    v = c.check(frames(t=([3], [0.5])))
    assert v.step == 3 and v.expected == ">= 1" and "previous value 1 at step 2" in str(v)
    c = monotonic("t", strict=True).bind(schema)
    assert c.check(frames(t=([0], [0.0]))) is None
    v = c.check(frames(t=([1], [0.0])))
    assert v.step == 1 and v.expected == "> 0"
    c = monotonic("t", increasing=False).bind(schema)
    assert c.invariant.name == "monotonic(t, increasing=False)"
    v = c.check(frames(t=([0, 1, 2, 3], [3.0, 2.0, np.nan, 1.0])))
    assert v.step == 2 and "value is NaN" in str(v)
    c = monotonic("t").bind(schema)
    assert c.check(frames(t=([7], [np.nan]))).step == 7  # a NaN first value is a violation too


def test_predicate_invariant_per_frame_per_system_and_on_a_prefix():
    schema = Schema((leaf("p", (3,)),), batched=True)
    c = invariant("positive pressure", lambda p: p > 0, "p").bind(schema)
    vals = np.ones((4, 3))
    vals[2, 1] = -1
    vals[3, 0] = -1
    v = c.check(frames(p=(np.arange(4) * 10, vals)))
    assert (v.step, v.system, v.value) == (20, 1, -1.0)
    assert str(v).startswith("[jaxlog] invariant positive pressure violated at step 20 (system 1) in p: value -1, expected predicate true")
    c = invariant("all positive", lambda p: (p > 0).all(axis=1), "p").bind(schema)
    v = c.check(frames(p=(np.arange(4) * 10, vals)))
    assert (v.step, v.system) == (20, None) and list(v.value) == [1, -1, 1]
    json.dumps(v.to_json(), allow_nan=False)

    e = Schema((leaf("energy/kinetic"), leaf("energy/total")))
    c = invariant("kinetic below total+5", lambda e: e["kinetic"] <= e["total"] + 5, "energy").bind(e)
    v = c.check(frames(energy__kinetic=([0, 1, 2], [1.0, 9.0, 1.0]), energy__total=([0, 1, 2], [0.0, 0.0, 0.0])))
    assert v.step == 1 and v.value == {"kinetic": 9.0, "total": 0.0}
    assert v.recent[-1] == (1, {"kinetic": 9.0, "total": 0.0})


def test_predicate_with_wrong_shape_is_an_error_naming_it():
    schema = Schema((leaf("p", (3,)),))
    c = invariant("bad", lambda p: p > 0, "p").bind(schema)
    with pytest.raises(JaxlogError, match=r"invariant bad: the predicate must return .*\(2,\).* got shape \(2, 3\)"):
        c.check(frames(p=([0, 1], np.ones((2, 3)))))


def test_predicate_that_raises_is_an_error_naming_the_invariant_record_and_steps():
    schema = Schema((leaf("p", (3,)),))
    c = invariant("broken", lambda p: p.sum(axis=1) / undefined_name, "p").bind(schema)  # noqa: F821
    with pytest.raises(JaxlogError, match=r"^\[jaxlog\] invariant broken: the predicate raised NameError: .*"
                                          r"record 'p', steps 4\.\.5") as info:
        c.check(frames(p=([4, 5], np.ones((2, 3)))))
    assert isinstance(info.value.__cause__, NameError)


def test_recent_values_span_batches_of_one_frame():
    schema = Schema((leaf("x"),))
    c = finite("x").bind(schema)
    for k in range(8):
        assert c.check(frames(x=([k], [float(k)]))) is None
    v = c.check(frames(x=([8], [np.nan])))
    assert [s for s, _ in v.recent] == [4, 5, 6, 7, 8]
    assert v.recent[0] == (4, 4.0) and math.isnan(v.recent[-1][1])


def test_missing_record_in_a_batch_and_empty_batches():
    schema = Schema((leaf("a"), leaf("b")))
    c = conserved("b", atol=0.1).bind(schema)
    assert c.check(Frames()) is None
    assert c.check(frames(a=([0, 1], [1.0, 2.0]))) is None
    assert c.check(frames(b=([1], [5.0]))) is None  # reference = first *recorded* value
    f = frames(a=([2], [1.0]))
    f.add("b", np.zeros(0, np.int64), np.zeros(0))
    assert c.check(f) is None
    assert c.check(frames(b=([3], [5.2]))).step == 3


def test_warn_mode_checker_keeps_going_after_a_violation():
    schema = Schema((leaf("x"),))
    c = bounded("x", hi=1).bind(schema)
    assert c.check(frames(x=([0, 1], [2.0, 3.0]))).step == 0
    assert c.check(frames(x=([2, 3], [0.0, 5.0]))).step == 3


# --------------------------------------------------------------------------- bind errors (before the run)


def test_unrecorded_record_is_an_error_listing_what_is_recorded():
    schema = Schema((leaf("energy/total"), leaf("positions", (4, 3))))
    for inv in (finite("energy", "velocities"), bounded("velocities", hi=1), conserved("velocities"),
                monotonic("velocities"), invariant("v", lambda v: v, "velocities")):
        with pytest.raises(JaxlogError, match=r"record 'velocities' is not recorded; recorded: energy/total, positions"):
            inv.bind(schema)
    with pytest.raises(JaxlogError, match=r"invariant conserved\(velocities\)"):
        conserved("velocities").bind(schema)
    # a prefix names every leaf under it
    assert [l.path for l in conserved("energy").bind(schema).leaves] == ["energy/total"]


def test_invariants_that_cannot_apply_are_errors_naming_the_record():
    schema = Schema((leaf("z", dtype="complex128"), leaf("k", (2,), "uint32", key_impl="threefry2x32"),
                     leaf("flag", dtype="bool")))
    with pytest.raises(JaxlogError, match=r"bounded\(z, hi=1\) cannot apply to record 'z': it is complex"):
        bounded("z", hi=1).bind(schema)
    with pytest.raises(JaxlogError, match=r"monotonic\(z\) cannot apply to record 'z'"):
        monotonic("z").bind(schema)
    with pytest.raises(JaxlogError, match=r"record 'k': it is a PRNG key"):
        conserved("k").bind(schema)
    with pytest.raises(JaxlogError, match=r"record 'flag'"):
        conserved("flag").bind(schema)
    assert conserved("z", atol=1).bind(schema).check(frames(z=([0, 1], [1j, 3j]))).step == 1


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: bounded("x"), "needs lo=, hi= or both"),
        (lambda: bounded("x", lo=2, hi=1), "greater than"),
        (lambda: conserved("x", rtol=-1), r"conserved\(x\): rtol must be finite and >= 0, got -1"),
        (lambda: conserved("x", atol=float("nan")), r"conserved\(x\): atol must be finite and >= 0, got nan"),
        (lambda: bounded("x", hi=1, atol=-1e-6), r"bounded\(x\): atol must be finite and >= 0"),
        (lambda: bounded("x", lo="0"), r"bounded\(x\): lo must be a real number"),
        (lambda: monotonic("x", strict="yes"), r"monotonic\(x\): strict must be True or False"),
        (lambda: conserved("x", rtol="0.1"), "real number"),
        (lambda: finite(3), "record name"),
        (lambda: invariant("n", 3, "x"), "callable"),
        (lambda: invariant("", abs, "x"), "name"),
        (lambda: check_on_violation("ignore"), "on_violation"),
        (lambda: bind_all([lambda s: s], Schema(())), "invariants must be"),
    ],
)
def test_bad_arguments(make, match):
    with pytest.raises(JaxlogError, match=match):
        make()


def test_names():
    assert finite().name == "finite()"
    assert finite("a", "b").name == "finite(a, b)"
    assert conserved("energy", rtol=1e-4).name == "conserved(energy, rtol=0.0001)"
    assert conserved("e", atol=1e-6, rtol=0.01).name == "conserved(e, rtol=0.01, atol=1e-06)"
    assert bounded("x", lo=0).name == "bounded(x, lo=0)"
    assert monotonic("t", strict=True).name == "monotonic(t, strict=True)"
    assert invariant("my check", abs, "x").name == "my check"
    assert conserved("energy", rtol=1e-4).records == ("energy",)
    assert repr(finite("a")) == "finite(a)"


# --------------------------------------------------------------------------- driver helpers, JSON


def test_check_all_takes_the_earliest_step_and_first_listed_on_ties():
    schema = Schema((leaf("a"), leaf("b")))
    checkers = bind_all([bounded("b", hi=0), finite("a"), conserved("b")], schema)
    f = frames(a=([0, 1, 2], [0.0, np.nan, 0.0]), b=([0, 1, 2], [0.0, 1.0, 1.0]))
    v = check_all(checkers, f)
    assert v.step == 1 and v.invariant == "bounded(b, hi=0)"
    assert bind_all(None, schema) == [] and len(bind_all(finite(), schema)) == 1


def test_warn_violation_emits_runtime_warning_carrying_the_violation():
    v = InvariantViolation("finite()", record="x", step=3, value=float("nan"), expected="finite")
    with pytest.warns(JaxlogRuntimeWarning, match=r"invariant finite\(\) violated at step 3") as rec:
        warn_violation(v)
    assert rec[0].message.violation is v
    with warnings.catch_warnings():
        warnings.simplefilter("error", JaxlogRuntimeWarning)
        with pytest.raises(JaxlogRuntimeWarning):
            warn_violation(v)


violation_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**40), 2**40),
    st.complex_numbers(allow_nan=True, allow_infinity=True),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=4),
)


@settings(max_examples=100, deadline=None)
@given(
    value=violation_values,
    expected=st.one_of(st.floats(), st.just("finite"), st.just(">= 3")),
    tol=st.one_of(st.none(), st.floats(0, 1e3)),
    system=st.one_of(st.none(), st.integers(0, 100)),
    index=st.one_of(st.none(), st.lists(st.integers(0, 9), min_size=1, max_size=3).map(tuple)),
    recent=st.lists(st.tuples(st.integers(0, 10**6), st.floats(allow_nan=True)), max_size=5),
)
def test_to_json_round_trips_through_strict_json(value, expected, tol, system, index, recent):
    if isinstance(value, list):
        value = np.asarray(value)
    v = InvariantViolation("inv(x)", record="x/y", step=12, system=system, index=index, value=value,
                           expected=expected, tolerance=tol, detail="why", recent=recent,
                           artifacts={"trajectory": "/tmp/t.h5"})
    d = v.to_json()
    text = json.dumps(d, allow_nan=False)
    back = InvariantViolation.from_json(json.loads(text))
    assert back.to_json() == d
    assert str(back) == str(v)
    assert (back.step, back.system, back.index, back.record, back.invariant) == (12, system, index, "x/y", "inv(x)")
    np.testing.assert_equal(np.asarray(back.value), np.asarray(value))
    assert str(copy.deepcopy(v)) == str(v)


def test_from_json_of_a_real_violation():
    schema = Schema((leaf("x", (2, 3)),), batched=True)
    x = np.zeros((3, 2, 3))
    x[2, 1, 2] = np.nan
    v = finite().bind(schema).check(frames(x=([0, 5, 10], x))).with_artifacts({"trajectory": "/a/b.h5"})
    d = json.loads(json.dumps(v.to_json(), allow_nan=False))
    assert d["value"] == "nan" and d["step"] == 10 and d["system"] == 1 and d["index"] == [2]
    back = InvariantViolation.from_json(d)
    assert str(back) == str(v) and str(back.artifacts["trajectory"]) == "/a/b.h5"
    assert "in x[2]" in str(back)


def test_public_names_resolve():
    assert jl.finite is finite and jl.InvariantViolation is InvariantViolation and jl.Invariant
    assert issubclass(jl.InvariantViolation, AssertionError)


def test_finite_values_whose_sum_overflows_are_not_a_violation():
    """finite() first sums a batch (one pass, no mask); a sum that overflows on finite values must
    fall back to the exact check, and a NaN among them is still found at its step."""
    schema = Schema((LeafSpec("x", "x", (4,), np.dtype(np.float32), every(1)),))
    checker = jl.finite("x").bind(schema)
    big = np.full((6, 4), 3e38, dtype=np.float32)
    frames = Frames()
    frames.add("x", np.arange(6), big)
    assert checker.check(frames) is None
    big[4, 2] = np.nan
    frames = Frames()
    frames.add("x", np.arange(6, 12), big)
    v = checker.check(frames)
    assert v is not None and v.step == 10 and v.index == (2,)


# --------------------------------------------------------------------------- error family, wording


def test_violation_is_a_jaxlog_assertion_error():
    from pytest_jaxlog import JaxlogAssertionError

    v = InvariantViolation("finite()", record="x", step=3, value=float("nan"), expected="finite")
    assert isinstance(v, jl.JaxlogError) and isinstance(v, AssertionError) and isinstance(v, JaxlogAssertionError)
    assert str(v).startswith("[jaxlog] invariant finite() violated at step 3 in x: value nan, expected finite")


def test_an_invariant_on_a_record_group_names_the_leaf_and_the_group():
    schema = Schema((leaf("energy/kinetic"), leaf("energy/total")))
    c = conserved("energy", atol=0.1).bind(schema)
    assert [l.path for l in c.leaves] == ["energy/kinetic", "energy/total"]
    v = c.check(frames(energy__kinetic=([0, 1, 2], [1.0, 1.05, 1.0]), energy__total=([0, 1, 2], [5.0, 5.0, 5.5])))
    assert (v.record, v.group, v.step) == ("energy/total", "energy", 2)
    assert str(v).splitlines()[0] == (
        "[jaxlog] invariant conserved(energy, atol=0.1) violated at step 2 in energy/total (leaf of record group "
        "energy): value 5.5, expected 5 ± 0.1 (relative drift 0.1)"
    )
    back = InvariantViolation.from_json(json.loads(json.dumps(v.to_json(), allow_nan=False)))
    assert str(back) == str(v) and back.group == "energy"


@pytest.mark.parametrize(
    "inv, names_leaf",
    [
        (lambda: finite("x"), False),  # the name says x already
        (lambda: finite(), True),  # every record: say which
        (lambda: bounded("x", hi=0.5), False),
        (lambda: monotonic("x", increasing=False), False),
        (lambda: invariant("small", lambda x: x < 0.5, "x"), True),  # a user's name says nothing about x
    ],
)
def test_each_invariant_says_whether_its_message_names_the_record(inv, names_leaf):
    schema = Schema((leaf("x"),))
    v = inv().bind(schema).check(frames(x=([0, 1, 2], [0.0, 1.0, np.nan])))
    head = str(v).splitlines()[0]
    assert (" in x:" in head) is names_leaf, head
    assert InvariantViolation.from_json(v.to_json()).to_json() == v.to_json()


def test_violation_json_from_an_older_file_keeps_its_wording():
    """Files written before ``name_leaf`` was stored: the message keeps naming (or not) the leaf."""
    old = {"invariant": "conserved(energy, rtol=0.001)", "record": "energy", "step": 5, "system": None, "index": None,
           "value": 2.0, "expected": 1.0, "tolerance": 0.001, "detail": "relative drift 1", "recent": [],
           "artifacts": {}, "message": "[jaxlog] invariant conserved(energy, rtol=0.001) violated at step 5: value 2, ..."}
    assert " in energy" not in str(InvariantViolation.from_json(old))
    old["message"] = "[jaxlog] invariant x violated at step 5 in energy: ..."
    assert "at step 5 in energy: value 2" in str(InvariantViolation.from_json(old))


def test_bounded_atol_absorbs_float32_rounding_at_a_bound():
    schema = Schema((leaf("p", (3,), dtype="float32"),), batched=True)
    p = np.array([[0.5, 1 + 1.2e-7, 0.0]], np.float32)  # blackjax's acceptance probability
    assert p[0, 1] > 1
    assert bounded("p", 0, 1).bind(schema).check(frames(p=([0], p))).system == 1
    c = bounded("p", 0, 1, atol=1e-6).bind(schema)
    assert c.invariant.name == "bounded(p, lo=0, hi=1, atol=1e-06)"
    assert c.check(frames(p=([0], p))) is None
    worse = np.array([[0.5, 1.0, -3e-6]], np.float32)
    v = c.check(frames(p=([1], worse)))
    assert (v.step, v.system) == (1, 2)
    assert str(v).splitlines()[0] == (
        "[jaxlog] invariant bounded(p, lo=0, hi=1, atol=1e-06) violated at step 1 (system 2): value -3e-06, "
        "expected in [0, 1] ± 1e-06 (below the lower bound by 3e-06)"
    )
    assert bounded("p", lo=0.0, hi=1.0, atol=1e-6).name == "bounded(p, lo=0.0, hi=1.0, atol=1e-06)"


# --------------------------------------------------------------------------- running state (checkpoints)


STATEFUL = {
    "finite": lambda: finite(),
    "bounded": lambda: bounded("x", lo=0.5, hi=4.0, atol=0.25),
    "conserved": lambda: conserved("x", atol=2.0),
    "monotonic": lambda: monotonic("x"),
    "strictly decreasing": lambda: monotonic("x", increasing=False, strict=True),
    "predicate": lambda: invariant("below 5", lambda x: x < 5, "x"),
    "aggregate mean": lambda: jl.aggregate("x", "mean", lo=1.5, hi=3.0, steps=jl.window(6, 40)),
    "aggregate std": lambda: jl.aggregate("x", np.std, hi=1.2, steps=jl.every(2, start=4)),
    "aggregate max, whole run": lambda: jl.aggregate("x", "max", hi=4.5),
}


@pytest.mark.parametrize("kind", sorted(STATEFUL))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_state_round_trip_continues_exactly(kind, data):
    """Checking in one go and checking with a save/restore (through strict JSON) in between give the
    same violations, recent values and messages, at any batch split and restore point."""
    n = data.draw(st.integers(4, 30), label="frames")
    batched = data.draw(st.booleans(), label="batched")
    shape = (3,) if batched else ()
    values = data.draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, np.nan]),
                                min_size=n * (3 if batched else 1), max_size=n * (3 if batched else 1)))
    values = np.asarray(values).reshape((n, *shape))
    steps = np.arange(n, dtype=np.int64) * 2
    cuts = sorted(set(data.draw(st.lists(st.integers(1, n - 1), max_size=4), label="batch cuts")))
    edges = [0, *cuts, n]
    restore_at = data.draw(st.integers(1, len(edges) - 1), label="restore after batch")
    schema = Schema((leaf("x", shape, schedule=jl.every(2)),), batched=batched)

    def batches():
        for lo, hi in zip(edges[:-1], edges[1:]):
            yield frames(x=(steps[lo:hi], values[lo:hi]))

    def collect(checker, fs):
        return [v.to_json() for v in (checker.check(f) for f in fs) if v is not None]

    whole = STATEFUL[kind]().bind(schema)
    expected = collect(whole, batches())
    end = whole.finish()
    expected += [] if end is None else [end.to_json()]

    first = STATEFUL[kind]().bind(schema)
    parts = list(batches())
    got = collect(first, parts[:restore_at])
    saved = json.loads(json.dumps(first.state(), allow_nan=False))
    second = STATEFUL[kind]().bind(schema).restore(saved)
    got += collect(second, parts[restore_at:])
    end = second.finish()
    got += [] if end is None else [end.to_json()]
    assert got == expected


def test_state_holds_what_each_invariant_carries_between_batches():
    schema = Schema((leaf("e", (2,)),), batched=True)
    f = frames(e=([0, 5, 10], np.array([[1.0, -2.0], [1.5, -1.0], [2.5, 0.0]])))
    c = conserved("e", atol=10).bind(schema)
    c.check(f)
    assert c.state()["leaves"] == {"e": {"ref": [1.0, -2.0]}}
    m = monotonic("e").bind(schema)
    m.check(f)
    assert m.state()["leaves"] == {"e": {"step": 10, "value": [2.5, 0.0]}}
    a = jl.aggregate("e", "mean", lo=-10, steps=jl.window(5, 20)).bind(schema)
    a.check(f)
    st_ = a.state()
    assert st_["leaves"]["e"] == {"n": 2, "first": 5, "last": 10, "seen": 10, "done": False, "sum": [4.0, -1.0]}
    assert st_["recent"]["e"]["steps"] == [0, 5, 10]
    assert finite().bind(schema).state()["leaves"] == {}


def test_restore_refuses_another_invariants_state():
    schema = Schema((leaf("a"), leaf("b")))
    saved = conserved("a", atol=1).bind(schema).state()
    with pytest.raises(JaxlogError, match=r"invariant conserved\(b, atol=1\): the saved state is of invariant "
                                          r"conserved\(a, atol=1\)"):
        conserved("b", atol=1).bind(schema).restore(saved)
    c = conserved("a", atol=1).bind(schema)
    c.check(frames(a=([0], [1.0])))
    other = Schema((leaf("a/x"),))
    with pytest.raises(JaxlogError, match=r"holds records a, which this run does not check \(it checks a/x\)"):
        conserved("a", atol=1).bind(other).restore(c.state())
    with pytest.raises(JaxlogError, match="not a checker state"):
        c.restore({"leaves": {}})
    from pytest_jaxlog.check.invariants import restore_all, save_all

    checkers = bind_all([finite(), conserved("a", atol=1)], schema)
    with pytest.raises(JaxlogError, match="holds 1 invariants, this run checks 2"):
        restore_all(checkers, save_all(checkers[:1]))
    restore_all(checkers, save_all(checkers))
