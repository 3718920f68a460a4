"""Errors a run raises before its first step: the test *errored*, it did not fail.

Why: a bad ``when=``, an invariant on a record that is not recorded or a bad argument is a
mistake in how the test uses jaxlog, found before any step ran; reporting it as a failed test
whose run "stopped by interrupted" sends the reader looking for a fault in the kernel. Such an
error (a ``JaxlogError`` that is no assertion, whose run did no step) gets pytest's error outcome
(``E``, counted in "errors") and the manifest entry ``error`` with its message. Imports the
standard library and the package's errors only.
"""

from __future__ import annotations

from typing import Any

from ..errors import JaxlogError

FLAG = "jaxlog_error"  # set on the call report; it travels to the xdist controller with the report


def before_start(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a jaxlog usage error raised before a run's first step: raised where no run
    was made yet (its arguments), or by a run that did no step (``exc.jaxlog_run``)."""
    if not isinstance(exc, JaxlogError) or isinstance(exc, AssertionError):
        return False
    if getattr(exc, "jaxlog_before_start", False):
        return True
    run = getattr(exc, "jaxlog_run", None)
    timings = getattr(run, "timings", None)
    return run is not None and getattr(run, "status", None) == "failed" and getattr(timings, "steps", None) == 0


def mark(report: Any, excinfo: Any) -> None:
    """Flag the call report of a test whose exception is such an error."""
    if report.when == "call" and report.failed and excinfo is not None and before_start(excinfo.value):
        setattr(report, FLAG, True)


def teststatus(report: Any) -> tuple[str, str, str] | None:
    """pytest's error category for a flagged call report (else None: pytest decides). The word is
    plain text: pytest 8.0 prints a (word, markup) pair raw in its short summary."""
    if report.when == "call" and getattr(report, FLAG, False):
        return "error", "E", "ERROR"
    return None


def flagged(report: Any) -> bool:
    return report is not None and bool(getattr(report, FLAG, False))
