"""A second, tiny pytest plugin (entry point ``jaxlog_disabled``) for sessions run with
``-p no:jaxlog``.

Blocking the ``jaxlog`` plugin removes its fixtures, so every test that asks for ``jaxlog`` or
``jaxlog_factory`` would error with pytest's "fixture 'jaxlog' not found" and the whole list of
available fixtures. Blocking a plugin is a deliberate choice, so this plugin skips those tests
instead, with one reason line, and says once in the terminal summary that jaxlog is disabled.
It does nothing when the jaxlog plugin is active, and imports only pytest.
"""

from __future__ import annotations

from typing import Any

import pytest

FIXTURES = ("jaxlog", "jaxlog_factory")
REASON = "[jaxlog] the jaxlog plugin is disabled (-p no:jaxlog): this test uses its fixtures"


def _disabled(config: pytest.Config) -> bool:
    return config.pluginmanager.is_blocked("jaxlog")


def _needs_jaxlog(item: pytest.Item) -> bool:
    """Asks for a jaxlog fixture that no other plugin or conftest provides."""
    names = set(getattr(item, "fixturenames", ())) & set(FIXTURES)
    if not names:
        return False
    info = getattr(item, "_fixtureinfo", None)  # pytest's resolved fixtures: a user's own `jaxlog` counts
    defs = getattr(info, "name2fixturedefs", {}) if info is not None else {}
    return any(not defs.get(n) for n in names)


def pytest_configure(config: pytest.Config) -> None:
    if _disabled(config):
        config.pluginmanager.register(_Notice(config), "jaxlog-disabled-notice")


class _Notice:
    """Skips the tests that need jaxlog's fixtures and counts them from the reports (under xdist the
    workers collect and skip, the controller counts)."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.skipped = 0

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            if _needs_jaxlog(item):
                item.add_marker(pytest.mark.skip(reason=REASON))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        longrepr = report.longrepr
        if report.skipped and isinstance(longrepr, tuple) and len(longrepr) == 3 and REASON in str(longrepr[2]):
            self.skipped += 1

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.skipped:
            terminalreporter.write_line(
                f"jaxlog: the jaxlog plugin is disabled (-p no:jaxlog); skipped {self.skipped} test"
                f"{'s' if self.skipped != 1 else ''} that use its fixtures"
            )
