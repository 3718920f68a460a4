"""A golden carries its tolerance: ``check_golden`` stores the options it checks with and the
platform the golden was made on; ``jaxlog diff`` compares with them by default (options given
override them) and says where the golden was made when that is not here. Goldens written before
(no such attribute) read and compare as they always did."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.compare.golden import check_golden, golden_options
from pytest_jaxlog.store.hdf5.layout import provenance

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
BASE = np.linspace(1.0, 2.0, 40, dtype=np.float64).reshape(10, 4)


def traj(scale: float = 0.0) -> object:
    """A trajectory of 10 frames; ``scale``: every value off by that relative amount."""
    return jl.from_arrays({"x": BASE * (1.0 + scale), "y": np.arange(10.0)}).trajectory


def diff(a: Path, b: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest_jaxlog", "diff", str(a), str(b), *flags],
                          capture_output=True, text=True, env=ENV, timeout=120)


def accepts(actual, golden: Path, **options) -> bool:
    """Whether ``check_golden`` accepts ``actual`` against ``golden``."""
    try:
        check_golden(actual, golden, regen=False, **options)
    except jl.TrajectoryMismatch:
        return False
    return True


def test_a_golden_stores_the_options_it_is_checked_with_and_its_platform(tmp_path):
    golden = tmp_path / "g.h5"
    assert check_golden(traj(), golden, regen=True, rtol=1e-4, atol=1e-9, records="x") == "regenerated"
    stored = jl.load(golden).golden
    here = provenance()
    assert stored == {"rtol": 1e-4, "atol": 1e-9, "records": ["x"], "steps": None, "equal_nan": True, "tolerances": None,
                      "platform": {"backend": here["backend"], "device_kind": here["device_kind"],
                                   "jax": here["jax"], "x64": here["x64"]},
                      "jax_range": {"from": here["jax"], "below": "0.{}".format(int(here["jax"].split(".")[1]) + 1)}}
    # the data are the run's, bit for bit
    np.testing.assert_array_equal(jl.load(golden)["x"], BASE)
    # a steps= selection is stored too, and read back as the same selection
    check_golden(traj(), golden, regen=True, steps=slice(2, 8, 2))
    assert jl.load(golden).golden["steps"] == {"slice": [2, 8, 2]}
    options, notes = golden_options(golden, {})
    assert options["steps"] == slice(2, 8, 2) and options["rtol"] == 1e-7 and not options.get("records")
    assert len(notes) == 1 and "rtol=1e-07" in notes[0]  # the same platform: no note about it


def test_jaxlog_diff_agrees_with_what_check_golden_accepts(tmp_path):
    golden, near, far = tmp_path / "g.h5", tmp_path / "near.h5", tmp_path / "far.h5"
    check_golden(traj(), golden, regen=True, rtol=1e-4, atol=0.0)
    traj(3e-5).save(near)  # inside the golden's rtol, far outside the CLI's own default (1e-7)
    traj(3e-3).save(far)
    assert accepts(near, golden, rtol=1e-4) and not accepts(far, golden, rtol=1e-4)

    r = diff(near, golden)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("[jaxlog] trajectories match (2 records, 50 elements, rtol=0.0001, atol=0)")
    assert "note: compared with the options the golden stores: rtol=0.0001, atol=0, equal_nan=True" in r.stdout
    r = diff(far, golden)
    assert r.returncode == 1 and "first differs at step 0" in r.stdout and "(rtol=0.0001, atol=0)" in r.stdout
    # an option given overrides the stored one
    r = diff(near, golden, "--rtol", "1e-7")
    assert r.returncode == 1 and "(rtol=1e-07, atol=0)" in r.stdout
    assert "stores: atol=0, equal_nan=True" in r.stdout


def test_a_golden_made_elsewhere_says_where(tmp_path):
    golden = tmp_path / "g.h5"
    check_golden(traj(), golden, regen=True, rtol=1e-4)
    r = diff(golden, golden)
    assert r.returncode == 0 and "made on" not in r.stdout
    with h5py.File(golden, "r+") as f:
        info = json.loads(f["jaxlog"].attrs["golden"])
        info["platform"] = {"backend": "gpu", "device_kind": "NVIDIA H100 80GB HBM3", "jax": "0.12.0", "x64": True}
        f["jaxlog"].attrs["golden"] = np.bytes_(json.dumps(info).encode())
    r = diff(golden, golden)
    assert r.returncode == 0
    here = provenance()
    assert (f"note: the golden was made on backend 'gpu', device kind 'NVIDIA H100 80GB HBM3', jax 0.12.0, x64 on; "
            f"this platform: backend {here['backend']!r}, device kind {here['device_kind']!r}, jax {here['jax']}, "
            f"x64 {'on' if here['x64'] else 'off'}") in r.stdout


def test_a_golden_written_the_old_way_compares_as_before(tmp_path):
    old, near = tmp_path / "old.h5", tmp_path / "near.h5"
    traj().save(old)  # how goldens were written before they stored anything of their own
    traj(3e-5).save(near)
    with h5py.File(old, "r") as f:
        assert "golden" not in f["jaxlog"].attrs
    loaded = jl.load(old)
    assert loaded.golden == {} and golden_options(old, {"atol": 1.0}) == ({"atol": 1.0}, [])
    assert accepts(near, old, rtol=1e-4) and not accepts(near, old)
    r = diff(near, old)  # the CLI's own default tolerance, no note
    assert r.returncode == 1 and "(rtol=1e-07, atol=0)" in r.stdout and "note:" not in r.stdout
    assert diff(near, old, "--rtol", "1e-4").returncode == 0


def test_a_damaged_golden_attribute(tmp_path):
    golden = tmp_path / "g.h5"
    check_golden(traj(), golden, regen=True, rtol=1e-4)
    # a field of the wrong kind (a gate that would compare something else than it says) is one
    # JaxlogError naming the file and the field
    for field, bad in (("rtol", "loose"), ("atol", -1), ("rtol", float("nan")), ("atol", float("inf")),
                       ("records", [3]), ("steps", {"slice": [1]}), ("equal_nan", "yes"), ("platform", 5),
                       ("jax_range", {"from": "x"})):
        with h5py.File(golden, "r+") as f:
            f["jaxlog"].attrs["golden"] = np.bytes_(json.dumps({field: bad}).encode())
        with pytest.raises(jl.JaxlogError, match=rf"golden {re.escape(str(golden))}: stored field '{field}' is "):
            golden_options(golden, {})
        with pytest.raises(jl.JaxlogError, match=f"stored field '{field}'"):
            check_golden(traj(), golden, regen=False)
    check_golden(traj(), golden, regen=True, rtol=1e-4)  # what the message advises repairs it
    assert golden_options(golden, {})[0]["rtol"] == 1e-4
    with h5py.File(golden, "r+") as f:  # not an object: the file is malformed, one JaxlogError naming it
        f["jaxlog"].attrs["golden"] = np.bytes_(b"[1, 2]")
    with pytest.raises(jl.JaxlogError, match="'golden' must be an object or null"):
        jl.load(golden)
