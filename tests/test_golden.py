"""assert_trajectory_close / diff_trajectories / check_golden on real (in-memory and HDF5) trajectories."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import pytest_jaxlog as jl
from pytest_jaxlog import Frames, LeafSpec, Schema
from pytest_jaxlog.compare.golden import check_golden, diff_trajectories, golden_name
from pytest_jaxlog import MemorySink

PROV = {"backend": "cpu", "x64": False, "device_kind": "cpu", "jax": "test"}


def make_traj(records: dict, *, provenance=None, status="complete", batched=False, dt=None):
    """A real Trajectory from a MemorySink fed ``{path: (steps, values)}`` (values stacked on axis 0)."""
    leaves, frames = [], Frames()
    for path, (steps, values) in records.items():
        steps = np.asarray(steps, np.int64)
        values = np.asarray(values)
        leaves.append(LeafSpec(path, path.split("/")[0], values.shape[1:], values.dtype, jl.at(*steps.tolist())))
        frames.add(path, steps, values)
    sink = MemorySink()
    schema = Schema(tuple(leaves), batched=batched, dt=dt)
    last = max(int(s[-1]) for s, _ in records.values())
    sink.open(schema, {"provenance": dict(provenance or PROV), "run": {"steps": last, "chunk": 1, "dt": dt, "driver": "run"}})
    sink.write(frames)
    sink.close(status, steps_done=last)
    return jl.Trajectory.from_sink(sink)


STEPS = np.arange(0, 2001)
RNG = np.random.default_rng(0)
ENERGY = -280.0 + 0.01 * RNG.standard_normal(len(STEPS))
POS = RNG.standard_normal((len(STEPS[::10]), 8, 3)).astype(np.float32)


def reference(**changes):
    recs = {"energy": (STEPS, ENERGY.copy()), "state/positions": (STEPS[::10], POS.copy())}
    recs.update(changes)
    return make_traj({k: v for k, v in recs.items() if v is not None})


def test_equal_and_within_tolerance():
    jl.assert_trajectory_close(reference(), reference())
    d = diff_trajectories(reference(), reference())
    assert d.ok and d.n_elements == len(STEPS) + POS.size
    assert "trajectories match" in d.report()
    e = ENERGY * (1 + 1e-9)
    jl.assert_trajectory_close(reference(energy=(STEPS, e)), reference(), rtol=1e-7)
    jl.assert_trajectory_close(reference(energy=(STEPS, ENERGY + 1e-3)), reference(), rtol=0, atol=2e-3)


def test_outside_tolerance_names_first_step_index_and_stats():
    pos = POS.copy()
    pos[150:, 3, 1] += 0.5  # step 1500 onwards
    e = ENERGY.copy()
    e[1834] = -251.3
    with pytest.raises(AssertionError) as info:
        jl.assert_trajectory_close(reference(energy=(STEPS, e), **{"state/positions": (STEPS[::10], pos)}), reference())
    msg = str(info.value)
    lines = msg.splitlines()
    assert lines[0].startswith("[jaxlog] trajectories differ: record 'state/positions' first differs at step 1500, index (3, 1):")
    assert f"obtained {pos[150, 3, 1]!s}, expected {POS[150, 3, 1]!s}" in lines[0]
    assert "max abs error 0.5, max rel error" in lines[1] and f"{len(pos) - 150} of {POS.size} elements differ" in lines[1]
    (other,) = [ln for ln in lines if "'energy'" in ln]
    assert f"first differs at step 1834: obtained -251.3, expected {ENERGY[1834]}" in other
    assert "1 of 2001 elements differ" in other


@settings(max_examples=40, deadline=None)
@given(
    frame=st.integers(0, len(POS) - 1),
    atom=st.integers(0, 7),
    axis=st.integers(0, 2),
    rel=st.one_of(st.floats(0, 0.4), st.floats(2.0, 1e6)),
    sign=st.sampled_from([-1.0, 1.0]),
)
def test_random_perturbation_detected_iff_outside_rtol(frame, atom, axis, rel, sign):
    rtol = 1e-3
    values = POS.astype(np.float64)
    expected = make_traj({"x": (STEPS[::10], values)})
    pert = values.copy()
    pert[frame, atom, axis] += sign * rel * rtol * abs(values[frame, atom, axis])
    d = diff_trajectories(make_traj({"x": (STEPS[::10], pert)}), expected, rtol=rtol)
    if rel <= 0.4 or pert[frame, atom, axis] == values[frame, atom, axis]:
        assert d.ok
    else:
        (rd,) = d.differences
        assert (rd.step, rd.index, rd.n_diff) == (10 * frame, (atom, axis), 1)
        assert rd.obtained == pert[frame, atom, axis] and rd.expected == values[frame, atom, axis]
        assert rd.max_rel == pytest.approx(rel * rtol, rel=1e-6)


FLOATS = st.one_of(st.floats(-1e3, 1e3), st.sampled_from([np.nan, np.inf, -np.inf, 0.0]))


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    rtol=st.sampled_from([0.0, 1e-7, 1e-3, 0.5]),
    atol=st.sampled_from([0.0, 1e-6, 1.0]),
    equal_nan=st.booleans(),
)
def test_elementwise_rule_is_numpy_isclose(data, rtol, atol, equal_nan):
    """Whatever the values (NaN, infinities, zeros), an element differs iff numpy.isclose says so."""
    e = data.draw(hnp.arrays(np.float64, (5, 3), elements=FLOATS))
    noise = data.draw(hnp.arrays(np.float64, (5, 3), elements=st.floats(-2, 2)))
    mask = data.draw(hnp.arrays(np.bool_, (5, 3)))
    a = np.where(mask, e + noise * data.draw(st.sampled_from([1e-9, 1e-4, 1.0])), e)
    a = np.where(data.draw(hnp.arrays(np.bool_, (5, 3))), data.draw(hnp.arrays(np.float64, (5, 3), elements=FLOATS)), a)
    steps = np.arange(5) * 3
    d = diff_trajectories(make_traj({"v": (steps, a)}), make_traj({"v": (steps, e)}), rtol=rtol, atol=atol, equal_nan=equal_nan)
    bad = ~np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=equal_nan)
    if not bad.any():
        assert d.ok
    else:
        (rd,) = d.differences
        first = tuple(np.argwhere(bad)[0])
        assert rd.n_diff == bad.sum() and rd.n_total == bad.size
        assert (rd.step, rd.index) == (3 * first[0], (int(first[1]),))
        assert rd.n_nan == (bad & (np.isnan(a) | np.isnan(e))).sum()


@pytest.mark.filterwarnings("error")
def test_relative_error_stats_warn_nothing():
    """Huge errors over subnormal or zero expected values: max rel error is inf, and neither numpy
    warning (overflow, divide by zero, invalid) reaches the user's test run (warnings are errors here)."""
    e = np.array([[1e-310, 0.0, 1.0, -5e-324]])
    a = np.array([[1e300, 1.0, 1.0, 1e308]])
    with np.errstate(divide="warn", over="warn", invalid="warn"):  # numpy's defaults, whatever ran before
        d = diff_trajectories(make_traj({"v": ([0], a)}), make_traj({"v": ([0], e)}), rtol=1e-7)
        (rd,) = d.differences
        assert (rd.n_diff, rd.index) == (3, (0,))
        assert rd.max_rel == np.inf and rd.max_abs == 1e308
        # finite quotients are exact; a zero expected value alone still gives inf
        d = diff_trajectories(make_traj({"v": ([0], [[3.0, 2.0]])}), make_traj({"v": ([0], [[2.0, 0.0]])}))
        assert d.differences[0].max_rel == np.inf and d.differences[0].max_abs == 2.0
        d = diff_trajectories(make_traj({"v": ([0], [[3.0, 1e-300]])}), make_traj({"v": ([0], [[2.0, 1e-310]])}))
        assert d.differences[0].max_rel == pytest.approx((1e-300 - 1e-310) / 1e-310)
        assert "max rel error inf" in diff_trajectories(make_traj({"v": ([0], a)}), make_traj({"v": ([0], e)})).report()


