"""Text from a file, a manifest or a record's name made safe to show: every control or format
character written as its escape (``\\x1b``, ``\\u202e``), so a name or value never drives the
terminal (colours, cursor moves, titles, reordered text) nor, where each line is one entry (a
log), forges a line of its own. One function for the command line and the text sinks, so both
escape alike. Standard library only.
"""

from __future__ import annotations

__all__ = ["printable"]


def printable(text: str, *, newlines: bool = True) -> str:
    """``text`` with its control and format characters escaped; ``newlines=False`` escapes the
    newline too (one log line stays one line)."""
    keep = "\n" if newlines else ""
    if (text.replace("\n", "") if newlines else text).isprintable():
        return text
    return "".join(c if c == keep or c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
