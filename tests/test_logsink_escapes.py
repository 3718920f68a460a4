"""``LoggingSink`` lines cannot be forged: a record name holding a newline and terminal escapes
is written escaped, as the command line writes it (one function, ``record.values``), so each
step stays one line and no escape reaches the log's reader raw."""

from __future__ import annotations

import logging

import jax.numpy as jnp

import pytest_jaxlog as jl
from pytest_jaxlog.cli import _Printable
from pytest_jaxlog.record.values import printable

FORGED = "e\nstep 999: energy=0 \x1b]0;pwned\x07\x1b[2J\u202e"


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def test_a_forged_record_name_stays_one_escaped_line_per_step():
    handler = _Lines()
    logger = logging.getLogger("test_logsink_escapes")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        jl.run(lambda s: s + 1.0, jnp.float32(0), 3, record={FORGED: lambda s: s},
               sinks=[jl.LoggingSink(logger)], progress=False)
    finally:
        logger.removeHandler(handler)
    escaped = "e\\nstep 999: energy=0 \\x1b]0;pwned\\x07\\x1b[2J\\u202e"
    assert handler.lines == [f"step {k}: {escaped}={float(k):.6g}" for k in range(4)]
    assert all(c.isprintable() for line in handler.lines for c in line)


def test_the_command_line_and_the_sinks_escape_alike():
    """One helper: the command line's stream keeps its newlines (its output is lines), the sinks'
    lines escape them too; every other character is escaped the same way."""
    class Out:
        text = ""

        def write(self, t: str) -> int:
            Out.text += t
            return len(t)

    _Printable(Out()).write(FORGED)
    assert Out.text == printable(FORGED) == "e\nstep 999: energy=0 \\x1b]0;pwned\\x07\\x1b[2J\\u202e"
    assert printable(FORGED, newlines=False) == printable(FORGED).replace("\n", "\\n")
    assert printable("plain text\n") == "plain text\n" and printable("tab\there", newlines=False) == "tab\\there"
