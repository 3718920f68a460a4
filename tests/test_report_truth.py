"""The report, ``jaxlog summary`` and the terminal summary count only the session's own tests.

Entries an earlier session left (a test not run again, renamed or deleted: marked stale in the
manifest with the session they came from) are shown apart, each with its session, and never
counted as this session's: a session that ran no jaxlog test says so, not "3 jaxlog tests, 0 not
passed". Real pytest sessions, one after the other over the same ``.jaxlog``.
"""

from __future__ import annotations

import html.parser
import json
import time
from pathlib import Path

from plugin_helpers import no_jaxlog_env  # noqa: F401  (an autouse fixture)

from pytest_jaxlog.__main__ import main

pytest_plugins = ["pytester"]

RUN = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")

# test_a and test_b fail (their directories are kept), test_c passes; none needs jax
SUITE = """
def test_a(jaxlog):
    (jaxlog.dir / "a.txt").write_text("a")
    assert False, "a broke"

def test_b(jaxlog):
    (jaxlog.dir / "b.txt").write_text("b")
    assert False, "b broke"

def test_c(jaxlog):
    (jaxlog.dir / "c.txt").write_text("c")
"""
PLAIN = """
def test_plain():
    pass
"""


class Page(html.parser.HTMLParser):
    """The report's headline and the cells of each table's rows, as text."""

    def __init__(self) -> None:
        super().__init__()
        self.headline = ""
        self.headings: list[str] = []
        self.tables: dict[str, list[list[str]]] = {}
        self._in: str | None = None
        self._table: str | None = None
        self._row: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "p" and attrs.get("class") == "headline" or tag in ("h2", "td", "th"):
            self._in = tag
            if tag == "h2":
                self.headings.append("")
            if tag in ("td", "th") and self._row is not None:
                self._row.append("")
        elif tag == "table":
            self._table = attrs.get("class") or "tests"
            self.tables[self._table] = []
        elif tag == "tr":
            self._row = []

    def handle_endtag(self, tag):
        if tag == "tr" and self._row is not None and self._table is not None:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "p" and self._in == "p" or tag in ("h2", "td", "th"):
            self._in = None

    def handle_data(self, data):
        if self._in == "p":
            self.headline += data
        elif self._in == "h2":
            self.headings[-1] += data
        elif self._in in ("td", "th") and self._row is not None:
            self._row[-1] += data


def _page(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text())
    return page


def _manifest(base: Path) -> dict:
    return json.loads((base / "manifest.json").read_text())


def _when(doc: dict) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(doc["finished"]))


def _summary(capsys, *args: str) -> list[str]:
    capsys.readouterr()  # the inner sessions' output
    assert main(["summary", *args]) == 0
    return capsys.readouterr().out.splitlines()


