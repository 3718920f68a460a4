"""A failing check shows the user's line, not the library's: the assertion helpers hide their own
frames (``__tracebackhide__``), so pytest's traceback of the failure lies in the test file only."""

from __future__ import annotations

import pytest

# Imported before pytester's in-process runs snapshot sys.modules (h5py cannot be imported twice).
import h5py  # noqa: F401
import pytest_jaxlog.golden  # noqa: F401
import pytest_jaxlog.store.hdf5  # noqa: F401
import pytest_jaxlog.store.sinks  # noqa: F401
import pytest_jaxlog.store.trajectory  # noqa: F401

pytest_plugins = ["pytester"]

CHECKS = """
import numpy as np
import pytest_jaxlog as jl
from pytest_jaxlog.golden import check_golden
from pytest_jaxlog import Frames, LeafSpec, Schema


def traj(last):
    sink = jl.MemorySink()
    sink.open(Schema((LeafSpec("e", "e", (), np.dtype("float64"), jl.every(1)),)),
              {"provenance": {}, "run": {"steps": 2, "chunk": 1, "dt": None, "driver": "run"}})
    frames = Frames()
    frames.add("e", np.arange(3), np.array([1.0, 2.0, last]))
    sink.write(frames)
    sink.close("complete", steps_done=2)
    return jl.Trajectory.from_sink(sink)


def test_assert_trajectory_close():
    jl.assert_trajectory_close(traj(3.0), traj(3.5))


def test_check_golden(tmp_path):
    check_golden(traj(3.0), tmp_path / "g.h5", regen=True)
    check_golden(traj(3.5), tmp_path / "g.h5", regen=False, rtol=1e-3)


def test_check_golden_missing(tmp_path):
    check_golden(traj(3.0), tmp_path / "none.h5", regen=False)


def test_assert_compiles():
    jl.Timings(wall_s=1.0, steps=10, compiles=2).assert_compiles(1)


def test_assert_faster_than():
    jl.Timings(wall_s=1.0, steps=10).assert_faster_than(jl.Timings(wall_s=1.0, steps=100))


def test_assert_overhead():
    jl.Timings(wall_s=1.0, steps=10).assert_overhead(jl.Timings(wall_s=1.0, steps=100), at_most=1.1)
"""

EXPECTED = {
    "test_assert_trajectory_close": "TrajectoryMismatch",
    "test_check_golden": "TrajectoryMismatch",
    "test_check_golden_missing": "TrajectoryMismatch",
    "test_assert_compiles": "TimingAssertionError",
    "test_assert_faster_than": "TimingAssertionError",
    "test_assert_overhead": "TimingAssertionError",
}


@pytest.mark.parametrize("style", ["long", "short"])
def test_failing_checks_show_only_the_test_files_frames(pytester, style):
    path = pytester.makepyfile(test_checks=CHECKS)
    reprec = pytester.inline_run("-p", "no:cacheprovider", f"--tb={style}")
    failed = {r.nodeid.split("::")[-1]: r for r in reprec.getreports("pytest_runtest_logreport") if r.failed}
    assert set(failed) == set(EXPECTED)
    for name, report in failed.items():
        entries = report.longrepr.reprtraceback.reprentries
        files = [e.reprfileloc.path for e in entries]
        assert files and all(f.endswith(path.name) for f in files), (name, files)
        crash = report.longrepr.reprcrash
        assert crash.path.endswith(path.name), (name, crash.path)  # the failure points at the test's line
        assert crash.message.startswith("pytest_jaxlog.") and f"{EXPECTED[name]}: [jaxlog]" in crash.message