def test_bfloat16_and_complex_records():
    import ml_dtypes

    v = np.linspace(0, 1, 30).reshape(10, 3)
    b16 = v.astype(ml_dtypes.bfloat16)
    jl.assert_trajectory_close(make_traj({"h": (np.arange(10), b16)}), make_traj({"h": (np.arange(10), b16.copy())}))
    bumped = b16.copy()
    bumped[4, 1] = ml_dtypes.bfloat16(0.75)
    with pytest.raises(AssertionError, match=r"record 'h' first differs at step 4, index \(1,\): obtained 0.75, expected 0.4"):
        jl.assert_trajectory_close(make_traj({"h": (np.arange(10), bumped)}), make_traj({"h": (np.arange(10), b16)}))
    jl.assert_trajectory_close(make_traj({"h": (np.arange(10), bumped)}), make_traj({"h": (np.arange(10), b16)}), atol=0.5)
    c = v * (1 + 1j)
    with pytest.raises(AssertionError, match=r"first differs at step 9, index \(2,\)"):
        jl.assert_trajectory_close(make_traj({"c": (np.arange(10), c + np.where(v == 1, 1e-3j, 0))}),
                                   make_traj({"c": (np.arange(10), c)}))


def test_nan_policy():
    e = ENERGY.copy()
    e[[7, 900]] = np.nan
    jl.assert_trajectory_close(reference(energy=(STEPS, e)), reference(energy=(STEPS, e.copy())))
    with pytest.raises(AssertionError, match="first differs at step 7: obtained nan, expected nan"):
        jl.assert_trajectory_close(reference(energy=(STEPS, e)), reference(energy=(STEPS, e.copy())), equal_nan=False)
    # NaN against a number is a difference, in either direction
    with pytest.raises(AssertionError) as info:
        jl.assert_trajectory_close(reference(energy=(STEPS, e)), reference())
    assert "record 'energy' first differs at step 7: obtained nan" in str(info.value)
    assert "2 of 2001 elements differ, 2 of them NaN" in str(info.value)
    with pytest.raises(AssertionError, match=r"step 7: obtained -2\d\d\.\d+, expected nan"):
        jl.assert_trajectory_close(reference(), reference(energy=(STEPS, e)), rtol=1.0)
    # same infinities match; opposite ones do not
    e2 = ENERGY.copy()
    e2[3] = np.inf
    jl.assert_trajectory_close(reference(energy=(STEPS, e2)), reference(energy=(STEPS, e2.copy())))
    e3 = e2.copy()
    e3[3] = -np.inf
    with pytest.raises(AssertionError, match="step 3: obtained -inf, expected inf"):
        jl.assert_trajectory_close(reference(energy=(STEPS, e3)), reference(energy=(STEPS, e2)))
    with pytest.raises(AssertionError, match="step 3: obtained -2.*, expected inf"):  # rtol*|inf| is no free pass
        jl.assert_trajectory_close(reference(), reference(energy=(STEPS, e2)), rtol=0.5)