def test_a_session_that_ran_no_jaxlog_test_says_so_and_shows_the_earlier_one_apart(pytester, capsys, monkeypatch):
    pytester.makepyfile(test_s=SUITE, test_plain=PLAIN)
    base = pytester.path / ".jaxlog"
    pytester.runpytest(*RUN, "test_s.py").assert_outcomes(passed=1, failed=2)
    first = _manifest(base)
    page = _page(base / "report.html")
    assert page.headline == f"3 jaxlog tests in this session, 2 not passed; exit status 1; finished {_when(first)}; " \
                            "keep=failed"

    # an option given: the session uses jaxlog (without one, a session of plain tests leaves it all alone)
    result = pytester.runpytest(*RUN, "--jaxlog-keep=failed", "test_plain.py")
    result.assert_outcomes(passed=1)
    second = _manifest(base)
    assert second["session"] != first["session"] and second["exitstatus"] == 0
    sid = first["session"]

    # the report: no count of tests that did not run here, this session's time, the earlier entries apart
    page = _page(base / "report.html")
    assert page.headline == f"no jaxlog test ran in this session; exit status 0; finished {_when(second)}; keep=failed"
    assert page.headings == ["Stale evidence (3)"]  # no failures, no table of this session's tests
    rows = page.tables["stale"]
    assert rows[0] == ["test", "outcome", "session", "message", "files"]
    assert rows[1:] == [
        ["test_s.py::test_a", "FAILED", f"session {sid}", "", "dir: test_s.test_a"],
        ["test_s.py::test_b", "FAILED", f"session {sid}", "", "dir: test_s.test_b"],
        ["test_s.py::test_c", "PASSED", f"session {sid}", "", ""],
    ]
    text = (base / "report.html").read_text()
    assert "3 jaxlog tests" not in text and "not passed</b>" not in text

    # the terminal summary
    result.stdout.fnmatch_lines([
        "no jaxlog test ran in this session; manifest: .jaxlog/manifest.json",
        "stale: 3 tests not run in this session keep their earlier entries in manifest.json (2 with artifact "
        "directories); --jaxlog-clean-stale removes them",
        f"  from session {sid}: 3 tests, 2 not passed",
        f"  STALE (session {sid}) FAILED test_s.py::test_a -> .jaxlog/test_s.test_a",
        f"  STALE (session {sid}) FAILED test_s.py::test_b -> .jaxlog/test_s.test_b",
        "jaxlog report: .jaxlog/report.html",
    ])
    assert "artifacts kept for" not in result.stdout.str()

    # jaxlog summary, plain and Markdown
    monkeypatch.chdir(pytester.path)
    assert _summary(capsys, ".jaxlog")[:7] == [
        "jaxlog: .jaxlog",
        "no jaxlog test ran in this session (keep=failed); exit status 0",
        "  stale, not counted above: 3 tests not run in this session keep their earlier entries",
        f"      from session {sid}: 3 tests, 2 not passed",
        f"  STALE (session {sid}) FAILED test_s.py::test_a",
        f"  STALE (session {sid}) FAILED test_s.py::test_b",
        "  2 artifact directories from an earlier session (stale), e.g. .jaxlog/test_s.test_a",
    ]
    md = _summary(capsys, ".jaxlog", "--markdown")
    assert md[:8] == [
        "### jaxlog: .jaxlog",
        "no jaxlog test ran in this session (keep=failed); exit status 0",
        "",
        "- stale, not counted above: 3 tests not run in this session keep their earlier entries",
        f"  - from session `{sid}`: 3 tests, 2 not passed",
        f"- STALE (session `{sid}`) FAILED `test_s.py::test_a`",
        f"- STALE (session `{sid}`) FAILED `test_s.py::test_b`",
        "- 2 artifact directories from an earlier session (stale), e.g. `.jaxlog/test_s.test_a`",
    ]


