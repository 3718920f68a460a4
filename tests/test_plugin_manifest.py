"""manifest.json and the report section: one path convention (relative to the manifest's directory), tests
that error in setup listed, per-run timings, and the directories earlier sessions left (kept and listed as
stale, or removed with --jaxlog-clean-stale)."""

from __future__ import annotations

import json
from pathlib import Path

import h5py  # noqa: F401  (imported before pytester's inline runs snapshot sys.modules)
import jax.numpy  # noqa: F401

import pytest_jaxlog as jl

for _name in jl.__all__:  # every jaxlog module loaded now, so classes stay the same objects across inline runs
    getattr(jl, _name)

from plugin_helpers import KERNEL, fresh_programs, no_jaxlog_env  # noqa: E402,F401  (no_jaxlog_env: an autouse fixture)

pytest_plugins = ["pytester"]




def _manifest(base: Path) -> tuple[dict, dict]:
    doc = json.loads((base / "manifest.json").read_text())
    return doc, {t["nodeid"].split("::", 1)[1]: t for t in doc["tests"]}


SUITE = KERNEL + """
def test_violation(jaxlog):
    jaxlog.run(explode, STATE, 10, record={"energy": energy}, invariants=[jl.conserved("energy", rtol=0.1)])

def test_timed(jaxlog):
    run = jaxlog.run(rotate, STATE, 30, record={"energy": energy})
    jaxlog.run(rotate, STATE, 8, record={"energy": energy}, name="short")
    jaxlog.check_golden(run)
    assert run.steps_done == 0, "fails after its runs"

@pytest.fixture
def broken():
    raise RuntimeError("setup broke")

def test_setup_error(broken, jaxlog):
    pass

def test_missing_fixture(jaxlog, nonexistent):
    pass

@pytest.mark.jaxlog(keep="sometimes")
def test_bad_marker(jaxlog):
    pass

def test_not_jaxlog(broken):
    pass
"""


def test_manifest_paths_setup_errors_and_run_timings(pytester):
    fresh_programs()  # the compile counts below are a fresh process's
    pytester.makepyfile(test_m=SUITE)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "--jaxlog-keep=all",
                                "--jaxlog-create-goldens", "--jaxlog-dir=out/jaxlog")
    result.assert_outcomes(failed=2, errors=4)
    base = pytester.path / "out/jaxlog"
    doc, tests = _manifest(base)

    # one convention: every path is relative to the manifest's directory
    assert doc["version"] == 2 and doc["paths"] == "relative to the directory of this file"
    assert (base / doc["rootdir"]).resolve() == pytester.path.resolve()
    assert (base / doc["golden_dir"]).resolve() == (pytester.path / "fixtures/golden").resolve()
    paths = []
    for t in tests.values():
        paths += [t["dir"]] if t["dir"] else []
        paths += list(t["artifacts"].values())
        paths += [p for v in t["violations"] for p in v["artifacts"].values()]
        paths += [g["path"] for g in t["goldens"]]
    assert len(paths) >= 10
    for p in paths:
        assert not Path(p).is_absolute() and (base / p).exists(), p
    (violation,) = tests["test_violation"]["violations"]
    assert violation["artifacts"]["trajectory"] == "test_m.test_violation/trajectory.h5"
    assert tests["test_timed"]["goldens"] == [{"path": "../../fixtures/golden/test_m.test_timed.h5", "status": "created"}]

    # tests that error in setup are listed with the reason; a test that does not use jaxlog is not
    assert tests["test_setup_error"]["outcome"] == "error"
    assert tests["test_setup_error"]["error"] == "RuntimeError: setup broke"
    assert tests["test_missing_fixture"]["error"] == "fixture 'nonexistent' not found"
    assert tests["test_bad_marker"]["error"] == ("[jaxlog] test_m.py::test_bad_marker: @pytest.mark.jaxlog(keep=...): "
                                                "expected one of failed|all|none, got 'sometimes'")
    assert not tests["test_setup_error"]["kept"] and tests["test_setup_error"]["runs"] == []
    assert "test_not_jaxlog" not in tests

    # per-run timings, in the manifest and the report section
    runs = {r["name"]: r for r in tests["test_timed"]["runs"]}
    assert set(runs) == {"trajectory", "short"}
    assert runs["trajectory"]["steps"] == 30 and runs["short"]["steps"] == 8
    for r in runs.values():
        assert r["wall_s"] > 0 and r["status"] == "complete"
    # a rate needs MIN_TIMED_STEPS (10) work steps: the 30-step run has one, the 8-step run none (null)
    assert runs["trajectory"]["steps_per_s"] > 0 and runs["short"]["steps_per_s"] is None
    # the 8-step run of the same kernel and records runs the program the 30-step run compiled
    assert runs["trajectory"]["compiles"] == 1 and runs["short"]["compiles"] == 0
    assert tests["test_timed"]["compiles"] == sum(r["compiles"] for r in runs.values())
    (vrun,) = tests["test_violation"]["runs"]
    assert vrun["status"] == "violated" and vrun["steps"] >= 1
    section = result.stdout.str().split("_ test_timed _")[1].split("- jaxlog -")[1]
    assert "runs:\n  trajectory: 30 steps in " in section and "  short: 8 steps in " in section
    assert " steps/s, 1 compile (complete)" in section
    (short,) = [line for line in section.splitlines() if line.startswith("  short: ")]
    assert short.endswith(" s, 0 compiles, 1 reused (complete)") and "steps/s" not in short, short