def test_missing_and_extra_records():
    with pytest.raises(AssertionError) as info:
        jl.assert_trajectory_close(reference(**{"state/positions": None, "aux/ke": (STEPS[1:], ENERGY[1:])}), reference())
    msg = str(info.value)
    assert "record 'state/positions': missing from the obtained trajectory" in msg
    assert "record 'aux/ke': not in the expected trajectory (extra record)" in msg


def test_step_mismatch_and_steps_filter():
    short = reference(energy=(STEPS[:1001], ENERGY[:1001]), **{"state/positions": (STEPS[:1001:10], POS[:101])})
    with pytest.raises(AssertionError) as info:
        jl.assert_trajectory_close(short, reference())
    first = str(info.value).splitlines()[0]
    assert "steps differ: obtained 1001 frames, steps 0..1000, expected 2001 frames, steps 0..2000" in first
    assert "1000 expected steps missing (first 1001)" in first
    # restricted to the steps both have, they agree (slice, range, list, schedule)
    for sel in (slice(0, 1001), range(0, 1001), [0, 10, 500, 1000], jl.window(0, 1000, 100)):
        jl.assert_trajectory_close(short, reference(), steps=sel)
    # a shifted schedule is a difference even with the same frame count
    shifted = reference(energy=(STEPS + 1, ENERGY))
    d = diff_trajectories(shifted, reference(), records="energy")
    assert d.differences[0].kind == "steps" and d.differences[0].step == 0 and "steps differ" in d.report()


