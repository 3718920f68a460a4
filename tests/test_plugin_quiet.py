"""The plugin is quiet until a session uses jaxlog: a bad ``JAXLOG_*`` variable (set by CI for every
test command) fails nothing in a session whose tests never ask for the fixtures or the marker, and
that session gets no ``.jaxlog/``, header, summary section or manifest; a session that does use
jaxlog fails at once with one ``[jaxlog]`` usage error naming the variable. With and without
pytest-xdist (whose controller collects nothing and learns of jaxlog from its workers' reports)."""

from __future__ import annotations

import json

import pytest

from plugin_helpers import no_jaxlog_env  # noqa: F401  (an autouse fixture)

pytest_plugins = ["pytester"]

PLAIN = "def test_a():\n    pass\n\ndef test_b():\n    pass\n"
USES = "def test_uses(jaxlog):\n    (jaxlog.dir / 'data.txt').write_text('x')\n"
MARKED = "import pytest\n\n@pytest.mark.jaxlog(keep='all')\ndef test_marked():\n    pass\n"
BAD = [("JAXLOG_CHUNK", "banana", "jaxlog chunk (JAXLOG_CHUNK=banana): expected a positive number of steps or auto"),
       ("JAXLOG_KEEP", "sometimes", "jaxlog keep (JAXLOG_KEEP=sometimes): expected one of failed|all|none")]
XDIST = [pytest.param((), id="one-process"), pytest.param(("-n", "2"), id="xdist")]


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*args, timeout=300)


def _line(text: str) -> str:
    """``text`` as an fnmatch pattern (``[jaxlog]`` is no character class)."""
    return text.replace("[", "[[]")


def _text(result: pytest.RunResult) -> str:
    return result.stdout.str() + "\n" + result.stderr.str()


@pytest.mark.parametrize("xdist", XDIST)
@pytest.mark.parametrize("name, value, message", BAD, ids=[b[0] for b in BAD])
def test_a_session_without_jaxlog_ignores_a_bad_variable(pytester, monkeypatch, xdist, name, value, message):
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_plain=PLAIN)
    monkeypatch.setenv(name, value)
    result = _run(pytester, *xdist)
    assert result.ret == pytest.ExitCode.OK, _text(result)
    result.assert_outcomes(passed=2)
    text = _text(result)
    assert "[jaxlog]" not in text and name not in text
    assert "jaxlog: dir=" not in text  # no header
    assert "- jaxlog -" not in text  # no summary section
    assert not (pytester.path / ".jaxlog").exists()
    assert not (pytester.path / ".pytest_cache" / "d" / "jaxlog-compile-cache").exists()


@pytest.mark.parametrize("xdist", XDIST)
def test_a_session_without_jaxlog_leaves_an_earlier_manifest_alone(pytester, xdist):
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_uses=USES)
    _run(pytester, "--jaxlog-keep=all", *xdist).assert_outcomes(passed=1)
    manifest = pytester.path / ".jaxlog" / "manifest.json"
    before = manifest.read_bytes()
    assert [t["nodeid"] for t in json.loads(before)["tests"]] == ["test_uses.py::test_uses"]

    pytester.makepyfile(test_plain=PLAIN)
    result = _run(pytester, "test_plain.py", *xdist)
    result.assert_outcomes(passed=2)
    text = _text(result)
    assert "- jaxlog -" not in text and "no jaxlog test ran" not in text and "jaxlog report" not in text
    assert manifest.read_bytes() == before  # not rewritten, its entry not turned stale
    assert (pytester.path / ".jaxlog" / "test_uses.test_uses" / "data.txt").read_text() == "x"


@pytest.mark.parametrize("xdist", XDIST)
@pytest.mark.parametrize("name, value, message", BAD, ids=[b[0] for b in BAD])
def test_a_bad_variable_fails_a_session_that_uses_jaxlog(pytester, monkeypatch, xdist, name, value, message):
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_plain=PLAIN, test_uses=USES)
    monkeypatch.setenv(name, value)
    result = _run(pytester, *xdist)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, _text(result)
    result.stderr.fnmatch_lines([_line(f"ERROR: [jaxlog] {message}") + "*"])
    assert _text(result).count(f"{name}={value}") == 1, _text(result)  # one error, said once
    assert "Traceback" not in _text(result) and "INTERNALERROR" not in _text(result)
    assert not (pytester.path / ".jaxlog").exists()


def test_the_marker_alone_uses_jaxlog(pytester, monkeypatch):
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_plain=PLAIN, test_marked=MARKED)
    monkeypatch.setenv("JAXLOG_CHUNK", "banana")
    result = _run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([_line("ERROR: [jaxlog] jaxlog chunk (JAXLOG_CHUNK=banana): ") + "*"])
    # deselected, it is not used: the session passes
    result = _run(pytester, "-k", "not marked")
    assert result.ret == pytest.ExitCode.OK, _text(result)
    result.assert_outcomes(passed=2)


@pytest.mark.parametrize("given", [("--jaxlog-keep=all",), ("-o", "jaxlog_keep=all")], ids=["option", "ini"])
def test_an_option_given_resolves_the_settings_at_the_start(pytester, monkeypatch, given):
    """An explicit ``--jaxlog-*`` option or ``jaxlog_*`` ini key means the session uses jaxlog,
    whatever its tests do: its settings are resolved at configure, as before."""
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_plain=PLAIN)
    monkeypatch.setenv("JAXLOG_CHUNK", "banana")
    result = _run(pytester, *given)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([_line("ERROR: [jaxlog] jaxlog chunk (JAXLOG_CHUNK=banana): ") + "*"])


@pytest.mark.parametrize("xdist", XDIST)
def test_a_session_found_using_jaxlog_in_its_tests_works_as_before(pytester, monkeypatch, xdist):
    """Found at the collection (or, on an xdist controller, at a worker's first report): the header
    after the collection line, the manifest, the summary and stale clean-up as from the start."""
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_plain=PLAIN, test_uses=USES,
                        test_other="def test_other(jaxlog):\n    (jaxlog.dir / 'data.txt').write_text('o')\n")
    monkeypatch.setenv("JAXLOG_KEEP", "all")
    _run(pytester, *xdist).assert_outcomes(passed=4)
    base = pytester.path / ".jaxlog"
    assert (base / "test_other.test_other" / "data.txt").read_text() == "o"

    monkeypatch.setenv("JAXLOG_CLEAN_STALE", "1")  # the earlier session's test_other is not run again
    result = _run(pytester, "test_plain.py", "test_uses.py", *xdist)
    result.assert_outcomes(passed=3)
    doc = json.loads((base / "manifest.json").read_text())
    assert [t["nodeid"] for t in doc["tests"]] == ["test_uses.py::test_uses"] and doc["stale"] == []
    assert not (base / "test_other.test_other").exists()
    assert (base / "test_uses.test_uses" / "data.txt").read_text() == "x"
    result.stdout.fnmatch_lines(["artifacts kept for 1 of 1 jaxlog tests in .jaxlog (--jaxlog-keep=all)*",
                                 "removed 1 artifact directories left by an earlier session*"])
    if not xdist:  # an xdist controller learns of jaxlog with the tests running: no header
        result.stdout.fnmatch_lines(["collected 3 items", "jaxlog: dir=.jaxlog keep=all *"])
