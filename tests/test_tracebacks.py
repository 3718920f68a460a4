"""A failing check shows the user's line, not the library's: the assertion helpers hide their own
frames (``__tracebackhide__``), so pytest's traceback of the failure lies in the test file only."""

from __future__ import annotations

import pytest

# Imported before pytester's in-process runs snapshot sys.modules (h5py cannot be imported twice).
import h5py  # noqa: F401
import pytest_jaxlog.compare.golden  # noqa: F401
import pytest_jaxlog.store.hdf5.writer  # noqa: F401
import pytest_jaxlog.store.sinks  # noqa: F401
import pytest_jaxlog.store.hdf5.trajectory  # noqa: F401

pytest_plugins = ["pytester"]

CHECKS = """
import numpy as np
import pytest_jaxlog as jl
from pytest_jaxlog.compare.golden import check_golden
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


# Imported before pytester's in-process runs snapshot sys.modules (jax is imported once per process).
import jax  # noqa: E402,F401
import pytest_jaxlog.drive.host.recorder  # noqa: E402,F401
import pytest_jaxlog.drive.run  # noqa: E402,F401

VIOLATIONS = """
import jax.numpy as jnp
import pytest_jaxlog as jl

def grow(s):
    return s * 1.01

RECORD = {"e": lambda s: jnp.sum(s)}
CONSERVED = [jl.conserved("e", rtol=1e-3)]

def test_run():
    jl.run(grow, jnp.ones(3), 50, record=RECORD, invariants=CONSERVED, progress=False)

def test_fixture_run(jaxlog):
    jaxlog.run(grow, jnp.ones(3), 50, record=RECORD, invariants=CONSERVED)

def test_recorder():
    s = jnp.ones(3)
    with jl.Recorder(record=RECORD, invariants=CONSERVED, flush_every=4) as rec:
        for k in range(20):
            rec.log(s, k)
            s = grow(s)

def test_bad_view():
    jl.run(grow, jnp.ones(3), 5, record={"e": lambda s: s.no_such_attribute}, progress=False)
"""


def _library_lines(lines):
    return [line for line in lines if "pytest_jaxlog/" in line or "pytest_jaxlog\\\\" in line]


def test_failing_invariants_show_the_tests_line_and_no_library_source(pytester):
    """380 lines, 317 of them library source, before the driver's frames were hidden."""
    pytester.makepyfile(test_violations=VIOLATIONS)
    result = pytester.runpytest("-p", "no:cacheprovider", "--tb=auto", "-k", "not bad_view")
    result.assert_outcomes(failed=3)
    out = result.outlines
    assert _library_lines(out) == []
    source = (pytester.path / "test_violations.py").read_text().splitlines()
    for test, call in (("test_run", "    jl.run(grow"), ("test_fixture_run", "    jaxlog.run("),
                       ("test_recorder", "            rec.log(")):
        line = next(i for i, text in enumerate(source, 1) if text.startswith(call))
        result.stdout.fnmatch_lines([f"*_ {test} _*", f"test_violations.py:{line}: InvariantViolation"])
    # once per failure, in its own section (the short summary repeats it, whole where CI is set)
    assert sum(line.startswith("E ") and "InvariantViolation: [jaxlog] invariant conserved(e, rtol=0.001) violated "
               "at step 1" in line for line in out) == 3
    assert len(out) < 120, "\n".join(out)  # three failures and the plugin's summary


def test_full_trace_shows_the_library_frames_and_other_errors_keep_them(pytester):
    pytester.makepyfile(test_violations=VIOLATIONS)
    full = pytester.runpytest("-p", "no:cacheprovider", "--full-trace", "-k", "test_run")
    full.assert_outcomes(failed=1)
    assert any("pytest_jaxlog/drive/run.py" in line for line in full.outlines)
    # not a failed check but a bad view: the library's frames stay, to see where it went wrong
    bug = pytester.runpytest("-p", "no:cacheprovider", "--tb=short", "-k", "bad_view")
    bug.assert_outcomes(failed=1)
    assert any("pytest_jaxlog/drive/run.py" in line for line in bug.outlines)
