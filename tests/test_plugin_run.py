"""The ``jaxlog`` fixture running real kernels through pytester: files per run, violations as failures
(or warnings), report section and JUnit properties with real artifacts, the profile window from the
marker, the recorder, and golden checks with ``--jaxlog-regen``. In-process runs share one jax."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import h5py  # noqa: F401  (imported before pytester's inline runs snapshot sys.modules)
import jax  # noqa: F401
import numpy  # noqa: F401
import pytest

import pytest_jaxlog as jl

# pytester's in-process runs drop modules first imported inside them; import every jaxlog module now
# so that classes (jl.Record, ...) stay the same objects across runs.
for _name in jl.__all__:
    getattr(jl, _name)

from plugin_helpers import KERNEL, fresh_programs, no_jaxlog_env  # noqa: E402,F401  (no_jaxlog_env: an autouse fixture)

pytest_plugins = ["pytester"]




SUITE = KERNEL + """
def test_runs(jaxlog):
    inv = [jl.finite("energy"), jl.conserved("energy", rtol=0.05)]
    a = jaxlog.run(rotate, STATE, 50, record={"energy": energy}, invariants=inv)
    b = jaxlog.run(rotate, a.state, 10, record={"energy": energy})
    c = jaxlog.run(rotate, STATE, 5, record={"x": lambda s: s[0]}, name="positions")
    assert a.steps_done == 50 and a.violation is None
    names = sorted(p.name for p in jaxlog.dir.iterdir() if p.suffix == ".h5")
    assert names == ["positions.h5", "trajectory-1.h5", "trajectory.h5"]
    assert jaxlog.artifacts["trajectory"] == jaxlog.dir / "trajectory.h5"
    assert jaxlog.artifacts["trajectory-1:trajectory"] == jaxlog.dir / "trajectory-1.h5"
    assert jaxlog.artifacts["positions:trajectory"] == jaxlog.dir / "positions.h5"
    assert jaxlog.artifacts["timeline"].suffix == ".pftrace" and jaxlog.artifacts["timeline"].exists()
    traj = jaxlog.load()
    assert traj.status == "complete" and traj.steps_done == 50 and len(traj["energy"]) == 51
    assert jaxlog.load("positions")["x"].shape == (6, 8)
    with pytest.raises(jl.JaxlogError, match="already used"):
        jaxlog.run(rotate, STATE, 1, name="positions")

def test_violation(jaxlog):
    jaxlog.run(explode, STATE, 20, record={"energy": energy}, invariants=[jl.conserved("energy", rtol=0.1)])

@pytest.fixture
def exploded(jaxlog):  # a fixture that runs the kernel: a violation there is a setup error
    return jaxlog.run(explode, STATE, 20, record={"energy": energy}, invariants=[jl.conserved("energy", rtol=0.1)])

def test_uses_exploded(exploded):
    pass

@pytest.mark.jaxlog(on_violation="warn")
def test_warn(jaxlog):
    with pytest.warns(jl.JaxlogRuntimeWarning):
        run = jaxlog.run(explode, STATE, 20, record={"energy": energy}, invariants=[jl.conserved("energy", rtol=0.1)])
    assert run.violation is not None and run.violation.step == 1

@pytest.mark.jaxlog(profile=(2, 4))
def test_profile(jaxlog):
    run = jaxlog.run(rotate, STATE, 10, record={"energy": energy})
    assert len(run.timings.window) == 3
    trace = jl.load_trace(jaxlog.artifacts["jax_trace"])
    assert sorted(trace.steps()) == [2, 3, 4]
    other = jaxlog.run(rotate, STATE, 6, record={"energy": energy}, profile=(1, 2), name="second")
    assert len(other.timings.window) == 2
    assert sorted(jl.load_trace(jaxlog.artifacts["second:jax_trace"]).steps()) == [1, 2]