def test_a_renamed_tests_old_entry_is_shown_apart_with_its_session_not_counted(pytester, capsys, monkeypatch):
    pytester.makepyfile(test_s=SUITE)
    base = pytester.path / ".jaxlog"
    pytester.runpytest(*RUN).assert_outcomes(passed=1, failed=2)
    first = _manifest(base)["session"]

    # test_b renamed: this session ran three tests; the old test_b entry is the first session's
    pytester.makepyfile(test_s=SUITE.replace("def test_b(", "def test_b2("))
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(passed=1, failed=2)
    doc = _manifest(base)
    page = _page(base / "report.html")
    assert page.headline == f"3 jaxlog tests in this session, 2 not passed; exit status 1; finished {_when(doc)}; " \
                            "keep=failed"
    assert page.headings == ["Failures (2)", "Jaxlog tests of this session (3)", "Stale evidence (1)"]
    assert [r[:2] for r in page.tables["tests"][1:]] == [
        ["test_s.py::test_a", "FAILED"], ["test_s.py::test_b2", "FAILED"], ["test_s.py::test_c", "PASSED"]]
    assert [r[:3] for r in page.tables["stale"][1:]] == [["test_s.py::test_b", "FAILED", f"session {first}"]]
    assert page.tables["stale"][1][4] == "dir: test_s.test_b"
    result.stdout.fnmatch_lines([
        "artifacts kept for 2 of 3 jaxlog tests in .jaxlog (--jaxlog-keep=failed); manifest: .jaxlog/manifest.json",
        "stale: 1 tests not run in this session keep their earlier entries in manifest.json (1 with artifact "
        "directories); --jaxlog-clean-stale removes them",
        f"  from session {first}: 1 tests, 1 not passed",
        f"  STALE (session {first}) FAILED test_s.py::test_b -> .jaxlog/test_s.test_b",
    ])

    # a third session runs test_a only: the stale entries come from two sessions, the newest first
    second = doc["session"]
    result = pytester.runpytest(*RUN, "-k", "test_a")
    result.assert_outcomes(failed=1)
    doc = _manifest(base)
    page = _page(base / "report.html")
    assert page.headline == f"1 jaxlog tests in this session, 1 not passed; exit status 1; finished {_when(doc)}; " \
                            "keep=failed"
    assert [r[:3] for r in page.tables["stale"][1:]] == [
        ["test_s.py::test_b2", "FAILED", f"session {second}"],
        ["test_s.py::test_c", "PASSED", f"session {second}"],
        ["test_s.py::test_b", "FAILED", f"session {first}"],
    ]
    result.stdout.fnmatch_lines([
        "artifacts kept for 1 of 1 jaxlog tests in .jaxlog (--jaxlog-keep=failed); manifest: .jaxlog/manifest.json",
        "stale: 3 tests not run in this session keep their earlier entries in manifest.json (2 with artifact "
        "directories); --jaxlog-clean-stale removes them",
        f"  from session {second}: 2 tests, 1 not passed",
        f"  from session {first}: 1 tests, 1 not passed",
        f"  STALE (session {second}) FAILED test_s.py::test_b2 -> .jaxlog/test_s.test_b2",
        f"  STALE (session {first}) FAILED test_s.py::test_b -> .jaxlog/test_s.test_b",
    ])
    monkeypatch.chdir(pytester.path)
    assert _summary(capsys, ".jaxlog")[:10] == [
        "jaxlog: .jaxlog",
        "1 jaxlog tests, 1 not passed, artifacts kept for 1 (keep=failed); exit status 1",
        "  FAILED test_s.py::test_a",
        "  stale, not counted above: 3 tests not run in this session keep their earlier entries",
        f"      from session {second}: 2 tests, 1 not passed",
        f"      from session {first}: 1 tests, 1 not passed",
        f"  STALE (session {second}) FAILED test_s.py::test_b2",
        f"  STALE (session {first}) FAILED test_s.py::test_b",
        "  2 artifact directories from an earlier session (stale), e.g. .jaxlog/test_s.test_b",
        "Inspect a trajectory: python -m pytest_jaxlog info FILE.h5 (also diff, plot; python -m pytest_jaxlog "
        "trace TRACE for timings).",
    ]


def test_stale_directories_without_an_entry_or_a_session_and_merged_manifests(tmp_path, capsys, monkeypatch):
    """A manifest an older version wrote (a stale directory with no session), a hostile session id,
    and a merge of shards that ran nothing: each is said as it is, never counted as run."""
    from pytest_jaxlog.harness.report import render

    base = tmp_path / ".jaxlog"
    (base / "t.test_gone").mkdir(parents=True)
    doc = {"version": 2, "finished": 0.0, "exitstatus": 5, "settings": {"keep": "failed"},
           "shards": [{"manifest": "a"}, {"manifest": "b"}],
           "tests": [{"nodeid": "t.py::test_old", "outcome": "error", "stale": True, "session": "<b>x</b>",
                      "error": "RuntimeError: setup broke\nmore", "dir": None, "artifacts": {}}],
           "stale": [{"nodeid": "t.py::test_gone", "dir": "t.test_gone", "outcome": "failed"}]}
    page = Page()
    text = render(doc, base, base)
    page.feed(text)
    assert page.headline == "no jaxlog test ran in this session; exit status 5; finished 1970-01-01 00:00:00 UTC; " \
                            "keep=failed"
    assert page.tables["stale"][1:] == [
        ["t.py::test_old", "ERROR", "session <b>x</b>", "RuntimeError: setup broke", ""],
        ["t.py::test_gone", "FAILED", "session unknown", "", "dir: t.test_gone"],
    ]
    assert "<b>x</b>" not in text and "&lt;b&gt;x&lt;/b&gt;" in text

    (base / "manifest.json").write_text(json.dumps(doc))
    monkeypatch.chdir(tmp_path)
    assert _summary(capsys, ".jaxlog")[:6] == [
        "jaxlog: .jaxlog",
        "no jaxlog test ran in the 2 merged sessions (keep=failed); exit status 5",
        "  stale, not counted above: 1 tests not run in the 2 merged sessions keep their earlier entries",
        "      from session <b>x</b>: 1 tests, 1 not passed",
        "  STALE (session <b>x</b>) ERROR t.py::test_old",
        "      error: RuntimeError: setup broke",
    ]