def test_steps_filter_hides_late_divergence_only():
    e = ENERGY.copy()
    e[1500:] += 1.0
    actual = reference(energy=(STEPS, e))
    jl.assert_trajectory_close(actual, reference(), steps=slice(None, 1500))
    jl.assert_trajectory_close(actual, reference(), steps=slice(0, 1500, 7))
    with pytest.raises(AssertionError, match="first differs at step 1500"):
        jl.assert_trajectory_close(actual, reference(), steps=slice(1000, None))
    with pytest.raises(AssertionError, match="first differs at step 1504"):
        jl.assert_trajectory_close(actual, reference(), steps=slice(1000, None, 7))


def test_dtype_and_shape_mismatch():
    with pytest.raises(AssertionError, match=r"record 'state/positions': dtype differs: obtained float64, expected float32"):
        jl.assert_trajectory_close(reference(**{"state/positions": (STEPS[::10], POS.astype(np.float64))}), reference())
    with pytest.raises(AssertionError, match=re.escape("shape differs: obtained (8, 2), expected (8, 3) per frame")):
        jl.assert_trajectory_close(reference(**{"state/positions": (STEPS[::10], POS[..., :2])}), reference())


def test_records_filter_and_unknown_record():
    pos = POS + 1
    actual = reference(**{"state/positions": (STEPS[::10], pos)})
    jl.assert_trajectory_close(actual, reference(), records=["energy"])
    with pytest.raises(AssertionError, match="'state/positions'"):
        jl.assert_trajectory_close(actual, reference(), records=["state"])  # a prefix selects its leaves
    with pytest.raises(jl.JaxlogError, match=r"record 'nope' is not recorded; recorded: energy, state/positions"):
        jl.assert_trajectory_close(actual, reference(), records=["nope"])


def test_exact_dtypes_and_batched_system_index():
    counts = np.arange(len(STEPS), dtype=np.int64)[:, None] * np.ones((1, 4), np.int64)
    bumped = counts.copy()
    bumped[42, 2] += 1
    a = make_traj({"n": (STEPS, bumped)}, batched=True)
    e = make_traj({"n": (STEPS, counts)}, batched=True)
    with pytest.raises(AssertionError, match=r"record 'n' first differs at step 42, index \(2,\): obtained 43, expected 42"):
        jl.assert_trajectory_close(a, e, rtol=0.5)  # integers compare exactly whatever the tolerance
    assert diff_trajectories(a, e).differences[0].detail == "values differ (system 2)"


def test_paths_and_files(tmp_path):
    ref = tmp_path / "ref.h5"
    reference().save(ref)
    jl.assert_trajectory_close(str(ref), reference())
    jl.assert_trajectory_close(reference(), ref)
    e = ENERGY.copy()
    e[5] += 1
    with pytest.raises(AssertionError) as info:
        jl.assert_trajectory_close(reference(energy=(STEPS, e)), ref)
    assert "first differs at step 5" in str(info.value) and "ref.h5" in str(info.value)
    with pytest.raises(jl.JaxlogError, match="does not exist"):
        jl.assert_trajectory_close(reference(), tmp_path / "nope.h5")