STALE = """
def test_a(jaxlog):
    (jaxlog.dir / "a.txt").write_text("a")
    assert False

def test_b(jaxlog):
    (jaxlog.dir / "b.txt").write_text("b")
    assert False

def test_c(jaxlog):
    (jaxlog.dir / "c.txt").write_text("c")
"""


def test_directories_of_earlier_sessions_removed_or_listed_as_stale(pytester):
    pytester.makepyfile(test_s=STALE)
    base = pytester.path / ".jaxlog"
    dirs = {n: base / f"test_s.test_{n}" for n in "abc"}
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1, failed=2)
    assert dirs["a"].is_dir() and dirs["b"].is_dir() and not dirs["c"].exists()
    (base / "notes.txt").write_text("mine")  # a user's own files beside the artifacts are never touched
    (base / "mine").mkdir()

    # --collect-only runs nothing and removes nothing
    pytester.runpytest("-p", "no:cacheprovider", "--collect-only")
    assert dirs["b"].is_dir()

    # --jaxlog-clean-stale: a subset run removes what the earlier session left, so the folder is this session's
    result = pytester.runpytest("-p", "no:cacheprovider", "-k", "test_a", "--jaxlog-clean-stale")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["removed 1 artifact directories left by an earlier session for tests not run in this "
                                 "one (--jaxlog-clean-stale)"])
    assert dirs["a"].is_dir() and not dirs["b"].exists()
    assert (base / "notes.txt").read_text() == "mine" and (base / "mine").is_dir()
    doc, tests = _manifest(base)
    assert list(tests) == ["test_a"] and doc["stale"] == []

    # keep=all: kept, and listed as stale in the manifest (carried to the next session's manifest too)
    pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-keep=all").assert_outcomes(passed=1, failed=2)
    result = pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-keep=all", "-k", "test_a")
    result.stdout.fnmatch_lines(["stale: 2 tests not run in this session keep their earlier entries in manifest.json "
                                 "(2 with artifact directories); --jaxlog-clean-stale removes them"])
    doc, tests = _manifest(base)
    assert [n for n, t in tests.items() if not t.get("stale")] == ["test_a"]
    assert sorted((s["nodeid"], s["dir"], s["outcome"]) for s in doc["stale"]) == [
        ("test_s.py::test_b", "test_s.test_b", "failed"), ("test_s.py::test_c", "test_s.test_c", "passed")]
    assert all((base / s["dir"]).is_dir() for s in doc["stale"])

    # a manifest naming a directory outside the artifact folder: never followed
    outside = pytester.path / "outside"
    outside.mkdir()
    doc["tests"].append({"nodeid": "x.py::test_x", "dir": "../outside", "outcome": "failed"})
    (base / "manifest.json").write_text(json.dumps(doc))

    # keep=none and --jaxlog-clean-stale: everything earlier sessions left goes, stale ones included
    result = pytester.runpytest("-p", "no:cacheprovider", "--jaxlog-keep=none", "-k", "test_c", "--jaxlog-clean-stale")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["removed 2 artifact directories left by an earlier session for tests not run in this "
                                 "one (--jaxlog-clean-stale)"])
    left = sorted(p.name for p in base.iterdir() if not p.name.startswith(".trash-"))  # trash: being deleted
    assert left == ["manifest.json", "mine", "notes.txt"]
    assert outside.is_dir()
    doc, tests = _manifest(base)
    assert list(tests) == ["test_c"] and doc["stale"] == []