@pytest.mark.jaxlog(profile=(2, 4))
def test_recorder(jaxlog):
    rec = jaxlog.recorder({"energy": energy})
    s = STATE
    with rec:
        for k in range(6):
            rec.log(s, k)
            s = rotate(s)
    assert jaxlog.load().steps("energy").tolist() == [0, 1, 2, 3, 4, 5]
    # the recorder's files are in jaxlog.artifacts as soon as its `with` block exits, timeline included
    assert jaxlog.artifacts["trajectory"] == jaxlog.dir / "trajectory.h5"
    assert jaxlog.artifacts["timeline"] == jaxlog.dir / "trajectory.pftrace" and jaxlog.artifacts["timeline"].exists()
"""


def _props(xml_path):
    root = ET.parse(xml_path).getroot()
    out = {}
    for case in root.iter("testcase"):
        props: dict[str, list[str]] = {}
        for p in case.iter("property"):
            props.setdefault(p.get("name"), []).append(p.get("value"))
        out[case.get("name")] = (props, [c.tag for c in case])
    return out


def test_fixture_runs_violations_sections_and_junit(pytester, monkeypatch):
    monkeypatch.setenv("CI", "true")  # pytest then prints whole messages in the short summary
    fresh_programs()  # the compile counts below are a fresh process's
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("--junitxml=out.xml", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, failed=1, errors=1)
    text = result.stdout.str()
    # a violation in a fixture (setup error) gets the jaxlog section too; the message above it names
    # the files, so the section does not repeat them
    result.stdout.fnmatch_lines(["*ERROR at setup of test_uses_exploded*", "E *conserved(energy*",
                                 "E *  trajectory: .jaxlog/test_suite.test_uses_exploded/trajectory.h5",
                                 "*- jaxlog -*", "artifacts: .jaxlog/test_suite.test_uses_exploded", "runs:"])
    # the violation fails the test as a failure with the invariant's message, and a jaxlog section
    result.stdout.fnmatch_lines(["*InvariantViolation*conserved(energy*",
                                 "E *  trajectory: .jaxlog/test_suite.test_violation/trajectory.h5",
                                 "*- jaxlog -*", "artifacts: .jaxlog/test_suite.test_violation", "runs:"])
    # once in the failure's report; the short summary below it may repeat the whole message (it does
    # where pytest sees a CI, which the test sets)
    failures = text.split("short test summary info")[0]
    assert failures.count(".jaxlog/test_suite.test_violation/trajectory.h5") == 1
    assert "FAILED test_suite.py::test_violation" in text
    props = _props(pytester.path / "out.xml")
    vprops, vtags = props["test_violation"]
    assert "failure" in vtags and "error" not in vtags
    assert vprops["jaxlog.trajectory"] == [".jaxlog/test_suite.test_violation/trajectory.h5"]
    assert any(v.endswith(".pftrace") for v in vprops["jaxlog.trace"])
    assert int(vprops["jaxlog.compiles"][0]) >= 1
    passed_props, _ = props["test_runs"]
    assert "jaxlog.trajectory" not in passed_props  # removed: keep=failed
    traj = jl.load(pytester.path / ".jaxlog/test_suite.test_violation/trajectory.h5")
    assert traj.status == "violated" and traj.violation["step"] == 1
    doc = json.loads((pytester.path / ".jaxlog/manifest.json").read_text())
    entry = {e["nodeid"]: e for e in doc["tests"]}["test_suite.py::test_recorder"]
    # the marker's window does not reach a hand-written loop by itself: a note says so
    assert entry["notes"] == ["profile window 2:4 (@pytest.mark.jaxlog(profile=...)) not applied to recorder "
                              "'trajectory': in hand-written loops log a jaxlog.profile_window() too "
                              "(jl.CompositeLogger(recorder, window))"]
    entry = {e["nodeid"]: e for e in doc["tests"]}["test_suite.py::test_violation"]
    assert entry["violations"][0]["invariant"].startswith("conserved(energy")
    assert entry["artifacts"]["trajectory"] == "test_suite.test_violation/trajectory.h5"

    # the same test passes with a warning under --jaxlog-on-violation=warn
    result = pytester.runpytest("-k", "test_violation", "--jaxlog-on-violation=warn", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    # the warning points at the test's jaxlog.run line, not into the plugin
    line = SUITE.strip().splitlines().index("def test_violation(jaxlog):") + 2  # pytester strips SUITE
    result.stdout.fnmatch_lines([f"*test_suite.py:{line}: JaxlogRuntimeWarning: [[]jaxlog] invariant conserved(energy*"])


GOLDEN = KERNEL + """
def test_golden(jaxlog):
    run = jaxlog.run(rotate, STATE, 20, record={"energy": energy, "x": jl.Record(lambda s: s[0], every=5)})
    assert jaxlog.check_golden(run, rtol=1e-6) == "ok"
