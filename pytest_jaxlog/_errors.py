"""Errors and warnings: every message starts with ``[jaxlog]`` and names the culprit."""

from __future__ import annotations


class JaxlogError(ValueError):
    """Bad input to pytest-jaxlog: a record, schedule, view, file or option that cannot work."""

    def __init__(self, message: str):
        if not message.startswith("[jaxlog]"):
            message = f"[jaxlog] {message}"
        super().__init__(message)


class WriterError(RuntimeError):
    """A sink failed (often on its background thread); raised on the caller's thread."""

    def __init__(self, message: str):
        if not message.startswith("[jaxlog]"):
            message = f"[jaxlog] {message}"
        super().__init__(message)


class JaxlogRuntimeWarning(RuntimeWarning):
    """Something went wrong but the run goes on (``on_violation="warn"``, regenerated goldens)."""
