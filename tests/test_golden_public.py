"""``jl.diff_trajectories`` is the public comparison engine that ``jaxlog diff``, ``check_golden``
and ``assert_trajectory_close`` share: its answer is checked against the same comparison done
plainly with numpy."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import pytest_jaxlog as jl
from pytest_jaxlog.compare import golden


def _decay(s):
    return s * 0.9


def test_exported_with_its_result_types():
    assert jl.diff_trajectories is golden.diff_trajectories
    assert jl.Diff is golden.Diff and jl.RecordDiff is golden.RecordDiff
    assert {"diff_trajectories", "Diff", "RecordDiff"} <= set(jl.__all__)


def test_its_first_difference_is_the_one_numpy_finds(tmp_path):
    a = jl.run(_decay, jnp.ones(4), 30, record={"x": lambda s: s}, sinks=[jl.HDF5Writer(tmp_path / "a.h5")],
               progress=False)
    b = jl.run(_decay, jnp.ones(4).at[2].set(1.0 + 1e-3), 30, record={"x": lambda s: s}, progress=False)
    d = jl.diff_trajectories(b, tmp_path / "a.h5", rtol=1e-6)
    xa, xb = np.asarray(a.trajectory["x"]), np.asarray(b.trajectory["x"])
    bad = np.abs(xb - xa) > 1e-6 * np.abs(xa)
    first_step, first_index = np.argwhere(bad)[0]
    assert not d.ok and d.first.path == "x" and d.first.kind == "values"
    assert d.first.step == first_step and d.first.index == (first_index,)
    assert d.first.n_diff == int(bad.sum()) and d.first.max_abs == pytest.approx(float(np.abs(xb - xa).max()))
    with pytest.raises(jl.TrajectoryMismatch) as info:
        jl.assert_trajectory_close(b, tmp_path / "a.h5", rtol=1e-6)
    assert info.value.diff.report() == d.report()
    assert jl.diff_trajectories(a, tmp_path / "a.h5").ok
