"""Evidence that stays: a session replaces only the artifact directories of the tests it runs again;
what earlier sessions left for the other tests stays on disk and in the manifest (marked stale,
with the session it came from), and ``--jaxlog-clean-stale`` removes it."""

from __future__ import annotations

import json
from pathlib import Path

from plugin_helpers import no_jaxlog_env  # noqa: F401  (an autouse fixture)
from test_plugin_manifest import STALE as SUITE  # test_a and test_b fail, test_c passes; each writes a file

from pytest_jaxlog.cli import summarize

pytest_plugins = ["pytester"]



def _manifest(base: Path) -> tuple[dict, dict]:
    doc = json.loads((base / "manifest.json").read_text())
    return doc, {t["nodeid"].split("::", 1)[1]: t for t in doc["tests"]}


def _run(pytester, *args):
    return pytester.runpytest("-p", "no:cacheprovider", *args)


def test_a_subset_keeps_the_evidence_of_the_tests_it_does_not_run(pytester, monkeypatch):
    pytester.makepyfile(test_s=SUITE)
    base = pytester.path / ".jaxlog"
    dirs = {n: base / f"test_s.test_{n}" for n in "abc"}
    _run(pytester).assert_outcomes(passed=1, failed=2)
    first, _ = _manifest(base)
    assert first["session"] and dirs["a"].is_dir() and dirs["b"].is_dir()

    # a subset that now passes test_a: its directory is replaced (removed: keep=failed), test_b's stays
    passing = SUITE.replace('write_text("a")\n    assert False', 'write_text("a")')
    assert passing != SUITE
    pytester.makepyfile(test_s=passing)
    result = _run(pytester, "-k", "test_a")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["stale: 2 tests not run in this session keep their earlier entries in manifest.json "
                                 "(1 with artifact directories); --jaxlog-clean-stale removes them"])
    assert not dirs["a"].exists() and (dirs["b"] / "b.txt").read_text() == "b"
    second, tests = _manifest(base)
    assert second["session"] != first["session"]
    assert sorted(tests) == ["test_a", "test_b", "test_c"]
    assert tests["test_a"]["outcome"] == "passed" and "stale" not in tests["test_a"]
    assert (tests["test_b"]["stale"], tests["test_b"]["session"], tests["test_b"]["outcome"]) == (
        True, first["session"], "failed")
    assert tests["test_b"]["dir"] == "test_s.test_b" and tests["test_b"]["kept"] is True
    assert (tests["test_c"]["stale"], tests["test_c"]["outcome"], tests["test_c"]["dir"]) == (True, "passed", None)
    assert second["stale"] == [{"nodeid": "test_s.py::test_b", "dir": "test_s.test_b", "outcome": "failed",
                                "session": first["session"]}]

    # a third subset: the newest entry of each test wins, each stale one names the session it came from
    _run(pytester, "-k", "test_c").assert_outcomes(passed=1)
    third, tests = _manifest(base)
    assert [(n, t.get("stale", False), t.get("session")) for n, t in sorted(tests.items())] == [
        ("test_a", True, second["session"]), ("test_b", True, first["session"]), ("test_c", False, None)]
    assert (dirs["b"] / "b.txt").read_text() == "b"

    # the summary counts this session's tests and the stale ones apart
    text = summarize([(base / "manifest.json", third)], markdown=False)
    assert "1 jaxlog tests, 0 not passed" in text
    assert "stale, not counted above: 2 tests not run in this session keep their earlier entries" in text
    assert f"from session {second['session']}: 1 tests, 0 not passed" in text
    assert f"from session {first['session']}: 1 tests, 1 not passed" in text
    assert f"STALE (session {first['session']}) FAILED test_s.py::test_b" in text
    assert "1 artifact directories from an earlier session (stale), e.g. " in text

    # the cleaning option (here from the environment): the stale directories and entries go
    (base / "mine").mkdir()  # a user's own folder beside the artifacts is never touched
    monkeypatch.setenv("JAXLOG_CLEAN_STALE", "1")
    result = _run(pytester, "-k", "test_a")
    result.stdout.fnmatch_lines(["removed 1 artifact directories left by an earlier session for tests not run in this "
                                 "one (--jaxlog-clean-stale)"])
    assert not dirs["b"].exists() and (base / "mine").is_dir()
    doc, tests = _manifest(base)
    assert list(tests) == ["test_a"] and doc["stale"] == [] and doc["settings"]["clean_stale"] is True


def test_a_test_run_again_replaces_its_own_evidence_even_when_it_now_errors_before_its_fixture(pytester):
    pytester.makepyfile(test_s=SUITE)
    base = pytester.path / ".jaxlog"
    _run(pytester).assert_outcomes(passed=1, failed=2)
    assert (base / "test_s.test_a" / "a.txt").is_file()
    pytester.makepyfile(test_s="""
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("no setup today")

def test_a(broken, jaxlog):
    pass
""" + SUITE.split("def test_a", 1)[1].split("\n\n", 1)[1])
    result = _run(pytester, "-k", "test_a")
    result.assert_outcomes(errors=1)
    assert not (base / "test_s.test_a").exists() and (base / "test_s.test_b" / "b.txt").is_file()
    _, tests = _manifest(base)
    assert tests["test_a"]["outcome"] == "error" and "no setup today" in tests["test_a"]["error"]
    assert tests["test_a"]["dir"] is None and "stale" not in tests["test_a"]
    assert tests["test_b"]["stale"] is True


def test_the_controller_keeps_the_evidence_under_xdist(pytester):
    pytester.makepyfile(test_s=SUITE)
    base = pytester.path / ".jaxlog"
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2").assert_outcomes(passed=1, failed=2)
    first, _ = _manifest(base)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "-k", "test_a or test_c")
    result.assert_outcomes(passed=1, failed=1)
    assert (base / "test_s.test_b" / "b.txt").read_text() == "b"
    assert (base / "test_s.test_a" / "a.txt").read_text() == "a"  # rerun and failed again: its new directory
    doc, tests = _manifest(base)
    assert sorted(tests) == ["test_a", "test_b", "test_c"]
    assert [n for n, t in sorted(tests.items()) if t.get("stale")] == ["test_b"]
    assert tests["test_b"]["session"] == first["session"] and tests["test_a"]["worker"] in ("gw0", "gw1")

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "-k", "test_c",
                                           "--jaxlog-clean-stale")
    result.assert_outcomes(passed=1)
    assert not (base / "test_s.test_a").exists() and not (base / "test_s.test_b").exists()
    doc, tests = _manifest(base)
    assert list(tests) == ["test_c"] and doc["stale"] == []
