"""What a failing jaxlog test prints, read as a person reads it, in real pytest sessions (pytester):
the violation's message and its files once (under ``E``), the ``jaxlog`` section adding only what
the message does not say; a profile window's trace named once, and only when the window ran; paths
relative inside the project (the rootdir), absolute only outside it; no rate for a run too short
to time, and no compile-cache line when no program was compiled."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import h5py  # noqa: F401  (imported before pytester's inline runs snapshot sys.modules)
import jax  # noqa: F401
import numpy  # noqa: F401

import pytest_jaxlog as jl

for _name in jl.__all__:  # every jaxlog module imported now: in-process runs keep the same classes
    getattr(jl, _name)

from plugin_helpers import KERNEL, fresh_programs, no_jaxlog_env  # noqa: E402,F401  (no_jaxlog_env: an autouse fixture)

pytest_plugins = ["pytester"]

UNREACHED = KERNEL + """
@pytest.mark.jaxlog(profile=(100, 104))
def test_boom(jaxlog):
    jaxlog.run(explode, STATE, 200, record={"energy": energy}, invariants=[jl.conserved("energy", rtol=0.01)])
"""

REACHED = KERNEL + """
@pytest.mark.jaxlog(profile=(2, 4))
def test_late(jaxlog):  # energy grows 2.25x a step: above 50 first at step 5, after the window
    jaxlog.run(explode, STATE, 20, record={"energy": energy}, invariants=[jl.bounded("energy", hi=50.0)])
"""

SHORT = KERNEL + """
def test_one_step(jaxlog):
    jaxlog.run(rotate, STATE, 1, record={"energy": energy})
    assert False, "fails after its run"
"""


def _block(text: str, test: str) -> str:
    """The failure block of ``test``: from its header to the next header or the summary."""
    start = re.search(rf"_{{3,}} {test} _{{3,}}", text)
    assert start is not None, text[-3000:]
    rest = text[start.end():]
    end = re.search(r"\n(_{3,} \w+ _{3,}|=+ (short test summary|warnings summary)|-+ jaxlog -+\nartifacts kept)", rest)
    return rest[: end.start()] if end else rest


def _section(block: str) -> list[str]:
    """The lines of the failure's ``jaxlog`` report section."""
    return block.split("- jaxlog -", 1)[1].splitlines()[1:]


def test_a_window_never_reached_leaves_no_trace_and_each_path_is_printed_once(pytester):
    pytester.makepyfile(test_x=UNREACHED)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    block = _block(result.stdout.str(), "test_boom")
    d = ".jaxlog/test_x.test_boom"
    e_lines = [line[1:].strip() for line in block.splitlines() if line.startswith("E ")]
    assert e_lines[-3:] == [f"trajectory: {d}/trajectory.h5", f"timeline: {d}/trajectory.pftrace",
                            f"plot: {d}/trajectory-violation.png"]
    section = _section(block)
    assert section[0] == f"artifacts: {d}" and section[1] == "runs:", section
    assert section[-1] == ("note: run 'trajectory': profile window 100:104 not reached: the run stopped at step 1 "
                           "(violation); no trace kept")
    for name in ("trajectory.h5", "trajectory.pftrace", "trajectory-violation.png"):
        assert block.count(f"{d}/{name}") == 1, name  # under E, not again in the section
    assert "violation:" not in "\n".join(section) and f"  trajectory: {d}" not in "\n".join(section)
    assert not re.search(r"jax_trace|xplane|profile_dir|perfetto_trace", block)
    kept = pytester.path / d
    assert sorted(p.name for p in kept.iterdir()) == ["trajectory-violation.png", "trajectory.h5", "trajectory.pftrace"]
    entry = json.loads((pytester.path / ".jaxlog/manifest.json").read_text())["tests"][0]
    assert set(entry["artifacts"]) == {"trajectory", "timeline", "plot"}
    assert set(entry["violations"][0]["artifacts"]) == {"trajectory", "timeline", "plot"}


def test_a_window_that_ran_is_named_once_by_its_perfetto_trace(pytester):
    pytester.makepyfile(test_y=REACHED)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    block = _block(result.stdout.str(), "test_late")
    assert "violated at step 5" in block
    (trace,) = [line for line in block.splitlines() if "jax_trace:" in line]
    assert trace.startswith("E         jax_trace: .jaxlog/test_y.test_late/trajectory-profile/")
    assert trace.endswith("perfetto_trace.json.gz") and block.count("perfetto_trace.json.gz") == 1
    assert not re.search(r"jax_trace_json|xplane|profile_dir", block)  # the profile's other files: manifest only
    assert _section(block)[:2] == ["artifacts: .jaxlog/test_y.test_late", "runs:"]
    entry = json.loads((pytester.path / ".jaxlog/manifest.json").read_text())["tests"][0]
    assert {"jax_trace", "jax_trace_json", "xplane", "profile_dir"} <= set(entry["artifacts"])


