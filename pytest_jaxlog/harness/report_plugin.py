"""The pytest side of the session's HTML report: ``--jaxlog-report[=PATH]`` (``JAXLOG_REPORT``,
ini ``jaxlog_report``), the failure messages it shows, writing it at the session's end, and the
failing tests' plots as pytest-html extras.

The report is written by the process that writes the manifest (the xdist controller, from the
merged manifest), after it. A report that cannot be written is a warning, never a failed session.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any, Generator

import pytest

from ..errors import JaxlogError
from .options import Option, add_option, lookup, parse_flag, what
from .session import STATE_KEY, JaxlogSession

REPORT = Option("report", "auto", "the session's HTML report: on (DIR/report.html), a file (=PATH, relative as for "
                "dir), no, or auto: on under keep=failed|all", metavar="PATH", const="on")
MAX_MESSAGES = 500  # failure messages kept for the report (the report shows at most MAX_MESSAGE_CHARS of each)


def add_report_option(parser: pytest.Parser) -> None:
    add_option(parser, REPORT)


def report_path(session: JaxlogSession) -> Path | None:
    """Where the session's report goes, or None (off)."""
    from .report import NAME, is_report

    src = lookup(session.config, REPORT)
    text = str(src.value).strip()
    if text.lower() in ("", "auto"):
        return session.base / NAME if session.settings.keep in ("failed", "all") else None
    if text.lower() == "none":
        return None
    try:
        on = parse_flag(text, what("report", src))
    except JaxlogError:
        on = None  # a path
    if on is not None:
        return session.base / NAME if on else None
    where = session.invocation_dir if src.origin in ("cli", "env") else session.rootdir
    path = (where / os.path.expanduser(text)).resolve()
    why = None
    if path.is_dir():
        why = "is a directory; the report is a file"
    elif path.suffix.lower() not in (".html", ".htm"):
        why = "is not an .html file"
    elif path.exists() and not is_report(path):
        why = "exists and is not a jaxlog report (it is never overwritten)"
    if why is not None:
        raise pytest.UsageError(f"{what('report', src)}: {path} {why}: give it as {REPORT.flag_name}=PATH "
                                f"(a bare {REPORT.flag_name} takes the next argument)")
    return path


class ReportPlugin:
    """Registered per config: gathers failure messages, attaches plots to pytest-html, writes the report."""

    def __init__(self, session: JaxlogSession):
        self.session = session
        self.path = report_path(session) if session.worker is None else None
        self.messages: dict[str, str] = {}
        self.written: Path | None = None
        self.error = ""

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed and len(self.messages) < MAX_MESSAGES and report.nodeid not in self.messages:
            crash = getattr(report.longrepr, "reprcrash", None)
            self.messages[report.nodeid] = str(getattr(crash, "message", None) or report.longreprtext)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Generator[None, Any, Any]:
        report = yield
        if report.failed and call.when in ("setup", "call"):
            add_html_extras(item, report)
        return report

    @pytest.hookimpl(trylast=True)  # after the plugin's own hook has written the manifest
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        from ..store import manifest
        from .report import NAME, remove_stale, render, write

        if self.session.worker is not None or session.config.option.collectonly:
            return
        if self.path is None:
            remove_stale(self.session.base / NAME)
            return

        found = self.session.base / manifest.NAME
        if not (self.session.entries or self.session.previous_manifest) or not found.is_file():
            return  # no manifest written by this session: no jaxlog test ran
        try:
            doc = manifest.read(found)
            self.written = write(self.path, render(doc, self.session.base, self.path.parent, self.messages))
        except Exception as e:  # the session's outcome stands: said in the terminal summary
            self.error = f"could not write {self.session.display(self.path)}: {e!r}"

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.written is not None:
            terminalreporter.write_line(f"jaxlog report: {self.session.display(self.written)}")
        elif self.error:
            terminalreporter.write_line(f"jaxlog report: {self.error}")


def add_html_extras(item: pytest.Item, report: pytest.TestReport) -> None:
    """The test's plots as images in pytest-html's report (when it is writing one)."""
    config = item.config
    if config.pluginmanager.getplugin("html") is None or not config.getoption("htmlpath", None):
        return
    state = item.stash.get(STATE_KEY, None)
    if state is None:
        return
    try:
        from pytest_html import extras
    except ImportError:
        return
    added = list(getattr(report, "extras", []))
    for key, path in state.artifacts.items():
        if state.kinds.get(key) == "plot" and Path(path).suffix.lower() == ".png" and Path(path).is_file():
            added.append(extras.png(base64.b64encode(Path(path).read_bytes()).decode("ascii"), name=f"jaxlog {key}"))
    setattr(report, "extras", added)  # noqa: B010  (pytest-html reads it; TestReport does not declare it)