"""


def test_golden_missing_regen_ok_and_changed(pytester):
    pytester.makepyfile(test_g=GOLDEN)
    golden = pytester.path / "fixtures/golden/test_g.test_golden.h5"
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]jaxlog] golden trajectory fixtures/golden/test_g.test_golden.h5 does not exist",
                                 "*to create it, run pytest with --jaxlog-create-goldens (missing goldens only) or --jaxlog-regen"])
    assert not golden.exists()

    pytester.makepyfile(test_g=GOLDEN.replace('== "ok"', 'in ("ok", "regenerated")'))
    result = pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-regen")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*regenerated 1 golden trajectories (--jaxlog-regen):*",
                                 "  fixtures/golden/test_g.test_golden.h5"])
    assert golden.exists()

    pytester.makepyfile(test_g=GOLDEN)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)

    pytester.makepyfile(test_g=GOLDEN.replace("0.01 * v", "0.0101 * v"))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*--jaxlog-regen*"])


@pytest.mark.parametrize("profile", ["10:12"])
def test_profile_option_and_hypothesis_factory_with_runs(pytester, profile):
    pytester.makepyfile(
        test_h=KERNEL
        + """
from hypothesis import given, settings, strategies as st

@settings(max_examples=6, database=None, derandomize=True, deadline=None)
@given(st.integers(1, 30))
def test_property(jaxlog_factory, n):
    with jaxlog_factory() as jaxlog:
        run = jaxlog.run(rotate if n < 8 else explode, STATE, n, record={"energy": energy},
                         invariants=[jl.conserved("energy", rtol=0.1)], profile=None)
        assert run.steps_done == n

def test_option_window(jaxlog):
    run = jaxlog.run(rotate, STATE, 20, record={"energy": energy})
    assert len(run.timings.window) == 3
    # a global window must not break shorter runs: skipped when outside, clipped when it sticks out
    short = jaxlog.run(rotate, STATE, 5, record={"energy": energy}, name="short")
    assert short.steps_done == 5 and not short.timings.window and "short:jax_trace" not in jaxlog.artifacts
    mid = jaxlog.run(rotate, STATE, 12, record={"energy": energy}, name="mid")
    assert len(mid.timings.window) == 2
    assert sorted(jl.load_trace(jaxlog.artifacts["mid:jax_trace"]).steps()) == [10, 11]
"""
    )
    result = pytester.runpytest("-p", "no:cacheprovider", f"--jaxlog-profile={profile}")
    result.assert_outcomes(passed=1, failed=1)
    assert "FailedHealthCheck" not in result.stdout.str()
    doc = json.loads((pytester.path / ".jaxlog/manifest.json").read_text())
    entry = {e["nodeid"]: e for e in doc["tests"]}["test_h.py::test_property"]
    assert entry["kept"] and entry["violations"]
    kept = list((pytester.path / ".jaxlog" / entry["dir"]).iterdir())
    assert len(kept) == 1 and (kept[0] / "trajectory.h5").exists()
    traj = jl.load(kept[0] / "trajectory.h5")
    assert traj.status == "violated"
    notes = {e["nodeid"]: e for e in doc["tests"]}["test_h.py::test_option_window"]["notes"]
    assert notes == [
        "profile window 10:12 (--jaxlog-profile) skipped for run 'short': it has work steps 0..4",
        "profile window 10:12 (--jaxlog-profile) clipped to 10:11 for run 'mid': it has work steps 0..11",
    ]
    result.stdout.fnmatch_lines(["notes (2):", "  test_h.py::test_option_window: profile window 10:12 * skipped *"])


def test_recorder_violation_in_section(pytester):
    pytester.makepyfile(
        test_r=KERNEL
        + """