def test_check_golden_cycle(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    golden = Path("fixtures/golden") / golden_name("examples/test_lj.py::test_nve[64]")
    assert golden.name == "examples.test_lj.test_nve-64.h5"
    with pytest.raises(AssertionError) as info:
        check_golden(reference(), golden, regen=False, rtol=1e-7, atol=0)
    assert str(info.value) == (
        "[jaxlog] golden trajectory fixtures/golden/examples.test_lj.test_nve-64.h5 does not exist; "
        "run pytest with --jaxlog-regen to create fixtures/golden/examples.test_lj.test_nve-64.h5"
    )
    assert check_golden(reference(), golden, regen=True, rtol=1e-7, atol=0) == "regenerated"
    assert golden.exists() and not list(golden.parent.glob(".*tmp*"))
    assert check_golden(reference(), golden, regen=False, rtol=1e-7, atol=0) == "ok"
    loaded = jl.load(golden)
    assert loaded.provenance["backend"] == "cpu" and loaded.status == "complete"

    e = ENERGY.copy()
    e[1834] = -251.3
    changed = reference(energy=(STEPS, e))
    with pytest.raises(AssertionError) as info:
        check_golden(changed, golden, regen=False, rtol=1e-7, atol=0)
    msg = str(info.value)
    # the provenance leads: which entry, made where (here: this platform, jax "test" of PROV)
    assert msg.splitlines()[0] == (f"[jaxlog] golden {golden} (this platform's entry) made on this platform (backend "
                                   "'cpu', device kind 'cpu', jax test, x64 off)")
    assert msg.splitlines()[1].startswith(
        "[jaxlog] trajectories differ: record 'energy' first differs at step 1834: obtained -251.3")
    assert msg.splitlines()[-1] == f"run pytest with --jaxlog-regen to regenerate {golden} (this platform's entry)"
    assert "note:" not in msg
    assert check_golden(changed, golden, regen=False, rtol=1e-7, atol=0, records=["state"]) == "ok"
    # regeneration is unconditional and overwrites
    assert check_golden(changed, golden, regen=True, rtol=1e-7, atol=0) == "regenerated"
    assert check_golden(changed, golden, regen=False, rtol=1e-7, atol=0) == "ok"


def test_check_golden_names_other_backend_and_x64(tmp_path):
    golden = tmp_path / "gpu.h5"
    make_traj({"energy": (STEPS, ENERGY)}, provenance={**PROV, "backend": "gpu", "x64": True}).save(golden)
    e = ENERGY.copy()
    e[10] += 1e-3
    with pytest.raises(AssertionError) as info:
        check_golden(make_traj({"energy": (STEPS, e)}), golden, regen=False, rtol=1e-7, atol=0)
    msg = str(info.value)
    assert "note: the expected trajectory was made on backend 'gpu', this one on 'cpu'" in msg
    assert "x64=on (jax_enable_x64), this one with x64=off" in msg
    # the note is for failures only
    assert check_golden(make_traj({"energy": (STEPS, e)}), golden, regen=False, rtol=1e-3, atol=0) == "ok"


def test_golden_name():
    assert golden_name("tests/test_md.py::TestNVE::test_energy") == "tests.test_md.TestNVE.test_energy.h5"
    assert golden_name("test_x.py::test_a[cpu-float32]") == "test_x.test_a-cpu-float32.h5"
    odd = golden_name("t.py::test_x[a/b c]")
    assert re.fullmatch(r"t\.test_x-a_b_c-[0-9a-f]{8}\.h5", odd)
    assert odd != golden_name("t.py::test_x[a b/c]")
    long = golden_name("t.py::test_" + "x" * 300)
    assert len(long) <= 130 and long.endswith(".h5")
    # dotted directories and paths outside the rootdir must not give two tests one name (golden, artifact dir)
    assert golden_name("v1.2/test_x.py::test_f") != golden_name("v1/2/test_x.py::test_f")
    assert golden_name("../other/test_x.py::test_f") != golden_name("other/test_x.py::test_f")
    assert golden_name("t.py::test_x[1.5]") == "t.test_x-1.5.h5"  # dots in parameter ids are fine
    assert golden_name("t.py::test_x[a::b]") != golden_name("t.py::test_x[a.b]")  # '::' inside a parameter id
    assert golden_name("t.py::C::test_x[a::b]").startswith("t.C.test_x-a__b-")


def test_accepts_runs():
    from kernels.oscillators import make_oscillators

    step, state, energy = make_oscillators(n=16)
    a = jl.run(step, state, 20, record={"energy": energy})
    b = jl.run(step, state, 20, record={"energy": energy})
    jl.assert_trajectory_close(a, b)
    jl.assert_trajectory_close(a, b.trajectory)
    c = jl.run(step, state, 10, record={"energy": energy})
    with pytest.raises(AssertionError, match="steps differ"):
        jl.assert_trajectory_close(c, a)


def test_comparison_options_declared_once(tmp_path):
    """assert_trajectory_close and check_golden take diff_trajectories' options (positional too,
    as documented), show them in their signature, and reject a misspelt one even when regenerating."""
    import inspect

    sig = inspect.signature(jl.assert_trajectory_close)
    assert list(sig.parameters)[2:] == ["rtol", "atol", "records", "steps", "equal_nan", "tolerances", "hint"]
    assert sig.parameters["rtol"].default == 1e-7 and sig.parameters["hint"].kind is inspect.Parameter.KEYWORD_ONLY
    a, e = make_traj({"v": ([0, 1], [1.0, 2.0])}), make_traj({"v": ([0, 1], [1.0, 2.1])})
    jl.assert_trajectory_close(a, e, 0.1)
    with pytest.raises(AssertionError, match="(?s)rtol=0.001.*HINT"):
        jl.assert_trajectory_close(a, e, 1e-3, hint="HINT")
    with pytest.raises(jl.JaxlogError, match=r"check_golden: unknown option 'rtoll'; the options are rtol, atol, "
                                             r"records, steps, equal_nan, tolerances"):
        check_golden(a, tmp_path / "g.h5", regen=True, rtoll=1e-3)
    with pytest.raises(jl.JaxlogError, match="record 'w' is not recorded"):  # a misspelt record too
        check_golden(a, tmp_path / "g.h5", regen=True, records=["w"])
    assert not (tmp_path / "g.h5").exists()
    assert check_golden(a, tmp_path / "g.h5", regen=True, rtol=0) == "regenerated"
    assert check_golden(a, tmp_path / "g.h5", regen=False, rtol=0, records="v", steps=[0, 1]) == "ok"


def test_check_golden_passes_every_option_through(tmp_path):
    """Each option of assert_trajectory_close changes check_golden's outcome the same way."""
    import inspect

    from pytest_jaxlog.compare.golden import COMPARISON_OPTIONS

    shared = [n for n in inspect.signature(jl.assert_trajectory_close).parameters if n not in ("actual", "expected", "hint")]
    golden_sig = inspect.signature(check_golden).parameters
    assert shared == list(COMPARISON_OPTIONS) == ["rtol", "atol", "records", "steps", "equal_nan", "tolerances"]
    assert all(golden_sig[n].kind is inspect.Parameter.KEYWORD_ONLY for n in shared)
    assert all(golden_sig[n].default == inspect.signature(jl.assert_trajectory_close).parameters[n].default for n in shared)

    golden = tmp_path / "g.h5"
    base = {"e": ([0, 1, 2, 3], [1.0, 2.0, np.nan, 4.0]), "other/x": ([0, 2], [0.0, 0.0])}
    check_golden(make_traj(base), golden, regen=True)
    cases = {  # option: (obtained trajectory, option value that makes it pass)
        "rtol": ({"e": ([0, 1, 2, 3], [1.0, 2.0, np.nan, 4.004])}, 1e-3),
        "atol": ({"e": ([0, 1, 2, 3], [1.0, 2.0, np.nan, 4.004])}, 5e-3),
        "records": ({"other/x": ([0, 2], [0.0, 1.0])}, ["e"]),
        "steps": ({"e": ([0, 1, 2, 3], [1.0, 2.0, np.nan, 9.0])}, slice(0, 3)),
    }
    for option, (change, value) in cases.items():
        changed = make_traj({**base, **change})
        with pytest.raises(jl.TrajectoryMismatch):
            check_golden(changed, golden, regen=False)
        assert check_golden(changed, golden, regen=False, **{option: value}) == "ok", option
    assert check_golden(make_traj(base), golden, regen=False) == "ok"
    assert check_golden(make_traj({**base, **cases["records"][0]}), golden, regen=False, records=("e",)) == "ok"
    with pytest.raises(jl.TrajectoryMismatch, match="first differs at step 2: obtained nan, expected nan"):
        check_golden(make_traj(base), golden, regen=False, equal_nan=False)


def test_comparison_failures_are_trajectory_mismatches(tmp_path):
    from pytest_jaxlog import JaxlogAssertionError

    a, e = make_traj({"v": ([0, 1], [1.0, 2.0])}), make_traj({"v": ([0, 1], [1.0, 2.5])})
    with pytest.raises(jl.TrajectoryMismatch) as info:
        jl.assert_trajectory_close(a, e)
    err = info.value
    assert isinstance(err, jl.JaxlogError) and isinstance(err, AssertionError) and isinstance(err, JaxlogAssertionError)
    assert str(err).startswith("[jaxlog] trajectories differ: record 'v' first differs at step 1")
    assert err.diff.first.step == 1 and not err.diff.ok
    with pytest.raises(jl.TrajectoryMismatch, match=r"golden trajectory .*missing.h5 does not exist; run pytest with "
                                                    r"--jaxlog-regen to create") as info:
        check_golden(a, tmp_path / "missing.h5", regen=False)
    assert info.value.diff is None and isinstance(info.value, AssertionError)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda a: jl.assert_trajectory_close(a, a, rtol="1e-3"), r"rtol must be a real number, got '1e-3'"),
        (lambda a: jl.assert_trajectory_close(a, a, atol=-1.0), r"atol must be finite and >= 0, got -1.0"),
        (lambda a: jl.assert_trajectory_close(a, a, equal_nan="no"), r"equal_nan must be True or False, got 'no'"),
        (lambda a: jl.assert_trajectory_close(a, a, records=3), r"records= takes a record name or a list"),
        (lambda a: jl.assert_trajectory_close(a, a, steps=[1.5]), r"steps= takes a slice, a range, step numbers"),
        (lambda a: jl.assert_trajectory_close(a, a, steps=-2), r"steps= must be >= 0, got -2"),
        (lambda a: jl.assert_trajectory_close(a, a, steps=[0, -2]), r"each step number must be >= 0, got -2"),
        (lambda a: jl.assert_trajectory_close(a, a, steps=slice(0, 5, 0)), r"positive stride"),
        (lambda a: jl.assert_trajectory_close(a, a, steps=slice("a", 5)), r"slice\(start, ...\) must be an integer step"),
        (lambda a: jl.assert_trajectory_close(a, a, 1e-7, 0.0, None, None, True, None, 5), r"at most 6 comparison options"),
        (lambda a: jl.assert_trajectory_close(a, a, 1e-7, rtol=1e-3), r"option 'rtol' given twice"),
        (lambda a: jl.assert_trajectory_close(a, a, tol=1e-3), r"unknown option 'tol'"),
        (lambda a: jl.assert_trajectory_close(a, 42), r"cannot compare a int"),
        (lambda a: check_golden(a, 42, regen=False), r"golden path must be a str or a path, got 42"),
        (lambda a: check_golden(a, "g.h5", regen="yes"), r"regen=...\) must be True or False"),
        (lambda a: check_golden(a, "g.h5", regen=True, steps=[1.5]), r"steps= takes"),
    ],
)
def test_user_mistakes_are_jaxlog_errors_not_builtin_ones(call, match):
    a = make_traj({"v": ([0, 1], [1.0, 2.0])})
    with pytest.raises(jl.JaxlogError, match=match) as info:
        call(a)
    assert not isinstance(info.value, AssertionError)
