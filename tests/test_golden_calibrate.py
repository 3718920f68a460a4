"""Tolerances from evidence (``jl.calibrate``) and per-record tolerances (``tolerances=``): the
derived tolerances cover every rerun they came from, with the stated margin, and still fail a
fault larger than that margin; stored in a golden, read back, validated."""

import json

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.compare.golden import check_golden, diff_trajectories


def heat_step(s):
    """An explicit heat step on a ring with a reduction (the total heat), in float32."""
    u = s["u"]
    lap = jnp.roll(u, 1) - 2 * u + jnp.roll(u, -1)
    return {"u": u + 0.2 * lap + 1e-3 * jnp.sin(u)}


STATE = {"u": jnp.exp(-((jnp.linspace(0, 1, 128) - 0.3) ** 2) / 0.01)}
RECORD = {"u": lambda s: s["u"], "heat": lambda s: jnp.sum(s["u"]), "n": lambda s: jnp.int32(7)}


@pytest.fixture(scope="module")
def cal():
    return jl.calibrate(heat_step, STATE, 200, record=RECORD)


def test_the_spread_is_measured_and_the_tolerances_rest_on_it(cal):
    assert set(cal.variants) == {"blocks=8", "blocks=32", "x64"} and not cal.notes
    assert set(cal.tolerances) == {"u", "heat"}  # the int record is compared exactly: no tolerance
    for t in cal.tolerances.values():
        assert t["spread_rel"] > 0  # float32 against float64 moves every floating record
        assert t["rtol"] == pytest.approx(max(10 * t["spread_rel"], 10 * np.finfo(np.float32).eps))
        assert t["atol"] >= 10 * t["spread_abs"] and t["safety"] == 10.0
    # the x64 spread, computed plainly: the float32 run against the float64 run rounded back
    ref = jl.run(heat_step, STATE, 200, record=RECORD, progress=False).trajectory["heat"].astype(np.float64)
    jax.config.update("jax_enable_x64", True)
    try:
        wide = jl.run(heat_step, {"u": jnp.asarray(STATE["u"], jnp.float64)}, 200, record=RECORD,
                      progress=False).trajectory["heat"]
    finally:
        jax.config.update("jax_enable_x64", False)
    plain = float(np.max(np.abs(wide - ref) / np.abs(ref)))
    assert cal.tolerances["heat"]["spread_rel"] >= plain


def test_every_rerun_passes_and_a_fault_past_the_margin_fails(cal, monkeypatch):
    reference = jl.run(heat_step, STATE, 200, record=RECORD, progress=False)
    monkeypatch.setenv("JAXLOG_BLOCK", "8")
    rerun = jl.run(heat_step, STATE, 200, record=RECORD, progress=False)
    monkeypatch.delenv("JAXLOG_BLOCK")
    assert diff_trajectories(rerun, reference, **cal.options()).ok
    # a fault: the heat record off by 50x its measured relative spread from step 120
    heat = np.asarray(reference.trajectory["heat"], np.float64)
    bent = heat.copy()
    bent[120:] *= 1 + 50 * cal.tolerances["heat"]["spread_rel"]
    fake = jl.from_arrays({"u": reference.trajectory["u"], "heat": bent.astype(np.float32),
                           "n": reference.trajectory["n"]})
    diff = diff_trajectories(fake, reference, **cal.options())
    assert not diff.ok and diff.first.path == "heat" and diff.first.step == 120
    assert "(this record's)" in diff.report()


def test_a_golden_stores_the_calibrated_tolerances_and_checks_with_them(cal, tmp_path):
    run = jl.run(heat_step, STATE, 200, record=RECORD, progress=False)
    golden = tmp_path / "g.h5"
    assert check_golden(run, golden, regen=True, **cal.options()) == "regenerated"
    stored = jl.load(golden).golden["tolerances"]
    assert stored == {k: dict(v) for k, v in cal.tolerances.items()}  # JSON keeps every float exactly
    assert check_golden(run, golden, regen=False) == "ok"  # the stored tolerances apply without being given
    # a stored tolerance that is not a finite number >= 0 is one error naming the file and the field
    with h5py.File(golden, "r+") as f:
        info = json.loads(f["jaxlog"].attrs["golden"])
        info["tolerances"]["heat"]["rtol"] = float("nan")
        f["jaxlog"].attrs["golden"] = json.dumps(info)
    with pytest.raises(jl.JaxlogError, match=r"stored field 'tolerances.heat.rtol' is nan"):
        check_golden(run, golden, regen=False)


def test_tolerances_are_per_record_with_the_longest_prefix_winning():
    a = jl.from_arrays({"s": {"x": np.array([1.0, 2.0]), "y": np.array([1.0, 2.0])}})
    e = jl.from_arrays({"s": {"x": np.array([1.0, 2.01]), "y": np.array([1.0, 2.01])}})
    assert not diff_trajectories(a, e).ok
    loose = {"s": {"rtol": 1e-2}}
    assert diff_trajectories(a, e, tolerances=loose).ok
    d = diff_trajectories(a, e, tolerances={**loose, "s/y": {"rtol": 1e-4}})
    assert [x.path for x in d.differences] == ["s/y"]
    with pytest.raises(jl.JaxlogError, match="record 'z' is not recorded"):
        diff_trajectories(a, e, tolerances={"z": {"rtol": 1.0}})
    with pytest.raises(jl.JaxlogError, match=r"tolerances\['s'\]\['rtol'\] must be finite"):
        diff_trajectories(a, e, tolerances={"s": {"rtol": float("inf")}})


def test_bad_calibration_input_is_one_error():
    with pytest.raises(jl.JaxlogError, match="safety= must be"):
        jl.calibrate(heat_step, STATE, 5, record=RECORD, safety=0.5)
    with pytest.raises(jl.JaxlogError, match="perturb= takes"):
        jl.calibrate(heat_step, STATE, 5, record=RECORD, perturb=["keys"])
    with pytest.raises(jl.JaxlogError, match="sinks= not taken"):
        jl.calibrate(heat_step, STATE, 5, record=RECORD, sinks=[jl.MemorySink()])


def test_a_kernel_that_fails_in_float64_is_noted_not_fatal():
    def f32_only(s):
        return {"u": jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(s["u"], jnp.int32) + 1, jnp.float32)}

    cal = jl.calibrate(f32_only, STATE, 5, record={"u": lambda s: s["u"]})
    assert "x64" not in cal.variants and any(n.startswith("x64: not compared") for n in cal.notes)