def test_loop(jaxlog):
    jaxlog.run(rotate, STATE, 5, record={"energy": energy})  # a first, good run: trajectory.h5
    s = STATE
    with jaxlog.recorder({"energy": energy}, invariants=[jl.conserved("energy", rtol=0.1)], flush_every=1) as rec:
        for k in range(10):
            rec.log(s, k)
            s = explode(s)

def test_direct(jaxlog, tmp_path):
    jaxlog.run(rotate, STATE, 5, record={"energy": energy})
    jl.run(explode, STATE, 20, record={"energy": energy}, invariants=[jl.conserved("energy", rtol=0.1)],
           sinks=[jl.HDF5Writer(tmp_path / "mine.h5")])  # the test's own run: the fixture's files are not its files
"""
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(failed=2)
    direct = result.stdout.str().split("_ test_direct _")[1]
    message, section = direct.split("- jaxlog -")[:2]
    assert "E       pytest_jaxlog.check.violation.InvariantViolation: [jaxlog] invariant conserved(energy" in message
    assert "mine.h5" in message and ".jaxlog/" not in message  # the test's own run: its files, not the fixture's
    assert "violation:" not in section and "mine.h5" not in section  # said once, under E
    # the violation names the violating run's files (trajectory-1), not the first run's; the section
    # lists only the test's other files
    result.stdout.fnmatch_lines(["E *conserved(energy, rtol=0.1) violated at step 1*",
                                 "E *  trajectory: .jaxlog/test_r.test_loop/trajectory-1.h5",
                                 "E *  timeline: .jaxlog/test_r.test_loop/trajectory-1.pftrace",
                                 "*- jaxlog -*", "artifacts: .jaxlog/test_r.test_loop",
                                 "  trajectory: .jaxlog/test_r.test_loop/trajectory.h5",
                                 "  timeline: .jaxlog/test_r.test_loop/trajectory.pftrace", "runs:"])
    loop = result.stdout.str().split("_ test_loop _")[1].split("_ test_direct _")[0]
    assert loop.count("trajectory-1.h5") == 1 and loop.count("test_r.test_loop/trajectory.h5") == 1
    assert jl.load(pytester.path / ".jaxlog/test_r.test_loop/trajectory-1.h5").status == "violated"
    doc = json.loads((pytester.path / ".jaxlog/manifest.json").read_text())
    (violation,) = {e["nodeid"]: e for e in doc["tests"]}["test_r.py::test_loop"]["violations"]
    assert violation["artifacts"]["trajectory"] == "test_r.test_loop/trajectory-1.h5"  # relative to the manifest


def test_the_manifest_notes_a_window_an_until_stop_did_not_reach(pytester):
    """A run stopped at step 10 by until= under a marker window 50..50: no trace of steps that
    never ran among the test's files, and the manifest entry says the window was not reached."""
    pytester.makepyfile(test_u="""
import jax.numpy as jnp
import pytest

def count(s):
    return s + 1

@pytest.mark.jaxlog(profile="50:50")
def test_stops_early(jaxlog):
    run = jaxlog.run(count, jnp.zeros((), jnp.int32), 100, record={"k": lambda s: s}, until=lambda s: s >= 10)
    assert run.steps_done == 10 and run.stop_reason == "until"
    assert list(run.trajectory["k"]) == list(range(11))
    assert run.timings.window is None and "jax_trace" not in run.artifacts
""")
    result = pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-keep=all")
    result.assert_outcomes(passed=1)
    doc = json.loads((pytester.path / ".jaxlog/manifest.json").read_text())
    entry = {e["nodeid"]: e for e in doc["tests"]}["test_u.py::test_stops_early"]
    assert entry["notes"] == ["run 'trajectory': profile window 'window' (steps 50..50) not reached: the run stopped "
                              "at step 10 (until); no step of it ran, nothing was profiled"]
    assert set(entry["artifacts"]) == {"trajectory", "timeline"}, entry["artifacts"]
    assert entry["runs"][0]["stop_reason"] == "until" and entry["runs"][0]["steps"] == 10
    kept = pytester.path / ".jaxlog" / entry["dir"]
    assert (kept / "trajectory.h5").exists() and not list(kept.rglob("*.trace.json.gz"))
    assert not jl.load_trace(kept / "trajectory.pftrace").steps()