def test_paths_are_relative_inside_the_rootdir_with_an_absolute_jaxlog_dir(pytester, monkeypatch):
    pytester.makeini("[pytest]\n")  # the rootdir: pytester.path, wherever pytest starts
    pytester.makepyfile(test_x=UNREACHED)
    sub = pytester.mkdir("sub")
    monkeypatch.chdir(sub)
    base = pytester.path / "out" / "jaxlog"
    result = pytester.runpytest("-p", "no:cacheprovider", f"--jaxlog-dir={base}", "--junitxml=junit.xml", "../test_x.py")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    d = "../out/jaxlog/test_x.test_boom"
    result.stdout.fnmatch_lines([f"E * trajectory: {d}/trajectory.h5", f"E * plot: {d}/trajectory-violation.png",
                                 f"artifacts: {d}",
                                 "artifacts kept for 1 of 1 jaxlog tests in ../out/jaxlog (--jaxlog-keep=failed); "
                                 "manifest: ../out/jaxlog/manifest.json",
                                 f"  FAILED   test_x.py::test_boom -> {d}",
                                 "jaxlog report: ../out/jaxlog/report.html"])
    root = str(pytester.path)
    pytest_own = ("rootdir: ", "- generated xml file: ")  # pytest's header and its junitxml note
    assert [line for line in text.splitlines() if root in line and not line.startswith(pytest_own)] == []
    report = (base / "report.html").read_text()
    assert f"trajectory: {d}/trajectory.h5" in report and root not in report
    manifest = (base / "manifest.json").read_text()
    assert root not in manifest and json.loads(manifest)["rootdir"] == "../.."
    props = {p.get("name"): p.get("value") for p in ET.parse(sub / "junit.xml").getroot().iter("property")}
    assert props["jaxlog.trajectory"] == f"{d}/trajectory.h5"


def test_paths_outside_the_rootdir_are_absolute(pytester, tmp_path_factory):
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_x=UNREACHED)
    outside = tmp_path_factory.mktemp("elsewhere") / "jaxlog"
    assert pytester.path not in outside.parents
    result = pytester.runpytest("-p", "no:cacheprovider", f"--jaxlog-dir={outside}")
    result.assert_outcomes(failed=1)
    d = outside.resolve() / "test_x.test_boom"
    result.stdout.fnmatch_lines([f"E * trajectory: {d}/trajectory.h5", f"artifacts: {d}",
                                 f"  FAILED   test_x.py::test_boom -> {d}"])
    # the manifest keeps its own rule: relative to its directory, the project included
    doc = json.loads((outside / "manifest.json").read_text())
    assert doc["tests"][0]["artifacts"]["trajectory"] == "test_x.test_boom/trajectory.h5"
    assert (outside / doc["rootdir"]).resolve() == pytester.path.resolve()


def test_a_one_step_run_has_no_rate_and_a_session_that_compiled_nothing_no_cache_line(pytester):
    fresh_programs()  # the run compiles its program (its compile is what the cache line counts)
    pytester.makepyfile(test_s=SHORT, test_n="""
def test_no_run(jaxlog):  # uses jaxlog, compiles nothing (as a session that only benchmarks)
    assert jaxlog.dir.is_dir()
""")
    cache = pytester.path / "jaxcache"
    result = pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-keep=all", f"--jaxlog-compile-cache={cache}",
                                "test_s.py")
    result.assert_outcomes(failed=1)
    section = _section(_block(result.stdout.str(), "test_one_step"))
    (run,) = [line for line in section if line.startswith("  trajectory: 1 ")]
    assert re.fullmatch(r"  trajectory: 1 step in [0-9.e-]+ s, 1 compile \(complete\)", run), run
    doc = json.loads((pytester.path / ".jaxlog/manifest.json").read_text())
    (entry,) = doc["tests"][0]["runs"]
    assert entry["steps"] == 1 and entry["steps_per_s"] is None
    report = (pytester.path / ".jaxlog/report.html").read_text()
    assert '<td>trajectory: 1 step</td><td><span class="muted">too short to time</span></td>' in report
    result.stdout.fnmatch_lines(["compile cache jaxcache: * of the 1 programs the runs needed came from it"])

    quiet = pytester.runpytest("-p", "no:cacheprovider", f"--jaxlog-compile-cache={cache}", "test_n.py")
    quiet.assert_outcomes(passed=1)
    out = quiet.stdout.str()
    assert "compile_cache=jaxcache" in out and "compile cache jaxcache" not in out  # no "0 of the 0 programs"
    assert Path(cache).is_dir()
