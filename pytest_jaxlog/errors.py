"""The error family: one base class to catch (``JaxlogError``), every message starting with
``[jaxlog]`` and naming the culprit.

``JaxlogError`` stays a ``ValueError`` so code written against 0.1 (``except ValueError``) keeps
working; assertion-style failures are also ``AssertionError`` so pytest shows them as failed
checks, not as errors in the test's code.
"""

from __future__ import annotations


def _prefixed(message: str) -> str:
    return message if message.startswith("[jaxlog]") else f"[jaxlog] {message}"


class JaxlogError(ValueError):
    """Base of every error pytest-jaxlog raises: bad input (a record, schedule, view, file or
    option that cannot work), a failed sink, or a failed check."""

    def __init__(self, message: str):
        super().__init__(_prefixed(message))


class WriterError(JaxlogError, RuntimeError):
    """A sink failed (often on its background thread); raised on the caller's thread."""


class JaxlogAssertionError(JaxlogError, AssertionError):
    """A check on a run failed: an invariant, a golden comparison, a timing or compile count."""


class JaxlogRuntimeWarning(RuntimeWarning):
    """Something went wrong but the run goes on (``on_violation="warn"``, regenerated goldens)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (CI cancellation, a job time limit, a scheduler) while a run was recording:
    raised like Ctrl-C, so the run stops the same way (status ``stopped``, every frame handed
    over on disk) and ``except KeyboardInterrupt`` handles both."""

    def __init__(self, signum: int = 15):
        super().__init__(f"[jaxlog] terminated by signal {signum}")
        self.signum = signum


def hide_frame_from_checks(excinfo) -> bool:
    """A library frame's ``__tracebackhide__``: pytest leaves it out of the traceback of a failed
    check (an invariant, golden, cost or timing assertion), so the failure shows the test's line
    and the message; for any other exception (a bug, bad input) the frame stays, to debug.
    ``pytest --full-trace`` shows every frame. ``excinfo``: pytest's ``ExceptionInfo`` (duck-typed:
    the core never imports pytest)."""
    return isinstance(getattr(excinfo, "value", None), JaxlogAssertionError)


class CostRegression(JaxlogAssertionError):
    """A kernel's compiled cost (``jl.Cost``: flops, bytes, kernels, ...) moved from its stored
    cost golden, up or down: ``.moved`` lists each metric with the stored and obtained figures."""

    def __init__(self, message: str, moved: tuple = ()):
        super().__init__(message)
        self.moved = tuple(moved)
