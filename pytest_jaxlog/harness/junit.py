"""A failing test's plots as JUnit XML attachments: ``[[ATTACHMENT|path]]`` lines in the test
case's ``<system-out>``, the convention Jenkins' junit-attachments plugin, GitLab's test report
and Azure DevOps read (each on its own line, nothing around it).

pytest's ``--junitxml`` offers plugins ``<properties>`` only (``record_property``, the
``user_properties`` the plugin fills with ``jaxlog.plot`` too); no CI reads attachments there.
Its ``<system-out>`` holds captured output only under ``junit_logging=system-out|out-err|all``.
So: under those settings the lines join pytest's own captured output (a ``Captured stdout
teardown`` section of the teardown report, which pytest writes into ``<system-out>``); otherwise
a ``<system-out>`` element of our own goes into the test case through pytest's JUnit reporter
(``_pytest.junitxml``: not public, so a pytest without it gets the properties only). Either way
the element is added before pytest closes the test case at its teardown report, on the xdist
controller too (the manifest entry travels with the report).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from .session import JaxlogSession

SECTION = "Captured stdout teardown"  # a section pytest's junitxml writes into <system-out>


def attachment_lines(session: JaxlogSession, entry: dict) -> list[str]:
    """``[[ATTACHMENT|path]]`` per plot of the manifest entry; paths as the session displays them
    (relative to the directory pytest was started in, where CI jobs collect their artifacts)."""
    from ..store.manifest import is_plot

    out = []
    for key, rel in sorted((entry.get("artifacts") or {}).items()):
        if is_plot(key):
            out.append(f"[[ATTACHMENT|{session.display(os.path.normpath(session.base / rel))}]]")
    return out


class JunitAttachments:
    """Registered per config: adds each teardown report's plots to the JUnit XML test case."""

    def __init__(self, session: JaxlogSession):
        self.session = session

    @pytest.hookimpl(tryfirst=True)  # before junitxml's own hook closes the test case
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = getattr(report, "jaxlog", None)
        if report.when != "teardown" or not isinstance(entry, dict):
            return
        xml = _junit_xml(self.session.config)
        if xml is None:
            return
        lines = attachment_lines(self.session, entry)
        if not lines:
            return
        text = "\n".join(lines) + "\n"
        if getattr(xml, "logging", "no") in ("system-out", "out-err", "all"):
            report.sections.append((SECTION, text))
            return
        import xml.etree.ElementTree as ET

        node = ET.Element("system-out")
        node.text = text
        xml.node_reporter(report).append(node)


def _junit_xml(config: pytest.Config) -> Any:
    """pytest's JUnit XML writer of this session, or None (no --junitxml, or a pytest without it)."""
    try:
        from _pytest.junitxml import xml_key
    except ImportError:
        return None
    return config.stash.get(xml_key, None)
